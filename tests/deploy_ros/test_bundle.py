"""Policy bundles: parity with torch, metadata round trip, refusal of malformed bundles, eval equality."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from q2real.agents.config import TrainConfig
from q2real.agents.export import DeployPolicy, export_run, load_run_policy
from q2real.agents.train import train
from q2real.configs.loader import load
from q2real.contracts.schema import METADATA_KEY, BundleError, read_metadata, seal
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.gate.evaluation import evaluate_run
from q2real.hardware import robot_spec


def _train(root: Path, algo: str, task: str = "pendulum_swingup") -> Path:
    overrides = [
        f"algo={algo}",
        f"env.task={task}",
        "env.num_envs=2",
        "total_steps=400",
        "warmup_steps=200",
        "eval_every=0",
        "eval_envs=2",
        f"{algo}.batch_size=32",
        f"{algo}.actor_hidden=[32,32]",
        f"{algo}.critic_hidden=[32,32]",
        f"log.root={root}",
        f"log.name={algo}-{task.replace(':', '_')}",
        "log.tensorboard=false",
    ]
    if task == "pendulum_swingup":
        overrides.append("env.task_params.episode_length=60")
    return train(load(TrainConfig, None, overrides)).path


@pytest.fixture(scope="module")
def sac_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = _train(tmp_path_factory.mktemp("runs"), "sac")
    export_run(run)
    return run


def _torch_policy(run: Path) -> DeployPolicy:
    _, env, agent, _ = load_run_policy(run)
    env.close()
    return DeployPolicy(agent, env)


def _real_observations(run: Path, n: int = 1000) -> np.ndarray:
    env_config = load(TrainConfig, str(run / "config.yaml")).env
    from q2real.sim import make

    env = make(env_config, num_envs=10)
    obs, seen = env.reset(seed=3), []
    gen = torch.Generator().manual_seed(0)
    while len(seen) * 10 < n:
        seen.append(obs)
        obs = env.step(torch.rand(10, env.action_dim, generator=gen) * 2 - 1).obs
    return torch.cat(seen)[:n].numpy()


def test_onnx_matches_torch_on_random_and_real_observations(sac_run: Path) -> None:
    bundle, policy = PolicyBundle(sac_run / "policy.onnx"), _torch_policy(sac_run)
    rng = np.random.default_rng(0)
    for obs in (rng.normal(0, 3, (10_000, bundle.info.obs_dim)).astype(np.float32), _real_observations(sac_run)):
        with torch.no_grad():
            expected = policy(torch.from_numpy(obs)).numpy()
        got = np.concatenate([bundle(chunk) for chunk in np.array_split(obs, 10)])
        assert np.abs(got - expected).max() < 1e-5
    single = bundle(obs[:1])
    assert single.shape == (1, 1) and np.abs(single).max() <= 2.0  # pendulum effort limit


def test_checker_passes_and_metadata_round_trips(sac_run: Path) -> None:
    path = sac_run / "policy.onnx"
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    embedded = json.loads({p.key: p.value for p in model.metadata_props}[METADATA_KEY])
    sidecar = json.loads((sac_run / "policy.onnx.json").read_text())
    assert embedded == sidecar == read_metadata(path)
    spec = robot_spec("pendulum")
    assert embedded["robot"]["joint_names"] == spec.joint_names and embedded["robot"]["sha256"] == spec.sha256
    assert embedded["robot"]["effort_limits"] == [2.0] and embedded["robot"]["position_limits"] == [[None, None]]
    assert embedded["action"]["scale"] == [2.0] and embedded["control_period"] == 0.02
    assert [t["name"] for t in embedded["observation"]["terms"]] == ["pole_orientation", "pole_velocity"]
    assert embedded["training"]["config"]["algo"] == "sac" and embedded["schema_version"] == 1


def _rewrite(source: Path, target: Path, edit) -> Path:
    model = onnx.load(str(source))
    entries = {p.key: p.value for p in model.metadata_props}
    del model.metadata_props[:]
    value = edit(json.loads(entries[METADATA_KEY]))
    if value is not None:
        entry = model.metadata_props.add()
        entry.key, entry.value = METADATA_KEY, value if isinstance(value, str) else json.dumps(value)
    onnx.save(model, str(target))
    seal(target)  # resealed: what is tested is the field, not the digest
    return target


def _set(meta: dict, path: str, value) -> dict:
    node = meta
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[key]
    if value is KeyError:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return meta


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: None, "metadata: no 'q2real' entry"),
        (lambda m: "{not json", "metadata: not valid JSON"),
        (lambda m: _set(m, "schema_version", 99), "metadata.schema_version: 99, this q2real reads 1"),
        (lambda m: _set(m, "observation.dim", 4), "metadata.observation.terms: dims sum to 3, not 4"),
        (
            lambda m: _set(_set(m, "observation.dim", 4), "observation.terms", [{"name": "x", "dim": 4}]),
            "graph obs shape ['batch', 3] disagrees with metadata (expected [batch, 4])",
        ),
        (
            lambda m: _set(
                _set(_set(_set(m, "action.dim", 2), "action.scale", [1, 1]), "action.offset", [0, 0]),
                "robot",
                None,
            ),
            "graph actions shape [1, 1] for a batch of 1 disagrees with metadata (expected [1, 2])",
        ),
        (lambda m: _set(m, "robot.joint_names", KeyError), "metadata.robot.joint_names: missing"),
        (lambda m: _set(m, "action.scale", [float("nan")]), "metadata.action.scale: expected 1 finite numbers"),
        (lambda m: _set(m, "action.scale", ["2"]), "metadata.action.scale: expected 1 finite numbers"),
        (lambda m: _set(m, "control_period", -0.02), "metadata.control_period: expected > 0"),
    ],
)
def test_malformed_bundles_are_refused_with_the_field_named(sac_run: Path, tmp_path: Path, edit, message) -> None:
    bad = _rewrite(sac_run / "policy.onnx", tmp_path / "bad.onnx", edit)
    with pytest.raises(BundleError) as err:
        PolicyBundle(bad)
    assert str(bad) in str(err.value) and message in str(err.value)


def test_missing_and_non_onnx_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no such bundle file"):
        PolicyBundle(tmp_path / "nope.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    with pytest.raises(BundleError, match="junk.onnx: not an ONNX model"):
        PolicyBundle(junk)


def test_a_sidecar_that_disagrees_with_the_embedded_metadata_is_refused_naming_the_field(
    pendulum_bundle: Path, tmp_path: Path
) -> None:
    """The `.onnx.json` sidecar is what people and scripts read; the robot runs the embedded metadata.
    A sidecar that says something else is refused at the first field that differs; none at all is fine."""
    bundle, sidecar = tmp_path / "policy.onnx", tmp_path / "policy.onnx.json"
    bundle.write_bytes(pendulum_bundle.read_bytes())
    PolicyBundle(bundle, warmup=0)
    text = pendulum_bundle.with_name(pendulum_bundle.name + ".json").read_text()
    sidecar.write_text(text)
    PolicyBundle(bundle, warmup=0)
    meta = json.loads(text)
    kp = meta["robot"]["kp"][0]
    meta["robot"]["kp"][0] = kp + 1.0
    meta["exported_at"] = "changed too, but later in the document"
    sidecar.write_text(json.dumps(meta))
    with pytest.raises(BundleError, match=rf"metadata\.robot\.kp\[0\]: sidecar {kp + 1.0} vs embedded {kp}"):
        PolicyBundle(bundle, warmup=0)
    meta["robot"]["kp"][0] = kp
    del meta["task"]
    sidecar.write_text(json.dumps(meta))
    with pytest.raises(BundleError, match=r"metadata\.task: sidecar \(missing\) vs embedded 'pendulum_swingup'"):
        PolicyBundle(bundle, warmup=0)
    sidecar.write_text(text[:100])
    with pytest.raises(BundleError, match="policy.onnx.json: the bundle's sidecar is not readable JSON"):
        PolicyBundle(bundle, warmup=0)


def test_bundle_and_torch_policy_earn_the_same_returns(sac_run: Path) -> None:
    from_torch = evaluate_run(sac_run, episodes=4, seed=7)
    from_bundle = evaluate_run(sac_run, episodes=4, seed=7, bundle=sac_run / "policy.onnx")
    assert torch.allclose(from_torch, from_bundle, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    ("algo", "task"),
    [
        ("td3", "cartpole_swingup"),
        ("ddpg", "pendulum_swingup"),
        # FlashSAC's wide residual blocks train and export in 2.5 s quiet, 4.5 s on a slow day.
        pytest.param("flashsac", "pendulum_swingup", marks=pytest.mark.slow),
        ("sac", "gymnasium:Pendulum-v1"),
    ],
)
def test_every_learner_and_env_kind_exports_with_parity(tmp_path: Path, algo: str, task: str) -> None:
    run = _train(tmp_path, algo, task)
    bundle = PolicyBundle(export_run(run, tmp_path / "p.onnx"))
    obs = np.random.default_rng(1).normal(0, 2, (2000, bundle.info.obs_dim)).astype(np.float32)
    with torch.no_grad():
        expected = _torch_policy(run)(torch.from_numpy(obs)).numpy()
    assert np.abs(bundle(obs) - expected).max() < 1e-5
    if task.startswith("gymnasium:"):
        assert bundle.info.metadata["robot"] is None and bundle.info.control_period == 0.05
        assert bundle.info.metadata["action"]["scale"] == [2.0]
    else:
        assert bundle.info.joint_names == tuple(robot_spec(task.split("_")[0]).joint_names)
