"""ε(δ) of a privacy event, by `dp_accounting`'s RDP or PLD accountant.

PLD (privacy loss distributions, pessimistic discretisation) is the default wherever
it can analyse the event, because it is tighter; RDP analyses everything dpfl emits.
Two things are ours on top of `dp_accounting`:

* (ε, δ) events (`ApproximateDpEvent`) are pulled out of the composition tree and added
  by basic composition: ε(δ) = ε_acc(δ - Σδ_i) + Σε_i, with ε_acc from the accountant
  on the rest. That is sound for any mix (basic composition of two mechanisms).
* `ClientSampledDpEvent` is analysed exactly as the mixture described in
  `events.client_sampled`, under both PLD and RDP.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from dp_accounting import dp_event as dpe
from dp_accounting import pld, rdp
from dp_accounting.pld import privacy_loss_distribution
from dp_accounting.privacy_accountant import (
    NeighboringRelation,
    PrivacyAccountant,
    UnsupportedEventError,
)

from dpfl.privacy.errors import PrivacyParameterError, UnsupportedAccountingError
from dpfl.privacy.events import (
    ApproximateDpEvent,
    ClientSampledDpEvent,
    Neighbouring,
    PrivacyEvent,
)

PLD_DISCRETISATION = 1e-4
"""Width of the PLD's privacy-loss grid; pessimistic rounding keeps ε an upper bound."""

RDP_ORDERS: tuple[float, ...] = tuple(
    sorted(
        {round(float(o), 4) for o in rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS}
        | {round(1 + x / 20, 2) for x in range(1, 300)}
        | set(range(16, 128))
        | {160, 192, 256, 384, 512, 768, 1024, 2048, 4096}
    )
)
"""Rényi orders: `dp_accounting`'s defaults plus a 0.05 grid up to 16 (where small-ε optima
lie) and every integer to 128; ε is a minimum over this grid, so denser is tighter."""


class _DropUnconvergedOrders(logging.Filter):
    """dp_accounting logs every Rényi order whose series fails to converge, then leaves
    that order out of the minimum. On our dense grid at large q that is routine and says
    nothing the ε does not already account for, so it is not shown."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


logging.getLogger("absl").addFilter(_DropUnconvergedOrders())


class DeltaTooLargeWarning(UserWarning):
    """δ is larger than one over the number of records it protects."""


class Accountant(StrEnum):
    PLD = "pld"
    RDP = "rdp"


@dataclass(frozen=True)
class EpsilonReport:
    """ε at δ for an event, with the accountant that actually produced it."""

    epsilon: float
    delta: float
    accountant: Accountant
    neighbouring: Neighbouring


class _RdpAccountant(rdp.RdpAccountant):  # type: ignore[misc]
    """`dp_accounting`'s RDP accountant that also understands client-sampled rounds."""

    def _maybe_compose(
        self, event: dpe.DpEvent, count: int, do_compose: bool
    ) -> PrivacyAccountant.CompositionErrorDetails | None:
        if not isinstance(event, ClientSampledDpEvent):
            return super()._maybe_compose(event, count, do_compose)
        inner = _RdpAccountant(list(self._orders), self.neighboring_relation)
        error: PrivacyAccountant.CompositionErrorDetails | None = inner._maybe_compose(
            event.event, 1, do_compose
        )
        if error is None and do_compose:
            orders = np.asarray(self._orders, dtype=float)
            rate = event.sampling_probability
            # log((1 - C) + C·exp((α - 1)·R)) / (α - 1), evaluated without overflow.
            mixed = np.logaddexp(np.log1p(-rate), np.log(rate) + (orders - 1) * inner._rdp)
            self._rdp += count * mixed / (orders - 1)
        return error


class _PldAccountant(pld.PLDAccountant):  # type: ignore[misc]
    """`dp_accounting`'s PLD accountant that also understands client-sampled rounds: their
    PLD is the exact mixture C·PLD(round) + (1 - C)·identity (the ⊥ branch loses 0)."""

    _pld: privacy_loss_distribution.PrivacyLossDistribution
    _contains_non_dp_event: bool
    _value_discretization_interval: float

    def _maybe_compose(
        self, event: dpe.DpEvent, count: int, do_compose: bool
    ) -> PrivacyAccountant.CompositionErrorDetails | None:
        if _is_sampled_gaussian(event) and event.event.noise_multiplier > 0:
            if do_compose:  # the same PLD dp_accounting builds, built once per process
                leaf = _sampled_gaussian_pld(
                    event.event.noise_multiplier,
                    event.sampling_probability,
                    self.neighboring_relation,
                    self._value_discretization_interval,
                )
                self._pld = self._pld.compose(leaf.self_compose(count))
            return None
        if not isinstance(event, ClientSampledDpEvent):
            return super()._maybe_compose(event, count, do_compose)
        inner = _PldAccountant(self.neighboring_relation, self._value_discretization_interval)
        error: PrivacyAccountant.CompositionErrorDetails | None = inner._maybe_compose(
            event.event, 1, do_compose
        )
        if error is None and do_compose:
            if inner._contains_non_dp_event:
                self._contains_non_dp_event = True
            else:
                nothing_sent = privacy_loss_distribution.identity(
                    self._value_discretization_interval
                )
                mixed = inner._pld.compute_mixture(nothing_sent, event.sampling_probability)
                self._pld = self._pld.compose(mixed.self_compose(count))
        return error


def _is_sampled_gaussian(event: dpe.DpEvent) -> bool:
    return isinstance(event, dpe.PoissonSampledDpEvent) and isinstance(
        event.event, dpe.GaussianDpEvent
    )


@functools.lru_cache(maxsize=256)
def _sampled_gaussian_pld(
    sigma: float, rate: float, relation: NeighboringRelation, interval: float
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """PLD of one Poisson-sampled Gaussian step. Building it is the costly part of PLD
    accounting (seconds for large q); PLDs are immutable, so one per (σ, q) is kept."""
    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=sigma,
        value_discretization_interval=interval,
        sampling_prob=rate,
        neighboring_relation=relation,
    )


SEARCH_PLD_DISCRETISATION = 1e-3
"""A coarser grid for searches (calibration), which re-check their answer on the fine one."""


def make_accountant(
    accountant: Accountant | str, neighbouring: Neighbouring, *, coarse: bool = False
) -> PrivacyAccountant:
    """A fresh `dp_accounting` accountant of the named kind. `coarse` trades tightness for
    speed with a 10× coarser PLD grid; its ε is still an upper bound, a slightly looser
    one. (RDP has no coarse form: fewer orders would move its optimum too much.)"""
    kind = parse_accountant(accountant)
    relation = neighbouring.to_dp_accounting()
    if kind is Accountant.PLD:
        interval = SEARCH_PLD_DISCRETISATION if coarse else PLD_DISCRETISATION
        return _PldAccountant(relation, value_discretization_interval=interval)
    return _RdpAccountant(list(RDP_ORDERS), relation)


def parse_accountant(name: Accountant | str) -> Accountant:
    try:
        return Accountant(name)
    except ValueError:
        raise UnsupportedAccountingError(
            f"unknown accountant {name!r}: choose one of " + ", ".join(a.value for a in Accountant)
        ) from None


def check_delta(delta: float, *, dataset_size: int | None = None) -> None:
    """δ must be a probability below 1. A δ above 1/n is allowed with a warning: such a
    guarantee permits releasing one record of n outright."""
    if not (isinstance(delta, int | float) and 0.0 < delta < 1.0):
        raise PrivacyParameterError(f"δ must lie in (0, 1), got {delta!r}")
    if dataset_size is not None and delta > 1.0 / dataset_size:
        warnings.warn(
            f"δ={delta:g} exceeds 1/n = {1.0 / dataset_size:.3g} for a silo of {dataset_size} "
            "records: a mechanism that leaks one whole record would still meet it",
            DeltaTooLargeWarning,
            stacklevel=2,
        )


def choose_accountant(event: PrivacyEvent, requested: Accountant | str | None) -> Accountant:
    """The requested accountant, or PLD where it can analyse the event and RDP otherwise."""
    accountable, _, _ = split_basic_composition(event.dp_event)
    if requested is not None:
        kind = parse_accountant(requested)
        if not make_accountant(kind, event.neighbouring).supports(accountable):
            raise UnsupportedAccountingError(
                f"the {kind.value.upper()} accountant cannot analyse {event.describe()}; "
                f"use accountant='rdp'"
            )
        return kind
    if make_accountant(Accountant.PLD, event.neighbouring).supports(accountable):
        return Accountant.PLD
    return Accountant.RDP


def epsilon(
    event: PrivacyEvent,
    delta: float,
    accountant: Accountant | str | None = None,
    *,
    coarse: bool = False,
) -> EpsilonReport:
    """The smallest ε the accountant can prove for `event` at `delta` (`coarse`: a quick,
    looser upper bound, see `make_accountant`)."""
    check_delta(delta)
    kind = choose_accountant(event, accountant)
    accountable, basic_epsilon, basic_delta = split_basic_composition(event.dp_event)
    only_basic = isinstance(accountable, dpe.NoOpDpEvent)
    if basic_delta > delta or (basic_delta == delta and not only_basic):
        raise PrivacyParameterError(
            f"the (ε, δ) events alone already use δ={basic_delta:g}, leaving nothing of the "
            f"target δ={delta:g} for the rest"
        )
    value = basic_epsilon
    if not only_basic:
        acc = make_accountant(kind, event.neighbouring, coarse=coarse)
        try:
            acc.compose(accountable)
        except UnsupportedEventError as exc:
            raise UnsupportedAccountingError(str(exc)) from exc
        value += float(acc.get_epsilon(delta - basic_delta))
    return EpsilonReport(_as_epsilon(value), delta, kind, event.neighbouring)


def split_basic_composition(event: dpe.DpEvent) -> tuple[dpe.DpEvent, float, float]:
    """Separate (ε, δ) events from the rest: (rest, Σε, Σδ) with repeats multiplied out."""
    if isinstance(event, ApproximateDpEvent):
        return dpe.NoOpDpEvent(), event.epsilon, event.delta
    if isinstance(event, dpe.SelfComposedDpEvent):
        inner, eps, delta = split_basic_composition(event.event)
        rest = (
            inner
            if isinstance(inner, dpe.NoOpDpEvent)
            else dpe.SelfComposedDpEvent(inner, event.count)
        )
        return rest, eps * event.count, delta * event.count
    if isinstance(event, dpe.ComposedDpEvent):
        parts = [split_basic_composition(e) for e in event.events]
        kept = [p[0] for p in parts if not isinstance(p[0], dpe.NoOpDpEvent)]
        rest = dpe.NoOpDpEvent() if not kept else dpe.ComposedDpEvent(kept)
        return rest, sum(p[1] for p in parts), sum(p[2] for p in parts)
    return event, 0.0, 0.0


def _as_epsilon(value: float) -> float:
    if math.isnan(value):
        raise UnsupportedAccountingError("the accountant returned NaN for this event")
    return max(value, 0.0)
