"""The committed trained run (`tests/fixtures/pendulum_run`) still loads and still swings up.

Fast tests use it as their trained policy. When this fails after a change to checkpoints, networks,
the bundle schema or the pendulum's spec, regenerate it: `python tests/fixtures/make_pendulum_run.py`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.settings import NodeConfig
from q2real.gate.evaluation import evaluate_run

SWUNG_UP = 300.0
"""Of at most 500: a policy that swings up and balances (an untrained one scores below 60)."""


def test_the_checkpoint_and_the_bundle_swing_up_on_the_same_episodes(pendulum_run: Path) -> None:
    from_checkpoint = evaluate_run(pendulum_run, episodes=8, seed=7)
    from_bundle = evaluate_run(pendulum_run, episodes=8, seed=7, bundle=pendulum_run / "policy.onnx")
    assert from_checkpoint.mean() >= SWUNG_UP, from_checkpoint
    np.testing.assert_allclose(from_bundle.numpy(), from_checkpoint.numpy(), rtol=1e-3)


def test_the_bundle_matches_this_machines_pendulum_spec(pendulum_run: Path) -> None:
    """The node refuses a bundle whose robot (fields or spec+model hash) differs from the shipped spec."""
    node = PolicyNode(pendulum_run / "policy.onnx", NodeConfig())
    assert node.robot_mismatch == []
