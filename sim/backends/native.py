"""Native MuJoCo backend: the whole batch is stepped by `mujoco.rollout` on C threads.

One `rollout` call advances every env by one control period on a persistent C++ thread pool with
the GIL released, so no Python code runs per env in the step path; the state lives in one
preallocated (num_envs, nstate) array that torch reads without copying on CPU.
"""

from __future__ import annotations

import copy
import os

import mujoco
import numpy as np
import torch
from mujoco import rollout

from q2real.sim.physics import PhysicsState

_FULL = mujoco.mjtState.mjSTATE_FULLPHYSICS
_CTRL = int(mujoco.mjtState.mjSTATE_CTRL)


def _state_slice(model: mujoco.MjModel, component: mujoco.mjtState) -> slice:
    """Where one component sits inside a FULLPHYSICS state vector (components are in bit order)."""
    offset = 0
    for bit in sorted(int(b) for b in mujoco.mjtState.__members__.values() if int(b) & (int(b) - 1) == 0):
        if bit == int(component):
            return slice(offset, offset + mujoco.mj_stateSize(model, bit))
        if bit & int(_FULL):
            offset += mujoco.mj_stateSize(model, bit)
    raise ValueError(f"{component} is not part of the full physics state")


class NativeBackend:
    """Steps `num_envs` copies of `model` with MuJoCo's C rollout, `substeps` physics steps per call."""

    def __init__(
        self,
        model: mujoco.MjModel,
        num_envs: int,
        substeps: int,
        device: torch.device,
        model_fields: dict[str, np.ndarray] | None = None,
        nthread: int | None = None,
    ):
        self.model = model
        self.num_envs = num_envs
        self.substeps = substeps
        self.device = device
        # rollout takes one model per env; they are copies only where randomization makes them differ.
        self._models = [copy.copy(model) for _ in range(num_envs)] if model_fields else [model] * num_envs
        if model_fields:
            self.set_model_fields(model_fields)
        nthread = min(os.cpu_count() or 1, num_envs) if nthread is None else nthread
        self._pool = rollout.Rollout(nthread=nthread if nthread > 1 else 0)
        self._datas = [mujoco.MjData(model) for _ in range(max(nthread, 1))]
        nstate = mujoco.mj_stateSize(model, _FULL)
        self._qpos = _state_slice(model, mujoco.mjtState.mjSTATE_QPOS)
        self._qvel = _state_slice(model, mujoco.mjtState.mjSTATE_QVEL)
        self._initial = np.empty(nstate)
        mujoco.mj_getState(model, self._datas[0], self._initial, _FULL)
        self._state = np.tile(self._initial, (num_envs, 1))
        self._ctrl = np.zeros((num_envs, substeps, model.nu))
        self._ctrl_xfrc: np.ndarray | None = None
        self._out_state = np.empty((num_envs, substeps, nstate))
        self._out_sensor = np.zeros((num_envs, substeps, model.nsensordata))
        self._sensor = np.zeros((num_envs, model.nsensordata))

    def _view(self) -> PhysicsState:
        def tensor(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(array).to(self.device, torch.float32)

        return PhysicsState(
            tensor(self._state[:, self._qpos]), tensor(self._state[:, self._qvel]), tensor(self._sensor)
        )

    def step(self, ctrl: torch.Tensor, xfrc: torch.Tensor | None = None) -> PhysicsState:
        nu = self.model.nu
        if xfrc is None:
            control, spec = self._ctrl, _CTRL
        else:
            # Controls then body wrenches, in the order of their bits in the state spec.
            if self._ctrl_xfrc is None:
                self._ctrl_xfrc = np.zeros((self.num_envs, self.substeps, nu + 6 * self.model.nbody))
            control, spec = self._ctrl_xfrc, _CTRL | int(mujoco.mjtState.mjSTATE_XFRC_APPLIED)
            control[:, :, nu:] = xfrc.detach().to("cpu", torch.float64).reshape(self.num_envs, 1, -1).numpy()
        control[:, :, :nu] = ctrl.detach().to("cpu", torch.float64).numpy()[:, None, :]
        self._pool.rollout(
            self._models,
            self._datas,
            self._state,
            control,
            control_spec=spec,
            nstep=self.substeps,
            state=self._out_state,
            sensordata=self._out_sensor,
            skip_checks=True,
        )
        self._state[:] = self._out_state[:, -1]
        self._sensor[:] = self._out_sensor[:, -1]
        return self._view()

    def set_state(self, mask: torch.Tensor, qpos: torch.Tensor, qvel: torch.Tensor) -> PhysicsState:
        rows = np.flatnonzero(mask.cpu().numpy())
        self._state[rows] = self._initial
        self._state[rows, self._qpos] = qpos.detach().cpu().double().numpy()[rows]
        self._state[rows, self._qvel] = qvel.detach().cpu().double().numpy()[rows]
        if self.model.nsensordata:
            # Sensors are only computed by a physics step; recompute them for the envs just reset
            # (a few per step at most once episodes desynchronize) so their first observation is right.
            data = self._datas[0]
            for row in rows:
                mujoco.mj_setState(self._models[row], data, self._state[row], _FULL)
                mujoco.mj_forward(self._models[row], data)
                self._sensor[row] = data.sensordata
        return self._view()

    def set_model_fields(self, model_fields: dict[str, np.ndarray]) -> None:
        for name, values in model_fields.items():
            for env_model, value in zip(self._models, values, strict=True):
                getattr(env_model, name)[:] = value

    def full_state(self) -> dict[str, torch.Tensor]:
        """Exact (float64) physics state of every env, for checkpoints."""
        return {"state": torch.from_numpy(self._state.copy()), "sensor": torch.from_numpy(self._sensor.copy())}

    def load_full_state(self, state: dict[str, torch.Tensor]) -> PhysicsState:
        self._state[:] = state["state"].numpy()
        self._sensor[:] = state["sensor"].numpy()
        return self._view()

    def close(self) -> None:
        self._pool.close()
