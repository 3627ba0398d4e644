"""Running the simulator with canaries planted in one silo, and reading what an observer
held and saw of them after every exchange:

* the server: its state (the global model) and the planted silo's reply, where it sees
  replies (in the clear; never through a secure sum);
* another hospital, for an algorithm that accounts its view (Dopamine's "hospitals"):
  the global model it receives and its own reply, from which it recovers the sum of the
  other hospitals' replies (the global model is their mean with its own).

Every trial starts from the same model (`init="shared"`): the initial model is public,
and an auditor who knows it faces only the mechanism's randomness (batches and noise).
The runs keep no test sets (metrics are not what is audited) and charge a ledger of
their own, with the study's budgets if given (`epsilon_budget` and `delta`, or per silo
`budgets`, as `simulate` takes them; an algorithm that stops at its budget needs one):
ε is read off it afterwards, the figure the audit is set against.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dpfl.audit.canaries import Canary, GradientCanary, plant, scores, with_gradient_canaries
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import simulate
from dpfl.federation.algorithms.base import Algorithm, Reply, State, flat, unflat
from dpfl.federation.messages import SecureSum
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params
from dpfl.local.dpsgd import parameters_of, stack
from dpfl.privacy import Ledger
from dpfl.privacy.accounts import account

__all__ = ["Observed", "observe"]


@dataclass(frozen=True)
class Observed:
    """Canary scores of what the server held and saw, and the planted silo's ε by the
    ledger."""

    scores: np.ndarray
    """[exchanges + 1, trials, canaries]: the server's state before round 0, then after
    every exchange."""
    replies: np.ndarray
    """[exchanges, trials, canaries]: for the server, the planted silo's reply of every
    exchange; for a hospital, the sum of the other hospitals' replies. Scored as
    parameters (a model, or for an update the change it makes, the models being linear);
    0 where the observer did not see it (a secure sum, or no reply)."""
    exchanges: list[tuple[int, int]]
    """(round, exchange) of each row after the first."""
    epsilon: float
    """The planted silo's ε at its δ against this observer, the largest over trials (inf
    for a non-private run)."""


def observe(
    algorithm: Algorithm,
    silos: Sequence[Silo],
    target: str,
    planted: Sequence[Canary],
    scored: Sequence[Canary],
    *,
    rounds: int,
    trials: int,
    seed: int,
    delta: float,
    epsilon_budget: float | None = None,
    budgets: Mapping[str, tuple[float, float]] | None = None,
    secure_sum: SecureSum | None = None,
    observer: str | None = None,
) -> Observed:
    """Run `trials` stacked trials with the `planted` canaries in silo `target` and score
    the `scored` ones at everything the `observer` (None: the server; else a hospital's
    name) held and saw."""
    if target not in {s.name for s in silos}:
        raise ValueError(f"no silo named {target!r}")
    view = _view(algorithm, silos, target, observer)
    world = [
        plant(dataclasses.replace(s, x_test=None, y_test=None), planted if s.name == target else [])
        for s in silos
    ]
    if any(isinstance(c, GradientCanary) for c in scored):
        algorithm = with_gradient_canaries(algorithm)
    model = algorithm.model
    rows = [scores(model, stack([parameters_of(model)]), scored).expand(trials, -1)]
    replied: list[Tensor] = []
    exchanges: list[tuple[int, int]] = []

    def seen(
        round_: int,
        exchange: int,
        states: Sequence[State],
        replies: Sequence[Mapping[str, Reply]],
        revealed: bool,
    ) -> None:
        rows.append(scores(model, stack([s["global"] for s in states]), scored))
        like: Params = states[0]["global"]
        if observer is None:
            mine = [r[target].vector if revealed and target in r else None for r in replies]
        else:  # what the hospital recovers: the others' sum, from the mean and its own
            mine = [_others(r, observer) for r in replies]
        zero = flat(like).zero_()
        vectors = [zero if m is None else m.to(zero.dtype) for m in mine]
        moved = scores(model, stack([unflat(v, like) for v in vectors]), scored)
        unseen = torch.tensor([m is None for m in mine]).unsqueeze(1)
        replied.append(moved.masked_fill(unseen, 0.0))
        exchanges.append((round_, exchange))

    with tempfile.TemporaryDirectory(prefix="dpfl-audit-") as scratch:
        result = simulate(
            algorithm,
            world,
            audit_plan(
                rounds,
                trials,
                seed,
                delta,
                epsilon_budget,
                budgets,
                secure_sum,
                init="shared",
                observe=seen,
            ),
            ledger=Path(scratch) / "ledger.sqlite",
        )
        epsilon = np.inf
        if algorithm.private:
            with Ledger(result.ledger_path, create=False) as book:
                epsilon = max(book.spent(account(target, r, view)).epsilon for r in range(trials))
    return Observed(
        torch.stack(rows).numpy(), torch.stack(replied).numpy(), exchanges, float(epsilon)
    )


def audit_plan(
    rounds: int,
    trials: int,
    seed: int,
    delta: float,
    epsilon: float | None,
    budgets: Mapping[str, tuple[float, float]] | None,
    secure_sum: SecureSum | None,
    **more: Any,
) -> RunPlan:
    """The plan an audit runs the study's mechanism under: its rounds, budgets and secure
    sum, `trials` stacked runs from `seed`, without a progress bar (`more`: the rest)."""
    return RunPlan(
        rounds=rounds,
        trials=trials,
        seed=seed,
        epsilon=epsilon,
        budgets=budgets or {},
        delta=delta,
        progress=False,
        secure_sum=secure_sum,
        **more,
    )


def _view(
    algorithm: Algorithm, silos: Sequence[Silo], target: str, observer: str | None
) -> str | None:
    """The ledger view that accounts the observer (None: the server's)."""
    if observer is None:
        return None
    if observer == target or observer not in {s.name for s in silos}:
        raise ValueError(f"the observer must be another of the run's hospitals, not {observer!r}")
    infos = {s.name: s.with_public_size(s.public_size or s.size).info for s in silos}
    views = algorithm.view_events(infos[target], list(infos.values()))
    if "hospitals" not in views or not algorithm.needs_secure_sum:
        raise ValueError(
            f"{algorithm.name} accounts no view of another hospital: audit the server's"
        )
    return "hospitals"


def _others(replies: Mapping[str, Reply], observer: str) -> Tensor | None:
    """The sum of the other hospitals' replies: what the observer recovers from the global
    model it receives (Dopamine's: the mean of the K models, so the others' sum is K
    times it less its own reply; `_view` admits no other algorithm)."""
    if observer not in replies:
        return None
    return torch.stack([r.vector for name, r in replies.items() if name != observer]).sum(0)
