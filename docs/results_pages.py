"""The results pages: every figure on them read from the JSON the benchmarks in bench/ write.

Rerunning a benchmark and then `python docs/generate.py` is all it takes to update a page, so a page
cannot drift from the file it cites. The prose here says what a figure means and how it was measured
(each section opens with its script's own summary); what a figure came to is only ever read from the
JSON. Every file the pages read is noted in `loaded`, so a test can require that every result in
bench/results/ is shown on some page.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from q2real.gate.verdict import wilson_interval

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
FROM_PAGE = "../../bench/results/"
"""bench/results/ as seen from a page in docs/results/: images are linked there, and Sphinx copies them."""

loaded: set[str] = set()
"""The JSON files the pages have read, as paths under bench/results/."""


@dataclass(frozen=True)
class Bench:
    """A benchmark script, the results page that shows what it writes, and the command that reruns it."""

    script: str
    page: str
    command: str


BENCHES = [
    Bench("skills", "skills", "python bench/skills.py --task TASK --seed N [--recipe NAME OVERRIDES]"),
    Bench("videos", "skills", "python bench/videos.py"),
    Bench("transfer", "gate", "python bench/transfer.py"),
    Bench("vs_sb3", "speed", "python bench/vs_sb3.py"),
    Bench("sim_throughput", "speed", "python bench/sim_throughput.py"),
    Bench("robot_throughput", "speed", "python bench/robot_throughput.py"),
    Bench("replay_sampling", "speed", "python bench/replay_sampling.py"),
    Bench("pql_vs_sync", "speed", "python bench/pql_vs_sync.py"),
    Bench("distributed", "speed", "python bench/distributed.py --threshold 300"),
    Bench("grad_sync", "speed", "run by bench/distributed.py under torchrun"),
    Bench("contention", "speed", "python bench/contention.py"),
    Bench("gpu_smoke", "speed", "python bench/gpu_smoke.py"),
    Bench("chunks", "learners", "python bench/chunks.py"),
    Bench("safe", "learners", "python bench/safe.py"),
    Bench("dspear_robosuite", "learners", "python bench/dspear_robosuite.py"),
    Bench("stream_hopper", "learners", "python bench/stream_hopper.py --seeds 0 1"),
    Bench("residual", "learners", "python bench/residual.py"),
    Bench("deploy_loop", "deploy-loop", "python bench/deploy_loop.py"),
    Bench("shield_tick", "deploy-loop", "python bench/shield_tick.py"),
    Bench("policy_latency", "deploy-loop", "python bench/policy_latency.py"),
    Bench("finetune", "finetuning", "python bench/finetune.py [--task panda_reach] [--methods free anchored ...]"),
]
"""Every script in bench/, in the order the index lists them; its docstring names the same page."""
BENCH_OF = {b.script: b for b in BENCHES}


# Reading and writing


def load(name: str) -> Any:
    """bench/results/`name`, parsed, and noted in `loaded`."""
    loaded.add(name)
    return json.loads((RESULTS / name).read_text())


def found(pattern: str) -> list[str]:
    """The files under bench/results/ that match `pattern`, as paths under it, sorted."""
    return sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.glob(pattern))


def docstring(script: str) -> str:
    """bench/`script`.py's module docstring (read, not imported: the scripts import torch and MuJoCo)."""
    return ast.get_docstring(ast.parse((BENCH / f"{script}.py").read_text())) or ""


def summary(script: str) -> str:
    """The first paragraph of a script's docstring, on one line: what it compares, in its own words."""
    return " ".join(docstring(script).split("\n\n")[0].split())


def num(x: Any, digits: int = 3) -> str:
    """`x` to `digits` significant figures, thousands grouped, no exponent above 1; a dash where missing."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, str):
        return x
    if isinstance(x, int):
        return f"{x:,}"
    if abs(x) >= 10**digits:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def ratio(x: float | None, low: float | None = None, high: float | None = None) -> str:
    """A ratio to three decimals, with its interval where there is one."""
    if x is None:
        return "–"
    return f"{x:.3f}" + ("" if low is None or high is None else f" [{low:.3f}, {high:.3f}]")


def pct(x: float | None) -> str:
    """A share as a percentage to three significant figures."""
    return "–" if x is None else f"{100 * x:.3g} %"


def steps(n: float) -> str:
    """An env-step count as the pages write it: 5.86M, 120k."""
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.3g}k" if n >= 1e3 else f"{n:.0f}"


def code(text: Any) -> str:
    """`text` as inline code."""
    return f"`{text}`"


def table(header: list[str], rows: Iterable[list[str]]) -> str:
    """A Markdown table; a `|` inside a cell is escaped so that it stays one cell."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(c).replace("|", "\\|") for c in line) + " |" for line in lines) + "\n\n"


def image(name: str, alt: str) -> str:
    """bench/results/`name` shown on the page, where the benchmark's plot is committed."""
    return f"![{alt}]({FROM_PAGE}{name})\n\n" if (RESULTS / name).is_file() else ""


def section(script: str, title: str, written: list[str], lead: bool = True) -> str:
    """A benchmark's heading, its own summary (unless the page already opened with it) and what it wrote."""
    files = ", ".join(code(f"bench/results/{f}") for f in written)
    opening = f"{summary(script)}\n\n" if lead else ""
    return f"## {title}\n\n{opening}`{BENCH_OF[script].command}` wrote {files}.\n\n"


def keys(data: dict, meanings: dict[str, str]) -> str:
    """The headline keys named in `meanings`: their value in `data` (with its `_interval` where one is
    recorded) and what each is; a dash for a key the JSON lacks."""
    rows = []
    for key, meaning in meanings.items():
        value = data.get(key)
        cell = num(value) if not isinstance(value, list) else ", ".join(num(v) for v in value)
        if isinstance(data.get(f"{key}_interval"), list):
            cell += " [{}, {}]".format(*(num(v) for v in data[f"{key}_interval"]))
        rows.append([code(key), cell, meaning])
    return table(["key", "value", "what it is"], rows)


def machine(facts: dict[str, Any]) -> str:
    """What the JSON records about the machine it ran on; saying so where it records nothing."""
    recorded = ", ".join(f"{name} {num(v)}" for name, v in facts.items() if v is not None)
    return (
        f"Machine, as the JSON records it: {recorded}.\n\n" if recorded else "The JSON does not record the machine.\n\n"
    )


# Skills


@dataclass(frozen=True)
class Skill:
    """How bench/skills.py judges a task (its `Skill`, less the measuring): headline keys and floors."""

    headline: dict[str, str]
    """headline key -> the figure it reports."""
    floors: dict[str, float]
    at_most: frozenset[str]
    """Figures whose floor is an upper bound."""
    over_base: dict[str, str]
    """headline key -> the figure a residual run reports as a ratio to its own base's."""

    def meets(self, figure: str, value: float) -> bool:
        """Whether `value` of `figure` is on the right side of its floor."""
        return value <= self.floors[figure] if figure in self.at_most else value >= self.floors[figure]

    def met(self, figures: dict[str, float]) -> bool:
        """Whether every floor is met."""
        return all(self.meets(f, figures[f]) for f in self.floors)

    def floor(self, figure: str) -> str:
        """The floor of `figure` as the pages write it: ≤ 0.25 m/s."""
        bound = "≤" if figure in self.at_most else "≥"
        return f"{bound} {shown(figure, self.floors[figure])}"


def declared_skills() -> dict[str, Skill]:
    """Each task's `Skill` as bench/skills.py's `SKILLS_BY_TASK` declares it, read from its source so the
    floors on the page are the ones the benchmark judges by."""
    tree = ast.parse((BENCH / "skills.py").read_text())
    declared = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SKILLS_BY_TASK" for t in node.targets)
    )
    assert isinstance(declared, ast.Dict)
    out = {}
    for task, call in zip(declared.keys, declared.values, strict=True):
        assert isinstance(call, ast.Call) and task is not None
        nodes = dict(zip(("measure", "headline", "floors", "at_most"), call.args, strict=False))
        nodes |= {k.arg: k.value for k in call.keywords if k.arg}

        def literal(name: str, default: Any, nodes: dict[str, ast.expr] = nodes) -> Any:
            node = nodes.get(name)
            if isinstance(node, ast.Call):  # frozenset({...})
                node = node.args[0]
            return default if node is None else ast.literal_eval(node)

        out[ast.literal_eval(task)] = Skill(
            literal("headline", {}),
            literal("floors", {}),
            frozenset(literal("at_most", set())),
            literal("over_base", {}),
        )
    return out


FIGURES = {
    "tracking_error_lin": ("lin error", "m/s"),
    "tracking_error_ang": ("yaw error", "rad/s"),
    "fall_rate": ("falls", "%"),
    "stand_rate": ("standing", "%"),
    "success": ("success", "%"),
    "rate_limited": ("rate-limited steps", "%"),
    "return": ("return", ""),
}
"""figure -> (its name in a table, its unit; % for shares)."""
EPISODE_SHARES = {"fall_rate", "stand_rate", "success"}
"""Figures that are shares of episodes, so they have a count and an interval."""


def shown(figure: str, value: float, episodes: int | None = None) -> str:
    """A figure with its unit; a share of episodes also as a count with its 95 % interval."""
    unit = FIGURES.get(figure, (figure, ""))[1]
    if unit != "%":
        return f"{num(value)} {unit}".strip()
    if figure not in EPISODE_SHARES or not episodes:
        return pct(value)
    low, high = wilson_interval(round(value * episodes), episodes)
    return f"{pct(value)} ({round(value * episodes)} of {episodes}) [{100 * low:.0f}, {100 * high:.0f}]"


def delivered(run: dict) -> dict[str, float]:
    """The figures of the policy a run delivers, as bench/skills.py judges them: on held-out episodes
    once the run finished (its kept point's for a `--keep-best` run), else its last point's."""
    return run.get("held_out") or (run["kept"]["figures"] if run.get("kept") else run["final"])


def judged_on(run: dict) -> str:
    """Which episodes a run's delivered figures come from."""
    if run.get("held_out") or run.get("kept"):
        return "held-out episodes"
    return "the last point's episodes"


def held_out_episodes(run: dict) -> int | None:
    """How many episodes judged a run's delivered figures."""
    return run.get("held_out_episodes", run.get("episodes"))


def skills_page() -> str:
    """The skills: each task's headline against its floors, every run, and the exported policies."""
    data = load("skills.json")
    skills = declared_skills()
    out = summary("skills") + "\n\n"
    out += (
        "Each run trains from the task's skill preset with a recipe's overrides for up to an hour of wall-clock "
        "and judges the deterministic policy every so many env steps on seeded episodes of the training env's "
        "randomization. A `--keep-best` run delivers the point that falls least short of the floors, judged "
        "again on other seeded episodes and randomized robots (held out), because the best of several noisy "
        "points overstates itself on the episodes it was picked on; any other run delivers its last point. "
        "A run that finished since runs record it judges its delivered policy on held-out episodes and "
        "robots (at least 32, 256 for `panda_push`), as trained and again with exactly one tick of action "
        "latency. Shares of episodes carry their 95 % Wilson interval where the run records its episode "
        "count, and a headline the interval of its median seed where that seed recorded one.\n\n"
    )
    out += section("skills", "Headline", ["skills.json", "skills.png", "skills/"], lead=False)
    out += (
        "Per task, of the recipes with three finished seeds or more (all of them while none has three), the "
        "recipe whose median over seeds falls least short of the floors; each figure is that recipe's median "
        "over its seeds, beside the lowest and highest seed. A residual recipe's figure is its success over "
        "its own base's, on the same episodes.\n\n"
    )
    rows = []
    for task, skill in skills.items():
        if task not in data["tasks"]:
            continue
        recipes = data["tasks"][task]["recipes"]
        for key, figure in skill.headline.items():
            runs = recipes[data[f"{task}_recipe"]]["seeds"].values()
            seeds = [delivered(run)[figure] for run in runs]
            judged = (
                "held-out episodes"
                if all(judged_on(run) == "held-out episodes" for run in runs)
                else ("the last point's episodes")
            )
            interval = f" [{num(data[key + '_low'])}, {num(data[key + '_high'])}]" if key + "_low" in data else ""
            latency = shown(figure, data[key + "_latency1"]) if key + "_latency1" in data else "–"
            rows.append(
                [
                    code(task),
                    code(key),
                    f"**{shown(figure, data[key])}**{interval}",
                    latency,
                    f"{shown(figure, min(seeds))} – {shown(figure, max(seeds))} ({len(seeds)} seeds)",
                    code(data[f"{task}_recipe"]),
                    judged,
                    skill.floor(figure),
                    num(skill.meets(figure, data[key])),
                ]
            )
        for key, figure in skill.over_base.items():
            if key not in data:
                continue
            runs = recipes[data[f"{task}_residual_recipe"]]["seeds"].values()
            seeds = [delivered(run)[figure] / run["base"][figure] for run in runs]
            rows.append(
                [
                    code(task),
                    code(key),
                    f"**{num(data[key])}x**",
                    "–",
                    f"{num(min(seeds))}x – {num(max(seeds))}x ({len(seeds)} seeds)",
                    code(data[f"{task}_residual_recipe"]),
                    "the same episodes as its base",
                    "> 1x its base",
                    num(data[key] > 1),
                ]
            )
    header = ["task", "key", "headline [median seed's 95 % interval]", "at 1 tick of latency", "seeds", "recipe"]
    out += table([*header, "judged on", "floor", "met"], rows)
    gated = [task for task in skills if f"{task}_gate_passed" in data]
    if gated:
        out += (
            "The full transfer gate on each bundle (`q2real transfer bench/results/skills/runs/TASK --ros`, "
            "[Transfer gate](gate.md)): whether it passed, the lowest lower bound of a judged row, how often "
            "the shield changed a target (the worse of the gate's episodes and the node's), and the return "
            "without the shield over the return with it.\n\n"
        )
        rows = [
            [
                code(task),
                num(data[f"{task}_gate_passed"]),
                num(data[f"{task}_gate_lowest_lower"]),
                pct(data.get(f"{task}_shield_intervention_rate")),
                num(data.get(f"{task}_unshielded_ratio")),
            ]
            for task in gated
        ]
        out += table(
            ["task", "gate passed", "lowest lower bound", "shield intervention", "unshielded / shielded"], rows
        )
    out += image("skills.png", "each skill's figures against env steps, one line per recipe and seed")
    gifs = found("videos/*.gif")
    if gifs:
        out += "## On the robot\n\n" + summary("videos") + "\n\n"
        out += "".join(image(gif, f"{Path(gif).stem}.onnx on its robot") for gif in gifs)
    for task, skill in skills.items():
        if task in data["tasks"]:
            out += skill_runs(task, data, skill)
    out += bundles()
    return out


def skill_runs(task: str, data: dict, skill: Skill) -> str:
    """Every run of a task: what it reached and what its delivered policy scored."""
    recipes = data["tasks"][task]["recipes"]
    best = data["tasks"][task].get("best_run", {})
    runs = [(name, seed, run) for name, recipe in recipes.items() for seed, run in recipe["seeds"].items()]
    extra = [f for f in ("rate_limited", "return") if any(f in delivered(run) for _, _, run in runs)]
    based = any(run.get("base") for _, _, run in runs)
    out = f"## `{task}`\n\nFloors: " + ", ".join(f"{FIGURES[f][0]} {skill.floor(f)}" for f in skill.floors) + ". "
    out += (
        f"The headline recipe is `{data[f'{task}_recipe']}`; the exported bundle is the best single run's "
        f"(`{best.get('recipe')}` seed {best.get('seed')}).\n\n"
    )
    header = ["recipe", "seed", "env steps", "updates", "minutes", "judged on"]
    header += [FIGURES[f][0] for f in [*skill.floors, *extra]] + (["base alone"] if based else []) + ["floors met"]
    rows = []
    for name, seed, run in runs:
        figures = delivered(run)
        judged = f"held out, point at {steps(run['kept']['env_steps'])}" if run.get("kept") else "last point"
        judged += ", held out" if run.get("held_out") and not run.get("kept") else ""
        if run.get("complete") is False:
            judged += " (cut short)"
        cells = [code(name), seed, steps(run["env_steps"]), steps(run["updates"]), f"{run['seconds'] / 60:.0f}", judged]
        count = held_out_episodes(run)
        cells += [shown(f, figures[f], count) if f in figures else "–" for f in [*skill.floors, *extra]]
        if based:
            base = run.get("base")
            cells.append(shown("success", base["success"], run.get("episodes")) if base else "–")
        cells.append(num(skill.met(figures)))
        rows.append(cells)
    out += table(header, rows)
    kept = [(name, seed, run) for name, seed, run in runs if run.get("kept")]
    if kept:
        out += (
            "Kept points: the figure on the episodes the point was picked on, on held-out episodes, and the "
            "run's last point on the picking episodes.\n\n"
        )
        rows = []
        for name, seed, run in kept:
            picked = next((p for p in run.get("curve", []) if p["env_steps"] == run["kept"]["env_steps"]), {})
            for f in skill.floors:
                rows.append(
                    [
                        code(name),
                        seed,
                        steps(run["kept"]["env_steps"]),
                        FIGURES[f][0],
                        shown(f, picked[f]) if f in picked else "–",
                        shown(f, run["kept"]["figures"][f], held_out_episodes(run)),
                        shown(f, run["final"][f]),
                    ]
                )
        out += table(["recipe", "seed", "kept at", "figure", "picked on", "held out", "last point"], rows)
    out += "Recipes: the preset each ran from and the overrides that name the recipe.\n\n"
    rows = []
    for name, recipe in recipes.items():
        first = next(iter(recipe["seeds"].values()), {})
        rows.append(
            [
                code(name),
                code(recipe.get("preset", first.get("preset"))),
                code(" ".join(recipe["overrides"])) if recipe["overrides"] else "–",
            ]
        )
    return out + table(["recipe", "preset", "overrides"], rows)


def bundles() -> str:
    """The committed skill bundles and the run directories kept beside them."""
    out = "## Exported policies\n\n"
    out += (
        "The best run of each task is exported as `bench/results/skills/TASK.onnx` (its metadata beside it), "
        "and its run directory is kept under `bench/results/skills/runs/` for the transfer gate.\n\n"
    )
    rows = []
    for name in found("skills/*.onnx.json"):
        meta = load(name)
        training = meta["training"]
        config = training["config"]
        actor = config.get(config.get("algo"), {}).get("actor_hidden")
        rows.append(
            [
                code(name.removesuffix(".json")),
                code(meta["task"]),
                meta["robot"]["name"],
                training["algo"],
                "x".join(map(str, actor)) if actor else "–",
                f"{meta['observation']['dim']} → {meta['action']['dim']}",
                f"{meta['control_period'] * 1000:g} ms",
                steps(training["env_steps"]),
                num(config["env"]["seed"]),
                meta["exported_at"][:10],
            ]
        )
    header = ["bundle", "task", "robot", "learner", "actor", "obs → actions", "period", "env steps", "seed", "exported"]
    out += table(header, rows)
    rows = []
    for run in sorted({Path(p).parent.as_posix() for p in found("skills/runs/*/*.json")}):
        meta = load(f"{run}/meta.json") if (RESULTS / run / "meta.json").is_file() else {}
        bundle = load(f"{run}/policy.onnx.json") if (RESULTS / run / "policy.onnx.json").is_file() else None
        twin = f"skills/{Path(run).name}.onnx.json"
        same = bundle is not None and (RESULTS / twin).is_file() and load(twin) == bundle
        versions = meta.get("versions", {})
        rows.append(
            [
                code(f"{run}/"),
                code(" ".join(meta.get("command", []))),
                meta.get("started", "–")[:10],
                ", ".join(f"{k} {v}" for k, v in versions.items() if k in ("torch", "mujoco")),
                num(meta.get("threads", {}).get("chosen")),
                f"same as `{twin}`" if same else "its own" if bundle else "–",
            ]
        )
    out += "Run directories (the gate's reports from them are on [the gate's page](gate.md)):\n\n"
    return out + table(["run directory", "command", "started", "versions", "threads", "bundle"], rows)


# Transfer gate

GATE = (
    "`q2real transfer RUN_DIR` runs a run's exported bundle behind the safety shield on the physics backend "
    "the run did not train on, under every effect the robot will meet, each sized for that robot. Every row's "
    "return is a ratio of the return as trained (the same bundle and shield on the training backend and "
    "randomization, on the very same episodes), so each ratio carries a paired 95 % bootstrap interval. A row "
    "passes when its interval's lower end clears the threshold, and the gate passes when every required row "
    "does. *In range* rows are effects the run trained under, *beyond* rows effects it did not; both are "
    "judged, and *all beyond* (each effect twice past its row) is reported, not judged. The *shield* row is "
    "the return with the shield over the return without it; where the return without it is not positive a "
    "ratio says nothing, and the row passes when the shielded return is at least the unshielded one. "
    "*Via ROS 2 node* runs some of the same episodes through `q2real deploy --sim` in real time over DDS."
)

CONTROLS = {
    "panda_reach_positive": "Positive control: the `sac_panda_reach` preset",
    "panda_reach_no_shield_in_loop": "No shield in the loop: the preset with `env.shield_in_loop=false`",
    "panda_reach_negative": "Negative control: no randomization, no shield penalty, no previous action observed",
    "spot_joystick": "Spot joystick: the `sac_spot_joystick` preset",
}
TRANSFER_KEYS = {
    "transfer_ratio_in_range_lower": "the positive control's lowest in-range interval bound",
    "positive_control_passes": "1 when the gate passed the positive control",
    "negative_control_fails": "1 when the gate failed the negative control",
    "shield_intervention_rate_ratio": "share of ticks the node's shield changed the command, ROS path: "
    "trained without the shield in the loop / with it",
    "shield_change_ratio": "how far the clamps moved the command, ROS path: without / with",
    "sim_shield_intervention_rate_ratio": "the same share on the gate's simulated episodes: without / with",
    "sim_shield_change_ratio": "the same distance on the gate's simulated episodes: without / with",
    "reach_return_as_trained": "the positive control's return as trained",
    "reach_return_without_shield": "the positive control's return as trained, no shield",
    "ros_shield_intervention_rate_with": "share of ROS-path ticks the shield changed, trained with it in the loop",
    "ros_shield_change_with": "how far it moved them (action units per joint and tick)",
    "shield_intervention_rate_with": "the same share on the gate's episodes",
    "shield_change_with": "the same distance on the gate's episodes",
    "ros_shield_intervention_rate_without": "share of ROS-path ticks the shield changed, trained without it",
    "ros_shield_change_without": "how far it moved them",
    "shield_intervention_rate_without": "the same share on the gate's episodes",
    "shield_change_without": "the same distance on the gate's episodes",
    "locomotion_transfer_ratio_in_range": "Spot's all-together ratio",
}


def gate_page() -> str:
    """Every transfer gate report in bench/results/: the bench's controls and the skill bundles'."""
    bench = load("transfer.json")
    controls = {name: title for name, title in CONTROLS.items() if name in bench}
    controls |= {name: code(name) for name in sorted(set(bench) - set(CONTROLS) - {"headline"})}
    skills = {name: load(name) for name in found("skills/*_transfer*.json")}
    kept = {name: load(name) for name in found("skills/runs/*/transfer.json")}
    twins = {
        name: next((other for other, known in skills.items() if known == data), None) for name, data in kept.items()
    }
    reports = [(title, bench[name]) for name, title in controls.items()]
    reports += [(code(name), data) for name, data in skills.items()]
    reports += [(code(name), data) for name, data in kept.items() if not twins[name]]
    out = GATE + "\n\n"
    rows = [
        [
            title,
            code(data["task"]),
            data["gate_backend"],
            num(data["episodes"]),
            "passed" if data["passed"] else "**failed**",
            lowest_judged(data),
        ]
        for title, data in reports
    ]
    out += table(["report", "task", "gated on", "episodes per row", "verdict", "lowest judged bound"], rows)
    out += section("transfer", "Panda reach controls and Spot", ["transfer.json"])
    out += keys(bench["headline"], TRANSFER_KEYS)
    for name, title in controls.items():
        out += f"### {title}\n\n" + report(bench[name])
    out += "## Skill bundles\n\n"
    out += (
        "The committed skill bundles ([Skills](skills.md)) through `q2real transfer "
        "bench/results/skills/runs/TASK --ros`, each report copied beside the bundle; the ones with fewer rows "
        "ran `--only nominal` with more episodes per row, which a push or a fall needs for a narrow interval.\n\n"
    )
    for name, data in [*skills.items(), *((n, d) for n, d in kept.items() if not twins[n])]:
        out += f"### `{name}`\n\n" + report(data) + image(name.replace(".json", ".png"), f"gate rows of {name}")
    for name, twin in twins.items():
        if twin:
            out += f"`bench/results/{name}`, the run directory's own report, is the same report as `{twin}`.\n\n"
    return out


def lowest_judged(data: dict) -> str:
    """The bound the verdict hangs on: the lowest interval end (a lone episode's ratio) over the judged rows,
    in range of training or not, with the row's name."""
    judged = [(r["ratio"] if r["low"] is None else r["low"], r["name"]) for r in data["rows"] if r["required"]]
    if not judged:
        return "–"
    bound, name = min(judged)
    return f"{ratio(bound)} (`{name}`)"


def report(data: dict) -> str:
    """One gate report: its verdict, the shield's interventions and every row."""
    verdict = "**passed**" if data["passed"] else "**failed** on " + ", ".join(data["failed_rows"])
    out = (
        f"`{data['task']}` trained on {data['trained_backend']}, gated on {data['gate_backend']}, "
        f"{data['episodes']} episodes per row, threshold {num(data['threshold'])}. Return as trained "
        f"{num(data['reference_return'], 4)} ({num(data['unshielded_return'], 4)} without the shield; "
        f"{num(data['in_training_return'], 4)} in the run's own last evaluation). Verdict: {verdict}; lowest "
        f"judged bound {lowest_judged(data)}.\n\n"
    )
    rules = ", ".join(f"{rule} {pct(share)}" for rule, share in data.get("shield_rule_rates", {}).items())
    out += (
        f"The shield changed the command on {pct(data['shield_intervention_rate'])} of the gate's ticks ({rules}), "
        f"by {num(data['shield_change'])} action units per joint and tick on average"
    )
    if data.get("ros_shield_intervention_rate") is not None:
        out += (
            f"; through the node on {pct(data['ros_shield_intervention_rate'])} of ticks, by "
            f"{num(data['ros_shield_change'])}"
        )
    out += "." + (f" Trained in {num(data['train_seconds'])} s." if "train_seconds" in data else "") + "\n\n"
    costs = any(row.get("cost") is not None for row in data["rows"])
    rows = []
    for row in data["rows"]:
        verdict = "pass" if row["passed"] else "**FAIL**" if row["required"] else "not judged"
        cells = [row["name"], "in range" if row["in_range"] else "beyond", row["magnitude"], num(row["mean"], 4)]
        cells += [ratio(row["ratio"], row["low"], row["high"]), verdict]
        rows.append(cells + ([num(row.get("cost"))] if costs else []))
    header = ["row", "range", "size", "return", "ratio [95 % interval]", "verdict"] + (["cost"] if costs else [])
    return out + table(header, rows)


# Speed


def speed_page() -> str:
    """q2real against its peers on throughput, update rate and wall-clock."""
    out = (
        "Each benchmark runs q2real and its peer side by side in one invocation, alternating where they would "
        "share the cores, so a ratio compares the two over the same minutes of the same machine. Every ratio "
        "says which side is on top.\n\n"
    )
    out += sections(
        vs_sb3, sim_throughput, robot_throughput, replay_sampling, pql_vs_sync, distributed, contention, gpu_smoke
    )
    return out


def sections(*makers: Callable[[dict], str]) -> str:
    """Each bench's section, made from its JSON (named as the function is), for the benches that wrote one."""
    return "".join(
        make(load(f"{make.__name__}.json")) for make in makers if (RESULTS / f"{make.__name__}.json").is_file()
    )


def vs_sb3(data: dict) -> str:
    """Time to a return threshold and updates per second against stable-baselines3."""
    out = section("vs_sb3", "SAC against stable-baselines3", ["vs_sb3.json"])
    out += machine({"torch threads per side": data.get("torch_threads")})
    out += (
        "Time to threshold: training wall-clock (evaluation excluded) until the deterministic evaluation mean "
        "first reaches the threshold on gymnasium's Pendulum-v1, median over seeds "
        f"({', '.join(map(str, data['seeds']))}); the ratio is SB3's time over q2real's, so above 1 means "
        "q2real is faster.\n\n"
    )
    rows = []
    for row, key in [("matched", "time_to_threshold_ratio"), ("tuned", "tuned_time_ratio")]:
        runs = data["runs"].get(row)
        if runs:
            sides = [
                f"{num(runs[s]['env_steps'])} steps, {num(runs[s]['seconds'])} s ({runs[s]['reached']})"
                for s in ("sb3", "q2real")
            ]
            rows.append([row, *sides, f"**{ratio(runs['time_ratio'])}** (`{key}`)"])
    out += table(["row", "stable-baselines3", "q2real", "SB3 time / q2real time"], rows)
    out += (
        "Gradient updates per second at equal networks, batch and optimizer on a filled replay; the ratio is "
        "q2real's over SB3's (sb3-contrib's for CrossQ), above 1 when q2real is faster. q2real runs four ways: "
        "compiled steps in float32, eager, and both with bfloat16 products.\n\n"
    )
    rows = []
    for sizes, learner, peer, mine, suffix in [
        ("SAC, Pendulum-v1's sizes", "SAC", "sb3_updates_per_s", "q2real", ""),
        ("SAC, the Spot preset's sizes", "SAC", "sb3_updates_per_s_spot_recipe", "q2real", "_spot_recipe"),
        ("CrossQ, the Spot preset's sizes", "CrossQ", "sb3_crossq_updates_per_s_spot_recipe", "crossq", "_spot_recipe"),
    ]:
        prefix = "crossq_" if learner == "CrossQ" else ""
        for way, infix in [
            ("compiled", ""),
            ("eager", "_eager"),
            ("bf16 compiled", "_bf16"),
            ("bf16 eager", "_bf16_eager"),
        ]:
            rate = data.get(f"{mine}{infix}_updates_per_s{suffix}")
            key = f"{prefix}updates_per_s_ratio{infix}{suffix}"
            if rate is not None:
                rows.append([sizes, way, num(data.get(peer), 4), num(rate, 4), f"{ratio(data.get(key))} (`{key}`)"])
    return out + table(
        ["learner and sizes", "q2real steps", "peer updates/s", "q2real updates/s", "q2real / peer"], rows
    )


def sim_throughput(data: dict) -> str:
    """The native backend's env steps per second against its peers, per model and batch."""
    out = section("sim_throughput", "Simulator throughput", ["sim_throughput.json"])
    out += machine({"CPU cores": data.get("cpu_count"), "MuJoCo": data.get("mujoco")})
    out += (
        "Env steps per second, each env running the same episode from the model's initial state. Ratios are "
        "q2real's backend over the peer, above 1 when q2real is faster; *of C limit* is q2real's backend over "
        "MuJoCo's own multi-threaded rollout of the whole batch in one call.\n\n"
    )
    rows = [
        [
            f"{r['model']} ({r['substeps']})",
            num(r["batch"]),
            num(r.get("q2real_env")),
            num(r["q2real_backend"]),
            num(r["mj_step_loop"]),
            num(r["gymnasium_sync"]),
            num(r["c_limit"]),
            f"{num(r['ratio_vs_single_thread'])}x",
            f"{num(r['ratio_vs_gymnasium'])}x",
            pct(r["fraction_of_c_limit"]),
        ]
        for r in data["rows"]
    ]
    header = ["model (substeps)", "batch", "q2real env", "q2real backend", "mj_step loop", "gymnasium", "C limit"]
    out += table(header + ["backend / loop", "backend / gymnasium", "of C limit"], rows)
    return out + keys(
        data,
        {
            "ratio_vs_single_thread": "best over models at batch >= 256 of q2real backend / mj_step loop",
            "ratio_vs_single_thread_model": "the model it was measured on",
            "ratio_vs_single_thread_batch": "and the batch",
            "best_fraction_of_c_limit": "the highest share of the C limit q2real's backend reached",
        },
    )


def robot_throughput(data: dict) -> str:
    """The robot tasks' env steps per second against bare MuJoCo and robosuite."""
    out = section("robot_throughput", "Robot task throughput", ["robot_throughput.json"])
    out += machine({})
    out += (
        "Env steps per second with uniform random actions. *q2real / bare* is the task's env over "
        "`mujoco.rollout` on the same compiled model and substeps (the physics alone: at most 1); *q2real / "
        "robosuite* is q2real at robosuite's batch over robosuite's Panda (above 1 when q2real is faster).\n\n"
    )
    rows = []
    for r in data["rows"]:
        over = r.get("q2real_over_bare")
        robosuite = f"{num(r['robosuite'])}" if r.get("robosuite") is not None else "–"
        rows.append(
            [code(r["task"]), num(r["batch"]), num(r["q2real"]), num(r.get("bare_mujoco")), num(over), robosuite]
        )
    out += table(["task", "envs", "q2real", "bare MuJoCo", "q2real / bare", "robosuite"], rows)
    rows = [
        [
            code(task),
            num(rate),
            num(data.get("q2real_over_bare_mujoco", {}).get(task)),
            num(data.get("robosuite_peer_ratio", {}).get(task)),
        ]
        for task, rate in data.get("env_steps_per_s", {}).items()
    ]
    out += f"Headline at {num(data.get('batch'))} envs:\n\n"
    out += table(["task", "`env_steps_per_s`", "`q2real_over_bare_mujoco`", "`robosuite_peer_ratio`"], rows)
    peers = [
        [code(peer), "ran" if status == "ran" else f"did not run: `{status}`"]
        for peer, status in data.get("peers", {}).items()
    ]
    return out + "Peers:\n\n" + table(["peer", "status"], peers)


def replay_sampling(data: dict) -> str:
    """Prioritized sampling's cost against uniform sampling and cpprb."""
    out = section("replay_sampling", "Prioritized replay sampling", ["replay_sampling.json"])
    out += machine({})
    out += (
        "Milliseconds per batch (transitions gathered, 1-step targets) from one storage of 1M transitions, "
        "and for the prioritized samplers the write-back of the batch's priorities; medians of repeated calls, "
        "one torch thread.\n\n"
    )
    rows = [
        [
            num(r["batch"]),
            num(r["uniform_ms"]),
            num(r["prioritized_ms"]),
            num(r["update_ms"]),
            num(r["cpprb_sample_ms"]),
            num(r["cpprb_update_ms"]),
            ratio(r["prioritized_samples_per_s"] / r["cpprb_samples_per_s"]),
            ratio(r["priority_updates_per_s"] / r["cpprb_updates_per_s"]),
        ]
        for r in data["rows"]
    ]
    header = ["batch", "uniform ms", "prioritized ms", "priority update ms", "cpprb sample ms", "cpprb update ms"]
    out += table(header + ["samples/s, ours / cpprb", "updates/s, ours / cpprb"], rows)
    return out + keys(
        data,
        {
            "prioritized_over_uniform_cost": "prioritized time per batch / uniform's, worst over batch sizes",
            "ours_over_reference_speed": "sampled transitions/s, ours / cpprb's, worst over batch sizes",
            "ours_over_reference_update_speed": "priority updates/s, ours / cpprb's, worst over batch sizes",
        },
    )


def pql_vs_sync(data: dict) -> str:
    """Parallel Q-Learning's wall-clock to a threshold and its scaling with envs."""
    out = section("pql_vs_sync", "Parallel Q-Learning against the synchronous loop", ["pql_vs_sync.json"])
    out += machine({})
    out += (
        "Wall-clock of the whole run, which stops at the first evaluation reaching the return threshold of "
        f"{num(data['threshold'])} (PQL's process start-up included); the headline is the synchronous loop's "
        "mean over PQL's, above 1 when PQL is faster.\n\n"
    )
    rows = [
        [
            num(seed),
            num(data["sync_wall_s"][i], 4),
            num(data["sync_env_steps"][i]),
            num(data["pql_wall_s"][i], 4),
            num(data["pql_env_steps"][i]),
        ]
        for i, seed in enumerate(data["seeds"])
    ]
    out += table(["seed", "synchronous s", "synchronous env steps", "PQL s", "PQL env steps"], rows)
    out += keys(
        data,
        {
            "time_to_threshold_ratio": "synchronous wall-clock / PQL's, mean over seeds",
            "all_reached": "whether every run reached the threshold",
            "sync_cpu_cores": "CPU seconds per wall-clock second, synchronous",
            "pql_cpu_cores": "the same for PQL",
        },
    )
    rows = [
        [num(int(envs)), num(r["sync"]), num(r["pql"]), ratio(r["pql"] / r["sync"])]
        for envs, r in data.get("env_steps_per_s", {}).items()
    ]
    out += "Steady-state env steps per second (median logging window after warm-up):\n\n"
    return out + table(["envs", "synchronous", "PQL", "PQL / synchronous"], rows)


def distributed(data: dict) -> str:
    """Two torchrun ranks against one process, and the gradient all-reduce against DDP."""
    out = section("distributed", "Data-parallel training", ["distributed.json"])
    out += machine({})
    rows = [[ranks, num(r["env_steps_per_s"]), num(r["updates_per_s"])] for ranks, r in data["throughput"].items()]
    out += "Throughput after warm-up (env steps/s over all ranks; updates/s per rank):\n\n"
    out += table(["ranks", "env steps/s", "updates/s"], rows)
    out += keys(
        data,
        {
            "scaling_efficiency_2": "2-rank env steps/s / (2 x 1-rank env steps/s)",
            "grad_exactness_max_abs_diff": "largest difference between a 2-rank TD3 update and one process's "
            "update on both batches concatenated",
        },
    )
    threshold = data.get("threshold")
    if threshold:
        reached = threshold["reached"]
        out += (
            f"To an evaluation return of {num(threshold['return'])}, at most {num(threshold['max_steps'])} env "
            "steps; two ranks take half the updates per env step unless they run 2 updates per iteration:\n\n"
        )
        rows = []
        for run, label in [
            ("1", "1 rank"),
            ("2", "2 ranks"),
            ("2_updates_per_step_2", "2 ranks, 2 updates per iteration"),
        ]:
            if f"{run}_best_eval_return" in reached or run in reached:
                hit = reached.get(run)
                rows.append(
                    [
                        label,
                        num(hit["steps"]) if hit else "not reached",
                        num(hit["seconds"]) if hit else "–",
                        num(reached.get(f"{run}_best_eval_return")),
                    ]
                )
        out += table(["run", "env steps", "seconds", "best evaluation return"], rows)
    if data.get("grad_sync"):
        out += f"### Gradient averaging\n\n{summary('grad_sync')}\n\n"
        rows = [
            [
                name.replace("hidden_", "") + " wide",
                num(r["parameters"]),
                num(r["no_sync_ms"]),
                num(r["flat_all_reduce_ms"]),
                num(r["ddp_ms"]),
                ratio(r["ddp_ms"] / r["flat_all_reduce_ms"]),
            ]
            for name, r in data["grad_sync"].items()
        ]
        header = ["critic", "weights", "no sync ms", "flat all-reduce ms (q2real)", "DDP ms", "DDP / flat"]
        out += table(header, rows)
    return out


def contention(data: dict) -> str:
    """Each torch thread policy quiet and beside a busy process."""
    out = section("contention", "Torch threads beside a busy process", ["contention.json"])
    out += machine({})
    out += (
        f"Training wall-clock of {num(data['steps'])} env steps, median over {num(data['rounds'])} interleaved "
        "rounds; *busy / quiet* above 1 is what a neighbour costs.\n\n"
    )
    rows = [
        [policy, num(s["quiet"]), num(s["busy"]), ratio(s["busy"] / s["quiet"])]
        for policy, s in data["seconds"].items()
    ]
    out += table(["torch threads", "quiet s", "beside a busy process s", "busy / quiet"], rows)
    rows = [
        [
            run,
            t["policy"],
            num(t["chosen"]),
            ", ".join(f"{num(i)} at {n}" for n, i in t.get("iterations", {}).items()) or "–",
        ]
        for run, t in data.get("threads", {}).items()
    ]
    out += "The thread count each run used (the default tunes it while training):\n\n"
    out += table(["run", "policy", "used most", "iterations at each"], rows)
    return out + keys(
        data,
        {
            "busy_over_quiet": "the default's busy time / its quiet time (floor: at most 1.5)",
            "quiet_vs_best": "the default's quiet speed / the faster fixed count's, quiet (floor: at least 0.9)",
        },
    )


def gpu_smoke(data: dict) -> str:
    """The GPU smoke run's rates and its skill runs' curves."""
    out = section("gpu_smoke", "GPU smoke run", ["gpu_smoke.json"])
    if "skipped" in data:
        return out + f"Skipped: {data['skipped']}\n\n"
    out += machine({"device": data.get("device")})
    runs = sorted({k.removesuffix("_env_steps_per_s") for k in data if k.endswith("_env_steps_per_s")})
    skills = {name for name, run in data.items() if isinstance(run, dict) and "preset" in run}
    rows = [[code(name), num(data[f"{name}_env_steps_per_s"]), num(data.get(f"{name}_updates_per_s"))] for name in runs]
    out += (
        f"Steady-state env steps/s and updates/s (the median logging window after the first, which holds the "
        f"XLA compile); the learner rows train `{data.get('task')}` with {num(data.get('num_envs'))} envs for "
        f"{num(data.get('steps'))} env steps"
    )
    out += ":\n\n" if set(runs) - skills else ". This file holds no learner rows, only the skill runs':\n\n"
    out += table(["run", "env steps/s", "updates/s"], rows)
    for run in (data[name] for name in sorted(skills)):
        out += (
            f"### `{run['preset']}`\n\nJudged on physics as [Skills](skills.md) judges the CPU recipes, on native "
            f"MuJoCo. {num(run['env_steps'])} env steps and {num(run['updates'])} updates in "
            f"{num(run['seconds'])} s; bundle `{Path(run['bundle']).name}` ({num(run['bundle_bytes'])} bytes).\n\n"
        )
        figures = [f for f in FIGURES if f in run["final"]]
        rows = [
            [steps(p["env_steps"]), steps(p["updates"]), f"{p['seconds'] / 60:.1f}", *(shown(f, p[f]) for f in figures)]
            for p in run["curve"]
        ]
        out += table(["env steps", "updates", "minutes", *(FIGURES[f][0] for f in figures)], rows)
        out += table(["key", "value"], [[code(k), num(v)] for k, v in run.get("headline", {}).items()])
    return out


# Learners


def learners_page() -> str:
    """q2real's learners against their baselines at equal settings, seeds and budget."""
    out = (
        "Each benchmark trains q2real's learner and its baseline with the same settings, seeds and budget, "
        "one after the other in one invocation, and reports the means over seeds at the budget.\n\n"
    )
    out += sections(chunks, safe, residual, dspear_robosuite, stream_hopper)
    return out


def chunks(data: dict) -> str:
    """Action-chunk critics against n-step SAC on the sparse tasks."""
    out = section("chunks", "Action chunks", ["chunks.json"])
    out += (
        f"Chunks of {data['chunk']} actions, {data['envs']} envs, {data['hidden']}-wide networks, seeds "
        f"{', '.join(map(str, data['seeds']))}. On these sparse tasks the reward is 1 per step at the goal, so "
        "a return counts the steps there and success is a return above 0.\n\n"
    )
    rows = []
    for task, learners in data["learners"].items():
        for name, r in learners.items():
            rows.append(
                [
                    f"{task}, {num(data['env_steps'][task])} steps, threshold {num(data['thresholds'][task])}",
                    name,
                    num(r["final_return"]),
                    num(r["final_return_std_over_seeds"]),
                    num(r["final_success"]),
                    num(r["steps_to_threshold"]) if r["steps_to_threshold"] is not None else "never",
                    num(r["wall_s_per_run"]),
                ]
            )
    header = ["task", "learner", "final return", "std over seeds", "success", "env steps to threshold", "s / run"]
    out += table(header, rows)
    out += keys(
        data,
        {
            "qc_over_sac_return": "QC's mean final return / SAC's, on the first task",
            "qc_over_sac_success": "the same for success",
        },
    )
    rows = [
        [code(task), num(data["env_steps_to_threshold_ratio"].get(task)), num(data["best_chunked_over_sac"].get(task))]
        for task in data["learners"]
    ]
    header = ["task", "`env_steps_to_threshold_ratio` (SAC / fastest chunked)", "`best_chunked_over_sac` (return)"]
    return out + table(header, rows) + image("chunks.png", "return and success against env steps, per learner")


SAFE_NAMES = {"sac": "SAC", "sac_lag": "SAC-Lag", "coxq": "COX-Q"}


def safe(data: dict) -> str:
    """SAC, SAC-Lag and COX-Q: return, episode cost and the cost paid while learning."""
    out = section("safe", "Constrained learning", ["safe.json"])
    out += (
        f"Budgets: {', '.join(f'{task} {num(n)} env steps' for task, n in data['steps'].items())}; "
        f"{num(data['seeds'])} seeds. *Training cost* is every step's cost summed over all envs from the first "
        "step.\n\n"
    )
    rows = [
        [
            task,
            SAFE_NAMES.get(algo, algo),
            f"{num(r['return'], 4)} ± {num(r['return_std'])}",
            num(r["cost"]),
            num(r["training_cost"]),
            num(r["seconds"]),
        ]
        for task, learners in data["summary"].items()
        for algo, r in learners.items()
    ]
    out += table(
        ["task", "learner", "final return (mean ± std)", "final episode cost", "training cost", "s / run"], rows
    )
    out += keys(
        data,
        {
            "coxq_training_cost_ratio": "hopper: SAC-Lag's training cost / COX-Q's (above 1: COX-Q paid less)",
            "coxq_return_ratio": "hopper: COX-Q's final return / SAC-Lag's",
            "coxq_training_cost_ratio_reach": "reach: the same cost ratio",
            "coxq_return_ratio_reach": "reach: the same return ratio",
        },
    )
    rows = [
        [
            r["task"],
            SAFE_NAMES.get(r["algo"], r["algo"]),
            num(r["seed"]),
            num(r["return"], 4),
            num(r["cost"]),
            num(r["training_cost"]),
        ]
        for r in sorted(data["runs"], key=lambda r: (r["task"], list(SAFE_NAMES).index(r["algo"]), r["seed"]))
    ]
    out += "Every run:\n\n" + table(["task", "learner", "seed", "final return", "episode cost", "training cost"], rows)
    return out + image("safe.png", "return and cost against env steps, per learner")


def residual(data: dict) -> str:
    """Residual RL on a BC base against BC alone, RLPD and SAC from scratch."""
    out = section("residual", "Residual RL on a behaviour-cloned base", ["residual.json"])
    out += (
        f"`{data['task']}`, sparse reward, {num(data['budget_env_steps'])} env steps, {num(data['seeds'])} seeds, "
        f"{num(data['settings']['eval_episodes'])} evaluation episodes per point; the scripted expert's "
        f"{num(data['settings']['demos'])} demonstrations succeeded in {pct(data['expert_success'])}.\n\n"
    )
    rows = [
        [name, num(r["success"]), num(r["success_std"]), num(r["return"]), num(r["seconds_per_run"])]
        for name, r in data["table"].items()
    ]
    out += table(["learner", "success (mean over seeds)", "std over seeds", "return", "s / run"], rows)
    out += keys(
        data,
        {
            "residual_success": "residual SAC on the BC base",
            "bc_success": "the BC base alone",
            "scratch_success": "SAC from scratch",
            "rlpd_success": "RLPD from scratch, the same demonstrations",
            "residual_over_bc": "residual / BC (above 1: the residual beats its base)",
        },
    )
    settings = data["settings"]
    rows = [
        ["every RL learner", code(" ".join(settings["sac"]))],
        ["the residual", code(" ".join(settings["residual"])) + f", bound {num(settings['scale'])}"],
    ]
    out += table(["settings", "overrides"], rows)
    return out + image("residual.png", "success against env steps, per learner")


def dspear_robosuite(data: dict) -> str:
    """D-SPEAR's replay arms against uniform replay on robosuite Lift."""
    out = section("dspear_robosuite", "D-SPEAR replay on robosuite Lift", ["dspear_robosuite.json"])
    out += (
        f"`{data['task']}`, {num(data['steps_per_arm'])} env steps per arm, seeds: "
        f"{', '.join(map(str, data['seeds']))}; means over seeds of the last logged training episode and of the "
        "final deterministic evaluation.\n\n"
    )
    rows = [[code(arm), num(r["return"]), num(r["success"]), num(r["eval"])] for arm, r in data["arms"].items()]
    out += table(["arm", "training return", "training success", "evaluation return"], rows)
    return out + image("dspear_robosuite.png", "training return and success against env steps, per arm")


def stream_hopper(data: dict) -> str:
    """Stream AC's evaluation curves on Hopper against the random policy."""
    out = section("stream_hopper", "Stream AC on Hopper", ["stream_hopper.json", "stream_hopper.png"])
    out += (
        f"{num(data['transitions'])} transitions per seed. The peer in the same invocation is the uniform-random "
        "policy on the same evaluation episodes; stream-x's published return at 2M transitions is quoted for "
        "scale, not as a ratio.\n\n"
    )
    out += keys(
        data,
        {
            "final_return": "the mean over seeds of the last evaluation",
            "best_return": "the best evaluation of any seed",
            "random_return": "the uniform-random policy on the same episodes",
            "final_over_random": "final / random",
            "transitions_per_s": "the whole run, evaluations included",
            "stream_x_return_at_2m": "stream-x's published Hopper return at 2M transitions",
        },
    )
    runs = data.get("runs", [])
    points = sorted({p[0] for run in runs for p in run["curve"]})
    rows = [[num(int(t)), *(num(dict(map(tuple, run["curve"])).get(t), 4) for run in runs)] for t in points]
    out += "Deterministic evaluation return, 10 episodes per point:\n\n"
    out += table(["transitions", *(f"seed {run['seed']} ({num(run['wall_s'])} s)" for run in runs)], rows)
    return out + image("stream_hopper.png", "Stream AC's evaluation return on Hopper-v5 against transitions")


# Deploy loop


def deploy_loop_page() -> str:
    """What a tick of the node costs: the loop over DDS, the shield and the policy's call."""
    out = (
        "What a tick of the node costs on the robot's computer: the whole loop over DDS against a bare echo, "
        "the safety shield's tick, and the policy's call.\n\n"
    )
    out += sections(deploy_loop, shield_tick, policy_latency)
    return out


def deploy_loop(data: dict) -> str:
    """The node's lost states and latency against a bare echo, per rate and load."""
    out = section("deploy_loop", "The node against a bare echo", ["deploy_loop.json"])
    out += machine({})
    out += (
        f"{num(data['seconds_per_row'])} s per row in {num(data['rounds_per_row'])} rounds, node and echo "
        "alternating, each side's rounds pooled. A state without a command within 0.95 of a period is lost; "
        "latency is from the probe's send of a state to its receipt of the command (a lost state counts as "
        "infinite), *answered* over the states that were answered. Lost states are put down to their cause: "
        "the probe sending late, the node's tick answering late, ticking on an older state, or not ticking.\n\n"
    )
    rows = []
    for name, r in data["rows"].items():
        causes = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in r.get("lost_causes", {}).items())
        rows.append(
            [
                name,
                num(r["states"]),
                f"{num(r['lost'])} ({pct(r['lost_fraction'])})",
                num(r["p50_ms"]),
                num(r["p99_ms"]),
                f"{num(r['answered_p50_ms'])} / {num(r['answered_p99_ms'])} / {num(r['answered_max_ms'])}",
                num(r["jitter_p99_ms"]),
                causes,
            ]
        )
    header = [
        "row",
        "states",
        "lost",
        "p50 ms",
        "p99 ms",
        "answered p50 / p99 / max ms",
        "jitter p99 ms",
        "lost causes",
    ]
    out += table(header, rows)
    out += keys(
        data,
        {
            "lost_fraction_500hz": "the node's lost share at 500 Hz, quiet",
            "echo_lost_fraction_500hz": "the echo's, same row",
            "lost_fraction_500hz_busy": "the node's beside a CPU-bound process",
            "echo_lost_fraction_500hz_busy": "the echo's, same row",
            "lost_fraction_500hz_busy_fifo": "the node's beside it with `realtime.priority=50` (SCHED_FIFO)",
            "lost_fraction_1khz": "the node's at 1 kHz, quiet",
            "node_over_echo_lost_500hz": "node lost / echo lost, 500 Hz quiet, with its exact 95 % interval",
            "node_over_echo_lost_500hz_busy": "the same beside the busy process",
            "latency_p99_ms_500hz": "the node's p99 latency at 500 Hz (null where lost ticks make it infinite)",
            "answered_p99_ms_500hz": "its p99 over answered states",
            "echo_latency_p99_ms_500hz": "the echo's p99",
            "node_over_echo_p99_500hz": "node p99 / echo p99",
            "node_minus_echo_p50_ms_500hz": "node answered p50 − echo answered p50",
            "latency_p99_ms_50hz": "the node's p99 at 50 Hz, the task's rate",
        },
    )
    staged = {name: r for name, r in data["rows"].items() if "stage_ms" in r}
    stages = list(next(iter(staged.values()))["stage_ms"]) if staged else []
    rows = [
        [name, *(f"{num(r['stage_ms'][s]['p50'])} / {num(r['stage_ms'][s]['p99'])}" for s in stages)]
        for name, r in staged.items()
    ]
    out += "The node's stages from its own tick stamps, p50 / p99 ms (`stage_ms_500hz` is the 500 Hz quiet row's):\n\n"
    out += table(["row", *stages], rows)
    slow = {name: r["slowest_1pct_ms"] for name, r in staged.items() if "slowest_1pct_ms" in r}
    parts = list(next(iter(slow.values()))) if slow else []
    rows = [[name, *(num(s[p]) for p in parts)] for name, s in slow.items()]
    out += "Where the slowest 1 % of each row's states spent their time, mean ms (the wire either way included):\n\n"
    return out + table(["row", *(p.replace("_", " ") for p in parts)], rows)


def shield_tick(data: dict) -> str:
    """The compiled shield's tick against the numpy reference."""
    out = section("shield_tick", "The shield's tick", ["shield_tick.json"])
    out += machine({})
    out += (
        f"{num(data['ticks'])} ticks per spec in RUN, garbage collected between ticks as the node's collector does.\n\n"
    )
    rows = [[name, num(r["p50_us"]), num(r["p99_us"])] for name, r in data["rows"].items()]
    out += table(["spec, shield", "p50 µs", "p99 µs"], rows)
    rows = [[name, num(r["p50_us"]), num(r["p99_us"])] for name, r in data.get("workspace_fk", {}).items()]
    out += "The workspace check (forward kinematics of the target) on the cartpole rail, a 1-DoF position robot:\n\n"
    out += table(["tick", "p50 µs", "p99 µs"], rows)
    return out + keys(
        data,
        {
            "tick_p99_us": "the compiled shield's p99 on the 7-DoF arm",
            "reference_tick_p99_us": "the numpy reference's, same spec",
            "tick_p50_us": "the compiled shield's p50",
            "reference_tick_p50_us": "the reference's p50",
            "speedup_p50": "reference p50 / compiled p50",
            "kernel_import_s": "the kernels' import (compiled, or loaded from numba's cache), seconds",
        },
    )


LATENCY_CALLS = [
    ("the node's call, ONNX Runtime", "onnx_act"),
    ("the node's call, compiled graph", "compiled_act"),
    ("onnxruntime session", "onnx"),
    ("eager torch", "torch"),
]


def policy_latency(data: dict) -> str:
    """The policy's call per runtime, back to back and after a sleep."""
    out = section("policy_latency", "The policy's call", ["policy_latency.json"])
    out += machine({})
    out += (
        f"{num(data['calls'])} calls each, single-threaded, back to back and with a 2 ms sleep before each call "
        "as a 500 Hz node makes them (after sleeping, caches are cold: the latency a robot sees).\n\n"
    )
    rows = []
    for policy, r in data["rows"].items():
        for label, key in LATENCY_CALLS:
            if f"{key}_p50_us" in r:
                awake = f"{num(r[f'{key}_p50_us'])} / {num(r[f'{key}_p99_us'])}"
                asleep = (
                    f"{num(r[f'{key}_p50_us_sleeping'])} / {num(r[f'{key}_p99_us_sleeping'])}"
                    if f"{key}_p50_us_sleeping" in r
                    else "–"
                )
                rows.append([policy, label, awake, asleep])
    out += table(["policy", "call", "back to back p50 / p99 µs", "after 2 ms asleep p50 / p99 µs"], rows)
    return out + keys(
        data,
        {
            "onnx_p99_us": "the default policy's p99 in onnxruntime",
            "torch_over_onnx_p99": "eager torch p99 / onnxruntime p99 (above 1: ONNX is faster)",
            "compiled_p50_us_sleeping": "the node's compiled call, p50 after sleeping",
            "onnx_over_compiled_p50_sleeping": "the node's ONNX call / its compiled call, p50 after sleeping",
        },
    )


# Fine-tuning


def finetuning_page() -> str:
    """Fine-tuning beside the node after a dynamics shift, per task, and the committed reach run."""
    data = load("finetune.json")
    out = summary("finetune") + "\n\n"
    out += (
        "Each task's bundle is deployed with `q2real deploy --sim` on the sim robot in real time over DDS "
        "loopback, three runs of the same length: *frozen* (the bundle as deployed, no noise; the learner only "
        "scores the ticks), *fine-tuned* (`--finetune`: versions published by the learner beside the node, each "
        "on trial against the ticks before it, kept or rolled back) and *no learner* (plain deploy, for the "
        "tick latency without a learner). Every version the node swapped in is evaluated offline without noise "
        "on seeded episodes of the shifted simulator; return on the robot is per episode, from the stream, with "
        "the exploration noise in it.\n\n"
    )
    out += section("finetune", "Headline", ["finetune.json", "finetune.png"], lead=False)
    out += (
        "The top level of the file holds pendulum's headline (as it did before the bench took `--task`), "
        "each other task's return ratios with the task's name in front, and the worst "
        "`rolled_back_version_ticks_max`, `worse_version_ticks_max` and `tick_p99_ratio_with_learner` over the "
        "tasks:\n\n"
    )
    out += table(["key", "value"], [[code(k), num(v)] for k, v in data.items() if not isinstance(v, dict)])
    for task, result in data.get("tasks", {}).items():
        out += finetune_task(task, result)
    run = "finetune/panda_reach_run"
    if (RESULTS / run).is_dir():
        out += "## The committed reach run\n\n"
        out += f"`bench/results/{run}/`, the run `--task panda_reach` deploys and fine-tunes.\n\n"
        meta = load(f"{run}/meta.json")
        bundle = load(f"{run}/policy.onnx.json")
        training = bundle["training"]
        payload = training["config"]["env"]["randomization"].get("payload")
        rows = [
            ["command", code(" ".join(meta["command"]))],
            ["started", meta["started"]],
            ["versions", ", ".join(f"{k} {v}" for k, v in meta["versions"].items())],
            ["learner", f"{training['algo']}, {num(training['env_steps'])} env steps"],
            ["trained payload (kg)", ", ".join(map(num, payload)) if payload else "–"],
            ["exported", bundle["exported_at"]],
        ]
        out += table(["", "the run"], rows) + image(f"{run}/curves.png", "the reach run's training curves")
    return out


def finetune_task(task: str, result: dict) -> str:
    """One task's fine-tuning: offline levels, the runs, every version and event."""
    bullet = re.search(rf"^- `{task}`: (.*?)(?=^\S|^- |\Z)", docstring("finetune"), re.M | re.S)
    setup = " ".join(bullet.group(1).split()) if bullet else ""
    out = f"## `{task}`\n\n" + (setup[:1].upper() + setup[1:] + "\n\n" if setup else "")
    plot = "finetune.png" if task == "pendulum" else f"finetune_{task}.png"
    out += image(plot, f"{task}: return on the robot and each version offline, after the shift")
    levels = result.get("levels", {})
    versions = result.get("runs", {}).get("fine-tuned", {}).get("versions", [])
    rows = [
        ["the deployed bundle, nominal dynamics", num(levels.get("nominal"), 4), "1"],
        [
            "the deployed bundle (frozen), shifted",
            num(levels.get("frozen"), 4),
            f"{num(result['frozen_return_ratio'])} (`frozen_return_ratio`)",
        ],
        [
            "the node's last good version, shifted",
            num(levels.get("good"), 4),
            f"**{num(result['recovered_return_ratio'])}** (`recovered_return_ratio`)",
        ],
        [
            "the best version it swapped in, shifted",
            num(max((v["return"] for v in versions), default=None), 4),
            f"{num(result['best_version_return_ratio'])} (`best_version_return_ratio`)",
        ],
    ]
    out += table(["offline", "return", "÷ nominal"], rows)
    out += keys(
        result,
        {
            "stream_tail_ratio_finetuned": "the fine-tuned run's return on the robot at the end / the frozen run's "
            "before the shift",
            "stream_tail_ratio_frozen": "the same for the frozen run",
            "tick_p99_ratio_with_learner": "tick latency p99, fine-tuned run / no-learner run",
            "tick_p99_ms_with_learner": "the fine-tuned run's tick p99",
            "tick_p99_ms_without_learner": "the no-learner run's",
            "loop_deadline_misses_with_learner": "loop deadline misses in the fine-tuned run",
            "loop_deadline_miss_fraction_with_learner": "the same as a share of its ticks",
            "robot_seconds_after_shift": "seconds on the robot after the shift",
            "robot_seconds_to_recover": "seconds from the shift to the acceptance of the first version at 0.9 "
            "of nominal offline",
            "rolled_back_version_ticks_max": "the most ticks a version later rolled back ran on the robot",
            "worse_version_ticks_max": "the most ticks a version ran whose offline return was worse than the last "
            "good version's by more than the trial's tolerated drop",
            "versions_swapped": "versions the node swapped in",
            "rollbacks": "versions it rolled back",
        },
    )
    methods = result.get("methods", {})
    if methods:
        out += (
            f"Fine-tuning methods tried (`--methods`; the figures above are `{result.get('method', 'free')}`'s), "
            "each beside the same frozen run:\n\n"
        )
        columns = ["recovered_return_ratio", "best_version_return_ratio", "stream_tail_ratio_finetuned"]
        columns += ["robot_seconds_to_recover", "rolled_back_version_ticks_max", "worse_version_ticks_max"]
        columns += ["versions_swapped", "rollbacks"]
        rows = [[code(name), *(num(figures.get(c), 4) for c in columns)] for name, figures in methods.items()]
        out += table(["method", *map(code, columns)], rows)
    rows = []
    for kind, run in result.get("runs", {}).items():
        tuning = run.get("finetune", {})
        rows.append(
            [
                kind,
                num(run["wall_s"]),
                num(run["ticks"]),
                num(run["p50_ms"]),
                num(run["p99_ms"]),
                num(run["loop_misses"]),
                num(run["policy_misses"]),
                num(run.get("pre_shift_return"), 4),
                num(run.get("tail_return"), 4),
                f"{num(tuning.get('swaps'))} / {num(tuning.get('accepted'))} / {num(tuning.get('rollbacks'))}",
            ]
        )
    header = ["run", "wall s", "ticks", "tick p50 ms", "tick p99 ms", "loop misses", "policy misses"]
    header += ["return before the shift", "return at the end", "swapped / kept / rolled back"]
    out += table(header, rows)
    tuned = result.get("runs", {}).get("fine-tuned", {})
    rows = [
        [
            f"v{v['version']}",
            num(v["seconds"]),
            v["verdict"] + (", worse" if v.get("worse") else ""),
            num(v.get("ticks")),
            num(v["return"], 4),
            ratio(v["return"] / levels["nominal"]),
        ]
        for v in tuned.get("versions", [])
    ]
    out += "Each version the node swapped in, offline on the shifted simulator:\n\n"
    out += table(["version", "swapped in at s", "verdict", "ticks on the robot", "offline return", "÷ nominal"], rows)
    rows = [
        [e["event"].replace("_", " "), num(e["version"]), num(e["tick"]), e["detail"]]
        for e in tuned.get("finetune", {}).get("events", [])
    ]
    return out + "The node's events:\n\n" + table(["event", "version", "tick", "detail"], rows)


# Index


PAGES: dict[str, tuple[str, Callable[[], str]]] = {
    "skills": ("Skills", skills_page),
    "gate": ("Transfer gate", gate_page),
    "speed": ("Speed against peers", speed_page),
    "learners": ("Learners against their baselines", learners_page),
    "deploy-loop": ("The deploy loop", deploy_loop_page),
    "finetuning": ("Fine-tuning on the robot", finetuning_page),
}
"""Page name under docs/results/ -> (its title, the function that writes the rest of it)."""


def index_page() -> str:
    """The results pages and the benchmark behind each."""
    out = (
        "Every figure on these pages is read from the JSON a benchmark script in `bench/` wrote into "
        "`bench/results/`, and `python docs/generate.py` rewrites the pages from it: rerun a benchmark, then the "
        "generator, and the page follows. Where a benchmark compares q2real with a peer, both run in the same "
        "invocation, so a ratio compares the two on the same machine over the same minutes.\n\n"
    )
    out += "```{toctree}\n:maxdepth: 1\n\n" + "\n".join(PAGES) + "\n```\n\n"
    rows = [[f"[{PAGES[b.page][0]}]({b.page}.md)", code(f"bench/{b.script}.py"), code(b.command)] for b in BENCHES]
    return out + table(["page", "benchmark", "reruns it"], rows)


def sources(page: str) -> str:
    """What a page is generated from, for its header: this module's prose and the benchmarks' JSON."""
    files = [f"bench/results/{b.script}.json" for b in BENCHES if b.page == page]
    return ", ".join(["docs/results_pages.py", *(f for f in files if (ROOT / f).is_file())])


def titled(title: str, make: Callable[[], str]) -> Callable[[], str]:
    """`make` with the page's title above what it writes."""
    return lambda: f"# {title}\n\n" + make()


def generators() -> dict[str, tuple[str, Callable[[], str]]]:
    """Page path under docs/ -> (what it is generated from, a function returning its Markdown)."""
    pages = {"results/index.md": (sources("index"), titled("Results", index_page))}
    for page, (title, make) in PAGES.items():
        pages[f"results/{page}.md"] = (sources(page), titled(title, make))
    return pages
