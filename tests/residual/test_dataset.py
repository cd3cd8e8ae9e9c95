"""Demonstration datasets: LeRobotDataset v3 round trip, refusals that name the field, robomimic import."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from q2real.residual.dataset import DATA_PATH, DatasetError, Demos, read_lerobot, write_lerobot
from q2real.residual.robomimic import read_robomimic


def _demos(lengths=(5, 3, 4), obs_dim=4, action_dim=2, seed=0) -> Demos:
    rng = np.random.default_rng(seed)
    frames = sum(lengths)
    success = np.zeros(frames, dtype=bool)
    success[lengths[0] - 1] = True  # only the first episode succeeds, on its last frame
    terminal = success.copy()
    return Demos(
        obs=rng.normal(size=(frames, obs_dim)).astype(np.float32),
        action=rng.uniform(-1, 1, size=(frames, action_dim)).astype(np.float32),
        episode=np.repeat(np.arange(len(lengths)), lengths),
        fps=50.0,
        reward=success.astype(np.float32),
        terminal=terminal,
        success=success,
        task="panda_reach",
        q2real={"task": "panda_reach", "task_params": {"episode_length": 5}},
    )


def test_round_trip_keeps_frames_episodes_and_flags(tmp_path: Path) -> None:
    demos = _demos()
    root = write_lerobot(demos, tmp_path / "ds", robot_type="panda", names={"action": ["a", "b"]})
    back = read_lerobot(root)
    np.testing.assert_array_equal(back.obs, demos.obs)
    np.testing.assert_array_equal(back.action, demos.action)
    np.testing.assert_array_equal(back.episode, demos.episode)
    assert back.reward is not None and back.terminal is not None and back.success is not None
    np.testing.assert_array_equal(back.reward, demos.reward)
    np.testing.assert_array_equal(back.terminal, demos.terminal)
    assert back.fps == 50.0 and back.task == "panda_reach" and back.q2real == demos.q2real
    np.testing.assert_array_equal(back.bounds(), [[0, 5], [5, 8], [8, 12]])
    np.testing.assert_array_equal(back.episode_success(), [True, False, False])
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] == 3 and info["total_frames"] == 12
    assert info["features"]["observation.state"]["shape"] == [4] and info["features"]["action"]["names"] == ["a", "b"]
    frame = pq.read_table(root / DATA_PATH.format(chunk_index=0, file_index=0))
    assert frame.column("frame_index").to_pylist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]
    assert frame.column("timestamp").to_pylist()[:2] == pytest.approx([0.0, 0.02])
    stats = json.loads((root / "meta/stats.json").read_text())
    np.testing.assert_allclose(stats["observation.state"]["mean"], demos.obs.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats["action"]["max"], demos.action.max(0))
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet")
    assert episodes.column("length").to_pylist() == [5, 3, 4]
    assert episodes.column("dataset_from_index").to_pylist() == [0, 5, 8]
    assert pq.read_table(root / "meta/tasks.parquet").column("task").to_pylist() == ["panda_reach"]


def test_select_renumbers_episodes() -> None:
    picked = _demos().select(np.array([2, 0]))
    np.testing.assert_array_equal(picked.episode, [0] * 4 + [1] * 5)
    np.testing.assert_array_equal(picked.episode_success(), [False, True])


def test_writing_is_all_or_nothing_and_never_overwrites(tmp_path: Path) -> None:
    root = write_lerobot(_demos(), tmp_path / "ds")
    with pytest.raises(DatasetError, match="already exists"):
        write_lerobot(_demos(seed=1), root)
    bad = _demos()
    bad.action[3, 1] = np.nan
    with pytest.raises(DatasetError, match="action holds non-finite"):
        write_lerobot(bad, tmp_path / "nan")
    assert not (tmp_path / "nan").exists() and not list(tmp_path.glob(".*tmp"))


def _edit_info(root: Path, edit) -> None:
    path = root / "meta/info.json"
    info = json.loads(path.read_text())
    edit(info)
    path.write_text(json.dumps(info))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda i: i.pop("fps"), "fps: expected a positive number"),
        (lambda i: i.update(fps=-3), "fps: expected a positive number"),
        (lambda i: i.update(fps=True), "fps: expected a positive number"),
        (lambda i: i.update(codebase_version="v2.1"), "codebase_version: expected a v3"),
        (lambda i: i["features"].pop("action"), "features.action: missing"),
        (lambda i: i["features"]["observation.state"].update(shape=[2, 2]), "features.observation.state: expected"),
        (lambda i: i["features"]["action"].update(dtype="string"), "features.action: expected dtype float32"),
        (
            lambda i: i["features"]["action"].update(shape=[3]),
            "column 'action': frame 0 has 2 values, info.json says 3",
        ),
        (lambda i: i.update(q2real=[1]), "q2real: expected a mapping"),
    ],
)
def test_bad_info_fields_are_refused_by_name(tmp_path: Path, edit, message: str) -> None:
    root = write_lerobot(_demos(), tmp_path / "ds")
    _edit_info(root, edit)
    with pytest.raises(DatasetError, match=message):
        read_lerobot(root)


def _rewrite_data(root: Path, edit) -> None:
    path = root / DATA_PATH.format(chunk_index=0, file_index=0)
    pq.write_table(edit(pq.read_table(path)), path)


def test_bad_frames_are_refused_by_name(tmp_path: Path) -> None:
    root = write_lerobot(_demos(), tmp_path / "ds")
    with pytest.raises(DatasetError, match="not a LeRobotDataset folder"):
        read_lerobot(tmp_path)
    _rewrite_data(root, lambda t: t.drop_columns(["episode_index"]))
    with pytest.raises(DatasetError, match="column 'episode_index' missing"):
        read_lerobot(root)

    root = write_lerobot(_demos(), tmp_path / "ds2")

    def poison(table: pa.Table) -> pa.Table:
        obs = np.stack(table.column("observation.state").to_pylist()).astype(np.float32)
        obs[7, 0] = np.inf
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(obs.reshape(-1)), obs.shape[1])
        return table.set_column(table.column_names.index("observation.state"), "observation.state", vectors)

    _rewrite_data(root, poison)
    with pytest.raises(DatasetError, match="'observation.state': frame 7 holds a non-finite value"):
        read_lerobot(root)

    root = write_lerobot(_demos(), tmp_path / "ds3")

    def skip_frame(table: pa.Table) -> pa.Table:
        frames = np.array(table.column("frame_index").to_pylist())
        frames[6] = 5
        return table.set_column(table.column_names.index("frame_index"), "frame_index", pa.array(frames))

    _rewrite_data(root, skip_frame)
    with pytest.raises(DatasetError, match="frame_index of frame 6 is 5, expected 1"):
        read_lerobot(root)

    root = write_lerobot(_demos(), tmp_path / "ds4")
    episodes = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(episodes)
    pq.write_table(table.set_column(3, "dataset_from_index", pa.array([0, 4, 8])), episodes)
    with pytest.raises(DatasetError, match="dataset_from_index/dataset_to_index disagree"):
        read_lerobot(root)


def _robomimic_file(path: Path, lengths=(6, 4)) -> Path:
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["env_args"] = json.dumps({"env_name": "Lift", "env_type": 1, "env_kwargs": {"control_freq": 20}})
        for i, steps in enumerate(lengths):
            demo = data.create_group(f"demo_{i}")
            demo.attrs["num_samples"] = steps
            demo.create_dataset("obs/robot0_eef_pos", data=rng.normal(size=(steps, 3)))
            demo.create_dataset("obs/object", data=rng.normal(size=(steps, 10)))
            demo.create_dataset("actions", data=rng.uniform(-1, 1, size=(steps, 7)))
            rewards = np.zeros(steps)
            rewards[-1] = 1
            demo.create_dataset("rewards", data=rewards)
            demo.create_dataset("dones", data=rewards.astype(np.int64))
    return path


def test_robomimic_import_concatenates_keys_and_reads_success(tmp_path: Path) -> None:
    path = _robomimic_file(tmp_path / "low_dim.hdf5")
    demos = read_robomimic(path, ["robot0_eef_pos", "object"])
    assert demos.obs.shape == (10, 13) and demos.action.shape == (10, 7)
    np.testing.assert_array_equal(demos.bounds(), [[0, 6], [6, 10]])
    np.testing.assert_array_equal(demos.episode_success(), [True, True])
    assert demos.task == "robosuite:Lift" and demos.fps == 20.0
    with h5py.File(path) as f:
        np.testing.assert_allclose(demos.obs[6:, :3], f["data/demo_1/obs/robot0_eef_pos"][:], rtol=1e-6)
    round_trip = read_lerobot(write_lerobot(demos, tmp_path / "ds"))
    np.testing.assert_array_equal(round_trip.obs, demos.obs)
    assert round_trip.q2real["obs_keys"] == ["robot0_eef_pos", "object"]


def test_robomimic_missing_fields_are_named(tmp_path: Path) -> None:
    path = _robomimic_file(tmp_path / "low_dim.hdf5")
    with pytest.raises(DatasetError, match=r"data/demo_0/obs/gripper missing"):
        read_robomimic(path, ["gripper"])
    with h5py.File(path, "a") as f:
        del f["data/demo_1/rewards"]
    with pytest.raises(DatasetError, match="data/demo_1/rewards missing"):
        read_robomimic(path)
    with pytest.raises(DatasetError, match="no such robomimic"):
        read_robomimic(tmp_path / "absent.hdf5")
