"""Off-policy learners over the batched env API; shared parts in `q2real.agents.common`."""
