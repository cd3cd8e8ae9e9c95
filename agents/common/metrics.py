"""Metric sinks for a run: JSONL + CSV on disk, TensorBoard, optional wandb, and the curve plot."""

from __future__ import annotations

import csv
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from q2real.agents.common.run_dir import LogConfig, RunDir
from q2real.configs.errors import MissingDependency


@dataclass(frozen=True)
class Panel:
    """One row of curves.png: the metrics a run optimizes, on one y axis."""

    ylabel: str
    keys: tuple[str, ...]
    limit: float | None = None
    """A level drawn across the row (a safe run's cost limit)."""
    levels: tuple[str, ...] = ()
    """Metrics drawn as a level across the row at their last logged value (a residual's base, scored alone)."""


RETURNS = Panel("return", ("episode_return", "eval_return"))


class MetricLogger:
    """`log(step, metrics)` fans out to every sink; `close()` writes the CSV and the curves PNG, one row
    per panel, against `x_label` (what `step` counts)."""

    def __init__(
        self,
        run: RunDir,
        config: LogConfig,
        elapsed: float = 0.0,
        panels: tuple[Panel, ...] = (RETURNS,),
        x_label: str = "env steps",
    ):
        self.path = run.path
        self.panels, self.x_label = panels, x_label
        self._jsonl = open(self.path / "metrics.jsonl", "a", buffering=1)
        self._start = time.monotonic() - elapsed
        self._tb = None
        if config.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.path / "tb"))
        self._wandb = None
        if config.wandb != "off":
            self._wandb = _start_wandb(run, config)

    @property
    def elapsed(self) -> float:
        """Wall-clock seconds of the run, across resumes."""
        return time.monotonic() - self._start

    def log(self, step: int, metrics: dict[str, float]) -> dict[str, Any]:
        record = {"step": int(step), "wall_time": round(self.elapsed, 3), **metrics}
        self._jsonl.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in metrics.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        return record

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        records = read_metrics(self.path / "metrics.jsonl")
        write_csv(records, self.path / "metrics.csv")
        plot_curves(records, self.path / "curves.png", self.panels, self.x_label)


def _start_wandb(run: RunDir, config: LogConfig):
    try:
        # An optional extra; the checker's environment may not have it.
        import wandb  # pyright: ignore[reportMissingImports]
    except ImportError as err:
        raise MissingDependency("log.wandb: wandb logging needs pip install 'q2real[wandb]'") from err
    from q2real.configs.loader import to_dict

    logged = wandb.init(
        project=config.wandb_project,
        name=run.path.name,
        dir=str(run.path),
        mode=config.wandb,
        config=to_dict(run.config),
    )
    if config.wandb == "offline":
        where = Path(logged.dir).parent  # the run's own folder; `dir` is its files/
        print(f"wandb: offline run written to {where}; upload it with: wandb sync {where}", flush=True)
    return logged


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Records from a metrics.jsonl; a line cut short by a crash is skipped, not fatal."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def write_csv(records: list[dict[str, Any]], path: Path) -> None:
    columns = list(dict.fromkeys(key for record in records for key in record))
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(records)
    os.replace(tmp, path)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _last(records: list[dict[str, Any]], key: str) -> float | None:
    return next((r[key] for r in reversed(records) if _finite(r.get(key))), None)


def plot_curves(
    records: list[dict[str, Any]], path: Path, panels: tuple[Panel, ...] = (RETURNS,), x_label: str = "env steps"
) -> bool:
    """Each panel's metrics present in the records, a row per panel, against the run's progress (env
    steps, or epochs) and against wall-clock; returns False when there is nothing to plot."""
    rows = []
    for panel in panels:
        series = {}
        for key in panel.keys:
            points = [r for r in records if _finite(r.get(key))]
            if points:
                series[key] = points
        if series:
            rows.append((panel, series))
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rows), 2, figsize=(10, 3.4 * len(rows)), sharey="row", squeeze=False)
    for (panel, series), row in zip(rows, axes, strict=True):
        for key, points in series.items():
            for ax, x_key in ((row[0], "step"), (row[1], "wall_time")):
                ax.plot([r[x_key] for r in points], [r[key] for r in points], marker="o", markersize=3, label=key)
        if panel.limit is not None:
            for ax in row:
                ax.axhline(panel.limit, color="tab:red", linestyle="--", linewidth=1, label="limit")
        for key in panel.levels:
            level = _last(records, key)
            for ax in row if level is not None else ():
                ax.axhline(level, color="tab:gray", linestyle=":", linewidth=1.5, label=key)
        for ax, label in ((row[0], x_label), (row[1], "wall-clock (s)")):
            ax.set_xlabel(label)
            ax.grid(alpha=0.3)
        row[0].set_ylabel(panel.ylabel)
        row[0].legend()
    fig.suptitle(path.parent.name)
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return True
