"""Calibration: the least noise, or the most steps, that a target (ε, δ) allows.

Both searches are `dp_accounting.calibrate_dp_mechanism` (Brent's method with a bisection
fallback) on a monotone ε: ε falls as σ grows and rises with the number of steps. The
result always satisfies the target; the tolerance bounds how far it is from the optimum
(σ within `tolerance` above the least σ; steps exact). Each answer is re-checked with
`accounting.epsilon`, the very function the ledger uses, before it is returned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from dp_accounting import get_epsilon_gaussian, get_sigma_gaussian
from dp_accounting.mechanism_calibration import (
    ExplicitBracketInterval,
    calibrate_dp_mechanism,
)

from dpfl.privacy import events
from dpfl.privacy.accounting import (
    Accountant,
    check_delta,
    choose_accountant,
    epsilon,
    make_accountant,
    split_basic_composition,
)
from dpfl.privacy.errors import PrivacyParameterError

_Param = TypeVar("_Param", int, float)

NOISE_TOLERANCE = 1e-4
"""Default absolute tolerance on σ: the answer lies in [σ*, σ* + 1e-4]."""

NOISE_FLOOR = 0.25
"""Smallest σ searched. At σ = 0.25 one full-batch step already costs ε ≈ 25 at δ = 1e-5,
and PLD grids grow as 1/σ²; a target so loose that less noise would do gets this σ."""


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
    eps_left, delta_left = _left_for_accountant(probe, target_epsilon, delta)
    within = _within_target(make_event, target_epsilon, delta, kind)
    # The search runs on the coarse accountant (fast, an upper bound a little above the
    # fine one), so its σ is at or just above the least; the fine check has the last word.
    roughly_within = _within_target(make_event, target_epsilon, delta, kind, coarse=True)
    bracket = _bracket(roughly_within, 1.0)
    if bracket is None:
        return _least_fine(within, NOISE_FLOOR, tolerance)
    sigma = float(
        calibrate_dp_mechanism(
            lambda: make_accountant(kind, probe.neighbouring, coarse=True),
            lambda s: split_basic_composition(make_event(s).dp_event)[0],
            eps_left,
            delta_left,
            bracket,
            tol=tolerance,
        )
    )
    return _least_fine(within, sigma, tolerance)


def _least_fine(within: Callable[[float], bool], sigma: float, tolerance: float) -> float:
    """Never return a σ whose (fine) ε exceeds the target."""
    while not within(sigma):
        sigma += tolerance
    return sigma


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
    limit: int = 10**7,
) -> int:
    """Largest T ≤ `limit` with ε(make_event(T)) ≤ target at δ (0 if one step is too many).

    Doubling then integer bisection on T: exact, since ε never falls as steps are added.
    """
    _check_target(target_epsilon, delta)
    kind = choose_accountant(make_event(1), accountant)
    within = _within_target(make_event, target_epsilon, delta, kind)
    if not within(0):
        raise PrivacyParameterError("the budget is already exhausted before any step")
    affordable, too_many = 0, 1
    while within(too_many):
        if too_many >= limit:
            return limit
        affordable, too_many = too_many, min(2 * too_many, limit)
    while too_many - affordable > 1:
        middle = (affordable + too_many) // 2
        affordable, too_many = (middle, too_many) if within(middle) else (affordable, middle)
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


def _bracket(within: Callable[[float], bool], start: float) -> ExplicitBracketInterval | None:
    """An interval [too little noise, enough noise] around the least σ, found by doubling
    and halving from `start`; None when even the floor σ is enough."""
    enough = start
    while not within(enough):
        enough *= 2
        if enough > 2.0**30:
            raise PrivacyParameterError("no noise multiplier up to 2^30 meets this target")
    too_little = enough / 2
    while within(too_little):
        if too_little <= NOISE_FLOOR:
            return None
        enough, too_little = too_little, max(too_little / 2, NOISE_FLOOR)
    return ExplicitBracketInterval(too_little, enough)


def _check_target(target_epsilon: float, delta: float) -> None:
    if not (isinstance(target_epsilon, int | float) and 0 < target_epsilon < float("inf")):
        raise PrivacyParameterError(f"target ε must be a finite number > 0, got {target_epsilon!r}")
    check_delta(delta)


def _left_for_accountant(
    probe: events.PrivacyEvent, target_epsilon: float, delta: float
) -> tuple[float, float]:
    """The (ε, δ) left for the accountant once basic-composition events are paid."""
    _, basic_eps, basic_delta = split_basic_composition(probe.dp_event)
    if basic_eps >= target_epsilon or basic_delta >= delta:
        raise PrivacyParameterError(
            f"the (ε, δ) events alone spend ε={basic_eps:g}, δ={basic_delta:g}: "
            f"nothing is left of ε={target_epsilon:g}, δ={delta:g}"
        )
    return target_epsilon - basic_eps, delta - basic_delta


def _within_target(
    make_event: Callable[[_Param], events.PrivacyEvent],
    target_epsilon: float,
    delta: float,
    kind: Accountant,
    *,
    coarse: bool = False,
) -> Callable[[_Param], bool]:
    def within(value: _Param) -> bool:
        return epsilon(make_event(value), delta, kind, coarse=coarse).epsilon <= target_epsilon

    return within
