"""The two-world canary audit: many trials with the canary and many without.

Both worlds run as stacked trials of the simulator. Each trial is scored at everything
the observer held and saw (`runs.observe`; the server, or under Dopamine another
hospital): the final model's score (moved from the initial one), the move of every
single exchange, and in every exchange the planted silo's reply where the server sees
it (or what the hospital recovers: the others' sum) are the candidate statistics; a
flaw may show in one round only (noise dropped on one step). The first half of each world's
trials picks the statistic and the threshold whose own Clopper–Pearson bound is largest;
the second half, which that choice never saw, gives the bound (`bounds.two_world_epsilon`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import roc_curve

from dpfl.audit.bounds import LowerBound, two_world_epsilon
from dpfl.audit.canaries import Canary
from dpfl.audit.runs import Observed, observe
from dpfl.federation.algorithms.base import Algorithm
from dpfl.federation.messages import SecureSum
from dpfl.federation.silo import Silo

__all__ = ["TwoWorldAudit", "two_world_audit"]


@dataclass(frozen=True)
class TwoWorldAudit(LowerBound):
    """An ε lower bound for one silo against one observer's view, beside the ε its
    ledger accounts against that observer."""

    trials: int
    """Per world; half of them chose the test, half bounded it."""
    statistic: str
    """The chosen observation: "final model", or "round r, exchange e: model" (the move of
    the server's model in one exchange) or "...: reply" (the silo's reply it saw)."""
    threshold: float
    true_positives: int
    false_positives: int
    positives: int
    negatives: int


def two_world_audit(
    algorithm: Algorithm,
    silos: Sequence[Silo],
    canary: Canary,
    *,
    rounds: int,
    trials: int = 1000,
    silo: str | None = None,
    seed: int = 0,
    delta: float = 1e-5,
    epsilon_budget: float | None = None,
    budgets: Mapping[str, tuple[float, float]] | None = None,
    confidence: float = 0.95,
    secure_sum: SecureSum | None = None,
    per_run: int | None = None,
    observer: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> TwoWorldAudit:
    """Audit `algorithm` over `silos` with `canary` planted in `silo` (default: the first)
    or not, `trials` trials per world, against the server or (`observer`) another
    hospital. Each world runs its trials stacked, `per_run` at a
    time (default: all in one run); run c of world w has seed `seed + w + 2c`, so the
    worlds' trials are independent. `progress` hears each run's trials as it ends."""
    if trials < 4:
        raise ValueError(f"need at least 4 trials per world, got {trials}")
    target = silo or silos[0].name
    size = per_run or trials
    worlds: list[list[Observed]] = [[], []]
    for w, planted in enumerate([[], [canary]]):
        for c, start in enumerate(range(0, trials, size)):
            worlds[w].append(
                observe(
                    algorithm,
                    silos,
                    target,
                    planted,
                    [canary],
                    rounds=rounds,
                    trials=min(size, trials - start),
                    seed=seed + w + 2 * c,
                    delta=delta,
                    epsilon_budget=epsilon_budget,
                    budgets=budgets,
                    secure_sum=secure_sum,
                    observer=observer,
                )
            )
            if progress is not None:
                progress(min(size, trials - start))
    # per world, [statistics, trials]
    statistics = [np.concatenate([_statistics(o) for o in w], 1) for w in worlds]
    half = trials // 2
    chosen, threshold = _choose(statistics[0][:, :half], statistics[1][:, :half], delta, confidence)
    flagged = [s[chosen, half:] >= threshold for s in statistics]
    negatives, positives = (len(f) for f in flagged)
    fp, tp = (int(f.sum()) for f in flagged)
    bound = two_world_epsilon(tp, positives, fp, negatives, delta, confidence)
    return TwoWorldAudit(
        algorithm=algorithm.name,
        silo=target,
        observer=observer or "server",
        canary=type(canary).__name__,
        trials=trials,
        delta=delta,
        confidence=confidence,
        epsilon_lower=float(bound),
        epsilon_ledger=max(o.epsilon for o in worlds[1]),
        statistic=_named(chosen, worlds[1][0].exchanges),
        threshold=float(threshold),
        true_positives=tp,
        false_positives=fp,
        positives=positives,
        negatives=negatives,
    )


def _statistics(observed: Observed) -> np.ndarray:
    """[1 + 2·exchanges, trials]: the final model's score moved from the initial one, each
    exchange's move of it, then the score of the observed reply in each exchange."""
    states = observed.scores[:, :, 0]
    return np.concatenate(
        [states[-1:] - states[:1], np.diff(states, axis=0), observed.replies[:, :, 0]]
    )


def _named(statistic: int, exchanges: list[tuple[int, int]]) -> str:
    if statistic == 0:
        return "final model"
    kind, (round_, exchange) = (
        ("model", exchanges[statistic - 1])
        if statistic <= len(exchanges)
        else ("reply", exchanges[statistic - 1 - len(exchanges)])
    )
    return f"round {round_}, exchange {exchange}: {kind}"


def _choose(
    without: np.ndarray, with_: np.ndarray, delta: float, confidence: float
) -> tuple[int, float]:
    """The statistic and threshold (flag the canary when statistic ≥ threshold) whose
    bound on these trials is largest."""
    labels = np.r_[np.zeros(without.shape[1]), np.ones(with_.shape[1])]
    best = (-1.0, 0, np.inf)
    for k, (a, b) in enumerate(zip(without, with_, strict=True)):
        fpr, tpr, thresholds = roc_curve(labels, np.r_[a, b], drop_intermediate=False)
        bounds = two_world_epsilon(
            np.rint(tpr * len(b)), len(b), np.rint(fpr * len(a)), len(a), delta, confidence
        )
        i = int(np.argmax(bounds))
        if bounds[i] > best[0]:
            best = (float(bounds[i]), k, float(thresholds[i]))
    return best[1], best[2]
