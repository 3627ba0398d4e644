"""What a study's results store says about its runs, read one way for every reader.

`dpfl report`, the summaries printed by `sweep`/`run`/`demo` and `dpfl best` all read
these functions, so that a run's accuracy, ε and bytes are the same figures wherever
they are shown. The conventions, in one place:

* A run's *final* metric is its value after the run's last round (earlier than planned
  for a run stopped by its budget; every trial is evaluated there), one value per trial.
  Undefined values (stored as NULL: e.g. AUROC on a one-class test set) are left out
  of means and spreads, so one undefined trial does not blank the others.
* ε per silo is `ResultsStore.epsilon_by_silo`: the largest over the run's trials, at
  the silo's δ, by the accountant named (the enforcing one unless asked), in the
  server's view unless another observer is named.
* Bytes are totals over the run's rounds per (trial, silo); a silo that sent nothing in
  a trial (client sampling) counts as 0 bytes there.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dpfl.experiments.store import ResultsStore, RunRow, SiloEpsilons, enforcing_accountant
from dpfl.privacy import Accountant

RESULTS_FILE = "results.sqlite"
"""The results store's file name in a study directory."""
ACCOUNTANTS = tuple(a.value for a in Accountant)
Direction = Literal["up", "down"]
"""client → server, or server → client"""


def open_results(directory: str | Path) -> ResultsStore:
    """A study directory's results store, read-only (readers never write)."""
    return ResultsStore(Path(directory) / RESULTS_FILE, create=False)


@dataclass(frozen=True)
class Spread:
    """A figure over trials: the defined values, their mean and sample std."""

    values: tuple[float, ...]
    """one per trial that defined it"""

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread:
        """The spread of the values that are defined (SQLite stores NaN as NULL)."""
        return cls(tuple(v for v in values if v is not None))

    @property
    def defined(self) -> bool:
        return bool(self.values)

    @property
    def mean(self) -> float:
        """The mean; NaN if no trial defined the figure."""
        return statistics.fmean(self.values) if self.values else math.nan

    @property
    def std(self) -> float:
        """The sample std; NaN under two values (one trial has no spread)."""
        return statistics.stdev(self.values) if len(self.values) > 1 else math.nan


@dataclass(frozen=True)
class Metrics:
    """A run's metrics, over trials: final values on the union of the test sets and on
    each silo's, and the union's learning curves."""

    final: dict[str | None, dict[str, Spread]]
    """silo (None: the union) -> metric -> its final value; every metric with a row at
    the last round is here, even one that no trial defined"""
    curves: dict[str, dict[int, Spread]]
    """metric -> evaluated round (ascending) -> its value on the union"""

    def score(self, metric: str, silo: str | None = None) -> Spread:
        """The final `metric` on the union or on `silo`'s test set; undefined (no
        values) if the run did not report it."""
        return self.final.get(silo, {}).get(metric, Spread(()))

    @property
    def names(self) -> set[str]:
        """The metrics the run reported."""
        return {m for by_metric in self.final.values() for m in by_metric} | set(self.curves)

    @property
    def silos(self) -> set[str]:
        """The silos that have metrics of their own."""
        return {s for s in self.final if s is not None}


def read_metrics(store: ResultsStore, run: RunRow) -> Metrics:
    """The run's metrics, read in one pass over its rows."""
    final: dict[str | None, dict[str, list[float | None]]] = defaultdict(lambda: defaultdict(list))
    curves: dict[str, dict[int, list[float | None]]] = defaultdict(lambda: defaultdict(list))
    for row in store.rows("metrics", run.id):
        if row["round"] == run.last_round:
            final[row["silo"]][row["metric"]].append(row["value"])
        if row["silo"] is None:
            curves[row["metric"]][row["round"]].append(row["value"])
    return Metrics(
        final={silo: _spreads(by_metric) for silo, by_metric in final.items()},
        curves={metric: _spreads(dict(sorted(by.items()))) for metric, by in curves.items()},
    )


def _spreads(values: dict[Any, list[float | None]]) -> dict[Any, Spread]:
    return {key: Spread.of(listed) for key, listed in values.items()}


@dataclass(frozen=True)
class Traffic:
    """Bytes per silo over a run: one total over the rounds per trial."""

    up: dict[str, tuple[int, ...]]
    """silo -> bytes it sent to the server, per trial"""
    down: dict[str, tuple[int, ...]]
    """silo -> bytes it received, per trial"""

    def totals(self, direction: Direction) -> list[int]:
        """Every (trial, silo) total of bytes `up` or `down`."""
        by_silo = self.up if direction == "up" else self.down
        return [n for per_trial in by_silo.values() for n in per_trial]

    def per_client(self, direction: Direction, silo: str | None = None) -> float:
        """Mean bytes `up` or `down` over trials, of `silo` or (None) of every silo;
        0 for a run that recorded no messages."""
        by_silo = self.up if direction == "up" else self.down
        listed = self.totals(direction) if silo is None else list(by_silo.get(silo, ()))
        return statistics.fmean(listed) if listed else 0.0


def read_traffic(store: ResultsStore, run: RunRow) -> Traffic:
    up: dict[str, list[int]] = defaultdict(lambda: [0] * run.trials)
    down: dict[str, list[int]] = defaultdict(lambda: [0] * run.trials)
    for row in store.rows("communication", run.id):
        up[row["silo"]][row["trial"]] += int(row["bytes_up"])
        down[row["silo"]][row["trial"]] += int(row["bytes_down"])
    return Traffic(
        up={silo: tuple(totals) for silo, totals in up.items()},
        down={silo: tuple(totals) for silo, totals in down.items()},
    )


def epsilon_over_rounds(store: ResultsStore, run: RunRow) -> dict[str, list[tuple[int, float]]]:
    """silo -> (round, ε) after each round accounted in the server's view by the run's
    own accountant, each ε the largest over trials."""
    rounds = sorted({int(row["round"]) for row in store.rows("privacy", run.id)})
    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for round_ in rounds:
        for silo, spent in store.epsilon_by_silo(run, through_round=round_).by_silo.items():
            curves[silo].append((round_, spent))
    return dict(curves)


@dataclass(frozen=True)
class RunSummary:
    """A finished run's figures: metrics, ε per silo, bytes."""

    run: RunRow
    metrics: Metrics
    private: bool
    """whether the run has any server-view privacy rows (a non-private run has none)"""
    epsilon: dict[str, SiloEpsilons]
    """accountant -> final ε per silo in the server's view"""
    views: dict[str, SiloEpsilons]
    """observer other than the server -> its final ε per silo (recorded, never enforced)"""
    traffic: Traffic

    @property
    def accountant(self) -> str:
        """The accountant that enforced the budgets."""
        return enforcing_accountant(self.run)

    @property
    def other_accountant(self) -> str:
        return next(a for a in ACCOUNTANTS if a != self.accountant)

    @property
    def own_epsilon(self) -> float | None:
        """The largest final ε over silos and trials by the enforcing accountant; None if
        it accounted none (non-private, or no figure at the last round)."""
        spent = self.epsilon[self.accountant]
        return spent.max if spent.by_silo else None


def summarise(store: ResultsStore, run: RunRow) -> RunSummary:
    views = {row["view"] for row in store.rows("privacy", run.id)}
    return RunSummary(
        run=run,
        metrics=read_metrics(store, run),
        private=None in views,
        epsilon={a: store.epsilon_by_silo(run, accountant=a) for a in ACCOUNTANTS},
        views={view: store.epsilon_by_silo(run, view) for view in sorted(views - {None})},
        traffic=read_traffic(store, run),
    )
