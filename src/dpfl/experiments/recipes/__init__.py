"""The seed papers' experiments, each re-run on the closest data we have.

A recipe module defines `NAME`, `TITLE`, `studies(data_dir, scale)` (the study configs
to run, as `Study` objects, possibly none when its real data are absent, with `notes`
saying so) and `compare(runs, store)` (rows: what the paper measured next to ours).
`reproduce` runs the studies through the ordinary sweep machinery, so a reproduction
is itself a study directory: resumable, with a results store, `best` and `report`.

Scales: `smoke` (seconds; the tests), `default` (minutes), `full` (the paper's trials,
rounds and grid).
"""

from __future__ import annotations

import importlib
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Literal

from dpfl.experiments.config import Study
from dpfl.experiments.runner import STORE, Progress, run_study
from dpfl.experiments.store import ResultsStore, RunRow

Scale = Literal["smoke", "default", "full"]

RECIPES = {
    "owkin-idash2020": "owkin",
    "astar-aop": "astar",
    "kerkouche-fl-sign": "kerkouche",
    "puffle-mrmtl": "puffle",
    "dopamine": "dopamine",
}
"""Command name -> module in this package."""


@dataclass(frozen=True)
class Row:
    """One comparison: a setting, the paper's figure, ours, and how the data differ."""

    setting: str
    paper: str
    ours: str
    note: str = ""


@dataclass
class Plan:
    """What a recipe will run, and what it had to leave out (e.g. absent real data)."""

    studies: list[Study]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Reproduction:
    name: str
    title: str
    rows: list[Row]
    notes: list[str]
    runs: list[RunRow]


def recipe(name: str) -> ModuleType:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}")
    return importlib.import_module(f"{__name__}.{RECIPES[name]}")


def reproduce(
    name: str,
    out: str | Path,
    *,
    data_dir: Path | None = None,
    scale: Scale = "default",
    workers: int = 1,
    report: Progress = lambda line: None,
) -> Reproduction:
    """Run recipe `name` into `out` (resuming what is there) and compare with the paper."""
    module = recipe(name)
    plan: Plan = module.studies(data_dir, scale)
    runs = (  # all studies' points share the workers
        run_study(plan.studies, out, workers=workers, report=report) if plan.studies else []
    )
    with ResultsStore(Path(out) / STORE) as store:
        rows: list[Row] = module.compare(runs, store)
    return Reproduction(name, module.TITLE, rows, plan.notes, runs)


def real_folder(data_dir: Path | None, folder: str, what: str, notes: list[str]) -> Path | None:
    """`data_dir / folder` if it exists; otherwise None, and a note naming what is
    skipped and where it was looked for."""
    if data_dir is not None and (data_dir / folder).is_dir():
        return data_dir / folder
    place = None if data_dir is None else (data_dir / folder).resolve()
    where = "no data folder given" if place is None else f"{place} not found"
    notes.append(f"skipped {what}: {where} (real data, not shipped with dpfl)")
    return None


def mean_std(values: Sequence[float], *, percent: bool = True) -> str:
    """'93.1 ± 1.2 %' over trials (no ± for one trial)."""
    scale, unit = (100.0, " %") if percent else (1.0, "")
    if not values:
        return "n/a"
    mean = statistics.fmean(values) * scale
    if len(values) == 1:
        return f"{mean:.1f}{unit}"
    return f"{mean:.1f} ± {statistics.stdev(values) * scale:.1f}{unit}"
