"""`compile`: a critic step and an actor step each run as one compiled graph and train exactly as the
eager ones do; the optimizer update they trace is torch's Adam on the same state."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from q2real.agents.algos.crossq import CrossQ, CrossQConfig
from q2real.agents.algos.sac import SAC, SACConfig
from q2real.agents.common.actor_critic import Sizes, make_optimizer, traced_step
from q2real.agents.config import TrainConfig, load_run_config
from q2real.agents.learners import restore_agent
from q2real.agents.onrobot.finetune import FinetuneConfig, handoff_config
from q2real.configs.loader import load
from q2real.sim import make

OBS, ACT, BATCH = 5, 2, 32


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_the_traced_optimizer_step_is_torchs_adam_on_the_same_state(weight_decay: float) -> None:
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    twins = [torch.nn.Parameter(w.detach().clone()) for w in weights]
    ours, torchs = (make_optimizer(p, 1e-2, weight_decay, beta1=0.5) for p in (weights, twins))
    assert isinstance(ours, torch.optim.AdamW if weight_decay else torch.optim.Adam)
    for step in range(3):
        for w, t in zip(weights, twins, strict=True):
            w.grad = torch.sin(w.detach() * (step + 1))
            t.grad = w.grad.clone()
        traced_step(ours)  # eagerly: the same operations a compiled step traces
        torchs.step()
    for w, t in zip(weights, twins, strict=True):
        torch.testing.assert_close(w, t, rtol=1e-6, atol=1e-7)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(ours.state[w][key], torchs.state[t][key], rtol=1e-6, atol=1e-9)


def test_the_optimizer_state_made_up_front_is_what_adams_first_step_would_make() -> None:
    weight = torch.nn.Parameter(torch.randn(3))
    made = make_optimizer([weight], 1e-3, 0.0).state[weight]
    reference = torch.optim.Adam([torch.nn.Parameter(torch.randn(3))], fused=True)
    reference.param_groups[0]["params"][0].grad = torch.zeros(3)
    reference.step()
    first = next(iter(reference.state.values()))
    assert made.keys() == first.keys()
    for key, value in made.items():
        assert (value.dtype, value.device, value.shape) == (first[key].dtype, first[key].device, first[key].shape)
        assert not value.any(), "nothing stepped yet"


def test_compile_is_refused_with_pql_by_name() -> None:
    with pytest.raises(ValueError, match=r"sac\.compile: PQL"):
        load(TrainConfig, None, ["algo=sac", "sac.compile=true", "pql.enabled=true"])


def test_a_compiled_run_acts_without_a_compiler_and_fine_tunes_compiled_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, pendulum_run
) -> None:
    run = load_run_config(pendulum_run)
    run = dataclasses.replace(run, agent=dataclasses.replace(run.agent, compile=True))
    monkeypatch.setattr("shutil.which", lambda _: None)  # a robot computer without g++
    with pytest.raises(ValueError, match="compile: .* C\\+\\+ compiler"):
        SAC(run.agent, Sizes(OBS, ACT, 1, torch.device("cpu")))
    env = make(dataclasses.replace(run.env, num_envs=1))
    try:
        agent, _ = restore_agent(pendulum_run, run, env)  # what export, evaluation and the gate do
    finally:
        env.close()
    assert not agent.config.compile
    assert not handoff_config(FinetuneConfig(run=str(pendulum_run)), run).agent.compile
    assert handoff_config(FinetuneConfig(run=str(pendulum_run), compile=True), run).agent.compile


@pytest.mark.slow  # compiles two graphs per learner, tens of seconds each on two cores
@pytest.mark.parametrize(
    "learner, config",
    [
        (SAC, SACConfig(actor_hidden=(16, 16), critic_hidden=(16, 16), batch_size=BATCH, max_grad_norm=1.0)),
        (CrossQ, CrossQConfig(actor_hidden=(16, 16), critic_hidden=(16, 16), batch_size=BATCH, renorm_warmup=2)),
    ],
    ids=["sac", "crossq"],
)
def test_compiled_steps_train_as_the_eager_ones_in_one_graph_each(learner, config, random_batch) -> None:
    import torch._dynamo
    import torch._inductor.config

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    agents = []
    for compiled in (False, True):
        torch.manual_seed(0)
        agents.append(learner(dataclasses.replace(config, compile=compiled), Sizes(OBS, ACT, 1, torch.device("cpu"))))
    eager, compiled = agents
    # inductor draws its own random numbers unless told to use eager's generator.
    with torch._inductor.config.patch(fallback_random=True):
        for update in range(4):  # CrossQ: past its renorm warmup, and two actor steps (policy delay 3)
            torch.manual_seed(update)
            expected = eager.update(random_batch(BATCH, OBS, ACT, update))
            torch.manual_seed(update)
            got = compiled.update(random_batch(BATCH, OBS, ACT, update))
            assert expected.keys() == got.keys()
            for key in expected:
                torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-5, msg=key)
    for (name, a), b in zip(eager.state_dict().items(), compiled.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
    for which in ("critic", "actor"):
        mine, theirs = getattr(eager, f"{which}_optim"), getattr(compiled, f"{which}_optim")
        for p, q in zip(mine.param_groups[0]["params"], theirs.param_groups[0]["params"], strict=True):
            torch.testing.assert_close(theirs.state[q]["exp_avg_sq"], mine.state[p]["exp_avg_sq"], rtol=1e-4, atol=1e-9)
    counters = torch._dynamo.utils.counters
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 2, "one graph for the critic step, one for the actor step"
    assert set(compiled._compiled) == {"critic_step", "actor_step"} and not eager._compiled
