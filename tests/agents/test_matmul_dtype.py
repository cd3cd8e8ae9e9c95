"""`matmul_dtype: bfloat16`: the networks' products in bfloat16, everything a learner keeps in float32,
and a bundle that runs float32 whatever the products trained in."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from q2real.agents.common.actor_critic import Sizes
from q2real.agents.common.networks import Critic, EnsembleLinear, float32_matmuls, set_matmul_dtype
from q2real.agents.config import TrainConfig
from q2real.agents.export import DeployPolicy, write_bundle
from q2real.agents.learners import build_agent
from q2real.agents.registry import LEARNERS
from q2real.configs.loader import load
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.sim import make


def test_bfloat16_products_keep_float32_weights_gradients_and_outputs_within_bfloat16_rounding() -> None:
    torch.manual_seed(0)
    critic = Critic(17, 6, (256, 256), "renorm", 2, 1)
    obs, action = torch.randn(512, 17), torch.rand(512, 6) * 2 - 1
    exact = critic(obs, action)
    exact.square().mean().backward()
    exact_grads = [p.grad.clone() for p in critic.parameters()]
    critic.zero_grad()

    set_matmul_dtype(critic, torch.bfloat16)
    low = critic(obs, action)
    low.square().mean().backward()
    assert low.dtype == torch.float32
    for p, exact_grad in zip(critic.parameters(), exact_grads, strict=True):
        assert p.dtype == p.grad.dtype == torch.float32
        if exact_grad.norm() < 1e-6:  # a bias just before a batch norm: its true gradient is zero
            continue
        cosine = torch.nn.functional.cosine_similarity(p.grad.flatten(), exact_grad.flatten(), dim=0)
        assert cosine > 0.99, f"a gradient in bfloat16 products points elsewhere (cosine {cosine:.4f})"
    # bfloat16 keeps 8 significant bits: about 0.4 % per rounding, a few roundings deep.
    assert (low - exact).abs().max() < 0.05 * exact.abs().max()
    assert not torch.equal(low, exact), "the products did not run in bfloat16"
    for buffer in critic.buffers():
        assert buffer.dtype in (torch.float32, torch.long)


def test_float32_matmuls_restores_each_layers_own_setting() -> None:
    layers = torch.nn.Sequential(EnsembleLinear(1, 3, 4), EnsembleLinear(1, 4, 2))
    layers[0].matmul_dtype = torch.bfloat16
    with float32_matmuls(layers):
        assert [layer.matmul_dtype for layer in layers] == [None, None]
    assert [layer.matmul_dtype for layer in layers] == [torch.bfloat16, None]


@pytest.mark.parametrize("algo", sorted(LEARNERS))
def test_the_setting_reaches_every_hidden_layer_of_every_learner_and_no_output_layer(algo: str) -> None:
    config = dataclasses.replace(LEARNERS[algo].config(), matmul_dtype="bfloat16")
    agent = LEARNERS[algo].learner(config, Sizes(5, 2, 1, torch.device("cpu")))
    layers = [(n, m) for n, m in agent.named_modules() if isinstance(m, EnsembleLinear)]
    hidden = [m.matmul_dtype for n, m in layers if not n.endswith(".head")]
    outputs = [m.matmul_dtype for n, m in layers if n.endswith(".head")]
    assert hidden and set(hidden) == {torch.bfloat16}, f"{algo}: a hidden layer multiplies in float32"
    assert outputs and set(outputs) == {None}, f"{algo}: an output layer lost float32"


def test_a_bad_value_is_refused_by_name() -> None:
    with pytest.raises(
        Exception, match=r"crossq\.matmul_dtype: expected one of \['float32', 'bfloat16'\], got 'float16'"
    ):
        load(TrainConfig, None, ["algo=crossq", "crossq.matmul_dtype=float16"])


def test_a_policy_trained_with_bfloat16_products_exports_a_float32_graph(tmp_path: Path) -> None:
    config = load(TrainConfig, None, ["algo=crossq", "crossq.matmul_dtype=bfloat16", "env.num_envs=1"])
    env = make(config.env)
    try:
        agent = build_agent(config, env)
        before = {n: m.matmul_dtype for n, m in agent.named_modules() if isinstance(m, EnsembleLinear)}
        path = write_bundle(config, env, agent, 0, tmp_path / "policy.onnx")
        graph = onnx.load(str(path)).graph
        kinds = {t.type.tensor_type.elem_type for t in [*graph.input, *graph.output, *graph.value_info]}
        kinds |= {a.i for n in graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"}
        assert onnx.TensorProto.BFLOAT16 not in kinds
        obs = torch.randn(8, env.policy_obs_dim)
        deploy = DeployPolicy(agent, env).eval()  # as the export traces it
        with torch.no_grad(), float32_matmuls(deploy):
            expected = deploy(obs).numpy()
        assert np.abs(PolicyBundle(path)(obs.numpy()) - expected).max() < 1e-5
        after = {n: m.matmul_dtype for n, m in agent.named_modules() if isinstance(m, EnsembleLinear)}
        assert torch.bfloat16 in after.values() and after == before, "exporting must not change how the learner trains"
    finally:
        env.close()
