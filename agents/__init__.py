"""Off-policy learners over the batched env API: one file per algorithm in `q2real.agents.algos`, each
named once in `q2real.agents.registry`; shared parts in `q2real.agents.common`."""
