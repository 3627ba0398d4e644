"""What the selection scripts of docs/studies (`noise_best.py`, `server_best.py`) share:
`dpfl best`'s choice made once per kind of run (a mechanism, an optimiser) and ε of a
sweep, and the cells of their tables.

Among the finished runs of one kind at one ε, the best mean test metric within (ε, δ),
ranked by `dpfl.experiments.results.best.candidates`, `dpfl best`'s own ranking. Like
`dpfl best` on a sweep it reads the test sets, so the choice is not in ε; it is made
alike for every kind.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from dpfl.experiments.results.best import Candidate, candidates
from dpfl.experiments.results.queries import mean_std_text, open_results, read_metrics


@dataclass(frozen=True)
class Sweep:
    """A finished sweep's store, its (ε, δ) levels, its metrics and the one chosen on."""

    directory: str
    store: Any
    levels: list[tuple[float, float]]
    metrics: list[str]
    chosen_on: str

    def best(self, epsilon: float, delta: float, kind: Callable[[Candidate], Hashable]) -> dict:
        """The best run within (ε, δ) of each `kind` of the runs at ε."""
        found: dict[Hashable, Candidate] = {}
        for c in candidates(self.directory, epsilon=epsilon, delta=delta, metric=self.chosen_on):
            if c.run.config["privacy"]["epsilon"] == epsilon and c.qualifies:
                found.setdefault(kind(c), c)
        return found

    def header(self, first: str, last: str) -> str:
        """The table's header and rule: `first` columns, the metrics, `last` columns."""
        metrics = [m + (" (chosen on)" if m == self.chosen_on else "") for m in self.metrics]
        cells = [*first.split(" | "), *metrics, *last.split(" | ")]
        return "| " + " | ".join(cells) + " |\n|" + "---|" * len(cells)

    def cells(self, run: Any) -> list[str]:
        """The run's mean ± sd of each metric."""
        scores = read_metrics(self.store, run)
        return [
            mean_std_text(s.mean, s.std if len(s.values) > 1 else None)
            for s in (scores.score(m) for m in self.metrics)
        ]


@contextmanager
def swept(description: str) -> Iterator[Sweep]:
    """The sweep named on the command line (`DIR --metric M`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("directory")
    parser.add_argument("--metric", default="accuracy")
    args = parser.parse_args()
    with open_results(args.directory) as store:
        runs = store.runs(status="finished")
        levels = sorted(
            {(r.config["privacy"]["epsilon"], r.config["privacy"]["delta"]) for r in runs}
        )
        metrics = list(runs[0].config["metrics"])
        yield Sweep(args.directory, store, levels, metrics, args.metric)
