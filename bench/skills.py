"""Skills within a CPU hour: does the policy q2real trains do the job, judged on physics, not return.

One training run per `--task`, `--recipe` and `--seed` (each invocation; results merged into one
file, so the seeds of one task can run in separate sittings), from the task's skill preset (or
`--preset`) with the recipe's config overrides (the recipe names them: `--recipe critic_terms
env.task_params.critic_terms=true`; the preset alone is recipe `preset`). A preset with a `residual:`
section (a base policy, demonstrations in every batch: `residual_panda_push`) runs on the residual
trainer. A run stops after
`--minutes` of wall-clock (training, evaluation and all) or at the preset's `total_steps`; `--resume`
continues the same recipe and seed's run from its checkpoint for another `--minutes` (its curve, time
and kept point carry on), so a run of several hours is done in parts and is still one run. Every
`--eval-every` env steps the deterministic policy is judged on `--episodes` seeded episodes of the
training env's randomization (the same seeds at every point):

  spot_joystick  20 s episodes, commands drawn in the task's ranges and redrawn every 5 s (10 % of
                 them zero): mean |v_xy - cmd_xy| (m/s) and |w_z - cmd_z| (rad/s) over the steps
                 the robot is up, the share of episodes that end in a fall, and the share of
                 steps whose target the shield's rate limit cut (a gait that leans on it);
  gr1_joystick   the same for the humanoid walking, with the preset's pushes;
  gr1_stand      20 s episodes with the preset's pushes: the share still standing at the end;
  panda_push     the task's episodes: the share that puts the cube on the target.

`--keep-best` (part of the recipe) delivers the point that falls least short of the floors instead of
the last one: its checkpoint is kept as the run's `selected.pt`, and at the end its policy is judged
again on other seeded episodes and randomized robots (`HELD_OUT_SEED`), because the best of several
noisy points overstates itself on the episodes it was picked on. Every run that finishes judges its
delivered policy (the kept point's, or the last) on held-out episodes and robots (at least
`Skill.held_out_episodes`: 32, 256 for push), as trained and again with exactly one tick of action
latency (`latency1_` figures), each figure with its 95 % interval (`_low`, `_high`: Wilson for shares
of episodes, a bootstrap over episodes for the errors) and, for the legged tasks, the share of ticks
the shield changed a target by any rule (`shield_intervention`). A run's figures are its delivered
policy's: those held-out ones, or its last point's for a run cut short.

Headline keys (per task, of the recipes with 3 finished seeds or more, or of all while none has 3, the
recipe whose median over its seeds of each seed's delivered figures falls least short of the floors,
by the worst figure's ratio to its floor, so that a run tracking better while falling far more does
not outrank one that stays up; that recipe's medians):
`spot_tracking_error_lin`, `spot_tracking_error_ang`, `spot_fall_rate`, `gr1_stand_rate`,
`gr1_tracking_error_lin`, `gr1_tracking_error_ang`, `gr1_fall_rate`, `push_success`, each with the
median seed's interval (`<key>_low`, `<key>_high`) and the median at one tick of latency
(`<key>_latency1`) where the runs recorded them; per run also `env_steps`, `updates`,
`seconds`. From the full transfer gate on a task's bundle, when `bench/results/skills/<task>_transfer.json`
holds one (`q2real transfer bench/results/skills/runs/<task> --ros` writes it as the run's
`transfer.json`, copied there; replacing the bundle deletes it): `<task>_gate_passed`,
`<task>_gate_lowest_lower`, `<task>_shield_intervention_rate`, `<task>_unshielded_ratio`. A run on a BC
base (`residual.base=`) first judges the base alone on the same episodes, and at the end on the held-out
ones; `push_residual_over_bc` is the median over seeds of the residual's delivered success over its own
base's on the same episodes, for the best-ranked recipe that has a base. The best run's policy is
exported as `bench/results/skills/<task>.onnx`, its run directory kept under
`bench/results/skills/runs/` (networks only). Curves go to bench/results/skills.png (one line per
recipe and seed); figures to bench/results/skills.json, whose headline is also the last line printed.

Results: docs/results/skills.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch

from q2real.agents.callbacks import Callback, Every, StopTraining, deterministic_policy, evaluate_episodes
from q2real.agents.common.checkpoint import CHECKPOINT, load_checkpoint
from q2real.agents.config import TrainConfig
from q2real.agents.jobs import job_kind
from q2real.agents.train import Trainer
from q2real.configs.loader import load
from q2real.gate.evaluation import export_for_run
from q2real.gate.verdict import ratio_interval, wilson_interval
from q2real.hardware import robot_spec
from q2real.residual.base_env import BaseActionEnv
from q2real.residual.bc import executed, load_bc
from q2real.residual.train import ResidualTrainConfig, ResidualTrainer
from q2real.sim import VecEnv, make
from q2real.sim.registry import TASKS, describe
from q2real.sim.shield_clamps import RULES
from q2real.sim.tasks.floating_base import FloatingBaseTask

if TYPE_CHECKING:
    from matplotlib.figure import Figure

RESULTS = Path(__file__).resolve().parent / "results"
SKILLS = RESULTS / "skills"
PRESETS = {
    "spot_joystick": "crossq_spot_joystick",
    "gr1_stand": "crossq_gr1_legs_stand",
    "gr1_joystick": "crossq_gr1_joystick",
    "panda_push": "crossq_panda_push",
}
EVAL_SEED = 777_000
HELD_OUT_SEED = 778_000
"""Episodes (and randomized robots) a `--keep-best` run's kept policy is judged on: never the ones it
was picked on, so picking the best of several noisy points does not inflate its figures."""
SELECTED = "selected.pt"
"""The checkpoint of the point a `--keep-best` run keeps, beside the run's own `checkpoint.pt`."""
LATENCY1 = "latency1_"
"""Prefix of the delivered policy's figures with exactly one tick of action latency."""
ONLINE = "online_"
"""Prefix of a curve point's figures for the online actor, judged beside an averaged policy (`actor_average`)."""
RATE_LIMIT = RULES.index("RATE_LIMIT")
EPISODE_SECONDS = 20.0
K = TypeVar("K")


@dataclasses.dataclass(frozen=True)
class Skill:
    """How a task's skill is judged: `measure(policy, env, seed)` -> figures, each headline figure against
    its floor."""

    measure: Callable[[Callable[[torch.Tensor], torch.Tensor], VecEnv, int], dict[str, float]]
    headline: dict[str, str]
    """headline key -> the figure it reports."""
    floors: dict[str, float]
    """figure -> the floor it must reach (drawn on its curve)."""
    at_most: frozenset[str] = frozenset()
    """Figures whose floor is an upper bound (errors, fall rates); the others must reach theirs from below."""
    over_base: dict[str, str] = dataclasses.field(default_factory=dict)
    """headline key -> the figure a residual run reports as a ratio to its own base's, same episodes."""
    episodes: int = 32
    """Seeded evaluation episodes per point, unless `--episodes` says otherwise."""
    held_out_episodes: int = 32
    """At least this many held-out episodes judge the delivered policy (its interval's width)."""

    def shortfall(self, figures: dict[str, float]) -> float:
        """How far the worst figure is from its floor, as a ratio (at most 1 once every floor is met).
        Runs rank on it, so one that tracks better but falls more does not rank above one that stays up."""
        return max(
            figures[name] / floor if name in self.at_most else floor / max(figures[name], 1e-9)
            for name, floor in self.floors.items()
        )


def bounds(name: str, interval: tuple[float | None, float | None]) -> dict[str, float]:
    """A figure's 95 % interval as `<name>_low` and `<name>_high` (none for a single episode)."""
    low, high = interval
    return {} if low is None or high is None else {f"{name}_low": low, f"{name}_high": high}


def brief(figures: dict[str, float]) -> str:
    """Figures as a progress line shows them, without their intervals."""
    return ", ".join(f"{k} {v:.3f}" for k, v in figures.items() if not k.endswith(("_low", "_high")))


def rate_bounds(name: str, hits: torch.Tensor) -> dict[str, float]:
    """The Wilson interval of the share of episodes where `hits` is true."""
    return bounds(name, wilson_interval(int(hits.sum()), hits.numel()))


@torch.no_grad()
def locomotion(policy: Callable[[torch.Tensor], torch.Tensor], env: VecEnv, seed: int = EVAL_SEED) -> dict[str, float]:
    """Tracking errors over the steps each robot is up, and the share of episodes that end fallen;
    one episode per env, each the env's full length. Each figure comes with its 95 % interval over the
    episodes (bootstrap for the errors, Wilson for the rates), and with the share of ticks the shield
    changed the policy's target by any rule (`shield_intervention`) or by its rate limit alone."""
    task = env.task
    assert isinstance(task, FloatingBaseTask)
    obs = env.reset(seed=seed)
    n = env.num_envs
    up = torch.ones(n, dtype=torch.bool)
    fell = torch.zeros(n, dtype=torch.bool)
    lin = torch.zeros(n)
    ang = torch.zeros(n)
    steps = torch.zeros(n)
    clamped = torch.zeros(n)
    intervened = torch.zeros(n)
    for _ in range(env.episode_length):
        command = task.command.clone()
        result = env.step(policy(obs))
        # After an auto-reset the physics is the new episode's; the step that ended one is not measured.
        counted = up & ~result.done
        if task.command_dim:
            v, w = task.base_linear_velocity(env.physics), task.base_angular_velocity(env.physics)
            lin += torch.where(counted, (v[:, :2] - command[:, :2]).norm(dim=-1), 0.0)
            ang += torch.where(counted, (w[:, 2] - command[:, 2]).abs(), 0.0)
        steps += counted.float()
        if "shield_rules" in result.info:  # the rate limit's share is what a gait leaning on it shows
            rules = result.info["shield_rules"]
            clamped += (counted & rules[:, RATE_LIMIT]).float()
            intervened += (counted & rules.any(-1)).float()
        fell |= up & result.terminated
        up &= ~result.done
        obs = result.obs
    total = float(steps.sum().clamp_min(1))
    return {
        "tracking_error_lin": float(lin.sum()) / total,
        **bounds("tracking_error_lin", ratio_interval(lin, steps)),
        "tracking_error_ang": float(ang.sum()) / total,
        **bounds("tracking_error_ang", ratio_interval(ang, steps)),
        "fall_rate": float(fell.float().mean()),
        **rate_bounds("fall_rate", fell),
        "stand_rate": float(1 - fell.float().mean()),
        **rate_bounds("stand_rate", ~fell),
        "rate_limited": float(clamped.sum()) / total,
        "shield_intervention": float(intervened.sum()) / total,
    }


@torch.no_grad()
def manipulation(
    policy: Callable[[torch.Tensor], torch.Tensor], env: VecEnv, seed: int = EVAL_SEED
) -> dict[str, float]:
    episodes = evaluate_episodes(policy, env, seed)
    assert episodes.success is not None, f"{env.config.task} has no success test"
    return {
        "success": float(episodes.success.float().mean()),
        **rate_bounds("success", episodes.success),
        "return": float(episodes.returns.mean()),
    }


SKILLS_BY_TASK = {
    "spot_joystick": Skill(
        locomotion,
        {
            "spot_tracking_error_lin": "tracking_error_lin",
            "spot_tracking_error_ang": "tracking_error_ang",
            "spot_fall_rate": "fall_rate",
        },
        {"tracking_error_lin": 0.25, "tracking_error_ang": 0.3, "fall_rate": 0.05},
        frozenset({"tracking_error_lin", "tracking_error_ang", "fall_rate"}),
    ),
    "gr1_stand": Skill(locomotion, {"gr1_stand_rate": "stand_rate"}, {"stand_rate": 0.95}),
    "gr1_joystick": Skill(
        locomotion,
        {
            "gr1_tracking_error_lin": "tracking_error_lin",
            "gr1_tracking_error_ang": "tracking_error_ang",
            "gr1_fall_rate": "fall_rate",
        },
        {"tracking_error_lin": 0.25, "tracking_error_ang": 0.3, "fall_rate": 0.05},
        frozenset({"tracking_error_lin", "tracking_error_ang", "fall_rate"}),
    ),
    "panda_push": Skill(
        manipulation,
        {"push_success": "success"},
        {"success": 0.6},
        over_base={"push_residual_over_bc": "success"},
        episodes=64,
        held_out_episodes=256,
    ),
}


def judged_policy(agent, env: VecEnv, averaged: bool = True) -> Callable[[torch.Tensor], torch.Tensor]:
    """`agent`'s deterministic policy on `env`'s device: the judge may step native MuJoCo on the CPU
    while the learner sits on a GPU."""
    policy, device = deterministic_policy(agent, env, averaged), agent.device
    return lambda obs: policy(obs.to(device)).to(env.device)


class SkillCurve(Callback):
    """Judges the skill every `every` env steps and at the end; stops training after `budget` seconds.
    With `keep_best`, the learner of the point that falls least short of the floors (the later one on a
    tie) is kept: its weights in memory, its checkpoint as the run's `SELECTED`."""

    def __init__(
        self,
        skill: Skill,
        env: VecEnv,
        every: int,
        budget: float,
        on_point: Callable[[], None],
        keep_best: bool = False,
    ):
        self.skill, self.env, self.budget, self.on_point, self.keep_best = skill, env, budget, on_point, keep_best
        self.interval = every
        self.every = Every(every, 0)
        self.points: list[dict[str, float]] = []
        self.kept: dict[str, float] | None = None
        self.kept_weights: dict[str, torch.Tensor] = {}
        self.start = time.monotonic()
        self.earlier = 0.0
        """Seconds the run took in its earlier parts (`--resume`), counted into every point's `seconds`."""

    def continue_from(self, trainer, earlier: dict) -> None:
        """Continue the curve of an earlier part of this run (its saved result) from the step `trainer`
        resumed at: its points up to that step, its time, and with `keep_best` its kept point and weights."""
        self.points = [p for p in earlier["curve"] if p["env_steps"] <= trainer.step]
        # The run's wall-clock up to its checkpoint, or to the last point judged after it.
        self.earlier = max([trainer.logger.elapsed, *(p["seconds"] for p in self.points)])
        selected = earlier.get("selected")
        if self.keep_best and selected is not None:
            kept = [p for p in self.points if p["env_steps"] == selected]
            if kept and (trainer.path / SELECTED).is_file():
                self.kept = kept[-1]
                self.kept_weights = load_checkpoint(trainer.path / SELECTED)["agent"]

    def on_start(self, trainer) -> None:
        self.start = time.monotonic()
        self.every = Every(self.interval, trainer.step)  # the same grid of points across parts

    def point(self, trainer) -> None:
        began = time.monotonic()
        agent = trainer.agent
        figures = self.skill.measure(judged_policy(agent, self.env), self.env, EVAL_SEED)
        shown = brief(figures)
        if agent.actor_average is not None:  # the online actor on the same episodes: what averaging bought
            online = self.skill.measure(judged_policy(agent, self.env, averaged=False), self.env, EVAL_SEED)
            figures |= {f"{ONLINE}{k}": v for k, v in online.items()}
            shown += f" (online actor: {brief(online)})"
        point = {"env_steps": trainer.step, "updates": agent.updates, "seconds": began - self.start + self.earlier}
        self.points.append(point | figures | {"eval_seconds": time.monotonic() - began})
        print(f"  skill at {trainer.step:,} env steps, {point['seconds'] / 60:.1f} min: {shown}", flush=True)
        if self.keep_best and (self.kept is None or self.skill.shortfall(figures) <= self.skill.shortfall(self.kept)):
            self.keep(trainer, self.points[-1])
        self.on_point()

    def keep(self, trainer, point: dict[str, float]) -> None:
        self.kept = point
        self.kept_weights = {k: v.detach().clone() for k, v in trainer.agent.state_dict().items()}
        checkpoint = trainer.save_checkpoint()
        tmp = checkpoint.with_name(f".{SELECTED}.tmp")
        shutil.copyfile(checkpoint, tmp)
        os.replace(tmp, checkpoint.with_name(SELECTED))  # a stop mid-copy leaves the previous pick whole

    def on_iteration(self, trainer) -> None:
        if self.every.due(trainer.step):
            self.point(trainer)
        if time.monotonic() - self.start >= self.budget:
            raise StopTraining

    def on_end(self, trainer) -> None:
        if not self.points or self.points[-1]["env_steps"] != trainer.step:
            self.point(trainer)


def eval_env(config: TrainConfig, episodes: int, seed: int = EVAL_SEED) -> VecEnv:
    """The training env's randomization and task settings, `episodes` envs, 20 s episodes for the
    legged tasks (the task's own length for manipulation), stepped by native MuJoCo on the CPU
    whichever backend and device train, so every recipe is judged by the same simulator."""
    params = dict(config.env.task_params)
    if issubclass(TASKS.get(config.env.task, object), FloatingBaseTask):
        period = robot_spec(describe(config.env.task).robot).control_period
        params["episode_length"] = round(EPISODE_SECONDS / period)
    return make(config.env, num_envs=episodes, seed=seed, task_params=params, backend="mujoco", device="cpu")


def run(
    task: str,
    seed: int,
    minutes: float,
    every: int,
    episodes: int,
    overrides: list[str],
    save: Callable[[dict], None],
    preset: str | None = None,
    keep_best: bool = False,
    earlier: dict | None = None,
) -> dict:
    """Train `preset` (the task's CPU skill preset by default) with `overrides`, judged as it goes; the
    run's figures so far go to `save` at every point (`complete` false until it ends), so a run cut
    short keeps its curve. With `keep_best` the run delivers its best point's policy, judged at the end
    on held-out episodes (`kept`), instead of its last. `earlier`: this run's saved result, whose run
    directory it continues from its checkpoint for another `minutes` (`--resume`)."""
    preset = preset or PRESETS[task]
    seeded = [f"env.seed={seed}", *overrides]
    # A preset or recipe with a `residual:` section (a base policy, demonstrations in the batches) runs
    # on the residual trainer, the shared loop with its pieces swapped.
    residual = job_kind(preset, seeded) == "residual"
    if residual and keep_best:
        raise ValueError(f"{preset}: --keep-best judges a learner's own policy; a residual's runs on its base")
    config_class, trainer_class = (ResidualTrainConfig, ResidualTrainer) if residual else (TrainConfig, Trainer)
    config = load(config_class, preset, seeded)
    skill = SKILLS_BY_TASK[task]
    env = eval_env(config, episodes)
    base: dict[str, float] | None = None
    base_dir = config.residual.base if isinstance(config, ResidualTrainConfig) else None
    if base_dir:
        # The base alone on the episodes every point of the residual is judged on; then the residual's
        # policy sees what it trains on, each observation with the base's action appended.
        base, env = judge_base(skill, base_dir, env)
    trainer: Trainer | None = None  # set before the first point is judged
    kept: dict | None = None

    def result(complete: bool) -> dict:
        last = curve.points[-1]
        return {
            "run_dir": str(trainer.run_dir.path) if trainer is not None else None,
            "preset": preset,
            "overrides": overrides,
            "complete": complete,
            "env_steps": last["env_steps"],
            "updates": last["updates"],
            "seconds": last["seconds"],
            "episodes": episodes,
            "final": {k: v for k, v in last.items() if k not in ("env_steps", "updates", "seconds", "eval_seconds")},
            "curve": list(curve.points),
            "selected": curve.kept["env_steps"] if curve.kept is not None else None,
            "base": base,
            **({"kept": kept} if keep_best else {}),
        }

    curve = SkillCurve(skill, env, every, minutes * 60, lambda: save(result(False)), keep_best)
    try:
        resume = Path(earlier["run_dir"]) if earlier is not None else None
        trainer = trainer_class(config, [curve], resume=resume)
        if earlier is not None:
            curve.continue_from(trainer, earlier)
            print(f"  resumed {resume} at {trainer.step:,} env steps, {curve.earlier / 60:.1f} min", flush=True)
        trainer.run()
    finally:
        env.close()
    if curve.kept is not None:
        kept = {k: curve.kept[k] for k in ("env_steps", "updates", "seconds")}
        trainer.agent.load_state_dict(curve.kept_weights)
    n = max(episodes, skill.held_out_episodes)
    held_out = judge_held_out(skill, config, n, trainer.agent)
    if kept is not None:
        kept["figures"] = held_out
    judged: dict[str, object] = {"held_out": held_out, "held_out_episodes": n}
    if base_dir:  # the residual over its base on the same held-out episodes
        env = eval_env(config, n, HELD_OUT_SEED)
        try:
            judged["held_out_base"], _ = judge_base(skill, base_dir, env, HELD_OUT_SEED)
        finally:
            env.close()
    return result(True) | judged


def judge_held_out(skill: Skill, config: TrainConfig, episodes: int, agent) -> dict[str, float]:
    """The delivered learner's figures on `HELD_OUT_SEED`'s episodes and randomized robots, under the
    training randomization and again with exactly one tick of action latency (`LATENCY1` figures): the
    tick every real actuator chain adds, which a run trained without latency never met."""
    figures: dict[str, float] = {}
    for prefix, latency in (("", None), (LATENCY1, (1, 1))):
        env = judged_env(config, episodes, HELD_OUT_SEED, latency)
        try:
            measured = skill.measure(judged_policy(agent, env), env, HELD_OUT_SEED)
        finally:
            env.close()
        figures |= {prefix + k: v for k, v in measured.items()}
    print(f"  delivered policy on {episodes} held-out episodes: {brief(figures)}", flush=True)
    return figures


def judged_env(config: TrainConfig, episodes: int, seed: int, latency: tuple[int, int] | None = None) -> VecEnv:
    """`eval_env`, with `latency` ticks of action latency instead of the training range if given, and
    the base's action appended for a residual on a BC base (what its policy acts on)."""
    if latency is not None:
        randomization = dataclasses.replace(config.env.randomization, action_latency=latency)
        config = dataclasses.replace(config, env=dataclasses.replace(config.env, randomization=randomization))
    env = eval_env(config, episodes, seed)
    if isinstance(config, ResidualTrainConfig) and config.residual.base:
        _, base, _ = load_bc(config.residual.base)
        return BaseActionEnv(env, base, base.action_dim * base.chunk)
    return env


def judge_base(skill: Skill, base_dir: str, env: VecEnv, seed: int = EVAL_SEED) -> tuple[dict[str, float], VecEnv]:
    """The BC base's figures on `env`'s `seed` episodes, and `env` extended with the base's action."""
    base_config, base, _ = load_bc(base_dir)
    figures = skill.measure(executed(base, base_config, env), env, seed)
    print(f"  base {base_dir}: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()), flush=True)
    return figures, BaseActionEnv(env, base, base.action_dim * base.chunk)


def keep(run_dir: str | Path, name: str, checkpoint: bool = True, selected: bool = False) -> Path:
    """Keep the run directory (networks only) as `SKILLS/runs/<name>` with its bundle inside, which is
    all `q2real transfer` needs, and the bundle as `SKILLS/<name>.onnx`; returns the bundle's path.
    `selected`: the run's `SELECTED` checkpoint is the one kept and exported, not its last."""
    kept = SKILLS / "runs" / name
    shutil.rmtree(kept, ignore_errors=True)
    for judged in (SKILLS / f"{name}_transfer.json", SKILLS / f"{name}_transfer.png"):
        judged.unlink(missing_ok=True)  # the gate judged the bundle this replaces
    skipped = ["events.*", "*.tmp", SELECTED, *([] if checkpoint and not selected else ["checkpoint*"])]
    shutil.copytree(run_dir, kept, ignore=shutil.ignore_patterns(*skipped))
    if selected:
        shutil.copy2(Path(run_dir) / SELECTED, kept / CHECKPOINT)
    export_for_run(kept if selected else run_dir, kept / "policy.onnx")
    bundle = SKILLS / f"{name}.onnx"
    shutil.copy2(kept / "policy.onnx", bundle)
    shutil.copy2(kept / "policy.onnx.json", bundle.with_name(bundle.name + ".json"))
    return bundle


def write_atomically(path: Path, text: str) -> None:
    """A reader (or a run stopped mid-write) sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def best(scores: dict[K, float]) -> K:
    """The key of the smallest shortfall."""
    return min(scores, key=scores.__getitem__)


def delivered(run: dict) -> dict[str, float]:
    """The figures of the policy a run delivers (its kept point's for a `--keep-best` run, else its last
    point's): on held-out episodes once the run finished, else as its last point was judged."""
    return run.get("held_out") or (run["kept"]["figures"] if run.get("kept") else run["final"])


def best_run(task: str, recipes: dict[str, dict]) -> tuple[str, str]:
    """(recipe, seed) of the run whose delivered policy falls least short of the floors."""
    skill = SKILLS_BY_TASK[task]
    return best(
        {(r, s): skill.shortfall(delivered(run)) for r, data in recipes.items() for s, run in data["seeds"].items()}
    )


HEADLINE_SEEDS = 3
"""Seeds a recipe needs before the headline ranks it: one lucky seed must not speak for a recipe."""


def ranked(recipes: dict[str, dict]) -> dict[str, dict]:
    """The recipes the headline ranks: those with `HEADLINE_SEEDS` finished seeds or more (a run under
    way or cut short does not count), or all of them while none has that many."""

    def finished(recipe: dict) -> int:
        return sum(run.get("complete", True) for run in recipe["seeds"].values())

    return {name: r for name, r in recipes.items() if finished(r) >= HEADLINE_SEEDS} or recipes


def median(runs: dict[str, dict], figure: Callable[[dict[str, float]], float]) -> float:
    return statistics.median(figure(delivered(run)) for run in runs.values())


def beside(key: str, figure: str, runs: dict[str, dict]) -> dict[str, float]:
    """What goes beside a headline median: the 95 % interval of the median seed's figure (the lower
    middle one of an even count; `<key>_low`, `<key>_high`) and the median with one tick of latency
    (`<key>_latency1`), where the runs have them."""
    ordered = sorted((delivered(run) for run in runs.values()), key=lambda figures: figures[figure])
    middle = ordered[(len(ordered) - 1) // 2]
    out = {f"{key}_{end}": middle[f"{figure}_{end}"] for end in ("low", "high") if f"{figure}_{end}" in middle}
    if all(f"{LATENCY1}{figure}" in figures for figures in ordered):
        out[f"{key}_latency1"] = statistics.median(figures[f"{LATENCY1}{figure}"] for figures in ordered)
    return out


def headline(tasks: dict[str, dict]) -> dict[str, object]:
    """Per task, the recipe whose median shortfall over its seeds is smallest (of those `ranked`), with
    its median figures."""
    out: dict[str, object] = {}
    for task, data in tasks.items():
        skill = SKILLS_BY_TASK[task]
        recipes = data["recipes"]
        recipe = best({name: median(r["seeds"], skill.shortfall) for name, r in ranked(recipes).items()})
        for key, figure in skill.headline.items():
            out[key] = median(recipes[recipe]["seeds"], lambda final, figure=figure: final[figure])
            out |= beside(key, figure, recipes[recipe]["seeds"])
        out[f"{task}_recipe"] = recipe
        # Residual runs against their own bases: the best-ranked recipe among those that have one.
        over = ranked({name: r for name, r in recipes.items() if all(run.get("base") for run in r["seeds"].values())})
        if over and skill.over_base:
            recipe = best({name: median(r["seeds"], skill.shortfall) for name, r in over.items()})
            for key, figure in skill.over_base.items():
                out[key] = statistics.median(
                    delivered(run)[figure] / max((run.get("held_out_base") or run["base"])[figure], 1e-9)
                    for run in over[recipe]["seeds"].values()
                )
            out[f"{task}_residual_recipe"] = recipe
    return out


def gate_figures(tasks: dict[str, dict]) -> dict[str, object]:
    """Per task, what the full transfer gate (`q2real transfer`, committed as `<task>_transfer.json`)
    said of the task's bundle: passed, the lowest lower bound of a judged row, how often the shield
    changed a target (the worse of the gate's episodes and the node's) and the return without the
    shield over the return with it. `keep` deletes a gate's file when it replaces the bundle it judged."""
    out: dict[str, object] = {}
    for task in tasks:
        path = SKILLS / f"{task}_transfer.json"
        if not path.is_file():
            continue
        gate = json.loads(path.read_text())
        lowers = [row["ratio"] if row["low"] is None else row["low"] for row in gate["rows"] if row["required"]]
        rates = [gate.get(k) for k in ("shield_intervention_rate", "ros_shield_intervention_rate")]
        rates = [rate for rate in rates if rate is not None]
        out[f"{task}_gate_passed"] = gate["passed"]
        if lowers:
            out[f"{task}_gate_lowest_lower"] = min(lowers)
        if rates:
            out[f"{task}_shield_intervention_rate"] = max(rates)
        if gate.get("unshielded_return") is not None and gate["reference_return"] > 0:  # a ratio of returns > 0
            out[f"{task}_unshielded_ratio"] = gate["unshielded_return"] / gate["reference_return"]
    return out


def skills_figure(tasks: dict[str, dict]) -> Figure:
    """One panel per headline figure of each task, drawn for the recipe the headline reports (one line
    per seed; every other recipe stays in skills.json), its floor labelled with which way is better.
    A kept point is a star (judged on held-out episodes) and a residual's own base a dotted line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = headline(tasks)
    panels = [(task, figure) for task in tasks for figure in SKILLS_BY_TASK[task].headline.values()]
    columns = len(panels) if len(panels) <= 5 else 3
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows), squeeze=False)
    colours = plt.get_cmap("tab10").colors
    for ax, (task, figure) in zip(axes.flat, panels, strict=False):
        skill, recipe = SKILLS_BY_TASK[task], chosen[f"{task}_recipe"]
        for seed, run in sorted(tasks[task]["recipes"][recipe]["seeds"].items()):
            colour = colours[int(seed) % len(colours)]
            xs = [p["env_steps"] for p in run["curve"]]
            ax.plot(xs, [p[figure] for p in run["curve"]], marker="o", ms=3, color=colour, label=f"seed {seed}")
            if f"{ONLINE}{figure}" in run["curve"][0]:  # an averaged policy's online actor
                online = [p[f"{ONLINE}{figure}"] for p in run["curve"]]
                ax.plot(xs, online, ls="--", lw=0.7, alpha=0.5, color=colour, label="online actor (dashed)")
            if run.get("kept"):
                kept = run["kept"]
                ax.plot(kept["env_steps"], kept["figures"][figure], marker="*", ms=11, ls="", color=colour,
                        label="kept, on held-out episodes")  # fmt: skip
            if run.get("base"):
                ax.axhline(run["base"][figure], ls=":", color=colour, label="its BC base (dotted)")
        better = "lower" if figure in skill.at_most else "higher"
        floor = skill.floors[figure]
        ax.axhline(floor, color="k", ls="--", lw=0.8, label=f"floor {floor:g} ({better} is better)")
        ax.set_title(f"{task}: {figure.replace('_', ' ')}\n({recipe})", fontsize=10)
        # Recipes differ 50-fold in env steps (demonstrations against many envs): a log axis shows both.
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(_steps)
        ax.xaxis.set_minor_formatter(lambda x, _: _steps(x, _) if str(round(x))[0] in "25" else "")
        ax.set_xlabel("env steps (log)")
        ax.grid(alpha=0.3)
        unique = dict(zip(*reversed(ax.get_legend_handles_labels()), strict=True))  # a marking once, not per seed
        ax.legend(unique.values(), unique.keys(), fontsize=7, frameon=False)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    return fig


def _steps(x: float, _position=None) -> str:
    """An env-step tick label: 200k, 1M, 2.5M."""
    return f"{x / 1e6:g}M" if x >= 1e6 else f"{x / 1000:g}k"


def plot(tasks: dict[str, dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = skills_figure(tasks)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(PRESETS), required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recipe", default="preset", help="the name the overrides' results merge under")
    parser.add_argument("--minutes", type=float, default=60.0, help="wall-clock budget of the run")
    parser.add_argument("--eval-every", type=int, default=50_000, help="env steps between skill points")
    parser.add_argument("--episodes", type=int, help="evaluation episodes per point (default: 32, 64 for panda_push)")
    parser.add_argument("--preset", help="the preset the overrides apply to (default: the task's skill preset)")
    parser.add_argument(
        "--keep-best",
        action="store_true",
        help="deliver the point that falls least short of the floors, judged again on held-out episodes "
        "(part of the recipe)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue this recipe and seed's run from its checkpoint for another --minutes: one run in parts",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides on top of the preset")
    args = parser.parse_args()
    preset = args.preset or PRESETS[args.task]

    path = RESULTS / "skills.json"
    # Where the run's files go is not part of the recipe.
    overrides = [o for o in args.overrides if not o.startswith("log.")]

    def merged_recipes() -> dict[str, dict]:
        tasks = json.loads(path.read_text())["tasks"] if path.is_file() else {}
        recipes = tasks.get(args.task, {}).get("recipes", {})
        ran = recipes.get(args.recipe)
        identity = (overrides, preset, args.keep_best)
        if (
            ran is not None
            and (ran["overrides"], ran.get("preset", PRESETS[args.task]), ran.get("keep_best", False)) != identity
        ):
            parser.error(
                f"--recipe {args.recipe}: ran with preset {ran.get('preset', PRESETS[args.task])}, overrides "
                f"{ran['overrides']} and keep_best {ran.get('keep_best', False)}; name this anew"
            )
        return tasks

    earlier = None
    if args.resume:
        earlier = merged_recipes().get(args.task, {}).get("recipes", {}).get(args.recipe, {}).get("seeds", {})
        earlier = earlier.get(str(args.seed))
        if earlier is None or not earlier.get("run_dir") or not (Path(earlier["run_dir"]) / CHECKPOINT).is_file():
            where = earlier.get("run_dir") if earlier else None
            parser.error(
                f"--resume: no run of --task {args.task} --recipe {args.recipe} --seed {args.seed} with a checkpoint "
                f"to continue ({path}: run directory {where})"
            )
    else:
        merged_recipes()  # refuse a clash before an hour of training, not after
    episodes = SKILLS_BY_TASK[args.task].episodes if args.episodes is None else args.episodes
    if episodes < 1:
        parser.error(f"--episodes: expected >= 1, got {episodes}")

    def save(result: dict) -> dict[str, dict]:
        tasks = merged_recipes()
        recipes = tasks.setdefault(args.task, {"recipes": {}})["recipes"]
        recipe = recipes.setdefault(
            args.recipe,
            {"preset": preset, "overrides": overrides, **({"keep_best": True} if args.keep_best else {}), "seeds": {}},
        )
        recipe["seeds"][str(args.seed)] = result
        best = best_run(args.task, recipes)
        tasks[args.task]["best_run"] = {"recipe": best[0], "seed": int(best[1])}
        if result["complete"] and best == (args.recipe, str(args.seed)):
            keep(result["run_dir"], args.task, selected=bool(result.get("kept")))
        figures = headline(tasks) | gate_figures(tasks)
        write_atomically(path, json.dumps(figures | {"tasks": tasks}, indent=2))
        plot(tasks, RESULTS / "skills.png")
        return tasks

    result = run(
        args.task,
        args.seed,
        args.minutes,
        args.eval_every,
        episodes,
        args.overrides,
        save,
        preset,
        args.keep_best,
        earlier,
    )
    tasks = save(result)
    figures = headline(tasks) | gate_figures(tasks)
    print(f"\n{'task':<15} {'recipe':<16} {'seed':>4} {'env steps':>10} {'updates':>9} {'minutes':>8}  final")
    for task, data in sorted(tasks.items()):
        for name, recipe_ in sorted(data["recipes"].items()):
            for seed, run_ in sorted(recipe_["seeds"].items()):
                shown = ", ".join(f"{k} {v:.3f}" for k, v in run_["final"].items())
                if run_.get("kept"):
                    shown += f"; kept at {run_['kept']['env_steps']:,}, held out: " + ", ".join(
                        f"{k} {v:.3f}" for k, v in run_["kept"]["figures"].items()
                    )
                if run_.get("base"):
                    shown += "; its base: " + ", ".join(f"{k} {v:.3f}" for k, v in run_["base"].items())
                shown += "" if run_.get("complete", True) else " (cut short)"
                print(
                    f"{task:<15} {name:<16} {seed:>4} {run_['env_steps']:>10,} {run_['updates']:>9,} "
                    f"{run_['seconds'] / 60:>8.1f}  {shown}"
                )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
