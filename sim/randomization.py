"""Per-env domain randomization, sampled once per env from a seed and shared by both backends.

Physical parameters are sampled here, as plain per-env arrays of model fields, and each backend
only installs them (per-env `MjModel` copies natively, a batched `mjx.Model` on MJX), so the same
seed gives the same randomized robots on either backend. Observation noise and action latency act
on torch tensors in the env and need no backend support.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np
import torch


@dataclass
class RandomizationConfig:
    """Ranges are (low, high); the defaults randomize nothing."""

    mass_scale: tuple[float, float] = (1.0, 1.0)
    """Multiplier on each body's mass and inertia."""
    friction_scale: tuple[float, float] = (1.0, 1.0)
    """Multiplier on each geom's sliding friction."""
    damping_scale: tuple[float, float] = (1.0, 1.0)
    """Multiplier on each joint DoF's damping."""
    actuator_gain_scale: tuple[float, float] = (1.0, 1.0)
    """Multiplier on each actuator's gain (and position-actuator stiffness)."""
    kp_scale: tuple[float, float] = (1.0, 1.0)
    """Multiplier on the stiffness of each position (PD) actuator."""
    kd_scale: tuple[float, float] = (1.0, 1.0)
    """Multiplier on the damping of each position (PD) actuator."""
    com_offset: float = 0.0
    """Shift (m) of each body's centre of mass, uniform in [-com_offset, com_offset] per axis."""
    armature: tuple[float, float] = (0.0, 0.0)
    """Reflected rotor inertia (kg m^2 or kg) added to each joint DoF's armature."""
    obs_noise_std: float = 0.0
    """Std of Gaussian noise added to every observation entry, fresh each step."""
    obs_bias: float = 0.0
    """Per-env constant offset on every observation entry, uniform in [-obs_bias, obs_bias]."""
    action_latency: tuple[int, int] = (0, 0)
    """Per-env delay, in control ticks, between choosing an action and it reaching the actuators."""
    push_force: tuple[float, float] = (0.0, 0.0)
    """Magnitude (N) of horizontal shoves on the task's push body, each held for one control tick."""
    push_interval: tuple[int, int] = (50, 150)
    """Control ticks between two shoves of one env, drawn afresh after each."""
    payload: tuple[float, float] = (0.0, 0.0)
    """Mass (kg) added at the centre of mass of the last joint's link (an arm's flange, the task's push
    body), carried by the actuators: gravity compensation keeps covering only the link's own mass."""

    def validate(self, where: str = "randomization") -> None:
        for name in ("mass_scale", "friction_scale", "damping_scale", "actuator_gain_scale", "kp_scale", "kd_scale"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ValueError(f"{where}.{name}: expected 0 < low <= high, got ({lo}, {hi})")
        if self.obs_noise_std < 0 or self.obs_bias < 0:
            raise ValueError(f"{where}: obs_noise_std and obs_bias must be >= 0")
        if self.com_offset < 0:
            raise ValueError(f"{where}.com_offset: expected >= 0 m, got {self.com_offset}")
        lo, hi = self.armature
        if not 0 <= lo <= hi:
            raise ValueError(f"{where}.armature: expected 0 <= low <= high, got ({lo}, {hi})")
        lo, hi = self.action_latency
        if not 0 <= lo <= hi:
            raise ValueError(f"{where}.action_latency: expected 0 <= low <= high ticks, got ({lo}, {hi})")
        lo, hi = self.push_force
        if not 0 <= lo <= hi:
            raise ValueError(f"{where}.push_force: expected 0 <= low <= high N, got ({lo}, {hi})")
        lo, hi = self.payload
        if not 0 <= lo <= hi:
            raise ValueError(f"{where}.payload: expected 0 <= low <= high kg, got ({lo}, {hi})")
        lo, hi = self.push_interval
        if not 1 <= lo <= hi:
            raise ValueError(f"{where}.push_interval: expected 1 <= low <= high ticks, got ({lo}, {hi})")

    @property
    def randomizes_physics(self) -> bool:
        ranges = (
            self.mass_scale,
            self.friction_scale,
            self.damping_scale,
            self.actuator_gain_scale,
            self.kp_scale,
            self.kd_scale,
        )
        scaled = any(lo != 1.0 or hi != 1.0 for lo, hi in ranges)
        return scaled or self.com_offset > 0 or self.armature != (0.0, 0.0) or self.payload != (0.0, 0.0)


def sample_model_fields(
    model: mujoco.MjModel,
    config: RandomizationConfig,
    num_envs: int,
    gen: torch.Generator,
    payload_body: int = -1,
    strength: float = 1.0,
) -> dict[str, np.ndarray]:
    """Per-env values (num_envs, *field.shape) of every model field the config randomizes (the payload
    goes on `payload_body`). `strength` in [0, 1] moves every drawn value toward nominal (0: the model's
    own, 1: the full draw) without changing the draws, so a curriculum grows the same robots."""

    def _uniform(low: float, high: float, shape: tuple[int, ...], nominal: float = 1.0) -> np.ndarray:
        drawn = low + (high - low) * torch.rand(shape, generator=gen, dtype=torch.float64)
        return (nominal + strength * (drawn - nominal)).numpy()

    fields: dict[str, np.ndarray] = {}
    n = num_envs
    if config.mass_scale != (1.0, 1.0):
        scale = _uniform(*config.mass_scale, (n, model.nbody))
        fields["body_mass"] = model.body_mass[None] * scale
        fields["body_inertia"] = model.body_inertia[None] * scale[..., None]
    if config.friction_scale != (1.0, 1.0):
        friction = np.repeat(model.geom_friction[None], n, axis=0)
        friction[..., 0] *= _uniform(*config.friction_scale, (n, model.ngeom))
        fields["geom_friction"] = friction
    if config.damping_scale != (1.0, 1.0):
        fields["dof_damping"] = model.dof_damping[None] * _uniform(*config.damping_scale, (n, model.nv))
    gains = (config.actuator_gain_scale, config.kp_scale, config.kd_scale)
    if any(g != (1.0, 1.0) for g in gains):
        # Position actuators: force = kp * ctrl - kp * q - kd * qdot, so a stiffness scale moves gain
        # and bias together; a motor's strength is its gain alone (its bias terms are zero), and it has
        # no stiffness for kp to scale.
        motor, kp, kd = (_uniform(*g, (n, model.nu)) for g in gains)
        kp = np.where(model.actuator_biastype[None] == mujoco.mjtBias.mjBIAS_AFFINE, kp, 1.0)
        gain = np.repeat(model.actuator_gainprm[None], n, axis=0)
        bias = np.repeat(model.actuator_biasprm[None], n, axis=0)
        gain[..., 0] *= motor * kp
        bias[..., 1] *= motor * kp
        bias[..., 2] *= kd
        fields["actuator_gainprm"] = gain
        fields["actuator_biasprm"] = bias
    if config.com_offset > 0:
        shift = _uniform(-config.com_offset, config.com_offset, (n, model.nbody, 3), 0.0)
        shift[:, 0] = 0.0  # the world body has no mass to move
        fields["body_ipos"] = model.body_ipos[None] + shift
    if config.armature != (0.0, 0.0):
        fields["dof_armature"] = model.dof_armature[None] + _uniform(*config.armature, (n, model.nv), 0.0)
    if config.payload != (0.0, 0.0):
        mass = fields.get("body_mass", np.repeat(model.body_mass[None], n, axis=0)).copy()
        own = mass[:, payload_body].copy()
        mass[:, payload_body] += _uniform(*config.payload, (n,), 0.0)
        fields["body_mass"] = mass
        # MuJoCo compensates gravcomp * mass; a controller's gravity model knows the link, not the load.
        gravcomp = np.repeat(model.body_gravcomp[None], n, axis=0)
        gravcomp[:, payload_body] *= own / mass[:, payload_body]
        fields["body_gravcomp"] = gravcomp
    return fields


DRAW_RANGES = (
    "action_latency", "mass_scale", "payload", "friction_scale", "actuator_gain_scale", "kp_scale", "kd_scale",
    "damping_scale",
)  # fmt: skip
"""The ranges `draw_summary` describes, the robot's draw as the critics see it (`TaskConfig.critic_dynamics`)."""


def summarized(config: RandomizationConfig) -> bool:
    """Whether any range `draw_summary` describes draws anything but the nominal robot."""
    nominal = RandomizationConfig()
    return any(getattr(config, name) != getattr(nominal, name) for name in DRAW_RANGES)


def draw_summary(model: mujoco.MjModel, fields: dict[str, np.ndarray] | None, latency: torch.Tensor) -> torch.Tensor:
    """Each env's robot in a few numbers (num_envs, 6), 0 for the nominal robot: its action latency in
    ticks, then the relative change of its total mass (payload included), and the mean relative change
    of its geoms' sliding friction, its actuators' gain (actuator gain and Kp together) and damping
    (Kd), and its joints' damping. What they leave out (where on the robot the mass moved, centre of
    mass shifts, armature) the critic learns its expectation over."""
    n = latency.shape[0]
    fields = fields or {}

    def change(name: str, nominal: np.ndarray, pick=lambda a: a) -> np.ndarray:
        if name not in fields:
            return np.zeros(n)
        used = pick(nominal) != 0
        if not used.any():
            return np.zeros(n)
        return (pick(fields[name])[:, used] / pick(nominal)[used]).mean(-1) - 1.0

    mass = fields["body_mass"].sum(-1) / model.body_mass.sum() - 1.0 if "body_mass" in fields else np.zeros(n)
    columns = [
        mass,
        change("geom_friction", model.geom_friction, lambda a: a[..., 0]),
        change("actuator_gainprm", model.actuator_gainprm, lambda a: a[..., 0]),
        change("actuator_biasprm", model.actuator_biasprm, lambda a: a[..., 2]),
        change("dof_damping", model.dof_damping),
    ]
    summary = torch.from_numpy(np.stack(columns, axis=-1)).to(torch.float32)
    return torch.cat([latency.float().cpu()[:, None], summary], dim=-1).to(latency.device)
