from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from q2real.agents.common.metrics import read_metrics
from q2real.cli.main import main
from q2real.sim.registry import task_names


def test_envs_lists_every_task_and_adapter(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    for name in task_names():
        assert name in out
    assert "gymnasium:<name>" in out and "playground:<name>" in out


def test_envs_task_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["envs", "--task", "cartpole_swingup"]) == 0
    out = capsys.readouterr().out
    assert "episode_length: 1000" in out and "hardware/cartpole/robot.yaml" in out


def test_rollout_writes_a_complete_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["rollout", "env.task=pendulum_swingup", "env.num_envs=16", "env.backend=mujoco", "total_steps=2048"]
    args += ["env.task_params.episode_length=50", f"log.root={tmp_path}", "log.name=r", "log.interval_steps=512"]
    assert main(args) == 0
    run = tmp_path / "r"
    assert {"config.yaml", "meta.json", "metrics.jsonl", "metrics.csv", "curves.png", "tb"} <= {
        p.name for p in run.iterdir()
    }
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["env"]["num_envs"] == 16 and config["total_steps"] == 2048
    meta = json.loads((run / "meta.json").read_text())
    assert meta["versions"]["mujoco"] == "3.9.0" and "git_sha" in meta
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [512, 1024, 1536, 2048]
    finished = [r for r in records if "episode_return" in r]
    assert len(finished) == 2 and all(r["episode_length"] == 50 and r["episodes"] == 16 for r in finished)
    assert 0 <= records[-1]["episode_return"] <= 50  # reward per step lies in [0, 1]
    assert (run / "metrics.csv").read_text().startswith("step,wall_time,steps_per_second")
    # Resolved config reloads as a preset and reproduces the same config.
    assert main(["rollout", "--preset", str(run / "config.yaml"), "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out.split("run directory")[-1].split("\n", 1)[1]) == config
    # A second run into the same name is refused rather than overwriting it.
    assert main(args) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_wandb_online_without_credentials_is_refused_before_the_run_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Online logging without a login would run offline while its user watches an empty dashboard."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    args = ["rollout", "env.task=pendulum_swingup", "env.num_envs=2", "total_steps=4", f"log.root={tmp_path}"]
    assert main([*args, "log.name=r", "log.wandb=online"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("q2real rollout: error: log.wandb=online: no wandb credentials")
    assert "set WANDB_API_KEY or run `wandb login`, or use log.wandb=offline" in line
    assert not (tmp_path / "r").exists()


def test_bad_override_exits_2_with_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rollout", "env.num_envs=many"]) == 2
    assert "command line: env.num_envs: expected an integer, got 'many'" in capsys.readouterr().err
    assert main(["rollout", "env.task=nope"]) == 2
    assert "env.task: unknown task 'nope'" in capsys.readouterr().err


def test_train_then_eval_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["train", "env.num_envs=2", "env.task_params.episode_length=50", "total_steps=400", "warmup_steps=100"]
    args += ["sac.actor_hidden=[16]", "sac.critic_hidden=[16]", "sac.batch_size=16", "eval_envs=2"]
    args += [f"log.root={tmp_path}", "log.name=t", "log.tensorboard=false"]
    assert main(args) == 0
    out = capsys.readouterr().out
    run = tmp_path / "t"
    assert f"run directory: {run}" in out and "curves.png" in out and "checkpoint.pt" in out
    assert "final evaluation: mean return" in out
    assert (run / "curves.png").exists() and (run / "checkpoint.pt").exists()
    assert main(["eval", str(run), "--episodes", "3"]) == 0
    evaluated = capsys.readouterr().out
    assert "mean return" in evaluated and "over 3 episodes" in evaluated
    assert main(["train", "--resume", str(tmp_path / "missing")]) == 2
    assert "missing: no such run directory" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "no checkpoint.pt in that directory" in capsys.readouterr().err
    assert main(["eval", str(tmp_path)]) == 2
    assert "not a training run directory" in capsys.readouterr().err


# --- errors -------------------------------------------------------------------------------------------------
def test_our_errors_print_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"q2real eval: error: {tmp_path}: not a training run directory (no config.yaml)\n"


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_of_our_errors(tmp_path: Path, where: str) -> None:
    from q2real.configs.errors import RunDirError

    args = ["eval", str(tmp_path)]
    with pytest.raises(RunDirError, match="not a training run directory"):
        main(["--debug", *args] if where == "before" else [*args, "--debug"])


def test_a_bug_is_not_dressed_up_as_bad_input(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A plain ValueError (or any other) from inside a command is a programming error: it keeps its traceback."""
    import q2real.gate.evaluation

    def broken(*args, **kwargs):
        raise ValueError("an internal invariant broke")

    monkeypatch.setattr(q2real.gate.evaluation, "evaluate_run", broken)
    with pytest.raises(ValueError, match="internal invariant"):
        main(["eval", str(tmp_path)])


def test_deploy_sim_leaves_the_loaded_config_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    import q2real.cli.main as cli
    import q2real.deploy_ros.session
    from q2real.deploy_ros.settings import NodeConfig

    handed: list[NodeConfig] = []
    loaded = NodeConfig()
    monkeypatch.setattr(cli, "load", lambda *args: loaded)

    def deploy(bundle, config, **kwargs):
        handed.append(config)
        raise RuntimeError("stop before any robot starts")

    monkeypatch.setattr(q2real.deploy_ros.session, "deploy", deploy)
    with pytest.raises(RuntimeError, match="stop before"):
        main(["deploy", "b.onnx", "--sim"])
    assert handed[0].autostart and not loaded.autostart


@pytest.mark.slow  # three gates over the committed run
def test_transfer_exits_1_when_the_gate_fails(pendulum_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A script can refuse to ship: the un-randomized pendulum run fails the weaker-actuator row."""
    common = ["transfer", str(pendulum_run), "--backend", "mujoco", "--episodes", "3", "--only"]
    assert main([*common, "nominal"]) == 0
    assert main([*common, "actuator_gain"]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    # The verdict and the figure beside it name the same row, though training never covered it.
    assert last.startswith("gate FAILED on actuator_gain") and "(actuator_gain; threshold 0.9)" in last
    assert main([*common, "nominal", "--threshold", "1.5"]) == 2  # a ratio threshold is in (0, 1]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.randomization.mass_scale=[2,1]", "env.randomization.mass_scale: expected 0 < low <= high"),
        ("env.randomization.kp_scale=[nan,1]", "env.randomization.kp_scale: expected 0 < low <= high"),
        ("env.randomization.obs_noise_std=-1", "env.randomization: obs_noise_std and obs_bias must be >= 0"),
        ("env.randomization.action_latency=[-1,0]", "env.randomization.action_latency: expected 0 <= low"),
        ("env.randomization.push_interval=[0,0]", "env.randomization.push_interval: expected 1 <= low"),
        ("env.task_params.episode_length=0", "env.task_params.episode_length: expected >= 1 control step"),
        ("env.task_params.episode_length=-5", "env.task_params.episode_length: expected >= 1 control step"),
        ("replay_capacity=10000000000000", "replay_capacity: this job needs about"),
        ("sac.batch_size=1000000000", "sac.batch_size: this job needs about"),
        ("sac.critic_hidden=[1000000,1000000]", "sac.actor_hidden/critic_hidden: this job needs about"),
        ("log.root=/proc", "log.root: cannot create the run directory /proc/"),
    ],
)
def test_values_a_careless_user_types_get_one_line_naming_the_key(
    override: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before anything is allocated or written, with the key and what was expected."""
    assert main(["train", override, "env.num_envs=2", "total_steps=10", "warmup_steps=5", "eval_envs=1"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_a_python_tag_in_a_preset_is_refused_not_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    preset = tmp_path / "evil.yaml"
    marker = tmp_path / "ran"
    preset.write_text(f'algo: !!python/object/apply:os.system ["touch {marker}"]\n')
    assert main(["train", "--preset", str(preset)]) == 2
    assert f"{preset}: not valid YAML" in capsys.readouterr().err and not marker.exists()


def test_a_constrained_learner_on_a_task_without_a_cost_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "algo=sac_lag", "env.task=panda_push", "env.num_envs=2", "total_steps=10"]) == 2
    assert "panda_push defines no safety cost" in capsys.readouterr().err


def test_a_residual_on_a_base_that_is_not_bc_names_both_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "pendulum_run"
    assert main(["train", f"residual.base={fixture}", "env.task=pendulum_swingup", "total_steps=10"]) == 2
    err = capsys.readouterr().err
    assert "an off-policy learner's run, and a BC run is needed here" in err and "algo=bc" in err


def test_demos_record_refuses_an_existing_folder_before_recording(tmp_path, capsys) -> None:
    out = tmp_path / "demos"
    out.mkdir()
    assert main(["demos", "record", "env.task=panda_reach", "env.num_envs=1", "episodes=1", f"out={out}"]) == 2
    printed = capsys.readouterr()
    assert f"out: {out} already exists; demonstrations are written to a new folder" in printed.err
    assert "recording" not in printed.err + printed.out, "nothing was recorded first"
