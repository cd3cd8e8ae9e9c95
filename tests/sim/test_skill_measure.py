"""`bench/skills.py` judges locomotion on physics: checked on the one policy whose answer is known by
hand, standing still on the default pose (PD holds the stance, the base does not move)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from q2real.agents.config import TrainConfig
from q2real.configs.loader import load

BENCH = Path(__file__).resolve().parents[2] / "bench" / "skills.py"


def skills_bench():
    spec = importlib.util.spec_from_file_location("skills_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # two sets of four 20 s episodes, 8000 Spot steps
def test_standing_still_never_falls_and_misses_each_command_by_its_own_size() -> None:
    bench = skills_bench()
    config = load(TrainConfig, "crossq_spot_joystick", ["env.randomization.obs_noise_std=0"])
    env = bench.eval_env(config, episodes=4)
    assert env.episode_length == 1000, "skills are judged on 20 s episodes"
    stand = lambda obs: torch.zeros(obs.shape[0], env.action_dim)  # noqa: E731
    figures = bench.locomotion(stand, env)
    # By hand: the same seeded episodes, the command of every measured step (all but the last, which
    # ends the episode), |cmd_xy| and |cmd_wz| averaged.
    env.reset(seed=bench.EVAL_SEED)
    lin, ang = [], []
    for _ in range(env.episode_length - 1):
        command = env.task.command.clone()
        env.step(torch.zeros(4, env.action_dim))
        lin.append(command[:, :2].norm(dim=-1))
        ang.append(command[:, 2].abs())
    assert figures["fall_rate"] == 0.0 and figures["stand_rate"] == 1.0
    assert figures["rate_limited"] == 0.0, "holding the stance never needs the rate limit"
    expected_lin, expected_ang = float(torch.stack(lin).mean()), float(torch.stack(ang).mean())
    assert abs(figures["tracking_error_lin"] - expected_lin) < 0.03, (figures, expected_lin)
    assert abs(figures["tracking_error_ang"] - expected_ang) < 0.03, (figures, expected_ang)
    assert expected_lin > 0.3, "the commands change and are mostly not zero"
    env.close()


def test_the_headline_is_the_recipe_whose_median_seed_ranks_best_and_the_bundle_the_best_run() -> None:
    bench = skills_bench()

    def run(error: float) -> dict:
        return {"final": {"tracking_error_lin": error, "tracking_error_ang": 2 * error, "fall_rate": error / 4}}

    recipes = {
        "preset": {"seeds": {"0": run(0.5), "1": run(0.2), "2": run(0.6)}},  # median 0.5, best single run
        "critic_terms": {"seeds": {"0": run(0.3), "1": run(0.4), "2": run(0.35)}},  # median 0.35
    }
    figures = bench.headline({"spot_joystick": {"recipes": recipes}})
    assert figures == {
        "spot_tracking_error_lin": 0.35,
        "spot_tracking_error_ang": 0.7,
        "spot_fall_rate": 0.0875,
        "spot_joystick_recipe": "critic_terms",
    }
    assert bench.best_run("spot_joystick", recipes) == ("preset", "1")
    stand = {
        "a": {"seeds": {"0": {"final": {"stand_rate": 0.5}}}},
        "b": {"seeds": {"0": {"final": {"stand_rate": 0.9}}}},
    }
    assert bench.headline({"gr1_stand": {"recipes": stand}}) == {"gr1_stand_rate": 0.9, "gr1_stand_recipe": "b"}


def test_a_residual_is_judged_against_its_own_base_and_runs_without_one_do_not_count() -> None:
    bench = skills_bench()

    def run(success: float, base: float | None) -> dict:
        return {"final": {"success": success}, "base": None if base is None else {"success": base}}

    recipes = {
        "rlpd": {"seeds": {"0": run(0.7, None), "1": run(0.6, None), "2": run(0.65, None)}},  # best, no base
        "residual": {"seeds": {"0": run(0.3, 0.1), "1": run(0.4, 0.1), "2": run(0.2, 0.25)}},
        "residual_small": {"seeds": {"0": run(0.1, 0.05)}},  # a higher ratio, a worse run
    }
    figures = bench.headline({"panda_push": {"recipes": recipes}})
    assert figures["push_success"] == pytest.approx(0.65) and figures["panda_push_recipe"] == "rlpd"
    assert figures["push_residual_over_bc"] == pytest.approx(3.0), "median of 3.0, 4.0 and 0.8"
    assert figures["panda_push_residual_recipe"] == "residual"
    assert "push_residual_over_bc" not in bench.headline({"panda_push": {"recipes": {"rlpd": recipes["rlpd"]}}})


def test_the_headline_ranks_only_recipes_with_three_seeds_once_one_has_them() -> None:
    bench = skills_bench()

    def run(rate: float) -> dict:
        return {"final": {"stand_rate": rate}}

    recipes = {"lucky": {"seeds": {"0": run(1.0)}}, "steady": {"seeds": {"0": run(0.8), "1": run(0.9)}}}
    assert bench.headline({"gr1_stand": {"recipes": recipes}})["gr1_stand_recipe"] == "lucky", "none has 3 yet"
    recipes["steady"]["seeds"]["2"] = run(0.95) | {"complete": False}
    assert bench.headline({"gr1_stand": {"recipes": recipes}})["gr1_stand_recipe"] == "lucky", "one under way"
    recipes["steady"]["seeds"]["2"]["complete"] = True
    assert bench.headline({"gr1_stand": {"recipes": recipes}}) == {"gr1_stand_rate": 0.9, "gr1_stand_recipe": "steady"}
    assert bench.best_run("gr1_stand", recipes) == ("lucky", "0"), "the bundle is still the best single run"

    def residual(success: float) -> dict:
        return {"final": {"success": success}, "base": {"success": 0.1}}

    push = {  # the residual figure too comes from the recipe with three seeds
        "lucky_residual": {"seeds": {"0": residual(0.9)}},
        "residual": {"seeds": {str(seed): residual(0.3) for seed in range(3)}},
    }
    figures = bench.headline({"panda_push": {"recipes": push}})
    assert figures["panda_push_residual_recipe"] == "residual"
    assert figures["push_residual_over_bc"] == pytest.approx(3.0)


def test_a_run_that_keeps_its_best_point_is_judged_by_that_point_on_held_out_episodes() -> None:
    bench = skills_bench()
    kept = {
        "final": {"stand_rate": 0.5},
        "curve": [{"env_steps": 1, "stand_rate": 1.0}, {"env_steps": 2, "stand_rate": 0.5}],
        "kept": {"env_steps": 1, "figures": {"stand_rate": 0.875}},  # the 1.0 point, judged again
    }
    last = {"final": {"stand_rate": 0.9}}
    cut_short = {"final": {"stand_rate": 0.6}, "kept": None}  # stopped before its held-out judgement
    recipes = {"keep_best": {"seeds": {"0": kept, "1": cut_short}}, "last": {"seeds": {"0": last}}}
    assert bench.delivered(kept) == {"stand_rate": 0.875} and bench.delivered(cut_short) == {"stand_rate": 0.6}
    assert bench.best_run("gr1_stand", recipes) == ("last", "0"), "0.9 at the end beats 0.875 held out"
    kept["kept"]["figures"]["stand_rate"] = 0.95
    assert bench.best_run("gr1_stand", recipes) == ("keep_best", "0")
    assert bench.headline({"gr1_stand": {"recipes": recipes}}) == {
        "gr1_stand_rate": pytest.approx(0.9),
        "gr1_stand_recipe": "last",
    }, "keep_best's median is (0.95 + 0.6) / 2"


def test_a_headline_median_carries_its_seeds_interval_and_its_figure_at_one_tick_of_latency() -> None:
    bench = skills_bench()

    def run(rate: float) -> dict:
        held_out = {"stand_rate": rate, "stand_rate_low": rate - 0.1, "stand_rate_high": rate + 0.05}
        return {"final": {"stand_rate": 1.0}, "held_out": held_out | {"latency1_stand_rate": rate / 2}}

    recipes = {"r": {"seeds": {"0": run(0.9), "1": run(0.7), "2": run(0.8)}}}
    assert bench.headline({"gr1_stand": {"recipes": recipes}}) == {
        "gr1_stand_rate": 0.8,
        "gr1_stand_rate_low": pytest.approx(0.7),
        "gr1_stand_rate_high": pytest.approx(0.85),
        "gr1_stand_rate_latency1": 0.4,
        "gr1_stand_recipe": "r",
    }, "the interval is the median seed's; held-out figures, not the last point's"
    del recipes["r"]["seeds"]["2"]["held_out"]
    figures = bench.headline({"gr1_stand": {"recipes": recipes}})
    assert "gr1_stand_rate_latency1" not in figures, "not every seed was judged at one tick"


def test_the_gate_figures_come_from_the_tasks_transfer_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = skills_bench()
    monkeypatch.setattr(bench, "SKILLS", tmp_path)
    rows = [
        {"name": "nominal", "required": True, "ratio": 1.0, "low": 0.95},
        {"name": "latency", "required": True, "ratio": 0.6, "low": 0.45},
        {"name": "all beyond", "required": False, "ratio": 0.1, "low": 0.05},
    ]
    gate = {"rows": rows, "passed": False, "reference_return": 200.0, "unshielded_return": 150.0}
    gate |= {"shield_intervention_rate": 0.08, "ros_shield_intervention_rate": 0.12}
    (tmp_path / "spot_joystick_transfer.json").write_text(json.dumps(gate))
    tasks = {"spot_joystick": {}, "gr1_stand": {}}
    assert bench.gate_figures(tasks) == {
        "spot_joystick_gate_passed": False,
        "spot_joystick_gate_lowest_lower": 0.45,
        "spot_joystick_shield_intervention_rate": 0.12,
        "spot_joystick_unshielded_ratio": 0.75,
    }, "the unjudged stress row does not count; the worse of the gate's and the node's rate"


def test_keep_best_is_refused_for_a_residual_before_anything_trains() -> None:
    with pytest.raises(ValueError, match="residual_panda_push: --keep-best"):
        skills_bench().run("panda_push", 0, 1.0, 64, 2, [], lambda _: None, "residual_panda_push", keep_best=True)


def test_a_run_that_tracks_better_but_falls_more_does_not_rank_first() -> None:
    bench = skills_bench()
    # Worst ratio to its floor: falls 0.47 / 0.05 = 9.4 against 0.19 / 0.05 = 3.8.
    falls = {"final": {"tracking_error_lin": 0.49, "tracking_error_ang": 0.48, "fall_rate": 0.47}}
    stays_up = {"final": {"tracking_error_lin": 0.56, "tracking_error_ang": 0.48, "fall_rate": 0.19}}
    recipes = {"falls": {"seeds": {"0": falls}}, "stays_up": {"seeds": {"0": stays_up}}}
    assert bench.best_run("spot_joystick", recipes) == ("stays_up", "0")
    assert bench.headline({"spot_joystick": {"recipes": recipes}})["spot_joystick_recipe"] == "stays_up"
    skill = bench.SKILLS_BY_TASK["spot_joystick"]
    assert skill.shortfall({"tracking_error_lin": 0.25, "tracking_error_ang": 0.1, "fall_rate": 0.0}) == 1.0
    assert bench.SKILLS_BY_TASK["gr1_stand"].shortfall({"stand_rate": 0.475}) == 2.0


def test_the_plot_has_a_panel_per_headline_figure_for_the_headline_recipe_with_labelled_floors() -> None:
    bench = skills_bench()

    def run(rate: float, kept: bool = False) -> dict:
        curve = [{"env_steps": 1000, "stand_rate": rate / 2}, {"env_steps": 2000, "stand_rate": rate}]
        return {"final": {"stand_rate": rate}, "curve": curve} | (
            {"kept": {"env_steps": 2000, "figures": {"stand_rate": rate}}} if kept else {}
        )

    spot = {"final": {"tracking_error_lin": 0.3, "tracking_error_ang": 0.2, "fall_rate": 0.1}}
    spot["curve"] = [{"env_steps": 1000, **spot["final"]}]
    tasks = {
        "spot_joystick": {"recipes": {"a": {"seeds": {"0": spot}}}},
        "gr1_stand": {"recipes": {"weak": {"seeds": {"0": run(0.5)}}, "strong": {"seeds": {"1": run(0.9, True)}}}},
    }
    fig = bench.skills_figure(tasks)
    assert [ax.get_title() for ax in fig.axes] == [
        "spot_joystick: tracking error lin\n(a)",
        "spot_joystick: tracking error ang\n(a)",
        "spot_joystick: fall rate\n(a)",
        "gr1_stand: stand rate\n(strong)",
    ], "one panel per headline figure, no empty cells"
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes]
    assert legends[2] == ["seed 0", "floor 0.05 (lower is better)"]
    assert legends[3] == ["seed 1", "kept, on held-out episodes", "floor 0.95 (higher is better)"]
    drawn = [tuple(line.get_ydata()) for line in fig.axes[3].get_lines()]
    assert (0.45, 0.9) in drawn and (0.25, 0.5) not in drawn, "only the headline recipe is drawn"


@pytest.mark.slow  # trains three points' worth of a tiny CrossQ
def test_a_run_saves_its_curve_at_every_point_so_one_cut_short_keeps_it(tmp_path: Path) -> None:
    saved: list[dict] = []
    tiny = ["env.num_envs=4", "env.task_params.episode_length=16", "total_steps=192", "warmup_steps=64"]
    tiny += ["crossq.batch_size=32", "crossq.actor_hidden=[32]", "crossq.critic_hidden=[32]"]
    tiny += ["checkpoint_every=0", "replay_capacity=1000"]
    overrides = [*tiny, "eval_every=0", f"log.root={tmp_path}"]
    result = skills_bench().run("panda_push", 0, 10.0, 64, 2, overrides, saved.append)
    assert [len(r["curve"]) for r in saved] == [1, 2, 3], "one save per point, each with the curve so far"
    assert not any(r["complete"] for r in saved) and result["complete"]
    assert [p["env_steps"] for p in result["curve"]] == [64, 128, 192]
    assert result["run_dir"] == saved[0]["run_dir"] and Path(result["run_dir"]).is_dir()


@pytest.mark.slow  # trains four points' worth of a tiny CrossQ
def test_keep_best_delivers_the_best_point_judged_on_other_episodes_and_exports_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = skills_bench()
    # A tiny learner never succeeds; the points' success is scripted (two tie for best, before the
    # last), their returns are the policy's own.
    script = iter([0.2, 0.7, 0.7, 0.5, 0.0, 0.1])  # four points, then held out as trained and at 1 tick

    def measure(policy, env, seed=bench.EVAL_SEED):
        return bench.manipulation(policy, env, seed) | {"success": next(script)}

    skill = dataclasses.replace(bench.SKILLS_BY_TASK["panda_push"], measure=measure)
    monkeypatch.setitem(bench.SKILLS_BY_TASK, "panda_push", skill)
    tiny = ["env.num_envs=4", "env.task_params.episode_length=16", "total_steps=256", "warmup_steps=64"]
    tiny += ["crossq.batch_size=32", "crossq.actor_hidden=[32]", "crossq.critic_hidden=[32]"]
    tiny += ["checkpoint_every=0", "replay_capacity=1000", "eval_every=0", f"log.root={tmp_path}"]
    result = bench.run("panda_push", 0, 10.0, 64, 4, tiny, lambda _: None, keep_best=True)
    curve, kept = result["curve"], result["kept"]
    assert [p["env_steps"] for p in curve] == [64, 128, 192, 256]
    assert kept["env_steps"] == 192, "the best point, the later one of a tie"
    assert result["final"]["success"] == 0.5 and bench.delivered(result)["success"] == 0.0, "held out, not picked"
    assert bench.delivered(result)["latency1_success"] == 0.1, "and again with one tick of latency"
    assert kept["figures"]["return"] != pytest.approx(curve[2]["return"]), "judged on other episodes"

    monkeypatch.setattr(bench, "SKILLS", tmp_path / "skills")
    judged = bench.SKILLS / "panda_push_transfer.json"
    judged.parent.mkdir()
    judged.write_text("{}")
    bundle = bench.keep(result["run_dir"], "panda_push", selected=True)
    assert not judged.exists(), "the gate judged the bundle this one replaces"
    meta = json.loads(bundle.with_name(bundle.name + ".json").read_text())
    assert meta["training"]["env_steps"] == 192, "the kept point's policy is the one exported"
    assert not (bench.SKILLS / "runs" / "panda_push" / bench.SELECTED).exists()
    # The kept directory's learner, on the held-out episodes, is the one that was judged there.
    from q2real.agents.callbacks import deterministic_policy
    from q2real.agents.export import load_run_policy

    config, one_env, agent, step = load_run_policy(bench.SKILLS / "runs" / "panda_push")
    one_env.close()
    assert step == 192
    held_out = bench.SKILLS_BY_TASK["panda_push"].held_out_episodes
    env = bench.eval_env(config, held_out, bench.HELD_OUT_SEED)
    returns = bench.manipulation(deterministic_policy(agent, env), env, bench.HELD_OUT_SEED)["return"]
    env.close()
    assert returns == pytest.approx(kept["figures"]["return"], rel=1e-5)


@pytest.mark.slow  # trains for 128 env steps
def test_a_preset_with_demonstrations_runs_on_the_residual_trainer_and_its_bundle_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from q2real.residual.dataset import write_lerobot
    from q2real.residual.experts import make_expert
    from q2real.residual.record import record
    from q2real.sim import EnvConfig, make

    demos_env = EnvConfig(task="panda_push", num_envs=4, task_params={"sparse": True, "episode_length": 16})
    env = make(demos_env)
    expert = make_expert("panda_push", env)
    demos = write_lerobot(record(env, expert, 4, demos_env, "expert", expert.reset).demos, tmp_path / "demos")
    env.close()
    bench = skills_bench()
    tiny = ["env.task_params.episode_length=16", "total_steps=128", "warmup_steps=32", "sac.batch_size=32"]
    tiny += ["sac.actor_hidden=[32]", "sac.critic_hidden=[32]", "checkpoint_every=0", "eval_every=0"]
    overrides = [*tiny, f"residual.demos={demos}", "residual.successful_only=false", f"log.root={tmp_path}"]
    result = bench.run("panda_push", 0, 10.0, 64, 2, overrides, lambda _: None, preset="residual_panda_push")
    assert result["complete"] and [p["env_steps"] for p in result["curve"]] == [64, 128]
    from q2real.residual.train import ResidualTrainConfig

    ran = load(ResidualTrainConfig, str(Path(result["run_dir"]) / "config.yaml"))
    assert ran.residual.demos == str(demos) and ran.residual.critic_warmup == 1000, "the residual preset's own"
    monkeypatch.setattr(bench, "SKILLS", tmp_path / "skills")
    bundle = bench.keep(result["run_dir"], "panda_push")
    assert bundle.is_file() and bundle.with_name(bundle.name + ".json").is_file()
    assert result["base"] is None

    # On a BC base: before the actor's first update (the preset's critic warm-up outlasts the run) the
    # residual is exactly its base, so both score the same on the same seeded episodes.
    from q2real.agents.common.run_dir import LogConfig
    from q2real.residual.bc import BCConfig, BCRun

    bc_config = BCConfig(dataset=str(demos), env=demos_env, hidden=(32,), max_epochs=3, successful_only=False)
    bc = BCRun(dataclasses.replace(bc_config, log=LogConfig(root=str(tmp_path), name="bc", tensorboard=False)))
    bc.run()
    on_base = [*overrides, f"residual.base={bc.path}"]
    result = bench.run("panda_push", 0, 10.0, 128, 8, on_base, lambda _: None, preset="residual_panda_push")
    assert set(result["base"]) == {"success", "success_low", "success_high", "return"}
    assert result["final"] == pytest.approx(result["base"], abs=1e-4), "the untouched residual is its base"
    held_out = {k: v for k, v in result["held_out"].items() if not k.startswith(bench.LATENCY1)}
    assert held_out == pytest.approx(result["held_out_base"], abs=1e-4), "and is on the held-out episodes too"


@pytest.mark.slow  # three short CrossQ runs on push, each judged on 256 held-out episodes at the end
def test_a_run_resumed_in_parts_continues_its_curve_replay_and_learner_exactly(tmp_path: Path) -> None:
    """`--resume`: a run stopped at 600 env steps and continued to 1200 ends where one run straight to 1200
    does: the same learner and replay, and the same skill at every point of the curve's grid; its kept
    point and time carry over."""
    from q2real.agents.common.checkpoint import load_checkpoint

    bench = skills_bench()
    small = [
        "env.num_envs=4",
        "warmup_steps=200",
        "crossq.actor_hidden=[32,32]",
        "crossq.critic_hidden=[32,32]",
        "crossq.batch_size=32",
        "crossq.renorm_warmup=50",
        "checkpoint_every=0",
        "checkpoint_replay=true",
        "replay_capacity=2000",
        "threads=1",
        f"log.root={tmp_path}",
    ]

    def part(name: str, steps: int, earlier: dict | None = None) -> dict:
        overrides = [*small, f"total_steps={steps}", f"log.name={name}"]
        return bench.run("panda_push", 0, 60.0, 400, 2, overrides, lambda _: None, keep_best=True, earlier=earlier)

    straight = part("straight", 1200)
    first = part("parts", 600)
    assert first["env_steps"] == 600 and first["selected"] is not None
    resumed = part("parts", 1200, first)
    assert resumed["run_dir"] == first["run_dir"] and resumed["env_steps"] == 1200
    steps = [p["env_steps"] for p in resumed["curve"]]
    assert steps == [400, 600, 800, 1200], "the points of both parts, on one grid"
    seconds = [p["seconds"] for p in resumed["curve"]]
    assert seconds == sorted(seconds) and seconds[1] == first["curve"][-1]["seconds"]
    grid = {p["env_steps"]: p for p in straight["curve"]}
    for point in resumed["curve"]:
        if point["env_steps"] in grid:
            mine = {k: v for k, v in point.items() if "seconds" not in k}
            theirs = {k: v for k, v in grid[point["env_steps"]].items() if "seconds" not in k}
            assert mine == theirs
    assert resumed["kept"] == {**straight["kept"], "seconds": resumed["kept"]["seconds"]}
    a, b = (load_checkpoint(Path(r["run_dir"]) / "checkpoint.pt") for r in (straight, resumed))
    for key in ("agent", "replay"):
        flat_a, flat_b = _tensors(a[key]), _tensors(b[key])
        assert flat_a.keys() == flat_b.keys() and all(torch.equal(flat_a[k], flat_b[k]) for k in flat_a), key


def _tensors(tree, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in _tensors(value, f"{prefix}/{key}").items()}
    if isinstance(tree, list | tuple):
        return {k: v for i, value in enumerate(tree) for k, v in _tensors(value, f"{prefix}/{i}").items()}
    return {}
