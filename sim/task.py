"""Task logic, written once in torch over `PhysicsState` so it runs on every backend."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import mujoco
import torch

from q2real.configs.loader import ConfigError
from q2real.hardware import RobotSpec
from q2real.hardware.action import action_mapping, command_from_action
from q2real.hardware.model import actuator_for_joint
from q2real.hardware.spec import SpecError
from q2real.safety.shield import ShieldConfig
from q2real.sim.action_steps import KEY as STEPS_KEY
from q2real.sim.action_steps import ActionSteps
from q2real.sim.kinematics import BodyPoint
from q2real.sim.physics import PhysicsState
from q2real.sim.reward import RewardScales, WeighedReward, weigh


@dataclass
class TaskConfig:
    """Settings every task has; tasks extend it with their own reward or reset parameters."""

    episode_length: int = 1000
    """Control steps before an episode is truncated."""
    action_scale: float | None = None
    """How far an action of 1 reaches (`q2real.hardware.action.action_mapping`): rad around the default
    pose for position-controlled robots, a fraction of the effort limit for torque-controlled ones;
    None: the whole range (the nearer position limit, the whole effort limit). The bundle carries the
    resulting per-joint scale, so shield and gate map actions as the task did."""
    command_every: int = 0
    """Control steps between fresh commands within an episode (0: one command per episode). As a
    joystick does, the command changes under a running policy; the step's reward is paid for the
    command it was taken under, and its observation shows the new one."""
    observe_last_action: bool = False
    """Append the policy's previous action (clipped to [-1, 1]; zeros at an episode's start, where the
    previous target is the default pose) to the observation, as the deploy node's `last_action` term
    does. The shield's rate limit is a window around the previous target: a policy that cannot see it
    cannot learn to stay inside it."""
    action_history: int = 0
    """Also observe the policy's actions of the `action_history` ticks before its previous one (newest
    first, zeros at an episode's start), as the deploy node's `action_history` term. With
    `observe_last_action`, which it needs, the policy then sees every action still in flight under up to
    `action_history + 1` ticks of action latency (`randomization.action_latency`), which it must know
    to act well under latency: an actuator chain moves on what was asked a few ticks ago."""
    action_rate: float | None = None
    """Actions as steps, for position-controlled robots: the target moves from the previous one by
    `action * action_rate` of the shield's rate window (velocity limit x control period), kept inside
    the shield's soft position window (`q2real.sim.action_steps`), so a policy never asks for a target
    the rate or soft-limit rule would cut. None: an action is the target itself, and a policy must
    learn to keep its output within one rate window of the last (on the Panda 0.044 of the action
    range per tick; the shield cut 99 % of its targets from scratch).
    Needs `observe_last_action`: the step is added to the previous action the policy sees, and the
    exported bundle adds it the same way, so the node, shield and gate receive targets as before."""
    critic_terms: bool = False
    """Append the task's `critic_terms` (true state the robot's sensors do not give, e.g. the base's
    velocity) after the policy's observation: the critics see them, the actor and the bundle do not
    (asymmetric actor-critic, as MuJoCo Playground's privileged state and FastTD3). A critic that cannot
    see what the reward reads learns its expectation over everything the observation leaves open."""
    critic_dynamics: bool = False
    """Append each env's robot as randomization drew it (`q2real.sim.randomization.draw_summary`: its
    action latency and the changes of its mass, friction, actuator gain and damping, and joint damping)
    after the policy's observation and any `critic_terms`, for the critics alone. The policy must act
    well on every robot of the ranges; a critic that knows which one it judges values each action for
    that robot instead of averaging over all of them (privileged dynamics, as in teacher-student and
    asymmetric actor-critic locomotion training)."""
    reward_scales: RewardScales = field(default_factory=RewardScales)
    """Per reward term, the scale it is summed with (`q2real.sim.reward.weigh`): reweight a term, or
    switch it off with 0, as `reward_scales.<term>: value`. Each task names its terms; training logs
    each one's scaled episode sum as `reward/<term>`."""


class Task(ABC):
    """Observation, reward, cost, termination and reset distribution of one task on one robot.

    Actions in [-1, 1] are mapped to joint commands from the robot spec and the task's `action_scale`
    (`command_offset + command_scale * action`): torque-controlled joints get a fraction of
    `action * effort_limit`, position-controlled joints a target around the default pose, at most
    `action_scale` rad and the nearer position limit away.
    """

    robot: str
    """Name of the spec in `hardware/` this task runs on."""
    Config: type[TaskConfig] = TaskConfig
    command_dim: int = 0
    """Size of the per-episode command (a target, a velocity) the policy is asked to follow; on a
    robot it arrives on the node's command input."""
    tracked_object: str | None = None
    """The body (with a free joint) whose pose a tracker reports on a robot (`object_pose`)."""
    native_only: bool = False
    """The robot's model needs MuJoCo features MJX lacks (e.g. the RK4 integrator): native backend only."""
    robot_reward: bool = False
    """Reward and termination read only what the deploy node streams: the actuated joints' positions
    and velocities, the command, the tracked object's position, sensors that forward kinematics gives
    (and the action), so a learner on the robot computes them (`q2real.sim.streamed`)."""

    @classmethod
    def scene(cls, mjspec: mujoco.MjSpec) -> None:
        """Add what the task needs around the robot (objects, sites, sensors) to its MJCF."""
        return None

    def __init__(self, spec: RobotSpec, model: mujoco.MjModel, config: TaskConfig, device: torch.device):
        self.spec = spec
        self.config = config
        self.device = device
        self.model = model
        joint_ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, n) for n in spec.joint_names]
        self.qpos_index = torch.tensor([model.jnt_qposadr[j] for j in joint_ids], device=device)
        self.qvel_index = torch.tensor([model.jnt_dofadr[j] for j in joint_ids], device=device)
        act_ids = [actuator_for_joint(model, j) for j in joint_ids]
        if act_ids != list(range(model.nu)):
            raise SpecError(f"{spec.source}: joints must list one actuated joint per actuator, in actuator order")
        gear = torch.tensor(model.actuator_gear[:, 0], dtype=torch.float32, device=device)
        limits = torch.tensor(spec.array("position_limits"), dtype=torch.float32, device=device)
        self.joint_low, self.joint_high = limits[:, 0], limits[:, 1]
        self.default_pose = torch.tensor(spec.array("default_position"), dtype=torch.float32, device=device)
        try:
            scale, offset = action_mapping(spec, config.action_scale)
        except SpecError as err:
            raise ConfigError(f"env.task_params.action_scale: {err}") from err
        self.command_scale = torch.tensor(scale, dtype=torch.float32, device=device)
        self.command_offset = torch.tensor(offset, dtype=torch.float32, device=device)
        # MuJoCo ctrl is the command divided by the actuator gear (1 for position actuators).
        self._gear = gear if spec.control_mode == "torque" else torch.ones_like(gear)
        self.action_steps = self._action_steps(spec, config, scale, offset)
        """How an action moves the target (`TaskConfig.action_rate`); None: actions are targets."""
        self.command = torch.zeros(0, self.command_dim, device=device)
        """The current command of every env (num_envs, command_dim); no rows before the first reset."""
        self.last_action = torch.zeros(0, self.action_dim, device=device)
        """The policy's previous action of every env (num_envs, action_dim), kept by the env."""
        if config.action_history < 0 or (config.action_history and not config.observe_last_action):
            raise ConfigError(
                "env.task_params.action_history: expected 0, or a number of ticks >= 1 with observe_last_action: "
                f"true (the history goes on from the previous action), got {config.action_history}"
            )
        self.action_history = torch.zeros(0, config.action_history * self.action_dim, device=device)
        """The actions before the previous one, newest first (num_envs, action_history * action_dim)."""

    def _action_steps(self, spec: RobotSpec, config: TaskConfig, scale, offset) -> ActionSteps | None:
        if config.action_rate is None:
            return None
        if not config.observe_last_action:
            raise ConfigError(f"{STEPS_KEY}: needs env.task_params.observe_last_action: true (the step adds to it)")
        margin = ShieldConfig().soft_limit_margin  # the clamps' in the loop, and a node's by default
        return ActionSteps.of(spec, config.action_rate, margin, scale, offset, self.device)

    def target_action(self, action: torch.Tensor) -> torch.Tensor:
        """The action that sets this tick's target: `action` itself, or with `action_rate` the previous
        one moved by its step."""
        return action if self.action_steps is None else self.action_steps.target(self.last_action, action)

    @property
    def push_body(self) -> int:
        """Body that randomized shoves act on: the link of the last actuated joint (an arm's wrist);
        floating-base tasks shove their base."""
        joint = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, self.spec.joint_names[-1])
        return int(self.model.jnt_bodyid[joint])

    @property
    def action_dim(self) -> int:
        return self.spec.num_joints

    def action_to_ctrl(self, action: torch.Tensor) -> torch.Tensor:
        """Map policy actions in [-1, 1] to MuJoCo `ctrl` through the robot spec."""
        return command_from_action(action, self.command_scale, self.command_offset) / self._gear

    def sample_command(self, num_envs: int, gen: torch.Generator) -> torch.Tensor:
        """Fresh commands (num_envs, command_dim) for new episodes; tasks with a command override it."""
        return torch.zeros(num_envs, 0, device=self.device)

    def resample_command(self, mask: torch.Tensor, gen: torch.Generator) -> None:
        """Give the envs where `mask` is true a new command (on every reset and every `command_every` steps)."""
        new = self.sample_command(mask.shape[0], gen)
        self.command = new if len(self.command) != len(new) else torch.where(mask[:, None], new, self.command)

    def advance(self, physics: PhysicsState, action: torch.Tensor) -> None:
        """Update per-env memory the reward reads (how long a foot has been in the air) with the state a
        step ended in and the action that reached the actuators; the env calls it once per step, before
        the reward. None by default."""
        del physics, action

    def reset_memory(self, mask: torch.Tensor, physics: PhysicsState) -> None:
        """Start that memory afresh for the envs where `mask` is true, just reset to `physics`."""
        del mask, physics

    def memory(self) -> dict[str, torch.Tensor]:
        """That memory, for checkpoints (`load_memory` takes it back)."""
        return {}

    def load_memory(self, memory: dict[str, torch.Tensor]) -> None:
        del memory

    @abstractmethod
    def initial_state(self, num_envs: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample (qpos, qvel) for `num_envs` fresh episodes."""

    @abstractmethod
    def observation_terms(self, physics: PhysicsState) -> dict[str, torch.Tensor]:
        """Named observation terms, each (num_envs, dim), concatenated in insertion order."""

    def critic_terms(self, physics: PhysicsState) -> dict[str, torch.Tensor]:
        """Named terms (num_envs, dim) that only the critics see (`TaskConfig.critic_terms`); none by default."""
        del physics
        return {}

    def observation_sources(self) -> dict[str, dict] | None:
        """Where each observation term comes from on a robot (see `q2real.deploy_ros.observation`), by
        term name; None for a task that cannot be deployed. Policy bundles carry it to the robot."""
        return None

    def figures(self) -> dict | None:
        """What the deploy node needs, beyond the observation, to show the operator how the task goes
        (`q2real.deploy_ros.figures`): a fall tilt, a point whose distance to the target counts, a
        success radius. Policy bundles carry it as `figures`; None: the observation's own figures only."""
        return None

    def site_point(self, site: str) -> dict:
        """A site of the robot as a `body_point`: its body and its offset there, moved by every joint."""
        index = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_SITE, site)
        body = mujoco.mj_id2name(self.model, mujoco.mjtObj.mjOBJ_BODY, int(self.model.site_bodyid[index]))
        offset = self.model.site_pos[index].tolist()
        return {"kind": "body_point", "joints": self.spec.joint_names, "body": body, "offset": offset}

    def site_kinematics(self, site: str) -> BodyPoint:
        """The site's world position from joint positions, the `site_point` the node computes."""
        point = self.site_point(site)
        return BodyPoint(self.model, point["body"], point["offset"], self.device)

    @abstractmethod
    def reward_terms(self, physics: PhysicsState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        """The reward's named terms (num_envs,) after a step taken with `action` (the action that reached
        the actuators), unscaled: `config.reward_scales` weighs them (`q2real.sim.reward`)."""

    @property
    def mean_reward(self) -> bool:
        """Whether the reward is the scales' weighted mean of the terms rather than their weighted sum."""
        return False

    def weighed_reward(self, physics: PhysicsState, action: torch.Tensor) -> WeighedReward:
        """The reward after a step taken with `action`, and each term's scaled part of it."""
        return weigh(self.reward_terms(physics, action), self.config.reward_scales, self.mean_reward)

    def reward(self, physics: PhysicsState, action: torch.Tensor) -> torch.Tensor:
        """Per-env reward after a step taken with `action` (the action that reached the actuators)."""
        return self.weighed_reward(physics, action).reward

    def cost(self, physics: PhysicsState, action: torch.Tensor) -> torch.Tensor:
        """Per-env safety cost (0 = safe); tasks with constraints override it."""
        return torch.zeros(physics.qpos.shape[0], device=self.device)

    @property
    def has_cost(self) -> bool:
        """Whether `cost` can be nonzero with this task's settings (a constrained learner needs it)."""
        return type(self).cost is not Task.cost

    def success(self, physics: PhysicsState) -> torch.Tensor | None:
        """Per env, whether the task is achieved in this state (training logs the episodes' success
        rate: an episode succeeded if it ever was); None for tasks without a success test."""
        return None

    def terminated(self, physics: PhysicsState) -> torch.Tensor:
        """True where the episode reached a terminal state."""
        return torch.zeros(physics.qpos.shape[0], dtype=torch.bool, device=self.device)

    def observed_terms(self, physics: PhysicsState) -> dict[str, torch.Tensor]:
        """The task's observation terms, then the previous actions where the config asks for them."""
        terms = dict(self.observation_terms(physics))
        if self.config.observe_last_action:
            terms["last_action"] = self.last_action
        if self.config.action_history:
            terms["action_history"] = self.action_history
        return terms

    def observed_sources(self) -> dict[str, dict] | None:
        """`observation_sources` for `observed_terms`."""
        sources = self.observation_sources()
        if sources is None:
            return sources
        sources = dict(sources)
        if self.config.observe_last_action:
            sources["last_action"] = {"kind": "last_action"}
        if self.config.action_history:
            sources["action_history"] = {"kind": "action_history"}
        return sources

    def observe(self, physics: PhysicsState) -> torch.Tensor:
        return torch.cat(list(self.observed_terms(physics).values()), dim=-1)

    def noisy_default_pose(self, gen: torch.Generator, num_envs: int, std: float) -> torch.Tensor:
        """The spec's default pose plus Gaussian noise of `std`, kept inside the joint limits."""
        noise = self._normal(gen, std, (num_envs, self.action_dim))
        return (self.default_pose + noise).clamp(self.joint_low, self.joint_high)

    def _uniform(
        self, gen: torch.Generator, low: float | torch.Tensor, high: float | torch.Tensor, shape: tuple[int, ...]
    ) -> torch.Tensor:
        return low + (high - low) * torch.rand(shape, generator=gen, device=self.device)

    def command_source(self, low: Sequence[float], high: Sequence[float]) -> dict:
        """The observation source of a command drawn uniformly in the box [low, high]: the bundle carries
        the box, and the node refuses a command outside what the policy was trained on."""
        return {"kind": "command", "ranges": [[float(lo), float(hi)] for lo, hi in zip(low, high, strict=True)]}

    def _uniform_box(self, gen: torch.Generator, low, high, num_envs: int) -> torch.Tensor:
        """Points uniform in the axis-aligned box [low, high] (sequences of equal length), one per env."""
        low, high = torch.tensor(low, device=self.device), torch.tensor(high, device=self.device)
        return self._uniform(gen, low, high, (num_envs, len(low)))

    def _normal(self, gen: torch.Generator, std: float, shape: tuple[int, ...]) -> torch.Tensor:
        return std * torch.randn(shape, generator=gen, device=self.device)


def tolerance(
    x: torch.Tensor, bounds: tuple[float, float], margin: float, value_at_margin: float = 0.1
) -> torch.Tensor:
    """1 inside `bounds`, a Gaussian fall-off to `value_at_margin` at `margin` outside (dm_control's shape)."""
    distance = x - x.clamp(*bounds)
    if margin == 0:
        return (distance == 0).float()
    scale = math.sqrt(-2 * math.log(value_at_margin)) / margin
    return torch.exp(-0.5 * (distance * scale) ** 2)
