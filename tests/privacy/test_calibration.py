"""Calibration returns the least noise (or most steps) that keeps within the target."""

from __future__ import annotations

import pytest
from dp_accounting import get_epsilon_gaussian
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfl.privacy import (
    Accountant,
    PrivacyParameterError,
    accounting,
    calibrate_dpsgd_noise,
    calibrate_noise,
    epsilon,
    events,
    gaussian_noise_multiplier,
    max_dpsgd_steps,
)
from dpfl.privacy.accounting import PldTooLargeError
from dpfl.privacy.calibration import NOISE_FLOOR, NOISE_TOLERANCE, STEPS_LIMIT


def _eps(q: float, sigma: float, steps: int, delta: float, accountant: str) -> float:
    return epsilon(events.poisson_gaussian(q, sigma, steps=steps), delta, accountant).epsilon


@settings(max_examples=8, deadline=None)
@given(
    target=st.floats(0.3, 8.0),
    q=st.floats(0.001, 0.2),
    steps=st.integers(1, 2000),
)
def test_rdp_calibration_round_trip(target: float, q: float, steps: int) -> None:
    sigma = calibrate_dpsgd_noise(target, 1e-5, sample_rate=q, steps=steps, accountant="rdp")
    assert _eps(q, sigma, steps, 1e-5, "rdp") <= target
    if sigma - NOISE_TOLERANCE > NOISE_FLOOR:  # and no smaller σ (to the tolerance) would do
        assert _eps(q, sigma - NOISE_TOLERANCE, steps, 1e-5, "rdp") >= target - 1e-9


@pytest.mark.parametrize(("target", "q", "steps"), [(1.0, 0.0036, 300), (4.0, 0.05, 100)])
def test_pld_calibration_round_trip(target: float, q: float, steps: int) -> None:
    sigma = calibrate_dpsgd_noise(target, 1.3e-5, sample_rate=q, steps=steps)
    assert _eps(q, sigma, steps, 1.3e-5, "pld") <= target
    assert _eps(q, sigma - NOISE_TOLERANCE, steps, 1.3e-5, "pld") >= target - 1e-9
    # PLD is tighter, so it needs less noise than RDP for the same target
    assert sigma < calibrate_dpsgd_noise(
        target, 1.3e-5, sample_rate=q, steps=steps, accountant="rdp"
    )


def test_calibration_of_any_event_family() -> None:
    """A*STAR-style mix: a fixed (ε, δ) charge plus Gaussian releases to calibrate."""

    def family(sigma: float) -> events.PrivacyEvent:
        return events.compose([events.gaussian(sigma, count=3), events.approximate_dp(0.2, 1e-6)])

    sigma = calibrate_noise(1.0, 1e-5, family, accountant="rdp", tolerance=1e-3)
    assert epsilon(family(sigma), 1e-5, "rdp").epsilon <= 1.0
    assert epsilon(family(sigma - 1e-3), 1e-5, "rdp").epsilon > 1.0 - 1e-9
    with pytest.raises(PrivacyParameterError, match="nothing is left"):
        calibrate_noise(0.1, 1e-5, family)


def test_loose_target_returns_the_noise_floor() -> None:
    sigma = calibrate_dpsgd_noise(500.0, 1e-5, sample_rate=0.01, steps=10, accountant="rdp")
    assert sigma == NOISE_FLOOR
    assert _eps(0.01, sigma, 10, 1e-5, "rdp") <= 500.0


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_max_steps_is_exact(accountant: str) -> None:
    steps = max_dpsgd_steps(
        1.0, 1e-5, sample_rate=0.01, noise_multiplier=1.0, accountant=accountant
    )
    assert steps > 0
    assert _eps(0.01, 1.0, steps, 1e-5, accountant) <= 1.0
    assert _eps(0.01, 1.0, steps + 1, 1e-5, accountant) > 1.0


def test_max_steps_is_zero_when_one_step_is_too_many() -> None:
    assert max_dpsgd_steps(0.01, 1e-5, sample_rate=1.0, noise_multiplier=1.0) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target_epsilon": 0.0}, "target ε"),
        ({"target_epsilon": -1.0}, "target ε"),
        ({"delta": 1.0}, "δ must lie"),
        ({"sample_rate": 0.0}, "sample rate"),
        ({"sample_rate": 1.5}, "sample rate"),
        ({"steps": -3}, "step count"),
    ],
)
def test_impossible_calibration_requests(kwargs: dict[str, float], message: str) -> None:
    request = {"target_epsilon": 1.0, "delta": 1e-5, "sample_rate": 0.01, "steps": 100}
    request.update(kwargs)
    with pytest.raises(PrivacyParameterError, match=message):
        calibrate_dpsgd_noise(
            request["target_epsilon"],
            request["delta"],
            sample_rate=request["sample_rate"],
            steps=int(request["steps"]),
        )


@pytest.mark.parametrize("target", [0.1, 1.0, 8.0, 40.0])
def test_analytic_gaussian_noise_meets_any_epsilon(target: float) -> None:
    sigma = gaussian_noise_multiplier(target, 1e-6)
    if target < 40:
        assert epsilon(events.gaussian(sigma), 1e-6, "pld").epsilon <= target + 0.01
    else:  # σ ≈ 0.1: a PLD of 1.4 million points, past the limit; RDP answers, looser
        with pytest.raises(PldTooLargeError):
            epsilon(events.gaussian(sigma), 1e-6, "pld")
        assert epsilon(events.gaussian(sigma), 1e-6).epsilon > target
    assert get_epsilon_gaussian(sigma, 1e-6) <= target
    assert get_epsilon_gaussian(sigma * (1 - 1e-6), 1e-6) > target


def test_pld_calibration_is_within_tolerance_of_the_least_sigma_on_the_fine_grid() -> None:
    """README's example: the coarse grid's answer (1.4159) is 1.3e-3 above the least σ."""
    sigma = calibrate_dpsgd_noise(1.0, 1e-5, sample_rate=0.01, steps=1000)
    assert _eps(0.01, sigma, 1000, 1e-5, "pld") <= 1.0
    assert _eps(0.01, sigma - NOISE_TOLERANCE, 1000, 1e-5, "pld") > 1.0


def test_calibration_answers_with_rdp_where_the_pld_would_be_too_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The answer is judged by the accountant that will charge it, which says so."""
    monkeypatch.setattr(accounting, "PLD_MAX_POINTS", 2**14)
    sigma = calibrate_dpsgd_noise(1.0, 1e-5, sample_rate=0.01, steps=1000)
    assert sigma == calibrate_dpsgd_noise(1.0, 1e-5, sample_rate=0.01, steps=1000, accountant="rdp")
    report = epsilon(events.poisson_gaussian(0.01, sigma, steps=1000), 1e-5)
    assert report.accountant is Accountant.RDP and "PLD would need" in report.note
    with pytest.raises(PldTooLargeError):
        calibrate_dpsgd_noise(1.0, 1e-5, sample_rate=0.01, steps=1000, accountant="pld")


def test_max_steps_answer_with_rdp_where_the_pld_would_be_too_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(accounting, "PLD_MAX_POINTS", 2**14)
    rdp = max_dpsgd_steps(1.0, 1e-5, sample_rate=0.01, noise_multiplier=1.0, accountant="rdp")
    assert max_dpsgd_steps(1.0, 1e-5, sample_rate=0.01, noise_multiplier=1.0) == rdp
    with pytest.raises(PldTooLargeError):
        max_dpsgd_steps(1.0, 1e-5, sample_rate=0.01, noise_multiplier=1.0, accountant="pld")


def test_max_steps_stops_at_its_limit() -> None:
    steps = max_dpsgd_steps(10.0, 1e-5, sample_rate=0.001, noise_multiplier=5.0)
    assert steps == STEPS_LIMIT
    assert _eps(0.001, 5.0, STEPS_LIMIT, 1e-5, "pld") <= 10.0
