"""Calibration: the least noise, or the most steps, that a target (ε, δ) allows.

Both searches run on a monotone ε (it falls as σ grows and rises with the number of
steps), evaluated by `accounting.epsilon`, the very function the ledger uses, so the
answer is judged by the accountant that will charge it. The result always satisfies the
target; σ lies within `tolerance` above the least σ that does, and steps are exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from dp_accounting import get_epsilon_gaussian, get_sigma_gaussian

from dpfl.privacy import events
from dpfl.privacy.accounting import (
    Accountant,
    EpsilonReport,
    PldTooLargeError,
    check_delta,
    choose_accountant,
    consortium_epsilon,
    epsilon,
    split_basic_composition,
)
from dpfl.privacy.errors import PrivacyParameterError

_Param = TypeVar("_Param", int, float)

NOISE_TOLERANCE = 1e-4
"""Default absolute tolerance on σ: the answer lies in [σ*, σ* + 1e-4]."""

NOISE_FLOOR = 0.25
"""Smallest σ searched. At σ = 0.25 one full-batch step already costs ε ≈ 25 at δ = 1e-5,
and PLD grids grow as 1/σ²; a target so loose that less noise would do gets this σ."""

NOISE_CEILING = 2.0**30
"""Largest σ searched; a target that needs more is refused."""

STEPS_LIMIT = 10**7
"""`max_steps` searches no further: an answer of exactly this many means at least this many."""

_Point = tuple[float, float]
"""(σ, ε at σ)."""


def calibrate_noise(
    target_epsilon: float,
    delta: float,
    make_event: Callable[[float], events.PrivacyEvent],
    *,
    accountant: Accountant | str | None = None,
    tolerance: float = NOISE_TOLERANCE,
) -> float:
    """Smallest noise multiplier σ (to `tolerance`) with ε(make_event(σ)) ≤ target at δ."""
    _check_target(target_epsilon, delta)
    if not tolerance > 0:
        raise PrivacyParameterError(f"tolerance must be > 0, got {tolerance!r}")
    probe = make_event(1.0)
    kind = choose_accountant(probe, accountant)
    _check_something_left(probe, target_epsilon, delta)
    # RDP first: its cost does not grow with the number of steps, it is smooth in σ, and
    # its σ lies near PLD's. The PLD search then starts from its answer.
    rdp = _Epsilon(make_event, delta, Accountant.RDP)
    bracket = _bracket(rdp, target_epsilon, (1.0, rdp(1.0)), 0.5)
    if bracket is None:
        start, power = (NOISE_FLOOR, rdp(NOISE_FLOOR)), 1.0
    else:
        below, start = _least(rdp, target_epsilon, *bracket, tolerance)
        power = math.log(below[1] / max(start[1], _TINY)) / math.log(start[0] / below[0])
    if kind is Accountant.RDP:
        return start[0]
    eps = _Epsilon(make_event, delta, accountant)
    at_start = (start[0], eps(start[0]))
    if eps.by_rdp(start[0]):  # the PLD would be too large here, and with less noise too
        return start[0]
    # ε falls about as σ^-power: a first step to just past where the PLD meets the target
    # (or, where the PLD asked for is too large, a doubling of σ).
    step = start[0]
    if math.isfinite(at_start[1]):
        guess = start[0] * (at_start[1] / target_epsilon) ** (1 / power)
        step = 1.5 * abs(guess - start[0]) + tolerance
    pld_bracket = _bracket(eps, target_epsilon, at_start, step)
    if pld_bracket is None:
        return NOISE_FLOOR
    below, above = _least(eps, target_epsilon, *pld_bracket, tolerance)
    if eps.refusal is not None and math.isinf(below[1]):
        raise eps.refusal  # the PLD asked for cannot tell whether a little less noise would do
    return above[0]


def calibrate_consortium_noise(
    target_epsilon: float,
    delta: float,
    make_plans: Callable[[float], Sequence[events.PrivacyEvent]],
    hospitals: int,
    *,
    accountant: Accountant | str | None = None,
    tolerance: float = NOISE_TOLERANCE,
) -> float:
    """Smallest σ (to `tolerance`) at which a patient seen by up to `hospitals` of the silos
    whose plans `make_plans(σ)` gives stays within ε = target at δ
    (`accounting.consortium_epsilon`, the figure the report shows)."""
    _check_target(target_epsilon, delta)
    probe = make_plans(1.0)
    for plan in probe:
        choose_accountant(plan, accountant)
    eps = _Consortium(make_plans, delta, accountant, hospitals)
    bracket = _bracket(eps, target_epsilon, (1.0, eps(1.0)), 0.5)
    if bracket is None:
        return NOISE_FLOOR
    return _least(eps, target_epsilon, *bracket, tolerance)[1][0]


def gaussian_noise_multiplier(epsilon: float, delta: float) -> float:
    """σ/Δ of the one-shot Gaussian mechanism that is exactly (ε, δ)-DP at any ε.

    The analytic Gaussian mechanism (Balle & Wang 2018, via `dp_accounting`); the classical
    √(2 ln(1.25/δ))/ε or (1 + √(2 ln 1/δ))/ε over-noise and hold only for small ε. The
    root is nudged up until the analytic ε is within the target.
    """
    _check_target(epsilon, delta)
    sigma = float(get_sigma_gaussian(epsilon, delta))
    while get_epsilon_gaussian(sigma, delta) > epsilon:
        sigma *= 1 + 1e-9
    return sigma


def calibrate_dpsgd_noise(
    target_epsilon: float,
    delta: float,
    *,
    sample_rate: float,
    steps: int,
    accountant: Accountant | str | None = None,
    tolerance: float = NOISE_TOLERANCE,
) -> float:
    """Smallest σ for `steps` Poisson-sampled DP-SGD steps at rate q within (ε, δ)."""
    events.poisson_gaussian(sample_rate, 1.0, steps=steps)  # validate q and steps up front
    return calibrate_noise(
        target_epsilon,
        delta,
        lambda sigma: events.poisson_gaussian(sample_rate, sigma, steps=steps),
        accountant=accountant,
        tolerance=tolerance,
    )


def max_steps(
    target_epsilon: float,
    delta: float,
    make_event: Callable[[int], events.PrivacyEvent],
    *,
    accountant: Accountant | str | None = None,
    limit: int = STEPS_LIMIT,
) -> int:
    """Largest T ≤ `limit` with ε(make_event(T)) ≤ target at δ (0 if one step is too many).

    Doubling then integer bisection on T: exact, since ε never falls as steps are added.
    """
    _check_target(target_epsilon, delta)
    choose_accountant(make_event(1), accountant)
    eps = _Epsilon(make_event, delta, accountant)
    if eps(0) > target_epsilon:
        raise PrivacyParameterError("the budget is already exhausted before any step")
    affordable, too_many = 0, 1
    while eps(too_many) <= target_epsilon:
        if too_many >= limit:
            return limit
        affordable, too_many = too_many, min(2 * too_many, limit)
    while too_many - affordable > 1:
        middle = (affordable + too_many) // 2
        affordable, too_many = (
            (middle, too_many) if eps(middle) <= target_epsilon else (affordable, middle)
        )
    if eps.refusal is not None and math.isinf(eps(too_many)):
        raise eps.refusal  # the PLD asked for cannot tell whether one more step would fit
    return affordable


def max_dpsgd_steps(
    target_epsilon: float,
    delta: float,
    *,
    sample_rate: float,
    noise_multiplier: float,
    accountant: Accountant | str | None = None,
) -> int:
    """Largest number of Poisson DP-SGD steps at (q, σ) that stays within (ε, δ)."""
    return max_steps(
        target_epsilon,
        delta,
        lambda t: events.poisson_gaussian(sample_rate, noise_multiplier, steps=t),
        accountant=accountant,
    )


class _Epsilon(Generic[_Param]):
    """ε(make_event(x)) at δ, remembered, or ∞ where an explicitly requested PLD would pass
    its size limit (little noise, many steps): such an x is treated as over the target."""

    def __init__(
        self,
        make_event: Callable[[_Param], events.PrivacyEvent],
        delta: float,
        accountant: Accountant | str | None,
    ) -> None:
        self.make_event: Callable[[_Param], events.PrivacyEvent] = make_event
        self.delta, self.accountant = delta, accountant
        self.reports: dict[_Param, EpsilonReport | None] = {}
        self.refusal: PldTooLargeError | None = None

    def __call__(self, value: _Param) -> float:
        if value not in self.reports:
            try:
                self.reports[value] = epsilon(self.make_event(value), self.delta, self.accountant)
            except PldTooLargeError as exc:
                self.reports[value], self.refusal = None, exc
        report = self.reports[value]
        return math.inf if report is None else report.epsilon

    def by_rdp(self, value: _Param) -> bool:
        report = self.reports.get(value)
        return report is not None and report.accountant is Accountant.RDP


class _Consortium(_Epsilon[float]):
    """The consortium ε at σ (`consortium_epsilon` of the silos' plans), remembered; ∞
    where an explicitly requested PLD would pass its size limit, as in `_Epsilon`."""

    def __init__(
        self,
        make_plans: Callable[[float], Sequence[events.PrivacyEvent]],
        delta: float,
        accountant: Accountant | str | None,
        hospitals: int,
    ) -> None:
        super().__init__(lambda _: events.compose([]), delta, accountant)
        self.make_plans, self.hospitals = make_plans, hospitals
        self.values: dict[float, float] = {}

    def __call__(self, value: float) -> float:
        if value not in self.values:
            try:
                self.values[value] = consortium_epsilon(
                    self.make_plans(value), self.hospitals, self.delta, self.accountant
                ).epsilon
            except PldTooLargeError as exc:
                self.values[value], self.refusal = math.inf, exc
        return self.values[value]


def _bracket(
    eps: _Epsilon[float], target: float, start: _Point, step: float
) -> tuple[_Point, _Point] | None:
    """Points either side of the least σ that meets the target: from `start`, by steps that
    double each time, down while the target is met and up while it is not; None when
    `NOISE_FLOOR` meets it."""
    point = start
    if point[1] <= target:
        while point[0] > NOISE_FLOOR:
            sigma = max(point[0] - step, NOISE_FLOOR)
            step *= 2
            lower = (sigma, eps(sigma))
            if lower[1] > target:
                return lower, point
            point = lower
        return None
    while point[0] < NOISE_CEILING:
        sigma = min(point[0] + step, NOISE_CEILING)
        step *= 2
        upper = (sigma, eps(sigma))
        if upper[1] <= target:
            return point, upper
        point = upper
    if eps.refusal is not None and math.isinf(point[1]):
        raise eps.refusal
    raise PrivacyParameterError(f"no noise multiplier up to {NOISE_CEILING:g} meets this target")


def _least(
    eps: _Epsilon[float], target: float, below: _Point, above: _Point, tolerance: float
) -> tuple[_Point, _Point]:
    """Narrow (below, above], where ε(below) > target ≥ ε(above), to `tolerance`. ε(σ) is
    smooth, close to a power of σ, so each step probes either side of where the secant
    through the two latest points, on log scales, meets the target: that closes the
    interval within a few steps. Bisection takes over after `_SECANT_STEPS`, or at ε = ∞."""
    latest = (below, above)
    steps = 0
    while above[0] - below[0] > tolerance:
        (s1, e1), (s2, e2) = ((math.log(s), math.log(max(e, _TINY))) for s, e in latest)
        if steps < _SECANT_STEPS and math.isfinite(e1 + e2) and e1 != e2:
            root = math.exp(s1 + (math.log(target) - e1) * (s2 - s1) / (e2 - e1))
            probes = [root - 0.4 * tolerance, root + 0.4 * tolerance]
        else:
            probes = [(below[0] + above[0]) / 2]
        steps += 1
        for probe in probes:
            sigma = min(max(probe, below[0] + tolerance / 4), above[0] - tolerance / 4)
            if below[0] < sigma < above[0]:
                point = (sigma, eps(sigma))
                latest = (latest[1], point)
                below, above = (below, point) if point[1] <= target else (point, above)
    return below, above


_TINY = 1e-300
_SECANT_STEPS = 4


def _check_target(target_epsilon: float, delta: float) -> None:
    if not (isinstance(target_epsilon, int | float) and 0 < target_epsilon < float("inf")):
        raise PrivacyParameterError(f"target ε must be a finite number > 0, got {target_epsilon!r}")
    check_delta(delta)


def _check_something_left(probe: events.PrivacyEvent, target_epsilon: float, delta: float) -> None:
    """Refuse a target that the basic-composition (ε, δ) events alone already spend."""
    _, basic_eps, basic_delta = split_basic_composition(probe.dp_event)
    if basic_eps >= target_epsilon or basic_delta >= delta:
        raise PrivacyParameterError(
            f"the (ε, δ) events alone spend ε={basic_eps:g}, δ={basic_delta:g}: "
            f"nothing is left of ε={target_epsilon:g}, δ={delta:g}"
        )
