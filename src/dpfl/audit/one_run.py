"""The one-run audit (Steinke, Nasr and Jagielski, "Privacy auditing with one (1)
training run", NeurIPS 2023, §3 and §5): m canaries, each planted independently with
probability 1/2, one training run. The auditor ranks the canaries by their score on the
final model, guesses "in" for the k highest and "out" for the k lowest, abstains on the
rest, and counts its correct guesses; `bounds.one_run_epsilon` turns the count into the
paper's ε lower bound. One run instead of thousands, at the price of a looser bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dpfl.audit.bounds import LowerBound, one_run_epsilon
from dpfl.audit.canaries import Canary
from dpfl.audit.runs import observe
from dpfl.federation.algorithms.base import Algorithm
from dpfl.federation.messages import SecureSum
from dpfl.federation.silo import Silo

__all__ = ["OneRunAudit", "one_run_audit"]


@dataclass(frozen=True)
class OneRunAudit(LowerBound):
    """An ε lower bound for one silo from one run against the server, beside its
    ledger's ε."""

    canaries: int
    guesses: int
    correct: int


def one_run_audit(
    algorithm: Algorithm,
    silos: Sequence[Silo],
    canaries: Sequence[Canary],
    *,
    rounds: int,
    guesses: int | None = None,
    silo: str | None = None,
    seed: int = 0,
    delta: float = 1e-5,
    epsilon_budget: float | None = None,
    budgets: Mapping[str, tuple[float, float]] | None = None,
    confidence: float = 0.95,
    secure_sum: SecureSum | None = None,
) -> OneRunAudit:
    """Plant each of the m `canaries` in `silo` (default: the first) with probability 1/2
    (a coin per canary, seeded by `seed`), run once and guess `guesses` of them (an even
    number, half each way; default m/2 rounded down to even). The number of guesses is
    fixed before the run: choosing it after seeing the scores would void the bound."""
    m = len(canaries)
    r = 2 * (m // 4) if guesses is None else guesses
    if r % 2 or not 0 < r <= m:
        raise ValueError(f"guesses must be even and in (0, {m}], got {r}")
    included = np.random.default_rng([seed, 1]).random(m) < 0.5
    target = silo or silos[0].name
    observed = observe(
        algorithm,
        silos,
        target,
        [c for c, planted in zip(canaries, included, strict=True) if planted],
        canaries,
        rounds=rounds,
        trials=1,
        seed=seed,
        delta=delta,
        epsilon_budget=epsilon_budget,
        budgets=budgets,
        secure_sum=secure_sum,
    )
    moved = observed.scores[-1, 0] - observed.scores[0, 0]
    order = np.argsort(moved, kind="stable")
    out, in_ = order[: r // 2], order[m - r // 2 :]
    correct = int(included[in_].sum() + (~included[out]).sum())
    return OneRunAudit(
        algorithm=algorithm.name,
        silo=target,
        observer="server",
        canary=type(canaries[0]).__name__,
        canaries=m,
        guesses=r,
        correct=correct,
        delta=delta,
        confidence=confidence,
        epsilon_lower=one_run_epsilon(m, r, correct, delta, confidence),
        epsilon_ledger=observed.epsilon,
    )
