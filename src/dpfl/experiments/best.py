"""Which finished configuration is best within a privacy budget (Owkin §IV-C).

A run qualifies for a target (ε, δ) when every silo of every trial is (ε, δ)-DP. Its
ledger gives each account's ε at the target δ directly; if that is ≤ ε, Lemma 1 (a
mechanism that is (ε₀, δ₀)-DP is (ε, δ)-DP for all ε ≥ ε₀, δ ≥ δ₀) makes the run
qualify. A run accounted at a larger δ is thus re-read at the smaller one, never
accepted on its own δ. Non-private runs never qualify.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from dpfl.experiments.runner import STORE
from dpfl.experiments.store import ResultsStore, RunRow

CAVEAT = (
    "Choosing among configurations by their results on private data leaks information "
    "of its own, which no run's ε includes (PETs prize seed: tuning has a privacy cost). "
    "Select on a public or held-out validation silo (--validation-silo), or account for "
    "the selection, before reporting the chosen run's ε as the study's."
)


@dataclass(frozen=True)
class Candidate:
    """A finished run with its metric over trials and its largest ε at the target δ."""

    run: RunRow
    mean: float
    std: float
    epsilon: float
    qualifies: bool


def candidates(
    directory: str | Path,
    *,
    epsilon: float,
    delta: float,
    metric: str = "accuracy",
    validation_silo: str | None = None,
) -> list[Candidate]:
    """Every finished run, best first among those within (ε, δ); its metric is the final
    one on the union of test sets, or on `validation_silo`'s test set if given. A metric
    or silo that no finished run has is refused with the names there are."""
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"need ε > 0 and 0 < δ < 1, got ε={epsilon}, δ={delta}")
    with ResultsStore(Path(directory) / STORE, create=False) as store:
        found = []
        for run in store.runs(status="finished"):
            values = store.final_metric(run, metric, validation_silo)
            spent = store.epsilon_by_silo(run, delta=delta).max
            found.append(
                Candidate(
                    run,
                    statistics.fmean(values) if values else math.nan,
                    statistics.stdev(values) if len(values) > 1 else 0.0,
                    spent,
                    spent <= epsilon and bool(values),
                )
            )
        if found and all(math.isnan(c.mean) for c in found):
            _require_known(store, [c.run for c in found], metric, validation_silo)
    lower_is_better = metric == "loss"
    return sorted(
        found,
        key=lambda c: (
            not c.qualifies,
            math.inf if math.isnan(c.mean) else (c.mean if lower_is_better else -c.mean),
        ),
    )


def _require_known(store: ResultsStore, runs: list[RunRow], metric: str, silo: str | None) -> None:
    """Refuse a misspelt metric or silo, which would rank every run as undefined; asked
    only when no run has a value, since it reads every metric row."""
    rows = [row for run in runs for row in store.rows("metrics", run.id)]
    metrics = sorted({row["metric"] for row in rows})
    silos = sorted({row["silo"] for row in rows} - {None})
    if metric not in metrics:
        raise ValueError(f"unknown metric {metric!r}; the finished runs have {', '.join(metrics)}")
    if silo is not None and silo not in silos:
        raise ValueError(
            f"unknown validation silo {silo!r}; the finished runs' silos are {', '.join(silos)}"
        )
