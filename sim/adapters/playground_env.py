"""`playground:<name>`: a MuJoCo Playground MJX env as a q2real `VecEnv`.

Playground's own training wrapper auto-resets by overwriting the observation of an ended episode,
so the last observation is lost (its issue #305) and off-policy bootstrapping reads the next
episode. Here the raw env is vmapped and reset by q2real, keeping `next_obs` true.
"""

from __future__ import annotations

import torch

from q2real.configs.errors import MissingDependency
from q2real.configs.loader import ConfigError
from q2real.sim.config import EnvConfig, resolve_device
from q2real.sim.vec_env import StepResult, VecEnv


def _obs(state):
    obs = state.obs
    return obs["state"] if isinstance(obs, dict) else obs


class PlaygroundEnv(VecEnv):
    def __init__(self, name: str, config: EnvConfig):
        try:
            import jax
            import jax.numpy as jnp
            from mujoco_playground import registry
        except ImportError as err:
            message = f"env.task: 'playground:{name}' needs pip install 'q2real[playground]' ({err})"
            raise MissingDependency(message) from err
        if config.backend == "mujoco":
            raise ConfigError(f"env.backend: 'playground:{name}' runs on MJX; use backend=auto or mjx")
        if name not in registry.ALL_ENVS:
            raise ConfigError(
                f"env.task: 'playground:{name}' is not a Playground env; known: {sorted(registry.ALL_ENVS)}"
            )
        if name not in registry.dm_control_suite.ALL_ENVS:
            from mujoco_playground._src.mjx_env import MENAGERIE_PATH

            if not MENAGERIE_PATH.exists():
                raise MissingDependency(
                    f"env.task: 'playground:{name}' needs MuJoCo Menagerie at {MENAGERIE_PATH}, which Playground "
                    "would git-clone at run time; put a menagerie checkout there (or run once with network). "
                    "Playground's DM Control suite envs need no download: "
                    + ", ".join(registry.dm_control_suite.ALL_ENVS)
                )
        self._env = registry.load(name, config_overrides={"impl": "jax", **config.task_params})
        self.device = resolve_device(config.device)
        self.num_envs = n = config.num_envs
        self.episode_length = int(self._env._config.episode_length)  # pyright: ignore[reportArgumentType]
        self.action_dim = int(self._env.action_size)
        self.control_period = float(self._env.dt)
        self.action_scale = torch.ones(self.action_dim, device=self.device)
        self.action_offset = torch.zeros(self.action_dim, device=self.device)
        self._key = jax.random.PRNGKey(config.seed)
        env = self._env

        def reset_all(key):
            return jax.vmap(env.reset)(jax.random.split(key, n))

        def step_all(state, action, key, steps):
            state = jax.vmap(env.step)(state, action)
            terminated = state.done > 0.5
            truncated = (steps + 1 >= self.episode_length) & ~terminated
            done = terminated | truncated
            fresh = reset_all(key)
            next_obs, reward = _obs(state), state.reward
            keep = lambda new, old: jnp.where(done.reshape(-1, *[1] * (old.ndim - 1)), new, old)  # noqa: E731
            state = jax.tree.map(keep, fresh, state)
            return state, next_obs, _obs(state), reward, terminated, truncated, jnp.where(done, 0, steps + 1)

        self._reset_all = jax.jit(reset_all)
        self._step_all = jax.jit(step_all)
        self._jax, self._jnp = jax, jnp
        obs = _obs(self._reset_all(self._key))
        self.obs_dim = int(obs.shape[-1])
        self.obs_names, self.obs_dims = ("observation",), (self.obs_dim,)

    def _torch(self, array) -> torch.Tensor:
        return torch.from_dlpack(array).to(self.device)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self._key = self._jax.random.PRNGKey(seed)
        self._key, key = self._jax.random.split(self._key)
        self._state = self._reset_all(key)
        self._steps = self._jnp.zeros(self.num_envs, dtype=self._jnp.int32)
        return self._torch(_obs(self._state))

    def step(self, action: torch.Tensor) -> StepResult:
        action = self._jnp.from_dlpack(self.check_action(action).contiguous())
        self._key, key = self._jax.random.split(self._key)
        self._state, next_obs, obs, reward, terminated, truncated, self._steps = self._step_all(
            self._state, action, key, self._steps
        )
        return StepResult(
            obs=self._torch(obs),
            next_obs=self._torch(next_obs),
            reward=self._torch(reward),
            terminated=self._torch(terminated),
            truncated=self._torch(truncated),
            cost=torch.zeros(self.num_envs, device=self.device),
        )

    def close(self) -> None:
        self._state = None
