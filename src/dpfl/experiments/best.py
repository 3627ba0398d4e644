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

from dpfl.engines.simulation import account
from dpfl.experiments.runner import STORE
from dpfl.experiments.store import ResultsStore, RunRow
from dpfl.privacy import Ledger

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
    one on the union of test sets, or on `validation_silo`'s test set if given."""
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"need ε > 0 and 0 < δ < 1, got ε={epsilon}, δ={delta}")
    with ResultsStore(Path(directory) / STORE, create=False) as store:
        found = []
        for run in store.runs(status="finished"):
            values = store.final_metric(run, metric, validation_silo)
            spent = _epsilon_at(store, run, delta)
            found.append(
                Candidate(
                    run,
                    statistics.fmean(values) if values else math.nan,
                    statistics.stdev(values) if len(values) > 1 else 0.0,
                    spent,
                    spent <= epsilon and bool(values),
                )
            )
    lower_is_better = metric == "loss"
    return sorted(
        found,
        key=lambda c: (
            not c.qualifies,
            math.inf if math.isnan(c.mean) else (c.mean if lower_is_better else -c.mean),
        ),
    )


def _epsilon_at(store: ResultsStore, run: RunRow, delta: float) -> float:
    """The largest ε at `delta` over the run's silos and trials (server view), from its
    ledger; ∞ for a run without one (non-private)."""
    accounts = {
        account(row["silo"], row["trial"])
        for row in store.rows("privacy", run.id)
        if row["view"] is None
    }
    if not accounts or run.ledger is None:
        return math.inf
    with Ledger(store.ledger_of(run), create=False) as book:
        return max(book.spent(name, delta=delta).epsilon for name in accounts)
