"""Chunk execution: the queue's semantics against their definition, the node running chunk bundles
tick by tick through the shield, re-anchoring without a jerk, and chunk metadata an attacker edits."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from q2real.agents.common.chunk_critics import ChunkConfig
from q2real.contracts.chunks import ChunkQueue, ChunkSpec
from q2real.contracts.schema import METADATA_KEY, BundleError, seal
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.settings import NodeConfig
from q2real.safety.flags import Mode, Rule
from q2real.safety.shield import ShieldConfig
from tests.deploy_ros.conftest import export_fresh_agent

SIZES = (2, 3, 5)


def reference_actions(spec: ChunkSpec, chunks: list[np.ndarray]) -> list[np.ndarray]:
    """The executed action of every tick, straight from the definition: queries at ticks 0, execute,
    2 execute, ...; tick t takes, from every chunk queried at q <= t < q + size, its row t - q, and
    either the newest one (no ensembling) or their mean weighted exp(-k i), i = 0 the oldest."""
    ticks = len(chunks)
    out = []
    for t in range(ticks):
        covering = [q for q in range(0, t + 1, spec.execute) if t < q + spec.size]
        if spec.ensemble is None:
            out.append(chunks[covering[-1]][t - covering[-1]])
            continue
        weights = [math.exp(-spec.ensemble * i) for i in range(len(covering))]
        total = sum(w * chunks[q][t - q] for w, q in zip(weights, covering, strict=True))
        out.append(total / sum(weights))
    return out


specs = st.sampled_from(SIZES).flatmap(
    lambda size: st.builds(
        ChunkSpec,
        st.just(size),
        st.integers(1, size),
        st.none() | st.floats(-1.0, 1.0, allow_nan=False),
    )
)


@settings(max_examples=60, deadline=None)
@given(spec=specs, seed=st.integers(0, 2**16), library=st.sampled_from(["numpy", "torch"]))
def test_the_queue_executes_what_the_definition_says(spec: ChunkSpec, seed: int, library: str) -> None:
    rng = np.random.default_rng(seed)
    num_envs, action_dim, ticks = 3, 2, 4 * spec.size + 3
    predictions = rng.uniform(-1, 1, (ticks, num_envs, spec.size, action_dim))
    if library == "numpy":
        queue = ChunkQueue(spec, num_envs, action_dim, np)
        executed = [queue.act(p) for p in predictions]
        assert queue.due().shape == (num_envs,)
    else:
        queue = ChunkQueue(spec, num_envs, action_dim, torch, dtype=torch.float64)
        executed = [queue.act(torch.from_numpy(p)).numpy() for p in predictions]
    for env in range(num_envs):
        expected = reference_actions(spec, [p[env] for p in predictions])
        assert np.allclose([e[env] for e in executed], expected, atol=1e-12)


def test_an_ended_episode_starts_on_a_fresh_chunk_while_the_others_continue() -> None:
    queue = ChunkQueue(ChunkSpec(4, 4, None), 2, 1, np)
    first = np.arange(8, dtype=float).reshape(2, 4, 1)
    assert np.array_equal(queue.act(first)[:, 0], [0.0, 4.0])
    queue.clear(np.array([False, True]))
    assert np.array_equal(queue.due(), [False, True])
    second = first + 100
    assert np.array_equal(queue.act(second)[:, 0], [1.0, 104.0])  # env 0 still on its first chunk
    assert not queue.due().any()


@pytest.mark.parametrize("ensemble", [None, 0.5])
def test_what_an_env_that_is_not_due_was_predicted_never_reaches_its_queue(ensemble) -> None:
    queue = ChunkQueue(ChunkSpec(3, 3, ensemble), 2, 1, np)
    queue.act(np.zeros((2, 3, 1)))
    queue.clear(np.array([False, True]))
    poisoned = np.full((2, 3, 1), np.nan)
    poisoned[1] = 7.0
    action = queue.act(poisoned)  # env 0 is mid-chunk, env 1 starts a new one
    assert action[0, 0] == 0.0 and action[1, 0] == 7.0
    assert np.isfinite(queue.pending).all()


def _chunk_bundle(tmp_path, size: int, task: str = "pendulum_swingup", edit_agent=None):
    return export_fresh_agent(
        task, tmp_path / f"{task}-{size}.onnx", chunk=ChunkConfig(size=size), edit_agent=edit_agent
    )


@pytest.fixture(scope="module")
def chunk_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[int, object]:
    root = tmp_path_factory.mktemp("chunk_bundles")
    return {size: _chunk_bundle(root, size) for size in SIZES}


def _rewritten(source, target, chunk):
    """`source` (same graph) saved to `target` with its metadata's chunk section set to `chunk(meta)`."""
    model = onnx.load(str(source))
    meta = json.loads(next(p.value for p in model.metadata_props if p.key == METADATA_KEY))
    meta["chunk"] = chunk(meta)
    del model.metadata_props[:]
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(meta)
    onnx.save(model, str(target))
    seal(target)
    return target


def _with_spec(source, target, spec: ChunkSpec):
    """`source` with its chunk section's execution fields replaced by `spec`'s."""
    return _rewritten(source, target, lambda m: m["chunk"] | {"execute": spec.execute, "ensemble": spec.ensemble})


def test_an_exported_chunk_bundle_says_how_its_chunks_run(chunk_bundles) -> None:
    bundle = PolicyBundle(chunk_bundles[3])
    meta = bundle.info.metadata
    assert meta["chunk"] == {"size": 3, "execute": 3, "ensemble": None, "dt": meta["control_period"]}
    assert meta["io"]["output"]["shape"] == ["batch", 3, 1]
    assert bundle(np.zeros((2, bundle.info.obs_dim), np.float32)).shape == (2, 3, 1)


@settings(max_examples=15, deadline=None)
@given(spec=specs, seed=st.integers(0, 2**16))
def test_the_node_executes_every_tick_as_the_metadata_says_and_through_the_shield(
    chunk_bundles, tmp_path_factory, spec: ChunkSpec, seed: int
) -> None:
    path = _with_spec(chunk_bundles[spec.size], tmp_path_factory.mktemp("spec") / "b.onnx", spec)
    node = PolicyNode(path, NodeConfig(autostart=True, shield=ShieldConfig(ramp_time=0.1)))
    rng = np.random.default_rng(seed)
    now, dt = 100.0, node.spec.control_period
    observations, executed = [], []
    while len(executed) < 4 * spec.size + 2:
        node.on_joint_state(["hinge"], [rng.uniform(-3, 3)], [rng.uniform(-5, 5)], [], received=now)
        tick = node.tick(now)
        now += dt
        if tick.raw_action is not None:
            observations.append(tick.observation.reshape(1, -1))
            executed.append(tick.raw_action)
    # What the graph predicted on each RUN tick's observation; only the query ticks' are ever used.
    chunks = [node.bundle.normalized(node.bundle(obs))[0] for obs in observations]
    assert np.allclose(executed, reference_actions(spec, chunks), atol=1e-6)
    counters = node.shield.counters
    assert node.shield.mode == Mode.RUN and counters.run_ticks == len(executed)
    assert node.policy_queries == -(-len(executed) // spec.execute)  # the graph ran on due ticks only


def _alternating_chunk(agent) -> None:
    """The policy ignores its observation and predicts full-scale +1, -1, +1, -1 for every joint."""
    head = agent.actor.head
    with torch.no_grad():
        head.weight.zero_()
        mean = head.bias[..., : agent.policy_dim].view(-1, agent.action_dim)
        mean.copy_(torch.tensor([5.0, -5.0, 5.0, -5.0])[:, None].expand_as(mean))


def test_re_anchoring_a_chunk_never_moves_the_target_faster_than_the_rate_limit(tmp_path) -> None:
    """A new chunk that disagrees with the queue it replaces (the sawtooth of chunked deployment) gets
    to the robot only through the rate window: no commanded target moves more than v_max dt a tick."""
    path = export_fresh_agent(
        "panda_reach", tmp_path / "saw.onnx", chunk=ChunkConfig(size=4, execute=3), edit_agent=_alternating_chunk
    )
    node = PolicyNode(path, NodeConfig(autostart=True, shield=ShieldConfig(ramp_time=0.1)))
    assert node.on_task_command([0.45, 0.0, 0.4]) is None  # the target the policy reads
    pose = [float(v) for v in node.spec.array("default_position")]
    step = node.spec.array("velocity_limit") * node.spec.control_period
    now, previous, raw, rated = 100.0, None, [], 0
    for _ in range(60):
        node.on_joint_state(list(node.joints), pose, [0.0] * len(pose), [], received=now)
        tick = node.tick(now)
        now += node.spec.control_period
        if tick.raw_action is None:
            previous = tick.values
            continue
        raw.append(tick.raw_action[0])
        assert np.all(np.abs(tick.values - previous) <= step + 1e-9)
        rated += bool(tick.command.flags & Rule.RATE_LIMIT)
        previous = tick.values
    assert raw[:6] == pytest.approx([1, -1, 1, 1, -1, 1], abs=1e-3)  # re-anchored every third tick
    assert rated > len(raw) // 2  # the policy asked for jumps; the shield made them ramps


@pytest.mark.parametrize(
    ("chunk", "message"),
    [
        (
            {"size": 0, "execute": 1, "ensemble": None, "dt": 0.02},
            "metadata.chunk.size: expected an integer in [1, 256]",
        ),
        ({"size": 3, "execute": 4, "ensemble": None, "dt": 0.02}, "metadata.chunk.execute: expected an integer in [1"),
        ({"size": 3, "execute": 0, "ensemble": None, "dt": 0.02}, "metadata.chunk.execute: expected an integer in [1"),
        ({"size": 3.0, "execute": 1, "ensemble": None, "dt": 0.02}, "metadata.chunk.size: expected int"),
        ({"size": True, "execute": 1, "ensemble": None, "dt": 0.02}, "metadata.chunk.size: expected int"),
        ({"size": 3, "execute": 1, "ensemble": "0.1", "dt": 0.02}, "metadata.chunk.ensemble: expected float"),
        ({"size": 3, "execute": 1, "ensemble": 1e308 * 10, "dt": 0.02}, "metadata.chunk.ensemble: expected float"),
        ({"size": 3, "execute": 1, "ensemble": 50.0, "dt": 0.02}, "metadata.chunk.ensemble: expected null or"),
        ({"size": 3, "execute": 1, "ensemble": None, "dt": 0.01}, "metadata.chunk.dt: expected the control period"),
        ({"size": 3, "execute": 1, "ensemble": None}, "metadata.chunk: expected an object with keys"),
        ({"size": 3, "execute": 1, "ensemble": None, "dt": 0.02, "x": 1}, "metadata.chunk: expected an object"),
        ([3, 1], "metadata.chunk: expected an object with keys"),
        ({"size": 2, "execute": 1, "ensemble": None, "dt": 0.02}, "graph actions shape [1, 3, 1] for a batch of 1"),
    ],
)
def test_chunk_metadata_an_attacker_edits_is_refused_with_the_field_named(
    chunk_bundles, tmp_path, chunk, message
) -> None:
    bad = _rewritten(chunk_bundles[3], tmp_path / "bad.onnx", lambda m: chunk)
    with pytest.raises(BundleError) as err:
        PolicyBundle(bad)
    assert str(bad) in str(err.value) and message in str(err.value)


def test_a_per_step_bundle_claiming_chunks_is_refused(pendulum_bundle, tmp_path) -> None:
    claim = lambda m: {"size": 4, "execute": 4, "ensemble": None, "dt": m["control_period"]}  # noqa: E731
    bad = _rewritten(pendulum_bundle, tmp_path / "bad.onnx", claim)
    with pytest.raises(BundleError, match=r"graph actions shape \[1, 1\] for a batch of 1 disagrees"):
        PolicyBundle(bad)


@pytest.mark.slow  # trains, then real-time DDS against the sim robot process and the gate
@pytest.mark.timeout(600)
def test_a_chunk_policy_trains_exports_deploys_on_the_sim_robot_and_goes_through_the_gate(tmp_path, capsys) -> None:
    from q2real.cli.main import main

    args = ["train", "sac.chunk.size=4", "sac.chunk.execute=2", "sac.chunk.ensemble=0.1", "env.num_envs=2"]
    args += ["total_steps=600", "warmup_steps=200", "eval_envs=2", "sac.batch_size=32", "sac.actor_hidden=[32]"]
    args += ["sac.critic_hidden=[32]", f"log.root={tmp_path}", "log.name=chunks", "log.tensorboard=false"]
    assert main(args) == 0
    run = tmp_path / "chunks"
    assert main(["export", str(run)]) == 0
    bundle = run / "policy.onnx"
    assert PolicyBundle(bundle).info.chunk == ChunkSpec(4, 2, 0.1)
    capsys.readouterr()
    assert main(["deploy", str(bundle), "--sim", "--duration", "4", "shield.ramp_time=0.5"]) == 0
    out = capsys.readouterr().out
    assert "stopped (duration) after" in out and "refused messages 0" in out, out
    assert main(["transfer", str(run), "--backend", "mujoco", "--episodes", "2", "--only", "nominal"]) in (0, 1)
    report = json.loads((run / "transfer.json").read_text())
    assert [row["name"] for row in report["rows"]] == ["shield", "nominal"]


def test_a_chunk_that_is_not_finite_never_runs_and_the_shield_falls_back(tmp_path) -> None:
    def poison(agent) -> None:
        with torch.no_grad():
            agent.actor.head.bias.fill_(math.nan)

    path = export_fresh_agent("pendulum_swingup", tmp_path / "nan.onnx", chunk=ChunkConfig(size=3), edit_agent=poison)
    node = PolicyNode(path, NodeConfig(autostart=True, shield=ShieldConfig(ramp_time=0.1, max_bad_actions=3)))
    now, run_ticks = 100.0, 0
    for _ in range(30):
        node.on_joint_state(["hinge"], [0.0], [0.0], [], received=now)
        tick = node.tick(now)
        now += node.spec.control_period
        run_ticks += tick.raw_action is not None
        if tick.raw_action is not None:
            assert np.isnan(tick.raw_action).all() and np.isfinite(tick.values).all()
    assert run_ticks == 3 and node.policy_queries == 3  # queried again on every tick: nothing was queued
    assert node.shield.mode in (Mode.HOLD, Mode.DAMP) and node.shield.counters.rules["ACTION_NONFINITE"] >= 3
