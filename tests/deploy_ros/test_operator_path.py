"""The operator's path on the sim robot, end to end, as the README's operator quick start gives it:
demonstrations -> BC -> residual -> gate -> deploy with a target -> stop, reset and start over ROS 2
-> fine-tuning an arm beside the node with a payload on its wrist."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest

from q2real.cli.main import main
from q2real.configs.loader import load
from q2real.contracts.transitions import RING, RUN, TransitionRing
from q2real.deploy_ros.session import deploy
from q2real.deploy_ros.settings import NodeConfig
from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.transport.dds import LATCHED_QOS, wait_for_match
from tests.deploy_ros.test_dds_loop import _wait_for

REACH = ["env.task=panda_reach"]
TARGET = ["0.5", "0.1", "0.4"]


@pytest.mark.slow  # records, trains three times, runs the gate, then three real-time sessions on the sim robot
@pytest.mark.timeout(900)
def test_the_operators_path_from_demonstrations_to_a_fine_tuned_arm(tmp_path: Path, capsys, participant) -> None:
    logs = [f"log.root={tmp_path}", "log.tensorboard=false"]
    demos = tmp_path / "demos"
    assert main(["demos", "record", *REACH, "env.num_envs=4", "episodes=8", f"out={demos}"]) == 0
    assert main(["train", "algo=bc", f"dataset={demos}", "max_epochs=20", "eval_episodes=2", "log.name=bc", *logs]) == 0
    args = ["train", f"residual.base={tmp_path / 'bc'}", f"residual.demos={demos}", *REACH, "env.num_envs=2"]
    args += ["total_steps=400", "warmup_steps=100", "eval_envs=2", "sac.batch_size=32", "sac.actor_hidden=[32]"]
    assert main([*args, "sac.critic_hidden=[32]", "log.name=residual", *logs]) == 0
    residual = tmp_path / "residual"

    # The gate, its ROS row through the node with the task's targets on ~/command.
    # On native MuJoCo, as a quick-start install (no JAX) runs it; the gate's MJX rows are tested on their own.
    gate = ["transfer", str(residual), "--backend", "mujoco", "--episodes", "4", "--only", "nominal", "--ros"]
    assert main([*gate, "--ros-episodes", "2"]) in (0, 1)
    report = json.loads((residual / "transfer.json").read_text())
    assert {row["name"] for row in report["rows"]} >= {"nominal", "via ROS 2 node"}, report["rows"]
    assert main(["export", str(residual)]) == 0
    bundle = residual / "policy.onnx"

    # Deploy with a target given on the command line: the node runs the policy on it, and says so.
    capsys.readouterr()
    command = ["deploy", str(bundle), "--sim", "--command", *TARGET, "--duration", "4", "shield.ramp_time=0.5"]
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "stopped (duration) after" in out and "no command on" not in out, out

    # Stop, reset and start over ROS 2 (the operator's topics on the wire), without restarting the node.
    operator = participant("operator")
    writers = {name: operator.writer(f"/q2real_policy/{name}", msg.Empty) for name in ("stop", "reset", "start")}
    modes: list[str] = []
    operator.reader("/q2real_policy/mode", msg.String, lambda m: modes.append(m.data), LATCHED_QOS)
    config = load(NodeConfig, None, ["autostart=true", "shield.ramp_time=0.5"])
    stop = threading.Event()
    result = {}
    session = threading.Thread(
        target=lambda: result.update(
            summary=deploy(bundle, config, sim=True, stop=stop, status_every=None, sim_extra=["--command", *TARGET])
        )
    )
    session.start()
    try:
        for writer in writers.values():
            wait_for_match(writer, timeout=30.0)
        for send, expected in [
            (None, "RUN"),
            ("stop", "ESTOP"),
            ("reset", "PASSIVE"),
            ("start", "RUN"),
            ("stop", "ESTOP"),
        ]:
            if send is not None:
                writers[send].write(msg.Empty())
            _wait_for(lambda expected=expected: modes and modes[-1] == expected, 30, f"~/mode {expected} after {send}")
    finally:
        stop.set()
        session.join(60)
    summary = result["summary"]
    assert summary.mode_at_stop == "ESTOP" and "RAMP" in modes, (summary, modes)

    # Fine-tuning an arm beside the node: a SAC run of the same task, 8 kg on the wrist from the start.
    train = ["train", *REACH, "env.num_envs=2", "total_steps=400", "warmup_steps=200", "eval_envs=2"]
    assert main([*train, "sac.actor_hidden=[32]", "sac.critic_hidden=[32]", "log.name=sac", *logs]) == 0
    sac = tmp_path / "sac"
    assert main(["export", str(sac)]) == 0
    directory = tmp_path / "finetune"
    settings = [f"finetune.directory={directory}", "autostart=true", "shield.ramp_time=0.5"]
    settings += ["finetune.learner=[warmup_steps=50,actor_start=100]"]
    command = ["deploy", str(sac / "policy.onnx"), *settings, "--sim", "--finetune", str(sac), "--duration", "20"]
    command += ["--shift", "payload=8", "--command", *TARGET]
    assert main(command) == 0
    ring = TransitionRing(directory / RING)
    rows, _ = ring.read(0)
    rewards, _, rewarded = ring.rewards_since(0)
    scored = rewards[(rows["flags"][:rewarded] & RUN > 0)[: len(rewards)]]
    finite = [r for r in scored.tolist() if math.isfinite(r)]
    assert len(finite) > 200 and all(0.0 <= r <= 1.0 for r in finite), (len(finite), rewarded)
    assert (directory / "v0000.onnx").is_file()
