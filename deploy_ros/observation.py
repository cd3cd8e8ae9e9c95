"""Observations on the robot, assembled from joint states exactly as the task computed them in sim.

Each observation term in a bundle's metadata names its `source`: what it is made of on the robot.
The vocabulary is small and closed, so a bundle either says precisely how to build its observation
or is refused before the robot moves:

  joint_position           q of the listed joints
  joint_velocity           q dot of the listed joints
  joint_position_cos_sin   cos q of the listed joints, then sin q (angles without the wrap at +-pi)
  last_action              the policy's previous output in [-1, 1] (zeros before the first)
  command                  the task command (e.g. a target), from the command input

The tests feed simulator states through this builder and require the task's own observation, so the
sim and robot sides cannot drift apart silently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from q2real.deploy_ros.schema import BundleError, brief

JOINT_KINDS = ("joint_position", "joint_velocity", "joint_position_cos_sin")
KINDS = (*JOINT_KINDS, "last_action", "command")


@dataclass(frozen=True)
class _Term:
    name: str
    kind: str
    start: int
    dim: int
    index: np.ndarray


class ObservationBuilder:
    """Fills one float32 (1, obs_dim) buffer per tick from joint states in the builder's joint order."""

    def __init__(self, metadata: dict, source: str):
        terms = metadata["observation"]["terms"]
        self.dim = metadata["observation"]["dim"]
        self.action_dim = metadata["action"]["dim"]
        joints: list[str] = []
        parsed = []
        start = 0
        self.command_dim = 0
        for i, term in enumerate(terms):
            where = f"{source}: metadata.observation.terms[{i}] ({brief(term['name'])})"
            spec = term.get("source")
            if not isinstance(spec, dict) or spec.get("kind") not in KINDS:
                raise BundleError(
                    f"{where}: source: expected {{'kind': one of {list(KINDS)}, ...}}, got {brief(spec)}; "
                    "this bundle does not say how to build its observation on a robot"
                )
            kind, dim = spec["kind"], term["dim"]
            names = spec.get("joints", [])
            if kind in JOINT_KINDS:
                if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
                    raise BundleError(f"{where}: source.joints: expected a list of joint names")
                expected = 2 * len(names) if kind == "joint_position_cos_sin" else len(names)
            elif names:
                raise BundleError(f"{where}: source.joints: a '{kind}' term reads no joints")
            elif kind == "last_action":
                expected = self.action_dim
            else:
                expected = dim
            if dim != expected:
                raise BundleError(f"{where}: dim {dim} disagrees with its source (expected {expected})")
            for name in names:
                if name not in joints:
                    joints.append(name)
            if kind == "command":
                index = list(range(self.command_dim, self.command_dim + dim))
                self.command_dim += dim
            else:
                index = [joints.index(n) for n in names]
            parsed.append((term["name"], kind, start, dim, index))
            start += dim
        self.joints = tuple(joints)
        """Every joint the observation reads, actuated or not (e.g. a passive pole's encoder)."""
        self._terms = [_Term(n, k, s, d, np.asarray(ix, dtype=np.intp)) for n, k, s, d, ix in parsed]
        """`index` holds joint positions for joint terms and positions in the command vector for commands."""
        self.buffer = np.zeros((1, self.dim), dtype=np.float32)

    def __call__(
        self, position: np.ndarray, velocity: np.ndarray, last_action: np.ndarray, command: np.ndarray | None = None
    ) -> np.ndarray:
        """The observation for joint states in `self.joints` order and the command vector (all command
        terms concatenated in term order); returns the (reused) buffer."""
        out = self.buffer[0]
        for term in self._terms:
            span = slice(term.start, term.start + term.dim)
            if term.kind == "joint_position":
                out[span] = position[term.index]
            elif term.kind == "joint_velocity":
                out[span] = velocity[term.index]
            elif term.kind == "joint_position_cos_sin":
                angle = position[term.index]
                half = len(term.index)
                out[term.start : term.start + half] = np.cos(angle)
                out[term.start + half : term.start + term.dim] = np.sin(angle)
            elif term.kind == "last_action":
                out[span] = last_action
            else:
                if command is None:
                    raise ValueError(f"observation term '{term.name}' needs a task command and none was given")
                out[span] = command[term.index]
        return self.buffer
