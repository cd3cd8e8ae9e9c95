"""MJX backend: the batch is one `jit(vmap(step))` XLA program; tensors cross to torch by DLPack.

The default on GPUs. It also runs on CPU for tests, but there it is 2-30x slower than the native
backend and XLA on CPU has been seen to hang for good at batch >= 1024, so CPU users get native.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import torch
from mujoco import mjx

from q2real.sim.physics import PhysicsState


def _to_torch(array: jax.Array, device: torch.device) -> torch.Tensor:
    return torch.from_dlpack(array).to(device)


def _to_jax(tensor: torch.Tensor) -> jax.Array:
    return jnp.from_dlpack(tensor.detach().to(torch.float32).contiguous())


def _step_one(substeps: int, m: mjx.Model, d: mjx.Data, ctrl: jax.Array, xfrc: jax.Array) -> mjx.Data:
    d = d.replace(ctrl=ctrl, xfrc_applied=xfrc)
    return jax.lax.fori_loop(0, substeps, lambda _, d: mjx.step(m, d), d)


def _reset_one(m: mjx.Model, d: mjx.Data, fresh: mjx.Data, reset: jax.Array, qpos, qvel) -> mjx.Data:
    fresh = mjx.forward(m, fresh.replace(qpos=qpos, qvel=qvel))
    return jax.tree.map(lambda new, old: jnp.where(reset, new, old), fresh, d)


_PROGRAMS: dict = {}


def _programs(substeps: int, axes: mjx.Model):
    """Jitted batched step and reset, shared by every backend with the same substeps and batched fields,
    so a second env of the same robot (an evaluation env, a test's twin) reuses XLA's compiled code."""
    key = (substeps, jax.tree.structure(axes))  # None is an empty subtree, so the structure names the batched fields
    if key not in _PROGRAMS:
        step = jax.vmap(functools.partial(_step_one, substeps), in_axes=(axes, 0, 0, 0))
        reset = jax.vmap(_reset_one, in_axes=(axes, 0, 0, 0, 0, 0))
        _PROGRAMS[key] = (jax.jit(step), jax.jit(reset))
    return _PROGRAMS[key]


class MjxBackend:
    """Steps `num_envs` copies of `model` in MJX, `substeps` physics steps per call."""

    def __init__(
        self,
        model: mujoco.MjModel,
        num_envs: int,
        substeps: int,
        device: torch.device,
        model_fields: dict[str, np.ndarray] | None = None,
    ):
        self.model = model
        self.num_envs = num_envs
        self.device = device
        mx = mjx.put_model(model, impl="jax")
        axes = jax.tree.map(lambda _: None, mx)
        self._mx = mx
        if model_fields:
            self.set_model_fields(model_fields)
            axes = axes.tree_replace({k: 0 for k in model_fields})
        initial = mjx.make_data(mjx.put_model(model, impl="jax"))
        self._initial = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_envs, *x.shape)), initial)
        self._step, self._reset = _programs(substeps, axes)
        self._no_push = jnp.zeros((num_envs, model.nbody, 6), jnp.float32)
        self._data = self._initial

    def _view(self) -> PhysicsState:
        d = self._data
        assert d is not None, "the backend was closed"
        return PhysicsState(
            _to_torch(d.qpos, self.device), _to_torch(d.qvel, self.device), _to_torch(d.sensordata, self.device)
        )

    def step(self, ctrl: torch.Tensor, xfrc: torch.Tensor | None = None) -> PhysicsState:
        wrench = self._no_push if xfrc is None else _to_jax(xfrc)
        self._data = self._step(self._mx, self._data, _to_jax(ctrl), wrench)
        return self._view()

    def set_state(self, mask: torch.Tensor, qpos: torch.Tensor, qvel: torch.Tensor) -> PhysicsState:
        self._data = self._reset(
            self._mx, self._data, self._initial, _to_jax(mask.to(torch.float32)) > 0.5, _to_jax(qpos), _to_jax(qvel)
        )
        return self._view()

    def set_model_fields(self, model_fields: dict[str, np.ndarray]) -> None:
        """New values of the fields batched at construction: same shapes, so the compiled step is reused."""
        mx = self._mx
        self._mx = mx.tree_replace({k: jnp.asarray(v, dtype=getattr(mx, k).dtype) for k, v in model_fields.items()})

    def full_state(self) -> dict[str, torch.Tensor]:
        """Every leaf of the batched mjx.Data, for checkpoints."""
        leaves = jax.tree.leaves(self._data)
        return {f"leaf_{i}": torch.from_dlpack(leaf).cpu().clone() for i, leaf in enumerate(leaves)}

    def load_full_state(self, state: dict[str, torch.Tensor]) -> PhysicsState:
        treedef = jax.tree.structure(self._data)
        leaves = [jnp.asarray(state[f"leaf_{i}"].numpy()) for i in range(treedef.num_leaves)]
        self._data = jax.tree.unflatten(treedef, leaves)
        return self._view()

    def close(self) -> None:
        self._data = None
