"""The learner registry: every name `algo` may take, and for each off-policy learner its settings and class.

Everything that lists learners reads them here: the training config's `algo` choices and its `<algo>:`
section (`q2real.agents.config`), the learner `build_agent` makes (`q2real.agents.learners`), which job
`q2real train algo=NAME` runs (`q2real.agents.jobs`) and the config reference. A learner is added by one
entry in `LEARNERS`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from q2real.agents.algos.coxq import COXQ, COXQConfig
from q2real.agents.algos.crossq import CrossQ, CrossQConfig
from q2real.agents.algos.droq import DroQConfig
from q2real.agents.algos.flashsac import FlashSACConfig
from q2real.agents.algos.sac import SAC, SACConfig
from q2real.agents.algos.sac_lag import SACLag, SACLagConfig
from q2real.agents.algos.td3 import TD3, DDPGConfig, TD3Config
from q2real.agents.common.actor_critic import ActorCritic, ActorCriticConfig

JobKind = Literal["rl", "stream", "bc", "residual"]


@dataclass(frozen=True)
class LearnerSpec:
    """An off-policy learner the one training loop runs."""

    config: type[ActorCriticConfig]
    """Its settings: the training config's section written under the learner's name."""
    learner: type[ActorCritic]
    """The class built for it; a variant of other defaults shares its family's (DDPG is TD3, DroQ is SAC)."""


LEARNERS: dict[str, LearnerSpec] = {
    "sac": LearnerSpec(SACConfig, SAC),
    "td3": LearnerSpec(TD3Config, TD3),
    "ddpg": LearnerSpec(DDPGConfig, TD3),
    "flashsac": LearnerSpec(FlashSACConfig, SAC),
    "crossq": LearnerSpec(CrossQConfig, CrossQ),
    "droq": LearnerSpec(DroQConfig, SAC),
    "sac_lag": LearnerSpec(SACLagConfig, SACLag),
    "coxq": LearnerSpec(COXQConfig, COXQ),
}
"""algo -> the off-policy learner it names; `q2real train algo=NAME` trains it."""

OTHER_JOBS: dict[str, JobKind] = {"stream_ac": "stream", "bc": "bc"}
"""`algo` values that choose a job of their own rather than a learner of `LEARNERS`: the streaming learner
(`q2real.agents.stream`) and behaviour cloning (`q2real.residual.bc`, a layer above the learners, so it is
named here, not imported)."""


class _Settings(Mapping[str, type[ActorCriticConfig]]):
    """`LEARNERS` seen as name -> settings class, read at each lookup."""

    def __getitem__(self, name: str) -> type[ActorCriticConfig]:
        return LEARNERS[name].config

    def __iter__(self) -> Iterator[str]:
        return iter(LEARNERS)

    def __len__(self) -> int:
        return len(LEARNERS)


LEARNER_SETTINGS: Mapping[str, type[ActorCriticConfig]] = _Settings()
"""What the training config's `algo` chooses a section from: a view of `LEARNERS`, not a copy, so a learner
registered after import (a plug-in, a test) is a choice too."""
