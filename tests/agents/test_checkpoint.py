"""Checkpoint integrity, refusal of checkpoints a run cannot continue, and config range checks."""

from __future__ import annotations

import dataclasses
import io
import math
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from q2real.agents.common.checkpoint import MAGIC, check_shapes, load_checkpoint, save_checkpoint
from q2real.agents.common.replay import ReplayStorage
from q2real.agents.common.run_dir import LogConfig, RunDir
from q2real.agents.config import TrainConfig
from q2real.agents.registry import LEARNERS
from q2real.agents.train import Trainer, resume, train
from q2real.cli.main import main
from q2real.configs.loader import load


def tiny(root: Path, name: str, algo: str = "sac", extra: tuple[str, ...] = ()) -> TrainConfig:
    """A run of a few hundred env steps on tiny networks, with a small replay so the file stays small."""
    overrides = [
        f"algo={algo}",
        "env.num_envs=2",
        "env.task_params.episode_length=50",
        "total_steps=200",
        "warmup_steps=100",
        "replay_capacity=400",
        "eval_every=0",
        "eval_envs=1",
        "checkpoint_every=0",
        f"{algo}.actor_hidden=[32,32]",
        f"{algo}.critic_hidden=[32,32]",
        f"{algo}.batch_size=16",
        f"log.root={root}",
        f"log.name={name}",
        "log.tensorboard=false",
        "log.interval_steps=100",
        *extra,
    ]
    return load(TrainConfig, None, overrides)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run directory of a finished tiny SAC run; tests copy it before changing anything."""
    root = tmp_path_factory.mktemp("finished")
    train(tiny(root, "run"))
    return root / "run"


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "run"))


PAYLOAD = len(MAGIC) + 65
"""Where the torch payload starts: after the magic line and the hex sha256 line."""


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def offset_of(path: Path, tensor: torch.Tensor) -> int:
    """Where `tensor`'s raw bytes lie in the checkpoint file."""
    data = path.read_bytes()
    offset = data.find(tensor.contiguous().numpy().tobytes())
    assert offset > PAYLOAD
    return offset


def refused(path: Path) -> pytest.RaisesContext:
    return pytest.raises(ValueError, match=re.escape(str(path)))


# --- integrity -------------------------------------------------------------------------------------------
def test_checkpoint_file_is_header_and_hash_then_a_plain_torch_payload(run: Path) -> None:
    data = (run / "checkpoint.pt").read_bytes()
    assert data.startswith(MAGIC)
    state = torch.load(io.BytesIO(data[PAYLOAD:]), weights_only=True)
    assert state["step"] == 200 and state["config"]["algo"] == "sac"
    assert state["spaces"] == {"obs_dim": 3, "action_dim": 1}


def test_clean_checkpoint_round_trips(tmp_path: Path) -> None:
    state = {
        "step": 7,
        "weights": torch.arange(6.0).reshape(2, 3),
        "nested": {"ids": [torch.ones(2, dtype=torch.long)]},
    }
    save_checkpoint(tmp_path / "c.pt", state)
    loaded = load_checkpoint(tmp_path / "c.pt")
    assert loaded["step"] == 7 and torch.equal(loaded["weights"], state["weights"])
    assert torch.equal(loaded["nested"]["ids"][0], state["nested"]["ids"][0])
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(
    ("tensor", "byte"),
    [(lambda state: state["agent"]["actor.body.0.weight"], 5), (lambda state: state["replay"]["data"]["obs"][:10], 17)],
    ids=["weight", "replay"],
)
def test_flipped_byte_in_a_tensor_is_refused(run: Path, tensor, byte: int) -> None:
    path = run / "checkpoint.pt"
    flip(path, offset_of(path, tensor(load_checkpoint(path))) + byte)
    with refused(path) as err:
        load_checkpoint(path)
    assert "corrupted" in str(err.value)


def test_flipped_byte_in_metadata_is_refused(run: Path) -> None:
    """The pickled part holds the step counters and the config; its records are found through the zip index."""
    path = run / "checkpoint.pt"
    data = path.read_bytes()
    start = PAYLOAD
    with zipfile.ZipFile(io.BytesIO(data[start:])) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("data.pkl"))
    record = start + info.header_offset + 30 + len(info.filename) + len(info.extra)
    flip(path, record + info.file_size // 2)
    with refused(path):
        load_checkpoint(path)


@pytest.mark.parametrize("offset", [0, 5, len(MAGIC) - 1, len(MAGIC), len(MAGIC) + 40, len(MAGIC) + 64])
def test_flipped_byte_in_the_header_is_refused(run: Path, offset: int) -> None:
    path = run / "checkpoint.pt"
    flip(path, offset)
    with refused(path):
        load_checkpoint(path)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(position=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_any_flipped_bit_is_refused(finished: Path, tmp_path: Path, position: float, bit: int) -> None:
    path = tmp_path / "checkpoint.pt"
    data = bytearray((finished / "checkpoint.pt").read_bytes())
    data[int(position * len(data))] ^= 1 << bit
    path.write_bytes(bytes(data))
    with refused(path):
        load_checkpoint(path)


def test_truncated_checkpoint_is_refused(run: Path) -> None:
    path = run / "checkpoint.pt"
    path.write_bytes(path.read_bytes()[:-100])
    with refused(path):
        load_checkpoint(path)


def test_checkpoint_without_header_is_refused_saying_so(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    torch.save({"step": 1}, path)
    with pytest.raises(ValueError, match=re.escape(f"{path}: not a q2real checkpoint")):
        load_checkpoint(path)


def test_resume_from_a_corrupted_checkpoint_is_refused(run: Path) -> None:
    path = run / "checkpoint.pt"
    flip(path, offset_of(path, load_checkpoint(path)["agent"]["critic.head.weight"]))
    with refused(path):
        resume(run, tiny(run.parent, "run", extra=("total_steps=300",)))


# --- checkpoints the run cannot continue ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("algo", "extra", "message"),
    [
        ("sac", ("sac.actor_hidden=[64,64]",), "sac.actor_hidden: checkpoint [32, 32], this run [64, 64]"),
        ("sac", ("sac.num_critics=3",), "sac.num_critics: checkpoint 2, this run 3"),
        ("td3", (), "algo: checkpoint 'sac', this run 'td3'"),
        ("sac", ("env.task=cartpole_swingup",), "env.task: checkpoint 'pendulum_swingup', this run 'cartpole_swingup'"),
        ("sac", ("replay_capacity=600",), "replay_capacity: checkpoint 400, this run 600"),
        ("sac", ("env.num_envs=4",), "env.num_envs: checkpoint 2, this run 4"),
    ],
)
def test_resume_with_a_mismatched_config_names_the_key(
    run: Path, algo: str, extra: tuple[str, ...], message: str
) -> None:
    config_before = (run / "config.yaml").read_text()
    with pytest.raises(ValueError, match=re.escape(f"{run / 'checkpoint.pt'}: {message}")):
        Trainer(tiny(run.parent, "run", algo, extra), resume=run)
    assert (run / "config.yaml").read_text() == config_before  # a refused resume leaves the run as it was


def test_resume_compares_every_tensor_shape_when_the_config_agrees(run: Path) -> None:
    """A checkpoint whose stored config claims other sizes than its tensors still fails on the tensor."""
    path = run / "checkpoint.pt"
    state = load_checkpoint(path)
    state["config"]["sac"]["actor_hidden"] = [64, 64]
    save_checkpoint(path, state)
    with pytest.raises(
        ValueError,
        match=re.escape(f"{path}: agent.actor.body.0.weight: checkpoint shape (1, 3, 32), this run (1, 3, 64)"),
    ):
        Trainer(tiny(run.parent, "run", extra=("sac.actor_hidden=[64,64]",)), resume=run)


def test_resume_compares_replay_shapes(run: Path) -> None:
    path = run / "checkpoint.pt"
    state = load_checkpoint(path)
    state["config"]["replay_capacity"] = 600
    save_checkpoint(path, state)
    with pytest.raises(
        ValueError, match=re.escape(f"{path}: replay: the checkpoint's replay has 200 rows per env, this run's 300")
    ):
        Trainer(tiny(run.parent, "run", extra=("replay_capacity=600",)), resume=run)


def test_check_shapes_names_missing_and_extra_tensors() -> None:
    current = {"a": torch.zeros(2), "b": {"c": torch.zeros(3)}}
    with pytest.raises(ValueError, match=r"f: agent\.b\.c: missing from the checkpoint"):
        check_shapes(Path("f"), "agent", {"a": torch.zeros(2)}, current)
    with pytest.raises(ValueError, match=r"f: agent\.d: in the checkpoint \(shape \(1,\)\) but not in this run"):
        check_shapes(Path("f"), "agent", {**current, "d": torch.zeros(1)}, current)
    check_shapes(Path("f"), "agent", current, current)


def test_cli_resume_with_a_mismatched_checkpoint_exits_2_with_the_key(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "--resume", str(run), "sac.critic_hidden=[64,64]"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("q2real train: error: ") and "sac.critic_hidden: checkpoint [32, 32], this run [64, 64]" in err
    )
    assert "Traceback" not in err


def test_export_refuses_a_checkpoint_of_other_network_sizes(run: Path) -> None:
    from q2real.agents.export import load_run_policy

    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(config.replace("- 32\n", "- 16\n"))
    with pytest.raises(ValueError, match=re.escape(f"{run / 'checkpoint.pt'}: sac.actor_hidden: checkpoint [32, 32]")):
        load_run_policy(run)


# --- range checks ------------------------------------------------------------------------------------------
def with_value(dotted: str, value: Any) -> TrainConfig:
    """Default config with one field set, the learner switched to the section the key lives in."""
    config = TrainConfig()
    section, _, _ = dotted.partition(".")
    if section in LEARNERS:
        config = dataclasses.replace(config, algo=section, agent=LEARNERS[section].config())
        dotted = "agent." + dotted.partition(".")[2]
    target = config
    *parents, leaf = dotted.split(".")
    for name in parents:
        target = getattr(target, name)
    setattr(target, leaf, value)
    return config


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("replay_capacity", 0),
        ("replay_capacity", -5),
        ("replay_capacity", 3),  # below the 4 default envs: one vectorized step would not fit
        ("updates_per_step", math.inf),
        ("stop_return", math.nan),
        ("sac.actor_hidden", (0, 32)),
        ("sac.critic_hidden", ()),
        ("sac.critic_hidden", (256, -1)),
        ("sac.gamma", 0.0),
        ("sac.gamma", 1.5),
        ("sac.gamma", math.nan),
        ("sac.tau", 0.0),
        ("sac.tau", 2.0),
        ("sac.actor_lr", 0.0),
        ("sac.critic_lr", math.inf),
        ("sac.critic_lr", math.nan),
        ("sac.batch_size", 0),
        ("sac.weight_decay", -0.1),
        ("sac.max_grad_norm", -1.0),
        ("sac.v_min", math.inf),
        ("sac.init_alpha", 0.0),
        ("sac.alpha_lr", -1e-3),
        ("sac.log_std_min", 3.0),
        ("sac.target_action_std", 0.0),
        ("sac.target_entropy", math.nan),
        ("sac.noise_repeat_mu", 0.0),
        ("sac.noise_repeat_max", 0),
        ("flashsac.num_atoms", 1),
        ("flashsac.critic_hidden", (128, 256)),
        ("td3.actor_hidden", (64, 0)),
        ("td3.exploration_noise", -0.1),
        ("td3.exploration_noise_min", 0.5),
        ("td3.target_noise", math.nan),
        ("td3.target_noise_clip", -0.5),
        ("ddpg.tau", math.inf),
        ("pql.critic_updates_per_step", math.inf),
        ("pql.slack", 0),
        ("log.interval_steps", 0),
    ],
)
def test_out_of_range_setting_is_refused_naming_its_key(key: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{re.escape(key)}: expected"):
        with_value(key, value).validate()


@pytest.mark.parametrize("name", ["../../tmp/x", "/tmp/x", "a/b", "a\\b", "..", ".", "two words", "x\n"])
def test_run_name_that_could_leave_the_log_root_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match=r"^log\.name: expected a single folder name"):
        with_value("log.name", name).validate()
    with pytest.raises(ValueError, match=r"^log\.name"):
        RunDir({}, LogConfig(root=str(tmp_path), name=name), "pendulum_swingup")
    assert not any(tmp_path.iterdir())


def test_plain_run_names_pass() -> None:
    for name in ("", "sac-pendulum_v1.2", "run.3", "..x"):
        with_value("log.name", name).validate()


def test_replay_storage_refuses_a_capacity_below_one_row() -> None:
    with pytest.raises(ValueError, match="replay capacity 3 is below num_envs 4"):
        ReplayStorage(3, 4, 1, 1, torch.device("cpu"))


# --- checkpoints whose hash is valid but whose contents are not ----------------------------------------------
def _edit_step(state: dict) -> None:
    state["step"] = -5


def _drop(key: str):
    return lambda state: state.pop(key)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_edit_step, "step: expected a whole number >= 0, got -5"),
        (lambda state: state.update(step=state["step"] + 1), "is not iteration"),
        (_drop("replay"), "the checkpoint lacks ['replay']"),
        (_drop("rng"), "the checkpoint lacks ['rng']"),
        (lambda state: state.update(elapsed=float("nan")), "elapsed: expected a finite number >= 0"),
    ],
    ids=["negative-step", "step-off-the-grid", "no-replay", "no-rng", "nan-elapsed"],
)
def test_a_checkpoint_edited_into_nonsense_is_refused_and_left_alone(run: Path, edit, message: str) -> None:
    """Written through `save_checkpoint`, so its hash is valid: only the contents can say no. The refused
    checkpoint is not overwritten by a run that restarted from scratch."""
    path = run / "checkpoint.pt"
    state = load_checkpoint(path)
    edit(state)
    save_checkpoint(path, state)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=re.escape(message)):
        Trainer(tiny(run.parent, "run"), resume=run)
    assert path.read_bytes() == before


def test_a_garbled_config_yaml_refuses_resume_in_one_line(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from q2real.cli.main import main

    (run / "config.yaml").write_text("env: [unclosed\n  task: {\n")
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'config.yaml'}: not valid YAML" in err and err.count("\n") <= 8, err


def test_a_run_checkpointed_without_replay_resumes_by_refilling_it_first(tmp_path: Path, capsys) -> None:
    """`checkpoint_replay=false`: the file keeps networks and counters only (smaller than the replay
    alone), and a resume collects a batch with the policy before the first update, then trains on."""
    config = tiny(tmp_path, "lean", extra=("checkpoint_replay=false",))
    first = Trainer(config)
    first.run()
    replay_bytes = sum(t[: first.replay.size].numel() * t.element_size() for t in first.replay.data.values())
    updates = first.agent.updates
    state = load_checkpoint(tmp_path / "lean" / "checkpoint.pt")
    assert state["replay"]["size"] == 0 and state["sampler"] == {}
    assert all(len(t) == 0 for t in state["replay"]["data"].values())
    assert (tmp_path / "lean" / "checkpoint.pt").stat().st_size < replay_bytes + 200_000
    more = dataclasses.replace(config, total_steps=300)
    trainer = Trainer(more, resume=tmp_path / "lean")
    assert trainer.step == 200 and len(trainer.replay) == 0 and trainer.agent.updates == updates
    assert trainer.learn_from == 216  # a batch of 16 at 2 env steps per iteration
    assert "keeps no replay" in capsys.readouterr().out
    for _ in range(7):  # 14 env steps: less than a batch, no update
        trainer.collect()
        trainer.learn()
    assert len(trainer.replay) == 14 and trainer.agent.updates == updates
    trainer.collect()  # the replay holds a batch: updates continue
    trainer.learn()
    assert trainer.agent.updates == updates + 1
    trainer.env.close()
    trainer.eval_env.close()
