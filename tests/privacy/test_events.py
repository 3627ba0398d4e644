"""Events: every constructor validates, round-trips through JSON and reads well."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest
from dp_accounting import dp_event as dpe
from dp_accounting import rdp
from hypothesis import given
from hypothesis import strategies as st

from dpfl.privacy import Neighbouring, PrivacyEvent, PrivacyParameterError, events
from dpfl.privacy.accounting import RDP_ORDERS, epsilon
from dpfl.privacy.events import ApproximateDpEvent, ClientSampledDpEvent


@pytest.mark.parametrize("q", [0.0, -0.1, 1.0001, math.nan])
def test_sample_rate_outside_unit_interval_is_refused(q: float) -> None:
    with pytest.raises(PrivacyParameterError, match="sample rate"):
        events.poisson_gaussian(q, 1.0)


@pytest.mark.parametrize("sigma", [0.0, -1.0, math.nan, math.inf])
def test_noise_must_be_finite_and_positive(sigma: float) -> None:
    with pytest.raises(PrivacyParameterError, match="noise multiplier"):
        events.poisson_gaussian(0.1, sigma)
    with pytest.raises(PrivacyParameterError, match="noise multiplier"):
        events.gaussian(sigma)


@pytest.mark.parametrize("steps", [-1, 2.5, True])
def test_step_counts_are_non_negative_integers(steps: object) -> None:
    with pytest.raises(PrivacyParameterError, match="step count"):
        events.poisson_gaussian(0.1, 1.0, steps=steps)  # type: ignore[arg-type]


def test_zero_steps_is_no_event() -> None:
    assert isinstance(events.poisson_gaussian(0.1, 1.0, steps=0).dp_event, dpe.NoOpDpEvent)


def test_fixed_size_sampling_only_under_replace_one() -> None:
    event = events.fixed_size_gaussian(1000, 10, 1.0, steps=5)
    assert event.neighbouring is Neighbouring.REPLACE_ONE
    with pytest.raises(PrivacyParameterError, match="replace-one"):
        PrivacyEvent(event.dp_event, Neighbouring.ADD_REMOVE)
    with pytest.raises(PrivacyParameterError, match="batch_size"):
        events.fixed_size_gaussian(10, 11, 1.0)


def _gaussian_delta(eps: float, sensitivity_over_std: float) -> float:
    """Exact δ(ε) of the Gaussian mechanism (Balle & Wang 2018, Thm 8)."""
    mu, phi = sensitivity_over_std, NormalDist().cdf
    return phi(mu / 2 - eps / mu) - math.exp(eps) * phi(-mu / 2 - eps / mu)


def test_fixed_size_gaussian_reads_dpsgd_sigma_against_the_replace_one_sensitivity() -> None:
    """One full batch of n is the Gaussian mechanism: noise std σC on a sum that replacing
    one record moves by up to 2C. The audit's case: σ = 2, δ = 1e-5."""
    sigma, delta = 2.0, 1e-5
    charged = epsilon(events.fixed_size_gaussian(100, 100, sigma), delta).epsilon
    gaussian = rdp.RdpAccountant(list(RDP_ORDERS))
    gaussian.compose(dpe.GaussianDpEvent(sigma / 2))
    assert charged == pytest.approx(gaussian.get_epsilon(delta), rel=1e-12)
    assert charged == pytest.approx(4.73, abs=0.005)
    assert _gaussian_delta(charged, 2 / sigma) <= delta  # an upper bound on the true ε
    assert _gaussian_delta(2.17, 2 / sigma) > 1000 * delta  # σ read as is: unsound
    subsampled = events.fixed_size_gaussian(1000, 10, sigma, steps=3).dp_event
    assert subsampled == dpe.SelfComposedDpEvent(
        dpe.SampledWithoutReplacementDpEvent(1000, 10, dpe.GaussianDpEvent(sigma / 2)), 3
    )


def test_poisson_sampling_only_under_add_remove() -> None:
    event = events.poisson_gaussian(0.1, 1.0)
    with pytest.raises(PrivacyParameterError, match="add/remove"):
        PrivacyEvent(event.dp_event, Neighbouring.REPLACE_ONE)


def test_approximate_events_cannot_be_sampled() -> None:
    sampled = dpe.PoissonSampledDpEvent(0.1, ApproximateDpEvent(1.0, 1e-6))
    with pytest.raises(PrivacyParameterError, match="only be composed"):
        PrivacyEvent(sampled)
    with pytest.raises(PrivacyParameterError, match="δ"):
        events.approximate_dp(1.0, 1.0)


def test_composing_different_relations_is_refused() -> None:
    with pytest.raises(PrivacyParameterError, match="different neighbouring"):
        events.compose([events.poisson_gaussian(0.1, 1.0), events.fixed_size_gaussian(10, 2, 1.0)])


def test_kerkouche_round_is_q1_then_q2_steps() -> None:
    event = events.kerkouche_round(
        client_rate=0.3, batch_size=50, min_silo_size=1000, noise_multiplier=1.1, local_steps=4
    ).dp_event
    assert isinstance(event, dpe.ComposedDpEvent)
    first, rest = event.events
    assert first == dpe.PoissonSampledDpEvent(0.3 * 0.05, dpe.GaussianDpEvent(1.1))
    assert rest == dpe.SelfComposedDpEvent(
        dpe.PoissonSampledDpEvent(0.05, dpe.GaussianDpEvent(1.1)), 3
    )


def test_client_sampling_at_rate_one_is_the_round_itself() -> None:
    round_event = events.poisson_gaussian(0.1, 1.0, steps=3)
    assert events.client_sampled(1.0, round_event) == round_event
    sampled = events.client_sampled(0.25, round_event).dp_event
    assert sampled == ClientSampledDpEvent(0.25, round_event.dp_event)


def test_description_names_mechanism_parameters_and_relation() -> None:
    text = events.poisson_gaussian(0.0036, 1.08, steps=300).describe()
    assert text == "300 × Poisson(q=0.0036) Gaussian(σ=1.08) [add/remove one record]"


def _all_kinds() -> list[PrivacyEvent]:
    step = events.poisson_gaussian(0.01, 1.2, steps=7)
    return [
        step,
        events.gaussian(2.0, count=3),
        events.laplace(0.5),
        events.fixed_size_gaussian(500, 25, 0.9, steps=4),
        events.approximate_dp(0.1, 1e-7, count=5),
        events.client_sampled(0.3, step),
        events.kerkouche_round(
            client_rate=0.5, batch_size=10, min_silo_size=100, noise_multiplier=1.0, local_steps=2
        ),
        events.compose([step, events.approximate_dp(0.2, 1e-8)]),
    ]


@pytest.mark.parametrize("event", _all_kinds(), ids=lambda e: e.describe())
def test_json_round_trip(event: PrivacyEvent) -> None:
    assert PrivacyEvent.from_json(event.to_json()) == event


@given(q=st.floats(1e-6, 1.0), sigma=st.floats(1e-3, 1e3), steps=st.integers(0, 10**6))
def test_json_round_trip_of_any_dpsgd_run(q: float, sigma: float, steps: int) -> None:
    event = events.poisson_gaussian(q, sigma, steps=steps)
    assert PrivacyEvent.from_json(event.to_json()) == event


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "{}",
        '{"neighbouring": "add_remove", "event": {"type": "os.system"}}',
        '{"neighbouring": "sideways", "event": {"type": "NoOpDpEvent"}}',
        '{"neighbouring": "add_remove", "event": {"type": "GaussianDpEvent", '
        '"noise_multiplier": -1}}',
    ],
)
def test_malformed_serialised_events_are_refused(text: str) -> None:
    with pytest.raises(PrivacyParameterError):
        PrivacyEvent.from_json(text)
