"""Node-level DP-SGD steps (`events.node_gaussian`): the bound checked against
dp_accounting where it reduces to a Gaussian, against an independent exact computation,
and against the true Rényi divergence of a concrete worst-case pair.

Neighbours replace one person with all their contacts, which changes up to 2S − 1 rows
(the person's, their S − 1 old contacts', their replacement's S − 1 contacts'; counted
on a real pruned graph in tests/federation/test_threshold.py): the tests below write
2S − 1 out themselves rather than read `events.replacement_rows`."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy import integrate, special, stats

from dpfl.privacy import events
from dpfl.privacy.accounting import RDP_ORDERS, epsilon, node_rdp
from dpfl.privacy.errors import PrivacyParameterError, UnsupportedAccountingError
from dpfl.privacy.events import Neighbouring, NodeSampledGaussianDpEvent


def _step(event: events.PrivacyEvent) -> NodeSampledGaussianDpEvent:
    inner = event.dp_event
    while not isinstance(inner, NodeSampledGaussianDpEvent):
        inner = inner.event
    return inner


@pytest.mark.parametrize("appearances", [1, 3, 20])
@pytest.mark.parametrize("batch", ["poisson", "fixed"])
def test_a_full_batch_is_the_gaussian_mechanism_of_the_2s_minus_1_changed_rows(
    appearances: int, batch: str
) -> None:
    """With every row in every batch ρ = 2S − 1 always: 2S − 1 rows each moved by 2C
    under noise σC are one Gaussian release of multiplier σ/(2(2S − 1)), which
    dp_accounting knows exactly."""
    sigma, steps, n = 7.0, 30, 50
    sampling = {"sample_rate": 1.0} if batch == "poisson" else {"dataset_size": n, "batch_size": n}
    node = events.node_gaussian(sigma, appearances=appearances, steps=steps, **sampling)
    gaussian = events.gaussian(
        sigma / (2 * (2 * appearances - 1)), count=steps, neighbouring=Neighbouring.REPLACE_ONE
    )
    ours, theirs = epsilon(node, 1e-5), epsilon(gaussian, 1e-5, "rdp")
    assert ours.accountant.value == "rdp"
    assert ours.epsilon == pytest.approx(theirs.epsilon, rel=1e-9)


def _exact_rdp(alpha: float, sigma: float, pmf: list[Fraction]) -> float:
    """γ(α) from exact probabilities at 50 digits, without scipy."""
    with mpmath.workdps(50):
        a = mpmath.mpf(alpha)
        total = mpmath.fsum(
            mpmath.mpf(p.numerator)
            / p.denominator
            * mpmath.exp(a * (a - 1) * 2 * k * k / mpmath.mpf(sigma) ** 2)
            for k, p in enumerate(pmf)
        )
        return float(mpmath.log(total) / (a - 1))


def _hypergeometric(n: int, s: int, b: int) -> list[Fraction]:
    total = math.comb(n, b)
    return [Fraction(math.comb(s, k) * math.comb(n - s, b - k), total) for k in range(s + 1)]


def _binomial(s: int, q: Fraction) -> list[Fraction]:
    return [math.comb(s, k) * q**k * (1 - q) ** (s - k) for k in range(s + 1)]


@pytest.mark.parametrize("appearances", [1, 4, 20, 50])
def test_rdp_matches_an_exact_independent_computation(appearances: int) -> None:
    """The seed's Fig. 10 setting (b = 512, n = 2.6M) and a Poisson one: scipy's log-pmfs
    and logsumexp against exact binomial coefficients over the 2S − 1 changed rows. At
    S = 50 and α = 1.15 the largest row counts' p underflows where their shift's expm1
    overflows: that order once read NaN, and ε 0."""
    sigma, orders = 2.0, [1.15, 2, 3, 8, 32]
    n, b, q = 2_600_000, 512, Fraction(1, 50)
    rows = 2 * appearances - 1
    fixed = events.node_gaussian(sigma, appearances=appearances, dataset_size=n, batch_size=b)
    poisson = events.node_gaussian(sigma, appearances=appearances, sample_rate=float(q))
    for event, pmf in (
        (fixed, _hypergeometric(n, rows, b)),
        (poisson, _binomial(rows, q)),
    ):
        ours = node_rdp(np.asarray(orders, dtype=float), _step(event))
        exact = [_exact_rdp(a, sigma, pmf) for a in orders]
        np.testing.assert_allclose(ours, exact, rtol=1e-9)


def test_epsilon_is_the_rdp_conversion_of_the_composed_bound() -> None:
    """One epoch of the seed's Fig. 10 (n/b steps, δ = 1/n), converted independently with
    the conversion of Canonne, Kamath and Steinke (2020) over the same orders."""
    n, b, sigma, appearances = 2_600_000, 512, 2.0, 10
    steps, delta = n // b, 1 / n
    event = events.node_gaussian(
        sigma, appearances=appearances, dataset_size=n, batch_size=b, steps=steps
    )
    orders = np.asarray(RDP_ORDERS)
    orders = orders[orders <= 64]  # ε's optimum lies far below; exact sums stay cheap
    pmf = _hypergeometric(n, 2 * appearances - 1, b)
    # non-integer orders too: the formula holds for every real α > 1
    rdp = np.array([steps * _exact_rdp(a, sigma, pmf) for a in orders])
    eps = rdp + np.log1p(-1 / orders) - (math.log(delta) + np.log(orders)) / (orders - 1)
    assert epsilon(event, delta).epsilon == pytest.approx(float(eps.min()), rel=1e-6)


def _mixture_rdp(alpha: float, sigma: float, pmf: np.ndarray) -> float:
    """The bound's formula over ρ with probabilities `pmf` (ρ = 0, 1, ...)."""
    shifts = alpha * (alpha - 1) * 2 * np.arange(len(pmf)) ** 2 / sigma**2
    return float(special.logsumexp(shifts, b=pmf)) / (alpha - 1)


@pytest.mark.parametrize("q", [0.3, 0.95])
@pytest.mark.parametrize("alpha", [2.0, 4.0, 10.0])
def test_the_bound_holds_for_a_worst_case_replacement(alpha: float, q: float) -> None:
    """Replacing a person of S = 3 changes 2S − 1 = 5 rows, each of which pushes the
    clipped sum by +C in one graph and −C in the other (aligned: the worst case); the
    rest is common to both. The true Rényi divergence of the two mixtures, by numerical
    integration, must not exceed the bound; near a full batch it exceeds the S-row
    bound (Daigavane et al.'s count, for adding or removing a node) that dpfl used to
    charge, so S rows are not enough under replacement."""
    sigma, s = 3.0, 3
    rows = 2 * s - 1
    weights = stats.binom.pmf(np.arange(rows + 1), rows, q)

    def log_density(x: float, sign: float) -> float:
        shifts = sign * np.arange(rows + 1)
        return float(special.logsumexp(stats.norm.logpdf(x, shifts, sigma), b=weights))

    def integrand(x: float) -> float:
        return math.exp(alpha * log_density(x, 1.0) + (1 - alpha) * log_density(x, -1.0))

    moment, _ = integrate.quad(integrand, -40, 40 + 4 * rows * alpha, limit=400)
    true = math.log(moment) / (alpha - 1)
    bound = node_rdp(
        np.asarray([alpha]), _step(events.node_gaussian(sigma, appearances=s, sample_rate=q))
    )
    assert 0 < true <= bound[0]
    if q > 0.9:  # near a full batch the pair comes close to the bound: a real worst case
        assert true > 0.5 * bound[0]
        assert true > _mixture_rdp(alpha, sigma, stats.binom.pmf(np.arange(s + 1), s, q))


def test_epsilon_grows_with_the_neighbourhood_size() -> None:
    """The shape of the seed's Fig. 10: one epoch, b = 512, n = 2.6M, δ = 1/n."""
    n, b = 2_600_000, 512
    eps = [
        epsilon(
            events.node_gaussian(2.0, appearances=s, dataset_size=n, batch_size=b, steps=n // b),
            1 / n,
        ).epsilon
        for s in (1, 5, 10, 20, 50)
    ]
    assert all(x < y for x, y in itertools.pairwise(eps))
    assert eps[-1] > 5 * eps[0]


def test_a_node_level_event_round_trips_and_describes_itself() -> None:
    event = events.node_gaussian(1.3, appearances=5, sample_rate=0.01, steps=7)
    assert events.PrivacyEvent.from_json(event.to_json()) == event
    fixed = events.node_gaussian(1.3, appearances=5, dataset_size=100, batch_size=10)
    assert events.PrivacyEvent.from_json(fixed.to_json()) == fixed
    assert "node-level(≤5 rows a person, 9 per replacement) Poisson(q=0.01)" in event.describe()
    assert "fixed-size(10 of 100)" in fixed.describe()
    assert event.neighbouring is Neighbouring.REPLACE_ONE


def test_client_sampled_rounds_of_node_level_steps_are_accounted() -> None:
    round_event = events.node_gaussian(2.0, appearances=4, sample_rate=0.05, steps=10)
    sampled = events.client_sampled(0.2, round_event)
    assert epsilon(sampled, 1e-6).epsilon < epsilon(round_event, 1e-6).epsilon


@pytest.mark.parametrize(
    "kwargs",
    [
        {"appearances": 3},  # neither sampling
        {"appearances": 3, "sample_rate": 0.1, "dataset_size": 10, "batch_size": 2},
        {"appearances": 0, "sample_rate": 0.1},
        {"appearances": 3, "sample_rate": 1.5},
        {"appearances": 3, "dataset_size": 10, "batch_size": 11},
        {"appearances": 30, "dataset_size": 10, "batch_size": 5},
        {"appearances": 6, "dataset_size": 10, "batch_size": 5},  # 11 rows change of 10
        {"appearances": 3, "dataset_size": 10},
    ],
)
def test_impossible_node_level_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(PrivacyParameterError):
        events.node_gaussian(1.0, **kwargs)  # type: ignore[arg-type]


def test_node_level_steps_are_replace_one_and_rdp_only() -> None:
    step = _step(events.node_gaussian(1.0, appearances=2, sample_rate=0.1))
    with pytest.raises(PrivacyParameterError, match="replace-one"):
        events.PrivacyEvent(step, Neighbouring.ADD_REMOVE)
    with pytest.raises(UnsupportedAccountingError, match="RDP"):
        epsilon(events.PrivacyEvent(step, Neighbouring.REPLACE_ONE), 1e-5, "pld")
