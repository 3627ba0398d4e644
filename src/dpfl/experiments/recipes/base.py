"""What every recipe is made of: the `Recipe` itself, the `Plan` it runs, the `Row`s it
compares, and two helpers the recipes share. Kept apart from the package's `__init__`,
which imports every recipe to build the registry, so that the recipes can import these
without a cycle."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dpfl.experiments.results.store import ResultsStore, RunRow
from dpfl.experiments.study.config import Study
from dpfl.experiments.study.tune import Tuned

Scale = Literal["smoke", "default", "full"]
"""`smoke` (seconds; the tests), `default` (minutes), `full` (the paper's trials, rounds
and grid)."""


@dataclass(frozen=True)
class Row:
    """One comparison: a setting, the paper's figure, ours, and how the data differ.
    `trials`: how many trials (or seeds) the measured figures in `ours` are over, the
    fewest where it compares several runs; None where `ours` holds no measured figure
    (an accounting bound). The pages mark the single-trial rows (`markdown`)."""

    setting: str
    paper: str
    ours: str
    note: str = ""
    trials: int | None = None


@dataclass(frozen=True)
class Tuning:
    """A study selected privately by `dpfl tune` instead of swept: its grid is the search
    space, K candidate runs drawn from the law (`mean`, `shape`), only the best on
    `metric` released, the selection charged to each silo (`dpfl.experiments.study.tune`)."""

    study: Study
    metric: str
    mean: float
    shape: float = 1.0


@dataclass(frozen=True)
class Selected:
    """A tuning's release: its outcome and the largest ε over its silos, the selection
    included, re-read from its ledger (∞ for a non-private study)."""

    tuning: Tuning
    tuned: Tuned
    epsilon: float


@dataclass
class Plan:
    """What a recipe will run (studies swept, and studies tuned), and what it had to
    leave out (e.g. absent real data)."""

    studies: list[Study]
    notes: list[str] = field(default_factory=list)
    tuned: list[Tuning] = field(default_factory=list)


Studies = Callable[[Path | None, Scale], Plan]
"""(folder of the real data or None, scale) -> the studies to run and what is left out."""
Compare = Callable[[list[RunRow], ResultsStore], list[Row]]
"""(the runs of the plan's studies, the results store they wrote) -> the table's rows."""
CompareTuned = Callable[[list[Selected]], list[Row]]
"""(the releases of the plan's tunings, in its order) -> the table's rows after those of
`Compare`."""


@dataclass(frozen=True)
class Recipe:
    """A seed paper's experiment, re-run on the closest data we have.

    `studies(data_dir, scale)` plans the study configs (possibly none when the real data
    are absent, with notes saying so); `compare(runs, store)` reads the finished runs and
    puts what the paper measured next to ours, `compare_tuned(selected)` the plan's
    tuned studies. Each recipe module exports one `RECIPE`."""

    name: str
    """The command's name: `dpfl reproduce NAME`."""
    title: str
    """The table's title."""
    studies: Studies
    compare: Compare
    compare_tuned: CompareTuned = lambda selected: []


def fewest_trials(runs: Iterable[RunRow]) -> int | None:
    """The fewest trials among `runs` (None for none): the `trials` of a row that reads
    each run's mean over its trials."""
    return min((run.trials for run in runs), default=None)


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
