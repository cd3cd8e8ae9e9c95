"""DroQ (Hiraoka et al., ICLR 2022, "Dropout Q-Functions for Doubly Efficient Reinforcement Learning"):
SAC at a high update-to-data ratio, kept from overestimating by a small ensemble of critics with
dropout and layer normalization, each hidden layer Linear -> Dropout -> LayerNorm -> activation.
"A Walk in the Park" (Smith, Kostrikov, Levine 2022) taught a quadruped to walk with it in about 20
minutes of real data.

Built from SAC and the shared loop's switches: `critic_network=layernorm`, `critic_dropout`, and the
training job's `updates_per_step` for the update-to-data ratio. Defaults follow the paper: two
critics, dropout 0.01, lr 3e-4, an mlp actor, the actor updated once per vectorized env step: set
`policy_delay` to `updates_per_step` (the paper's UTD 20: `updates_per_step=20 droq.policy_delay=20`
with one env). Departures: the layer-normalized layers use SiLU, the `layernorm` trunk's activation,
not ReLU; the initial temperature is SAC's 0.1 here (as "A Walk in the Park"), not 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from q2real.agents.algos.sac import SACConfig
from q2real.agents.common.networks import Trunk


@dataclass
class DroQConfig(SACConfig):
    critic_network: Trunk | None = "layernorm"
    critic_dropout: float = 0.01
