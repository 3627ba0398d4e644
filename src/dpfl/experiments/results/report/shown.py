"""A run as the report shows it, and the ways of writing its figures that the report's
figures and its page share (so that a legend and a table cell name a run alike)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from dpfl.experiments.results.queries import RunSummary
from dpfl.experiments.results.store import RunRow

_METRIC_NAMES = {
    "auroc": "AUROC",
    "auprc": "AUPRC",
    "c_index": "C-index (Harrell)",
    "c_index_uno": "C-index (Uno)",
    "ibs": "integrated Brier score",
    "td_auc": "time-dependent AUROC",
}


@dataclass(frozen=True)
class Shown:
    """A finished run with its label and the figures read for it."""

    summary: RunSummary
    label: str
    epsilon_rounds: dict[str, list[tuple[int, float]]]
    """silo -> (round, ε) at the run's own accountant (`queries.epsilon_over_rounds`)"""

    @property
    def run(self) -> RunRow:
        return self.summary.run


def labels(runs: Sequence[RunRow]) -> list[str]:
    """Algorithm and grid point; a short run id is added where two runs would read alike."""
    named = [f"{r.algorithm} ({point(r)})" if point(r) else r.algorithm for r in runs]
    counts = Counter(named)
    return [
        label if counts[label] == 1 else f"{label} [{run.id[:8]}]"
        for label, run in zip(named, runs, strict=True)
    ]


def point(run: RunRow, leave_out: Sequence[str] = ()) -> str:
    """The grid point for legends and tables: the last part of each dotted key (unless two
    would then read alike), without `algorithm.name` (shown on its own) or `leave_out`."""
    grid = {k: v for k, v in run.grid.items() if k not in ("algorithm.name", *leave_out)}
    keys = sorted(grid)
    names = [key.rsplit(".", 1)[-1] for key in keys]
    if len(set(names)) < len(names):
        names = keys
    return ", ".join(f"{name}={grid[key]}" for name, key in zip(names, keys, strict=True))


def metric_name(metric: str) -> str:
    return _METRIC_NAMES.get(metric, metric.replace("_", " "))


def byte_text(n: float) -> str:
    """A byte count in decimal units (1 kB = 1000 B)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.3g}\u00a0{unit}"
        n /= 1000
    return f"{n:.3g}\u00a0TB"
