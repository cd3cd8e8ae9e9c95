"""`TaskEnv`: a q2real task on a physics backend, with auto-reset, time limits and randomization."""

from __future__ import annotations

import torch

from q2real.configs.errors import MissingDependency
from q2real.configs.loader import ConfigError, merge
from q2real.hardware import robot_spec
from q2real.hardware.action import action_from_command
from q2real.hardware.model import load_model, substeps
from q2real.safety.shield import ShieldConfig
from q2real.sim.config import EnvConfig, resolve_backend, resolve_device
from q2real.sim.physics import PhysicsBackend
from q2real.sim.randomization import draw_summary, sample_model_fields
from q2real.sim.reward import check_scales
from q2real.sim.shield_clamps import ShieldClamps
from q2real.sim.task import Task
from q2real.sim.vec_env import StepResult, VecEnv

EXACT_SOURCES = frozenset({"command", "velocity_command", "last_action", "action_history"})
"""Observation sources that reach the node as numbers (an operator's command, its own last output), not
from a sensor: sensor noise and bias never touch them."""


def make_backend(name: str, model, num_envs: int, substeps: int, device: torch.device, model_fields) -> PhysicsBackend:
    if name == "mujoco":
        from q2real.sim.backends.native import NativeBackend

        return NativeBackend(model, num_envs, substeps, device, model_fields)
    if name == "mjx":
        try:
            from q2real.sim.backends.mjx import MjxBackend
        except ImportError as err:
            raise MissingDependency(f"env.backend: 'mjx' needs JAX and MJX: pip install 'q2real[mjx]' ({err})") from err
        return MjxBackend(model, num_envs, substeps, device, model_fields)
    raise ConfigError(f"env.backend: expected 'auto', 'mujoco' or 'mjx', got {name!r}")


class TaskEnv(VecEnv):
    """Batched env over a `Task`; every per-env operation is a tensor op, none a Python loop."""

    def __init__(self, task_cls: type[Task], config: EnvConfig):
        if config.num_envs < 1:
            raise ConfigError(f"env.num_envs: expected >= 1, got {config.num_envs}")
        try:
            config.randomization.validate("env.randomization")
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if not 0 <= config.shield_penalty < float("inf"):
            raise ConfigError(f"env.shield_penalty: expected a finite weight >= 0, got {config.shield_penalty}")
        if config.shield_penalty > 0 and config.shield_in_loop is False:
            raise ConfigError("env.shield_penalty: penalizes the clamps' changes, so it needs env.shield_in_loop")
        self.config = config
        self.device = resolve_device(config.device)
        if task_cls.native_only and config.backend == "mjx":
            raise ConfigError(f"env.backend: {task_cls.robot}'s model runs on MuJoCo's native backend only, not mjx")
        self.backend_name = "mujoco" if task_cls.native_only else resolve_backend(config.backend)
        self.num_envs = n = config.num_envs
        spec = robot_spec(task_cls.robot)
        model = load_model(spec, task_cls.scene)
        task_config = merge(task_cls.Config(), config.task_params, "env", prefix="task_params.")
        if task_config.episode_length < 1:
            raise ConfigError(
                f"env.task_params.episode_length: expected >= 1 control step, got {task_config.episode_length}"
            )
        if task_config.command_every < 0:
            raise ConfigError(
                f"env.task_params.command_every: expected >= 0 control steps (0: one command per episode), "
                f"got {task_config.command_every}"
            )
        self.task = task_cls(spec, model, task_config, self.device)
        self.spec = spec
        self.has_cost = self.task.has_cost
        self.episode_length = task_config.episode_length
        self._command_every = task_config.command_every if self.task.command_dim else 0

        dr = config.randomization
        dr_gen = torch.Generator().manual_seed(config.seed)
        fields = sample_model_fields(model, dr, n, dr_gen, self.task.push_body) if dr.randomizes_physics else None
        self.backend = make_backend(self.backend_name, model, n, substeps(spec, model), self.device, fields)
        self._model = model
        self._full_bias = (dr.obs_bias * (2 * torch.rand(n, 1, generator=dr_gen) - 1)).to(self.device)
        self._obs_bias = self._full_bias
        lo, hi = dr.action_latency
        self._full_latency = torch.randint(lo, hi + 1, (n,), generator=dr_gen).to(self.device)
        self._latency = self._full_latency
        self.randomization_strength = 1.0
        """How far every env's robot and effects are from nominal, as a share of its draw (see
        `set_randomization_strength`)."""
        self.action_dim = self.task.action_dim
        self.action_scale, self.action_offset = self.task.command_scale, self.task.command_offset
        self.action_steps = self.task.action_steps
        self.control_period = spec.control_period
        self._action_queue = torch.zeros(n, hi + 1, self.action_dim, device=self.device)
        self._clamps = None
        # Unset: on for a task that deploys behind the shield; a benchmark task without observation
        # sources never meets one.
        in_loop = config.shield_in_loop
        if in_loop is True or (in_loop is None and self.task.observation_sources() is not None):
            scale, offset = self.action_scale, self.action_offset
            self._clamps = ShieldClamps(spec, ShieldConfig(), scale, offset, n, self.device)
        self.shield_in_loop = self._clamps is not None
        self._steps = torch.zeros(n, dtype=torch.long, device=self.device)
        self._rows = torch.arange(n, device=self.device)
        self.reset_every_step = self.device.type != "cpu"
        """Run the masked auto-reset on every step instead of only when an episode ended: on a GPU,
        asking whether any did would wait for the device; on the CPU the question is free and
        skipping idle resets saves their work (the two draw initial states from the RNG differently)."""
        self._gen = torch.Generator(device=self.device)
        self._gen.manual_seed(config.seed)
        self._pushes = dr.push_force[1] > 0
        self._since_push = torch.zeros(n, dtype=torch.long, device=self.device)
        self._push_gap = torch.randint(dr.push_interval[0], dr.push_interval[1] + 1, (n,), generator=dr_gen)
        self._push_gap = self._push_gap.to(self.device)
        self._xfrc = torch.zeros(n, model.nbody, 6, device=self.device)

        self.task.last_action = torch.zeros(n, self.action_dim, device=self.device)
        self.task.action_history = torch.zeros(n, self.task.action_history.shape[1], device=self.device)
        self.physics = self.backend.set_state(*self._initial(torch.ones(n, dtype=torch.bool)))
        """The true physical state after the last reset or step (after auto-resets), for tools that act
        like a robot's drivers (the transfer gate's shields read joint states from it)."""
        self.task.reset_memory(torch.ones(n, dtype=torch.bool, device=self.device), self.physics)
        terms = self.task.observed_terms(self.physics)
        self.obs_names = tuple(terms)
        self.obs_dims = tuple(t.shape[-1] for t in terms.values())
        critic = self.task.critic_terms(self.physics) if task_config.critic_terms else {}
        if task_config.critic_terms and not critic:
            raise ConfigError(f"env.task_params.critic_terms: task {config.task!r} has no critic-only terms")
        self._critic_terms = task_config.critic_terms
        self._draw: torch.Tensor | None = None
        if task_config.critic_dynamics:
            critic["dynamics"] = self._draw = draw_summary(model, fields, self._latency)
        self.critic_names = tuple(critic)
        self.critic_dims = tuple(t.shape[-1] for t in critic.values())
        self.critic_dim = sum(self.critic_dims)
        self.obs_dim = sum(self.obs_dims) + self.critic_dim
        sources = self.task.observed_sources()
        self.obs_sources = tuple(sources[name] for name in self.obs_names) if sources is not None else None
        self.figures = self.task.figures()
        terms = self.task.weighed_reward(self.physics, torch.zeros(n, self.action_dim, device=self.device)).shares
        check_scales(task_config.reward_scales, tuple(terms), self.task.mean_reward)
        penalized = self._clamps is not None and config.shield_penalty > 0
        self.reward_terms = (*terms, "shield_penalty") if penalized else tuple(terms)
        """The task's reward terms, then the shield's penalty where `env.shield_penalty` charges one."""
        # A task without robot sources names its terms only: of those, the previous action is known exactly.
        kinds = self.obs_names if self.obs_sources is None else tuple(source["kind"] for source in self.obs_sources)
        exact = [
            self.term_columns(name) for name, kind in zip(self.obs_names, kinds, strict=True) if kind in EXACT_SOURCES
        ]
        self._sensed: torch.Tensor | None = None
        """1 on the policy's columns that sensors give, 0 on those the node knows exactly (None: all are
        sensed)."""
        if exact:
            self._sensed = torch.ones(sum(self.obs_dims), device=self.device)
            for columns in exact:
                self._sensed[columns] = 0.0

    def _initial(self, mask: torch.Tensor):
        mask = mask.to(self.device)
        self.task.resample_command(mask, self._gen)
        qpos, qvel = self.task.initial_state(self.num_envs, self._gen)
        return mask, qpos, qvel

    @property
    def policy_obs_dim(self) -> int:
        return self.obs_dim - self.critic_dim

    def _observe(self, physics, policy_obs: torch.Tensor | None = None) -> torch.Tensor:
        """The policy's observation with its noise, then the critic-only terms, exact."""
        obs = self._noisy(self.task.observe(physics) if policy_obs is None else policy_obs)
        if not self.critic_dim:
            return obs
        terms = [*self.task.critic_terms(physics).values()] if self._critic_terms else []
        return torch.cat([obs, *terms, *([self._draw] if self._draw is not None else [])], dim=-1)

    def _noisy(self, obs: torch.Tensor) -> torch.Tensor:
        """Sensor noise and bias on every column that a sensor gives; none on the command and the previous
        action, which reach the node as numbers (a step policy adds its step to its previous action: noise
        there would random-walk its target)."""
        dr = self.config.randomization
        noise = self._obs_bias  # zeros without obs_bias
        if dr.obs_noise_std > 0:
            std = dr.obs_noise_std * self.randomization_strength
            noise = noise + std * torch.randn(obs.shape, generator=self._gen, device=self.device)
        elif dr.obs_bias == 0:
            return obs
        return obs + (noise if self._sensed is None else noise * self._sensed)

    def _push(self) -> torch.Tensor:
        """Body wrenches for this tick: a horizontal shove of random heading and size on the envs due one."""
        dr, n = self.config.randomization, self.num_envs
        # Drawn for every env every tick, so the random stream does not depend on which envs are due.
        heading = 2 * torch.pi * torch.rand(n, generator=self._gen, device=self.device)
        lo, hi = dr.push_force
        size = (lo + (hi - lo) * torch.rand(n, generator=self._gen, device=self.device)) * self.randomization_strength
        gap = torch.randint(dr.push_interval[0], dr.push_interval[1] + 1, (n,), generator=self._gen, device=self.device)
        self._since_push += 1
        due = self._since_push >= self._push_gap
        force = torch.stack([size * torch.cos(heading), size * torch.sin(heading), torch.zeros_like(size)], dim=-1)
        self._xfrc[:, self.task.push_body, :3] = torch.where(due[:, None], force, 0.0)
        self._since_push[due] = 0
        self._push_gap = torch.where(due, gap, self._push_gap)
        return self._xfrc

    def set_randomization_strength(self, strength: float) -> None:
        """Move every env's randomized robot and effects to `strength` of their drawn distance from nominal
        (0: the nominal robot, 1: the full draw): model fields, sensor noise and bias, push sizes, and action
        latency (rounded to ticks). The draws stay those of `env.seed`, so a curriculum grows each env's
        own robot; random streams and episode state are untouched."""
        if not 0.0 <= strength <= 1.0:
            raise ValueError(f"randomization strength: expected 0 <= strength <= 1, got {strength}")
        dr = self.config.randomization
        fields = None
        if dr.randomizes_physics:
            gen = torch.Generator().manual_seed(self.config.seed)  # the draws of __init__, in its order
            fields = sample_model_fields(self._model, dr, self.num_envs, gen, self.task.push_body, strength)
            self.backend.set_model_fields(fields)
        self._obs_bias = self._full_bias * strength
        self._latency = torch.floor(self._full_latency * strength + 0.5).long()
        if self._draw is not None:
            self._draw = draw_summary(self._model, fields, self._latency)
        self.randomization_strength = strength

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self._gen.manual_seed(seed)
        self.physics = physics = self.backend.set_state(*self._initial(torch.ones(self.num_envs, dtype=torch.bool)))
        self.task.reset_memory(torch.ones(self.num_envs, dtype=torch.bool, device=self.device), physics)
        self._steps.zero_()
        self._since_push.zero_()
        # Drawn afresh, so a seeded reset starts the same shoves whatever the env did before.
        lo, hi = self.config.randomization.push_interval
        self._push_gap = torch.randint(lo, hi + 1, (self.num_envs,), generator=self._gen, device=self.device)
        self._action_queue.zero_()
        self.task.last_action.zero_()
        self.task.action_history.zero_()
        if self._clamps is not None:
            self._clamps.reset(torch.ones(self.num_envs, dtype=torch.bool, device=self.device))
        return self._observe(physics)

    def rest_at_default_pose(self) -> torch.Tensor:
        """Every env's robot joints at the default pose and everything at rest, the rest of the reset state
        kept (a floating base's pose, an object, the command): where a robot's start ramp hands over to
        the policy. Returns the observation."""
        qpos = self.physics.qpos.clone()
        qpos[:, self.task.qpos_index] = torch.as_tensor(
            self.task.spec.array("default_position"), dtype=qpos.dtype, device=qpos.device
        )
        everyone = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        self.physics = self.backend.set_state(everyone, qpos, torch.zeros_like(self.physics.qvel))
        self.task.reset_memory(everyone, self.physics)
        return self._observe(self.physics)

    def step(self, action: torch.Tensor) -> StepResult:
        applied = self.task.target_action(self.check_action(action))
        if self.task.action_history.shape[1]:
            history = torch.cat([self.task.last_action, self.task.action_history], dim=-1)
            self.task.action_history = history[:, : self.task.action_history.shape[1]]
        self.task.last_action = applied  # what the policy asked for (clipped), as the node keeps it
        if self._action_queue.shape[1] > 1:
            self._action_queue = torch.roll(self._action_queue, 1, dims=1)
            self._action_queue[:, 0] = applied
            applied = self._action_queue[self._rows, self._latency]
        info: dict[str, torch.Tensor] = {}
        penalty = None
        if self._clamps is not None:
            # What the robot's shield would send for this action in this state, back in action units:
            # the actuators, the reward and the cost all see the clamped action.
            task, before = self.task, self.physics
            q, qd = before.qpos[:, task.qpos_index], before.qvel[:, task.qvel_index]
            command, info["shield_rules"], changed = self._clamps(applied, q, qd)
            wanted, applied = applied, action_from_command(command, self.action_scale, self.action_offset)
            if self.config.shield_penalty > 0:
                penalty = self.config.shield_penalty * torch.where(changed, (wanted - applied).abs(), 0.0).mean(-1)
        physics = self.backend.step(self.task.action_to_ctrl(applied), self._push() if self._pushes else None)
        self.task.advance(physics, applied)
        reward, shares = self.task.weighed_reward(physics, applied)
        self._steps += 1
        if self._command_every:
            self.task.resample_command(self._steps % self._command_every == 0, self._gen)
        true_obs = self.task.observe(physics)
        diverged = ~torch.isfinite(true_obs).all(dim=-1)
        terminated = self.task.terminated(physics) | diverged
        truncated = (self._steps >= self.episode_length) & ~terminated
        next_obs = self._observe(physics, true_obs)
        if penalty is not None:
            reward = reward - penalty
            shares = shares | {"shield_penalty": -penalty}
        info["reward_terms"] = torch.stack(list(shares.values()), dim=-1)
        success = self.task.success(physics)
        if success is not None:
            info["success"] = success
        result = StepResult(
            obs=next_obs,
            next_obs=next_obs,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            cost=self.task.cost(physics, applied),
            info={"physics_diverged": diverged, **info},
        )
        done = result.done
        if self.reset_every_step or done.any():
            physics = self.backend.set_state(*self._initial(done))
            self.task.reset_memory(done, physics)
            self._steps[done] = 0
            self._action_queue[done] = 0.0
            self.task.last_action = torch.where(done[:, None], 0.0, self.task.last_action)
            self.task.action_history = torch.where(done[:, None], 0.0, self.task.action_history)
            if self._clamps is not None:
                self._clamps.reset(done)
            result.obs = torch.where(done[:, None], self._observe(physics), next_obs)
        self.physics = physics
        return result

    def state_dict(self) -> dict:
        return {
            "physics": self.backend.full_state(),
            "steps": self._steps.cpu(),
            "action_queue": self._action_queue.cpu(),
            "generator": self._gen.get_state(),
            "command": self.task.command.cpu(),
            "last_action": self.task.last_action.cpu(),
            "action_history": self.task.action_history.cpu(),
            "pushes": torch.stack([self._since_push, self._push_gap]).cpu(),
            "task_memory": {k: v.cpu() for k, v in self.task.memory().items()},
        } | ({"shield_previous": self._clamps.previous.cpu()} if self._clamps is not None else {})

    def load_state_dict(self, state: dict) -> None:
        self.physics = self.backend.load_full_state(state["physics"])  # the shield's clamps read it next step
        self._steps.copy_(state["steps"])
        self._action_queue.copy_(state["action_queue"])
        self._gen.set_state(state["generator"])
        self.task.command = state["command"].to(self.device)
        self.task.last_action = state["last_action"].to(self.device)
        # A checkpoint from before the term existed holds none: the history starts empty.
        history = state.get("action_history", torch.zeros_like(self.task.action_history))
        self.task.action_history = history.to(self.device)
        if "task_memory" in state:
            self.task.load_memory({k: v.to(self.device) for k, v in state["task_memory"].items()})
        else:  # a checkpoint from before tasks kept memory: start it from the restored state
            self.task.reset_memory(torch.ones(self.num_envs, dtype=torch.bool, device=self.device), self.physics)
        self._since_push.copy_(state["pushes"][0])
        self._push_gap.copy_(state["pushes"][1])
        if self._clamps is not None:
            self._clamps.previous = state["shield_previous"].to(self.device)

    def close(self) -> None:
        self.backend.close()
