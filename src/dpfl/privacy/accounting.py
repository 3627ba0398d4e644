"""ε(δ) of a privacy event, by `dp_accounting`'s RDP or PLD accountant.

PLD (privacy loss distributions, pessimistic discretisation) is the default wherever
it can analyse the event, because it is tighter; RDP analyses everything dpfl emits.
Five things are ours on top of `dp_accounting`:

* (ε, δ) events (`ApproximateDpEvent`) are pulled out of the composition tree and added
  by basic composition: ε(δ) = ε_acc(δ - Σδ_i) + Σε_i, with ε_acc from the accountant
  on the rest. That is sound for any mix (basic composition of two mechanisms).
* `ClientSampledDpEvent` is analysed exactly as the mixture described in
  `events.client_sampled`, under both PLD and RDP.
* Node-level steps (`NodeSampledGaussianDpEvent`) by RDP, with the bound derived in
  `events.node_gaussian` over the 2S − 1 rows a replacement changes; PLD does not
  analyse them.
* PLDs have a size limit. Their grid grows with 1/σ² and, through the Chernoff tail
  bounds of self-composition, linearly with the number of steps: 10⁹ steps at q = 0.01,
  σ = 1 would need tens of GB. A PLD that would pass `PLD_MAX_POINTS` is never built:
  the default accountant answers with RDP instead (its cost does not depend on the
  number of steps) and says so; an explicit request for PLD is refused.
* The step DP-SGD repeats, a Poisson-sampled Gaussian, is analysed by
  `sampled_gaussian`: `dp_accounting`'s formulas evaluated on arrays, many times faster
  and equal to the bit.
"""

from __future__ import annotations

import itertools
import logging
import math
import warnings
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
from dp_accounting import dp_event as dpe
from dp_accounting import pld, rdp
from dp_accounting.pld import common, privacy_loss_distribution, privacy_loss_mechanism
from dp_accounting.privacy_accountant import (
    NeighboringRelation,
    PrivacyAccountant,
    UnsupportedEventError,
)
from scipy import special, stats

from dpfl.privacy import sampled_gaussian
from dpfl.privacy.errors import PrivacyParameterError, UnsupportedAccountingError
from dpfl.privacy.events import (
    ApproximateDpEvent,
    ClientSampledDpEvent,
    Neighbouring,
    NodeSampledGaussianDpEvent,
    PrivacyEvent,
    compose,
)

PLD_DISCRETISATION = 1e-4
"""Width of the PLD's privacy-loss grid; pessimistic rounding keeps ε an upper bound."""

PLD_MAX_POINTS = 2**20
"""Most grid points a PLD may hold (per direction, add and remove). Composing one takes
100-200 bytes a point in FFT buffers, so a privacy command stays under about 0.4 GB and a
few seconds. PLDs this large come from millions of steps, where the pessimistic grid's
rounding, added up over the steps, leaves PLD little or no tighter than RDP anyway."""

MAX_REPETITIONS = 10**9
"""Most mechanism runs (steps) one account may compose. Beyond, a step whose privacy loss
is small enough for the total to stay small is below double precision in RDP's formulas,
and rounding, added up over the steps, would show in ε."""

PLD_MAX_SAMPLED_STEP_POINTS = 2**18
"""Most grid points of one Poisson-sampled step's PLD, whose construction is the slowest
part of PLD accounting, point by point (`sampled_gaussian.Loss`; under replace-one
`dp_accounting` builds it in Python). It bounds a step's construction to seconds."""

_CACHED_STEP_POINTS = 2**18
"""One-step PLDs up to this size are cached (`_StepCache`, 1 GiB of them at most)."""

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
    """ε at δ for an event, with the accountant that actually produced it; `note` says why
    that is not the default one (the PLD would be too large), and is empty otherwise."""

    epsilon: float
    delta: float
    accountant: Accountant
    neighbouring: Neighbouring
    note: str = ""


class PldTooLargeError(UnsupportedAccountingError):
    """The event's PLD would pass `PLD_MAX_POINTS` (or, for one sampled step,
    `PLD_MAX_SAMPLED_STEP_POINTS`): too little noise or too many steps for a PLD."""

    def __init__(self, points: float, limit: int) -> None:
        self.points, self.limit = points, limit
        super().__init__(
            f"the PLD of this event would need {_count(points)} grid points, above the limit "
            f"of {limit:,} that keeps PLD accounting within memory and time; "
            "use the RDP accountant, whose cost does not depend on the number of steps"
        )

    @property
    def note(self) -> str:
        return (
            f"RDP answered: the PLD would need {_count(self.points)} grid points "
            f"(limit {self.limit:,})"
        )


def _count(points: float) -> str:
    return f"{points:,.0f}" if points < 1e12 else f"{points:.3g}"


class _RdpAccountant(rdp.RdpAccountant):  # type: ignore[misc]
    """`dp_accounting`'s RDP accountant that also understands client-sampled rounds and
    node-level steps, and computes a Poisson-sampled Gaussian step on arrays
    (`sampled_gaussian.rdp`)."""

    def _maybe_compose(
        self, event: dpe.DpEvent, count: int, do_compose: bool
    ) -> PrivacyAccountant.CompositionErrorDetails | None:
        if isinstance(event, NodeSampledGaussianDpEvent):
            if do_compose:
                self._rdp += count * node_rdp(np.asarray(self._orders, dtype=float), event)
            return None
        if _is_sampled_gaussian(event) and self.neighboring_relation in _SAMPLED_RELATIONS:
            if do_compose:
                sigma = event.event.noise_multiplier
                q = event.sampling_probability
                self._rdp += count * sampled_gaussian.rdp(q, sigma, self._orders)
            return None
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


_SAMPLED_RELATIONS = (NeighboringRelation.ADD_OR_REMOVE_ONE, NeighboringRelation.REPLACE_SPECIAL)
"""The relations under which `dp_accounting` analyses a Poisson-sampled Gaussian by RDP."""


def node_rdp(orders: np.ndarray, event: NodeSampledGaussianDpEvent) -> np.ndarray:
    """Rényi divergence of one node-level step at each order α:
    ln E_ρ[exp(α(α − 1)·2ρ²/σ²)] / (α − 1), ρ the batch's rows among the 2S − 1 that
    replacing the person changes (`events.replacement_rows`)."""
    rows = np.arange(event.changed_rows + 1, dtype=float)
    log_pmf = _changed_rows_log_pmf(event)
    alpha = orders[:, None]
    shift = alpha * (alpha - 1) * 2.0 * rows**2 / event.noise_multiplier**2
    moment = special.logsumexp(log_pmf + shift, axis=1)
    # where the moment is near 1 (small orders, small q) its logarithm is far smaller
    # than the terms summed: log1p(Σ p·expm1) keeps its relative precision. Each term is
    # exp(ln p + ln expm1(shift)), never p·expm1(shift): a row count whose p underflows
    # to 0 while expm1 overflows would give 0·∞ = NaN, and a NaN order made ε read 0.
    with np.errstate(divide="ignore", over="ignore"):  # overflow: orders not near one
        log_expm1 = shift + np.log(-np.expm1(-shift))  # −∞ at shift 0
        near_one = np.log1p(np.sum(np.exp(log_pmf + log_expm1), axis=1))
    result: np.ndarray = np.where(moment < 1.0, near_one, moment) / (orders - 1)
    return result


def _changed_rows_log_pmf(event: NodeSampledGaussianDpEvent) -> np.ndarray:
    """log P(ρ = k), k = 0..R, R = 2S − 1 changed rows: Binomial(R, q) or
    Hypergeometric(n, R, b), from log P(0) by the ratio of consecutive terms (scipy's
    betaln-based log-pmf loses 1e-5 of ρ = 0's mass at n = 2.6M, enough to move a small
    RDP value)."""
    r = event.changed_rows
    k = np.arange(r, dtype=float)
    if event.sampling_probability is not None:
        q = event.sampling_probability
        if q == 1.0:
            return np.where(np.arange(r + 1) == r, 0.0, -np.inf)
        first = r * math.log1p(-q)
        ratios = np.log(r - k) - np.log(k + 1) + math.log(q) - math.log1p(-q)
    else:
        n, b = event.dataset_size, event.batch_size
        assert n is not None and b is not None  # validated with the event
        if b > n - r:  # every batch holds some of the changed rows: start from the least
            low = b - (n - r)
            log_pmf = stats.hypergeom.logpmf(np.arange(r + 1), n, r, b)
            log_pmf[:low] = -np.inf
            return np.asarray(log_pmf, dtype=float)
        first = float(np.sum(np.log1p(-b / (n - k))))
        with np.errstate(divide="ignore"):
            ratios = np.log(r - k) + np.log(b - k) - np.log(k + 1) - np.log(n - r - b + k + 1)
    return np.concatenate([[first], first + np.cumsum(ratios)])


class _PldAccountant(pld.PLDAccountant):  # type: ignore[misc]
    """`dp_accounting`'s PLD accountant that refuses a PLD past the size limits before
    building it, builds a Poisson-sampled Gaussian step on arrays (`sampled_gaussian.Loss`),
    and also understands client-sampled rounds: their PLD is the exact mixture
    C·PLD(round) + (1 - C)·identity (the ⊥ branch loses 0)."""

    _pld: privacy_loss_distribution.PrivacyLossDistribution
    _contains_non_dp_event: bool
    _value_discretization_interval: float

    def _maybe_compose(
        self, event: dpe.DpEvent, count: int, do_compose: bool
    ) -> PrivacyAccountant.CompositionErrorDetails | None:
        interval = self._value_discretization_interval
        relation = self.neighboring_relation
        if _is_sampled_gaussian(event) and event.event.noise_multiplier > 0:
            if do_compose:
                rate = event.sampling_probability
                step = _gaussian_step(event.event.noise_multiplier, rate, relation, interval)
                self._compose_repeated(step, count)
            return None
        if isinstance(event, dpe.GaussianDpEvent) and event.noise_multiplier > 0:
            if do_compose:  # k releases are one at σ/√k, as dp_accounting composes them
                sigma = event.noise_multiplier / math.sqrt(count)
                # σ is relative to the relation's own sensitivity, so either relation is
                # one Gaussian shifted by 1; dp_accounting's REPLACE pairs the shifts ±1
                # (sensitivity 2), which would count the 2C of replace-one twice, unlike
                # its RDP accountant (one full-data σ = 1 release at δ = 1e-5: ε 10.0
                # instead of the exact 4.38)
                remove = NeighboringRelation.ADD_OR_REMOVE_ONE
                self._compose_repeated(_gaussian_step(sigma, 1.0, remove, interval), 1)
            return None
        if (
            isinstance(event, dpe.LaplaceDpEvent)
            and event.noise_multiplier > 0
            and relation is NeighboringRelation.ADD_OR_REMOVE_ONE
        ):
            if do_compose:
                self._compose_repeated(_laplace_step(event.noise_multiplier, interval), count)
            return None
        if not isinstance(event, ClientSampledDpEvent):
            return super()._maybe_compose(event, count, do_compose)
        inner = _PldAccountant(relation, interval)
        error: PrivacyAccountant.CompositionErrorDetails | None = inner._maybe_compose(
            event.event, 1, do_compose
        )
        if error is None and do_compose:
            if inner._contains_non_dp_event:
                self._contains_non_dp_event = True
            else:
                nothing_sent = privacy_loss_distribution.identity(interval)
                mixed = inner._pld.compute_mixture(nothing_sent, event.sampling_probability)
                self._compose_repeated(_dense(mixed), count)
        return error

    def _compose_repeated(
        self, step: privacy_loss_distribution.PrivacyLossDistribution, count: int
    ) -> None:
        """Compose `count` copies of `step`; refused before any buffer is allocated when the
        result would pass the limit (sized by the Chernoff bounds `self_compose` uses, where
        `count` × the step's points, which bounds them, does not already fit: sizing takes
        as long as the composition)."""
        held = max(p.size for p in _pmfs(self._pld))
        if held + count * max(p.size for p in _pmfs(step)) > PLD_MAX_POINTS:
            points = held + max(_self_composed_points(p, count) for p in _pmfs(step))
            if points > PLD_MAX_POINTS:
                raise PldTooLargeError(points, PLD_MAX_POINTS)
        self._pld = self._pld.compose(step.self_compose(count))


def _is_sampled_gaussian(event: dpe.DpEvent) -> bool:
    return isinstance(event, dpe.PoissonSampledDpEvent) and isinstance(
        event.event, dpe.GaussianDpEvent
    )


def _pmfs(distribution: privacy_loss_distribution.PrivacyLossDistribution) -> tuple[Any, Any]:
    """The remove and add directions' PMFs (the same object for a symmetric PLD)."""
    return distribution._pmf_remove, distribution._pmf_add


def _self_composed_points(pmf: Any, count: int) -> int:
    """Grid points of `pmf` composed `count` times, sized as `DensePLDPmf.self_compose` does."""
    probs = pmf.to_dense_pmf()._probs
    lower, upper = common.compute_self_convolve_bounds(probs, count, _TAIL_MASS_TRUNCATION)
    return max(int(upper) - int(lower) + 1, len(probs))


_TAIL_MASS_TRUNCATION = 1e-15
"""`dp_accounting`'s default tail truncation in `self_compose`, which sizes its result."""


def _dense(
    distribution: privacy_loss_distribution.PrivacyLossDistribution,
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The same PLD on dense arrays: `SparsePLDPmf.self_compose` first computes
    size**count as an exact integer, which for 10⁷ steps takes minutes."""
    remove, add = (p.to_dense_pmf() for p in _pmfs(distribution))
    return privacy_loss_distribution.PrivacyLossDistribution(remove, None if add is remove else add)


def _gaussian_step(
    sigma: float, rate: float, relation: NeighboringRelation, interval: float
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """PLD of one (Poisson-sampled) Gaussian step; refused before it is built when its grid
    would pass the limit. Sampled steps are built point by point, so have a lower one."""
    adjacency = privacy_loss_mechanism.AdjacencyType.REMOVE
    if relation is NeighboringRelation.REPLACE_ONE:
        adjacency = privacy_loss_mechanism.AdjacencyType.REPLACE
    loss = privacy_loss_mechanism.GaussianPrivacyLoss(
        sigma, sampling_prob=rate, adjacency_type=adjacency
    )
    points = _grid_points(loss, interval)
    limit = PLD_MAX_POINTS if rate == 1.0 else PLD_MAX_SAMPLED_STEP_POINTS
    if points > limit:
        raise PldTooLargeError(points, limit)
    build = _gaussian_pld if points > _CACHED_STEP_POINTS else _cached_gaussian_pld
    return build(sigma, rate, relation, interval)


def _laplace_step(
    parameter: float, interval: float
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """PLD of one Laplace release (add/remove); refused before it is built when too large."""
    points = _grid_points(privacy_loss_mechanism.LaplacePrivacyLoss(parameter), interval)
    if points > PLD_MAX_POINTS:
        raise PldTooLargeError(points, PLD_MAX_POINTS)
    return _dense(
        privacy_loss_distribution.from_laplace_mechanism(
            parameter, value_discretization_interval=interval
        )
    )


def _grid_points(loss: Any, interval: float) -> float:
    """Grid points of the PLD that dp_accounting's connect-the-dots construction builds for
    `loss` (either direction): it spans the privacy losses between these two bounds."""
    with np.errstate(divide="ignore", over="ignore"):  # an infinite bound means too large
        bounds = loss.connect_dots_bounds()
    upper: float = bounds.epsilon_upper / interval
    lower: float = bounds.epsilon_lower / interval
    if not math.isfinite(upper - lower):
        return math.inf
    return math.ceil(upper) - math.floor(lower) + 1


def _gaussian_pld(
    sigma: float, rate: float, relation: NeighboringRelation, interval: float
) -> privacy_loss_distribution.PrivacyLossDistribution:
    if rate == 1.0 or relation is NeighboringRelation.REPLACE_ONE:
        return _dense(
            privacy_loss_distribution.from_gaussian_mechanism(
                standard_deviation=sigma,
                value_discretization_interval=interval,
                sampling_prob=rate,
                neighboring_relation=relation,
            )
        )
    remove, add = (
        privacy_loss_distribution._create_pld_pmf_from_monotone_privacy_loss(
            sampled_gaussian.Loss(sigma, sampling_prob=rate, adjacency_type=adjacency),
            value_discretization_interval=interval,
            use_connect_dots=True,
        )
        for adjacency in (sampled_gaussian.REMOVE, sampled_gaussian.ADD)
    )
    return _dense(privacy_loss_distribution.PrivacyLossDistribution(remove, add))


class _StepCache:
    """The least recently used one-step PLDs, up to `limit` bytes of grid in all.

    Building a step's PLD is the costly part of PLD accounting, and PLDs are immutable, so one
    per (σ, q) is kept. A count bound does not fit Kerkouche's 314 hospitals, each with its
    own q: with 32 kept, every ledger charge and plan check rebuilt its hospital's step
    (314 builds before round 0, 3 a round); by bytes, all of them stay (about 2 MB each at
    σ ≈ 1)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._kept: OrderedDict[tuple[Any, ...], tuple[Any, int]] = OrderedDict()
        self._bytes = 0

    def __call__(
        self, sigma: float, rate: float, relation: NeighboringRelation, interval: float
    ) -> privacy_loss_distribution.PrivacyLossDistribution:
        key = (sigma, rate, relation, interval)
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key][0]
        built = _gaussian_pld(sigma, rate, relation, interval)
        size = sum({id(p): p.to_dense_pmf()._probs.nbytes for p in _pmfs(built)}.values())
        self._kept[key] = (built, size)
        self._bytes += size
        while self._bytes > self.limit and len(self._kept) > 1:
            _, (_, dropped) = self._kept.popitem(last=False)
            self._bytes -= dropped
        return built


_cached_gaussian_pld = _StepCache(limit=1 << 30)
"""One-step PLDs of up to `_CACHED_STEP_POINTS` points, 1 GiB of them at most."""


def make_accountant(accountant: Accountant | str, neighbouring: Neighbouring) -> PrivacyAccountant:
    """A fresh `dp_accounting` accountant of the named kind."""
    kind = parse_accountant(accountant)
    relation = neighbouring.to_dp_accounting()
    if kind is Accountant.PLD:
        return _PldAccountant(relation, value_discretization_interval=PLD_DISCRETISATION)
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
                "use the RDP accountant"
            )
        return kind
    if make_accountant(Accountant.PLD, event.neighbouring).supports(accountable):
        return Accountant.PLD
    return Accountant.RDP


def epsilon(
    event: PrivacyEvent, delta: float, accountant: Accountant | str | None = None
) -> EpsilonReport:
    """The smallest ε the accountant can prove for `event` at `delta`. By default PLD
    answers where it can analyse the event within `PLD_MAX_POINTS`, else RDP (the report's
    note says why)."""
    check_delta(delta)
    kind = choose_accountant(event, accountant)
    runs = _repetitions(event.dp_event)
    if runs > MAX_REPETITIONS:
        raise PrivacyParameterError(
            f"{runs:.3g} mechanism runs (steps) in one account: dpfl accounts for at most "
            f"{MAX_REPETITIONS:.0e}, beyond which rounding in each step's privacy loss "
            "would add up to a visible error in ε"
        )
    accountable, basic_epsilon, basic_delta = split_basic_composition(event.dp_event)
    only_basic = isinstance(accountable, dpe.NoOpDpEvent)
    if basic_delta > delta or (basic_delta == delta and not only_basic):
        raise PrivacyParameterError(
            f"the (ε, δ) events alone already use δ={basic_delta:g}, leaving nothing of the "
            f"target δ={delta:g} for the rest"
        )
    if only_basic:
        return EpsilonReport(_as_epsilon(basic_epsilon), delta, kind, event.neighbouring)
    note = ""
    try:
        value = _accountant_epsilon(kind, event.neighbouring, accountable, delta - basic_delta)
    except PldTooLargeError as exc:
        if accountant is not None:
            raise
        kind, note = Accountant.RDP, exc.note
        value = _accountant_epsilon(kind, event.neighbouring, accountable, delta - basic_delta)
    return EpsilonReport(_as_epsilon(basic_epsilon + value), delta, kind, event.neighbouring, note)


def _accountant_epsilon(
    kind: Accountant, neighbouring: Neighbouring, event: dpe.DpEvent, delta: float
) -> float:
    acc = make_accountant(kind, neighbouring)
    try:
        acc.compose(event)
        return float(acc.get_epsilon(delta))
    except UnsupportedEventError as exc:
        raise UnsupportedAccountingError(str(exc)) from exc
    except ArithmeticError as exc:  # e.g. σ = 1e300: σ² overflows
        raise UnsupportedAccountingError(
            f"the {kind.value.upper()} accountant cannot evaluate this event in floating "
            "point: a parameter is outside the range it handles"
        ) from exc


def _repetitions(event: dpe.DpEvent) -> int:
    """How many mechanism runs the event composes, repeats multiplied out."""
    if isinstance(event, dpe.SelfComposedDpEvent):
        return int(event.count) * _repetitions(event.event)
    if isinstance(event, dpe.ComposedDpEvent):
        return sum(_repetitions(e) for e in event.events)
    if isinstance(event, dpe.NoOpDpEvent):
        return 0
    sampled = (
        dpe.PoissonSampledDpEvent,
        dpe.SampledWithoutReplacementDpEvent,
        ClientSampledDpEvent,
    )
    return _repetitions(event.event) if isinstance(event, sampled) else 1


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


CONSORTIUM_SUBSETS = 1140
"""Most h-subsets of hospitals' plans `consortium_epsilon` composes one by one (20 choose
3): past it, the RDP bound that holds for every subset answers instead."""


@dataclass(frozen=True)
class ConsortiumEpsilon:
    """ε at δ of a patient seen by up to `hospitals` hospitals: the composition of the
    `hospitals` plans that spend the most together. `exact`: the worst subset was found by
    composing every one (`worst`, indices into the plans given); otherwise `epsilon` is the
    RDP upper bound over all subsets and `worst` is empty."""

    epsilon: float
    delta: float
    hospitals: int
    exact: bool
    worst: tuple[int, ...]
    accountant: Accountant


def consortium_epsilon(
    plans: Sequence[PrivacyEvent],
    hospitals: int,
    delta: float,
    accountant: Accountant | str | None = None,
) -> ConsortiumEpsilon:
    """ε of a patient whose records may be in any `hospitals` of the silos whose plans
    (each silo's composed events, about that patient's records there) are given.

    The silos' mechanisms run on disjoint records with independent noise, so the patient's
    loss is the composition of those silos' events, which `epsilon` analyses (PLD where it
    can): never a sum of ε's. With heterogeneous events the worst subset is not always the
    silos with the largest ε's, so every subset is composed (identical plans count once)
    while there are at most `CONSORTIUM_SUBSETS` of them. Past that, each plan's Rényi
    divergence curve is computed once, and at each order the `hospitals` largest are
    added: that curve lies above every subset's, so the ε it converts to bounds them all.
    """
    if isinstance(hospitals, bool) or not isinstance(hospitals, int) or hospitals < 1:
        raise PrivacyParameterError(
            f"hospitals per patient must be an integer ≥ 1, got {hospitals!r}"
        )
    if not plans:
        raise PrivacyParameterError("no hospital's plan to compose")
    h = min(hospitals, len(plans))
    classes: dict[str, list[int]] = {}
    for i, plan in enumerate(plans):
        classes.setdefault(plan.to_json(), []).append(i)
    members = list(classes.values())
    if math.comb(len(members) + h - 1, h) <= CONSORTIUM_SUBSETS:
        best: tuple[EpsilonReport, tuple[int, ...]] | None = None
        for picked in itertools.combinations_with_replacement(range(len(members)), h):
            counts = Counter(picked)
            if any(n > len(members[c]) for c, n in counts.items()):
                continue
            chosen = tuple(sorted(i for c, n in counts.items() for i in members[c][:n]))
            report = epsilon(compose([plans[i] for i in chosen]), delta, accountant)
            if best is None or report.epsilon > best[0].epsilon:
                best = (report, chosen)
        assert best is not None  # h ≤ len(plans): some subset exists
        report, chosen = best
        return ConsortiumEpsilon(report.epsilon, delta, h, True, chosen, report.accountant)
    return ConsortiumEpsilon(
        _rdp_top_bound([plans[m[0]] for m in members], [len(m) for m in members], h, delta),
        delta,
        h,
        False,
        (),
        Accountant.RDP,
    )


def _rdp_top_bound(
    plans: Sequence[PrivacyEvent], copies: Sequence[int], h: int, delta: float
) -> float:
    """ε at δ from, at each Rényi order, the sum of the `h` largest RDP values among the
    plans (`copies[i]` silos share plan i), basic-composition parts likewise the `h`
    largest ε's and δ's: an upper bound on every h-subset's ε."""
    curves, basic_eps, basic_delta = [], [], []
    for plan, n in zip(plans, copies, strict=True):
        rest, eps_i, delta_i = split_basic_composition(plan.dp_event)
        acc = make_accountant(Accountant.RDP, plan.neighbouring)
        try:
            acc.compose(rest)
        except UnsupportedEventError as exc:
            raise UnsupportedAccountingError(str(exc)) from exc
        curves += [np.asarray(acc._rdp, dtype=float)] * n
        basic_eps += [eps_i] * n
        basic_delta += [delta_i] * n
    top = np.sort(np.stack(curves), axis=0)[-h:].sum(axis=0)
    spent_delta = sum(sorted(basic_delta)[-h:])
    if spent_delta >= delta:
        raise PrivacyParameterError(
            f"the (ε, δ) events of {h} hospitals alone use δ={spent_delta:g} of δ={delta:g}"
        )
    value, _ = rdp.rdp_privacy_accountant.compute_epsilon(RDP_ORDERS, top, delta - spent_delta)
    return _as_epsilon(float(value) + sum(sorted(basic_eps)[-h:]))
