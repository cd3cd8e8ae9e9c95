"""`gymnasium:<id>`: any gymnasium env with Box spaces, as a q2real `VecEnv`.

Uses gymnasium's same-step auto-reset, which keeps the last observation of an ended episode in
`info["final_obs"]`, so `next_obs` is the true successor as it is for q2real's own tasks.
"""

from __future__ import annotations

import numpy as np
import torch

from q2real.configs.errors import MissingDependency
from q2real.configs.loader import ConfigError
from q2real.sim.config import EnvConfig, resolve_device
from q2real.sim.vec_env import StepResult, VecEnv


class GymnasiumEnv(VecEnv):
    def __init__(self, env_id: str, config: EnvConfig):
        try:
            import gymnasium as gym
        except ImportError as err:
            message = f"env.task: 'gymnasium:{env_id}' needs gymnasium: pip install 'q2real[gym]'"
            raise MissingDependency(message) from err
        if config.backend == "mjx":
            raise ConfigError(f"env.backend: 'gymnasium:{env_id}' steps its own simulator; use backend=auto or mujoco")
        self.device = resolve_device(config.device)
        self.num_envs = config.num_envs
        try:
            self._env = gym.make_vec(
                env_id,
                num_envs=config.num_envs,
                vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                **config.task_params,
            )
        except gym.error.Error as err:
            raise ConfigError(f"env.task: 'gymnasium:{env_id}': {err}") from err
        obs_space, act_space = self._env.single_observation_space, self._env.single_action_space
        for role, space in (("observation", obs_space), ("action", act_space)):
            if not isinstance(space, gym.spaces.Box):
                raise ConfigError(f"env.task: 'gymnasium:{env_id}': q2real needs a Box {role} space, got {space}")
        assert isinstance(obs_space, gym.spaces.Box) and isinstance(act_space, gym.spaces.Box)  # checked just above
        if not np.all(np.isfinite(act_space.low)) or not np.all(np.isfinite(act_space.high)):
            raise ConfigError(f"env.task: 'gymnasium:{env_id}': action space must be bounded, got {act_space}")
        self._low = act_space.low.astype(np.float64)
        self._half_range = (act_space.high.astype(np.float64) - self._low) / 2
        self.action_scale = torch.as_tensor(self._half_range.ravel(), dtype=torch.float32, device=self.device)
        offset = (self._low + self._half_range).ravel()
        self.action_offset = torch.as_tensor(offset, dtype=torch.float32, device=self.device)
        envs = getattr(self._env, "envs", None)
        dt = getattr(envs[0].unwrapped, "dt", None) if envs else None
        self.control_period = float(dt) if dt else None
        self.obs_dim = int(np.prod(obs_space.shape))
        self.action_dim = int(np.prod(act_space.shape))
        self.obs_names, self.obs_dims = ("observation",), (self.obs_dim,)
        self._seed = config.seed

    def _tensor(self, array: np.ndarray, dtype=torch.float32) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array), dtype=dtype).reshape(self.num_envs, -1).to(self.device)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        obs, _ = self._env.reset(seed=self._seed if seed is None else seed)
        return self._tensor(obs)

    def step(self, action: torch.Tensor) -> StepResult:
        unit = self.check_action(action).cpu().double().numpy()
        env_action = (self._low + (unit + 1) * self._half_range).reshape(self._env.action_space.shape)
        obs, reward, terminated, truncated, info = self._env.step(env_action)
        next_obs = np.array(obs, dtype=np.float32).reshape(self.num_envs, -1)
        if "_final_obs" in info:
            ended = np.flatnonzero(info["_final_obs"])
            next_obs[ended] = np.stack([np.ravel(info["final_obs"][i]) for i in ended])
        return StepResult(
            obs=self._tensor(obs),
            next_obs=self._tensor(next_obs),
            reward=self._tensor(reward).squeeze(-1),
            terminated=self._tensor(terminated, torch.bool).squeeze(-1),
            truncated=self._tensor(truncated, torch.bool).squeeze(-1),
            cost=torch.zeros(self.num_envs, device=self.device),
        )

    def close(self) -> None:
        self._env.close()
