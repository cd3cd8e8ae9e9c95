"""Replay as storage x sampler (TorchRL's split): one device-resident ring per env, any sampler over it.

Storage is laid out (capacity_per_env, num_envs, ...) so a vectorized env step is one row write,
and an n-step window is `n` consecutive rows of one env. `next_obs` is stored explicitly, so the true
last observation of an episode (kept by the env across auto-reset) is what a truncated transition
bootstraps from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from q2real.sim.vec_env import StepResult


@dataclass
class Batch:
    """Transitions ready for a TD update; `reward` is the discounted n-step sum and `discount` is
    gamma^k for the k steps summed, or 0 when the window ended in a terminal state."""

    obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_obs: torch.Tensor
    discount: torch.Tensor
    row: torch.Tensor
    env: torch.Tensor
    cost: torch.Tensor
    """The safety cost summed over the same window as `reward`, discounted alike."""
    weight: torch.Tensor | None = None
    """Importance weights from a prioritized sampler; None for uniform sampling."""
    prefixes: Prefixes | None = None
    """For action chunks: the backup of every prefix of the chunk (multi-horizon critics)."""


@dataclass
class Prefixes:
    """Per sample and prefix length k = 1..h, the k-step backup of the chunk's first k actions:
    `reward` (B, h) the discounted sum, `discount` (B, h) gamma^k (0 after a terminal state) and
    `next_obs` (B, h, obs_dim) the state it bootstraps from. A prefix that reaches past an episode's end
    stops there, as the n-step windows do."""

    reward: torch.Tensor
    discount: torch.Tensor
    next_obs: torch.Tensor


class ReplayStorage:
    def __init__(self, capacity: int, num_envs: int, obs_dim: int, action_dim: int, device: torch.device):
        if capacity < num_envs:
            raise ValueError(f"replay capacity {capacity} is below num_envs {num_envs}: one vectorized step must fit")
        self.rows = capacity // num_envs
        self.num_envs = num_envs
        self.device = device
        shape = (self.rows, num_envs)
        self.data = {
            "obs": torch.zeros(*shape, obs_dim, device=device),
            "action": torch.zeros(*shape, action_dim, device=device),
            "reward": torch.zeros(shape, device=device),
            "cost": torch.zeros(shape, device=device),
            "next_obs": torch.zeros(*shape, obs_dim, device=device),
            "terminated": torch.zeros(shape, dtype=torch.bool, device=device),
            "truncated": torch.zeros(shape, dtype=torch.bool, device=device),
        }
        # Write position and fill level live in a tensor so that processes sharing the storage see them.
        self.cursor = torch.zeros(2, dtype=torch.long)

    @property
    def pos(self) -> int:
        return int(self.cursor[0])

    @property
    def size(self) -> int:
        return int(self.cursor[1])

    def share_memory_(self) -> ReplayStorage:
        """Put the storage in shared memory (CPU) so learner processes read what the collector writes."""
        for value in self.data.values():
            value.share_memory_()
        self.cursor.share_memory_()
        return self

    def __len__(self) -> int:
        return self.size * self.num_envs

    def add(self, obs: torch.Tensor, action: torch.Tensor, result: StepResult) -> None:
        row = self.pos
        self.data["obs"][row] = obs
        self.data["action"][row] = action
        self.data["reward"][row] = result.reward
        self.data["cost"][row] = result.cost
        self.data["next_obs"][row] = result.next_obs
        self.data["terminated"][row] = result.terminated
        self.data["truncated"][row] = result.truncated
        # Data first, cursor last: a concurrent reader never samples a row that is still being written.
        self.cursor[1] = min(self.size + 1, self.rows)
        self.cursor[0] = (row + 1) % self.rows

    def extend(self, obs: torch.Tensor, action: torch.Tensor, result: StepResult) -> None:
        """Write K consecutive rows at once (every tensor with a leading (K, num_envs)): loading a
        recorded stream, such as demonstrations, without a Python loop over its steps."""
        rows = (self.pos + torch.arange(len(obs))) % self.rows
        d = self.data
        d["obs"][rows], d["action"][rows], d["next_obs"][rows] = obs, action, result.next_obs
        d["reward"][rows], d["cost"][rows] = result.reward, result.cost
        d["terminated"][rows], d["truncated"][rows] = result.terminated, result.truncated
        self.cursor[1] = min(self.size + len(obs), self.rows)
        self.cursor[0] = (self.pos + len(obs)) % self.rows

    def gather(self, row: torch.Tensor, env: torch.Tensor, n_step: int, gamma: float, chunk: int) -> Batch:
        """n-step transitions starting at (row, env), cut at episode ends and at the newest row.

        With `chunk` > 1 (then `n_step == chunk`) the action is the window of the `chunk` actions taken
        from (row, env), flattened to (B, chunk * action_dim), and the batch carries every prefix's
        backup. Actions past the window's cut (an episode's end, or the newest row) repeat the last
        action taken: they never ran, so they change no reward the target sums."""
        d = self.data
        if n_step == 1:  # the common case without the window walk: a handful of index ops
            return Batch(
                obs=d["obs"][row, env],
                action=d["action"][row, env],
                reward=d["reward"][row, env],
                next_obs=d["next_obs"][row, env],
                discount=gamma * (~d["terminated"][row, env]).float(),
                row=row,
                env=env,
                cost=d["cost"][row, env],
            )
        pos, rows = self.pos, self.rows
        available = (pos - 1 - row) % rows + 1  # rows from `row` up to the newest, inclusive
        reward = torch.zeros(row.shape, device=self.device)
        cost = torch.zeros(row.shape, device=self.device)
        scale = torch.ones(row.shape, device=self.device)
        alive = torch.ones(row.shape, dtype=torch.bool, device=self.device)
        last, terminal = row.clone(), torch.zeros(row.shape, dtype=torch.bool, device=self.device)
        steps: list[tuple[torch.Tensor, ...]] = []
        for j in range(n_step):
            index = (row + j) % self.rows
            use = alive & (j < available)
            reward = reward + torch.where(use, scale * d["reward"][index, env], 0.0)
            cost = cost + torch.where(use, scale * d["cost"][index, env], 0.0)
            scale = torch.where(use, scale * gamma, scale)
            last = torch.where(use, index, last)
            ended = d["terminated"][index, env]
            terminal = torch.where(use, ended, terminal)
            alive = use & ~(ended | d["truncated"][index, env])
            if chunk > 1:
                steps.append((last, reward, scale * ~terminal))
        if chunk == 1:
            action = d["action"][row, env]
            prefixes = None
        else:
            taken = torch.stack([index for index, _, _ in steps], dim=1)  # (B, h): last row used so far
            action = d["action"][taken, env[:, None]].flatten(1)
            prefixes = Prefixes(
                reward=torch.stack([r for _, r, _ in steps], dim=1),
                discount=torch.stack([g for _, _, g in steps], dim=1),
                next_obs=d["next_obs"][taken, env[:, None]],
            )
        return Batch(
            obs=d["obs"][row, env],
            action=action,
            reward=reward,
            next_obs=d["next_obs"][last, env],
            discount=scale * (~terminal),
            row=row,
            env=env,
            cost=cost,
            prefixes=prefixes,
        )

    def state_dict(self) -> dict:
        """The rows in use only: writing starts at row 0 and wraps only once every row is filled, so
        they are the first `size`. Cloned, because saving a view would save the whole storage."""
        size = self.size
        data = {k: v[:size].clone() for k, v in self.data.items()}
        return {"data": data, "pos": self.pos, "size": size, "rows": self.rows}

    def empty_state(self) -> dict:
        """What `state_dict` gives for a replay of no rows: a checkpoint that keeps no replay."""
        data = {k: v[:0].clone() for k, v in self.data.items()}
        return {"data": data, "pos": 0, "size": 0, "rows": self.rows}

    def state_problem(self, state: dict) -> str | None:
        """Why `state` does not fit this replay (a field, its shape and this replay's), or None. A
        checkpoint holds its rows in use, so only the per-row shapes must match (checkpoints that
        saved every row load too)."""
        stored = state["data"]
        rows = state.get("rows", len(stored["obs"]) if "obs" in stored else self.rows)  # older: every row saved
        if rows != self.rows:
            return f"replay: the checkpoint's replay has {rows} rows per env, this run's {self.rows} (replay_capacity)"
        for key, tensor in self.data.items():
            if key not in stored:
                return f"replay.{key}: missing from the checkpoint"
            shape = tuple(stored[key].shape)
            if shape[1:] != tuple(tensor.shape[1:]) or not state["size"] <= shape[0] <= self.rows:
                return f"replay.{key}: checkpoint shape {shape} does not fit this replay's {tuple(tensor.shape)}"
        unknown = sorted(set(stored) - set(self.data))
        if unknown:
            return f"replay: the checkpoint has fields {unknown} this replay does not"
        if not (0 <= state["pos"] < self.rows and 0 <= state["size"] <= self.rows):
            return f"replay: position {state['pos']} and size {state['size']} outside its {self.rows} rows"
        return None

    def load_state_dict(self, state: dict) -> None:
        problem = self.state_problem(state)
        if problem is not None:
            raise ValueError(problem)
        for key, value in state["data"].items():
            self.data[key][: len(value)].copy_(value)
        self.cursor[0], self.cursor[1] = int(state["pos"]), int(state["size"])
