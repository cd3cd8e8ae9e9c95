"""One file per algorithm family: its config dataclass, its networks and its pieces of the shared
actor-critic update (`q2real.agents.common.actor_critic`); `q2real.agents.registry` names them."""
