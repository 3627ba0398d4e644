"""Which finished configuration is best within a privacy budget (Owkin §IV-C).

A run qualifies for a target (ε, δ) when every silo of every trial is (ε, δ)-DP. Its
ledger gives each account's ε at the target δ directly; if that is ≤ ε, Lemma 1 (a
mechanism that is (ε₀, δ₀)-DP is (ε, δ)-DP for all ε ≥ ε₀, δ ≥ δ₀) makes the run
qualify. A run accounted at a larger δ is thus re-read at the smaller one, never
accepted on its own δ. Non-private runs never qualify.

With `pool_seeds`, runs that differ only in their study seed (the split, the first
initialisation) are one candidate: its metric over every trial of every seed, its ε
the largest of any of them, and it qualifies only if every one of them does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from dpfl.experiments.results.queries import (
    OneClass,
    Replicates,
    one_class_of,
    open_results,
    pool_seeds,
    summarise,
)
from dpfl.experiments.results.store import RunRow

CAVEAT = (
    "Choosing among configurations by their results on private data leaks information "
    "of its own, which no run's ε includes (PETs prize seed: tuning has a privacy cost). "
    "Select on a public or held-out validation silo (--validation-silo), or account for "
    "the selection, before reporting the chosen run's ε as the study's."
)


@dataclass(frozen=True)
class Candidate:
    """A finished run (or runs pooled over seeds) with its metric over its replicates
    and its largest ε at the target δ."""

    run: RunRow
    """the run, or the first of the runs pooled"""
    mean: float
    std: float | None
    """the sample std; None for a single value (no spread)"""
    epsilon: float
    qualifies: bool
    replicates: Replicates | None = None
    """what the mean and std are over ("5 trials × 3 seeds")"""
    runs: tuple[RunRow, ...] = ()
    """every run pooled (the run alone unless pooled over seeds)"""
    one_class: OneClass | None = None
    """whether its final models put every test record in one class"""


LOWER_IS_BETTER = ("loss", "ibs")
"""Metrics to minimise: the log loss and the integrated Brier score."""


def candidates(
    directory: str | Path,
    *,
    epsilon: float,
    delta: float,
    metric: str = "accuracy",
    validation_silo: str | None = None,
    pool: bool = False,
) -> list[Candidate]:
    """Every finished run, best first among those within (ε, δ); its metric is the final
    one on the union of test sets, or on `validation_silo`'s test set if given. A metric
    or silo that no finished run has is refused with the names there are. `pool`: runs
    that differ only in their seed are one candidate (see the module docstring)."""
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"need ε > 0 and 0 < δ < 1, got ε={epsilon}, δ={delta}")
    with open_results(directory) as store:
        found: list[Candidate] = []
        names: set[str] = set()
        silos: set[str] = set()
        summaries = [summarise(store, run) for run in store.runs(status="finished")]
        for group in pool_seeds(summaries, pool=pool):
            metrics = group.metrics
            score = metrics.score(metric, validation_silo)
            spent = max(store.epsilon_by_silo(run, delta=delta).max for run in group.runs)
            found.append(
                Candidate(
                    group.run,
                    score.mean,
                    score.std if len(score.values) > 1 else None,
                    spent,
                    spent <= epsilon and score.defined,
                    group.replicates,
                    group.runs,
                    one_class_of(metrics, group.run.config),
                )
            )
            names |= metrics.names
            silos |= metrics.silos
    if found and all(math.isnan(c.mean) for c in found):
        _require_known(names, silos, metric, validation_silo)
    lower_is_better = metric in LOWER_IS_BETTER
    return sorted(
        found,
        key=lambda c: (
            not c.qualifies,
            math.inf if math.isnan(c.mean) else (c.mean if lower_is_better else -c.mean),
        ),
    )


def _require_known(names: set[str], silos: set[str], metric: str, silo: str | None) -> None:
    """Refuse a misspelt metric or silo (`names` and `silos`: those the finished runs
    have), which would rank every run as undefined."""
    if metric not in names:
        listed = ", ".join(sorted(names))
        raise ValueError(f"unknown metric {metric!r}; the finished runs have {listed}")
    if silo is not None and silo not in silos:
        raise ValueError(
            f"unknown validation silo {silo!r}; the finished runs' silos are "
            + ", ".join(sorted(silos))
        )
