"""Accountants against published figures and against independent computations."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting import dp_event as dpe
from dp_accounting import get_epsilon_gaussian, rdp
from dp_accounting.pld import privacy_loss_distribution
from opacus.accountants import PRVAccountant
from opacus.accountants.analysis import rdp as opacus_rdp

from dpfl.privacy import (
    Accountant,
    DeltaTooLargeWarning,
    PrivacyParameterError,
    UnsupportedAccountingError,
    accounting,
    epsilon,
    events,
)
from dpfl.privacy.accounting import (
    PLD_DISCRETISATION,
    RDP_ORDERS,
    NeighboringRelation,
    PldTooLargeError,
    _gaussian_pld,
    _StepCache,
    check_delta,
)

GRID = [  # (q, σ, steps, δ): DP-SGD regimes from the seeds and the tutorials
    (0.0036, 1.08, 300, 1.3e-5),  # Kerkouche, ε = 1 row
    (0.0036, 0.63, 300, 1.3e-5),  # Kerkouche, ε = 4 row
    (256 / 60000, 1.1, 60 * 60000 // 256, 1e-5),  # TF Privacy MNIST tutorial
    (0.01, 4.0, 10000, 1e-5),  # Abadi et al. 2016
    (0.05, 1.0, 200, 1e-6),
    (0.1, 2.0, 50, 1e-5),
    (1.0, 5.0, 10, 1e-5),  # full batch: plain Gaussian steps
]


def test_issue_reference_values() -> None:
    """q=0.0036, σ=1.08, 300 steps, δ=1.3e-5: RDP ≈ 0.73 and PLD ≈ 0.29."""
    event = events.poisson_gaussian(0.0036, 1.08, steps=300)
    by_rdp = epsilon(event, 1.3e-5, "rdp").epsilon
    by_pld = epsilon(event, 1.3e-5, "pld").epsilon
    assert by_rdp == pytest.approx(0.73, abs=0.03)
    assert by_pld == pytest.approx(0.29, abs=0.01)
    assert epsilon(event, 1.3e-5).accountant.value == "pld"  # PLD is the default


def test_abadi_2016_moments_accountant() -> None:
    """Abadi et al. report ε ≈ 1.26 for q=0.01, σ=4, T=10⁴, δ=1e-5 (moments accountant:
    integer λ ≤ 32, tail bound). The same analysis recomputed gives 1.26; ours is tighter."""
    orders = np.arange(2, 34)
    accountant = rdp.RdpAccountant(list(orders))
    accountant.compose(dpe.PoissonSampledDpEvent(0.01, dpe.GaussianDpEvent(4.0)), 10000)
    moments = float(np.min(accountant._rdp + np.log(1e5) / (orders - 1)))
    assert moments == pytest.approx(1.26, abs=0.005)
    event = events.poisson_gaussian(0.01, 4.0, steps=10000)
    assert epsilon(event, 1e-5, "rdp").epsilon < moments
    assert epsilon(event, 1e-5, "pld").epsilon < epsilon(event, 1e-5, "rdp").epsilon


@pytest.mark.parametrize(("q", "sigma", "steps", "delta"), GRID)
def test_rdp_matches_opacus(q: float, sigma: float, steps: int, delta: float) -> None:
    """Opacus's own RDP code over its default orders. Our grid contains those orders, so we
    may only be tighter: by up to 3% (0.712 vs 0.735 on the first row), where the best
    order falls between Opacus's."""
    alphas = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
    curve = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=alphas)
    theirs, _ = opacus_rdp.get_privacy_spent(orders=alphas, rdp=curve, delta=delta)
    ours = epsilon(events.poisson_gaussian(q, sigma, steps=steps), delta, "rdp").epsilon
    assert ours <= theirs * (1 + 1e-6)  # orders are rounded to 4 decimals
    assert ours == pytest.approx(theirs, rel=0.05)


@pytest.mark.parametrize(("q", "sigma", "steps", "delta"), GRID)
def test_pld_matches_independent_computations(
    q: float, sigma: float, steps: int, delta: float
) -> None:
    """PLD equals dp_accounting's PLD built by hand, agrees with Opacus's PRV accountant,
    and is never looser than RDP."""
    ours = epsilon(events.poisson_gaussian(q, sigma, steps=steps), delta, "pld").epsilon
    by_hand = (
        privacy_loss_distribution.from_gaussian_mechanism(
            sigma, sampling_prob=q, value_discretization_interval=PLD_DISCRETISATION
        )
        .self_compose(steps)
        .get_epsilon_for_delta(delta)
    )
    assert ours == pytest.approx(by_hand, rel=1e-9)
    prv = PRVAccountant()
    prv.history = [(sigma, q, steps)]
    assert ours == pytest.approx(prv.get_epsilon(delta), rel=0.05)
    assert ours <= epsilon(events.poisson_gaussian(q, sigma, steps=steps), delta, "rdp").epsilon


@pytest.mark.parametrize("sigma", [0.8, 1.0, 2.0, 5.0])
def test_gaussian_mechanism_against_analytic_epsilon(sigma: float) -> None:
    """Balle & Wang's exact ε for one Gaussian release: PLD is a pessimistic upper bound
    within its discretisation; RDP is an upper bound too."""
    exact = get_epsilon_gaussian(sigma, 1e-5)
    by_pld = epsilon(events.gaussian(sigma), 1e-5, "pld").epsilon
    assert exact <= by_pld <= exact + 0.01
    assert epsilon(events.gaussian(sigma), 1e-5, "rdp").epsilon >= exact
    # under replace-one, σ is relative to that relation's sensitivity: the same release
    replaced = events.gaussian(sigma, count=3, neighbouring=events.Neighbouring.REPLACE_ONE)
    added = events.gaussian(sigma, count=3)
    assert epsilon(replaced, 1e-5, "pld").epsilon == epsilon(added, 1e-5, "pld").epsilon
    assert epsilon(replaced, 1e-5, "pld").epsilon <= epsilon(replaced, 1e-5, "rdp").epsilon


def test_laplace_is_pure_dp_at_scale_over_sensitivity() -> None:
    for count in (1, 3):
        value = epsilon(events.laplace(2.0, count=count), 1e-9, "pld").epsilon
        assert count * 0.5 - 0.05 <= value <= count * 0.5 + 1e-3


def test_basic_composition_of_approximate_events() -> None:
    """A*STAR: T epochs at (ε/T, δ/T) add up to (ε, δ); mixed with DP-SGD, ε adds and the
    accountant answers at what δ is left."""
    assert epsilon(events.approximate_dp(0.25, 1e-7, count=4), 1e-5).epsilon == pytest.approx(1.0)
    dpsgd = events.poisson_gaussian(0.01, 1.0, steps=100)
    mixed = events.compose([dpsgd, events.approximate_dp(0.25, 1e-6, count=4)])
    expected = epsilon(dpsgd, 1e-5 - 4e-6).epsilon + 1.0
    assert epsilon(mixed, 1e-5).epsilon == pytest.approx(expected, rel=1e-12)
    with pytest.raises(PrivacyParameterError, match="already use δ"):
        epsilon(events.approximate_dp(0.25, 1e-5, count=4), 1e-5)
    # with nothing else to pay for, the events' own total δ is a valid target
    assert epsilon(events.approximate_dp(0.25, 1e-6, count=4), 4e-6).epsilon == 1.0
    with pytest.raises(PrivacyParameterError, match="already use δ"):
        epsilon(events.compose([dpsgd, events.approximate_dp(0.25, 1e-6, count=4)]), 4e-6)


def test_fixed_size_sampling_falls_back_to_rdp_and_costs_more_than_poisson() -> None:
    fixed = events.fixed_size_gaussian(1000, 10, 1.0, steps=100)
    with pytest.raises(UnsupportedAccountingError, match="use the RDP accountant"):
        epsilon(fixed, 1e-5, "pld")
    report = epsilon(fixed, 1e-5)
    assert report.accountant.value == "rdp"
    assert report.neighbouring.value == "replace_one"
    poisson = epsilon(events.poisson_gaussian(0.01, 1.0, steps=100), 1e-5, "rdp").epsilon
    assert report.epsilon > poisson  # replacing one record can move two gradients


def _rdp_to_epsilon(curve: np.ndarray, delta: float) -> float:
    eps, _ = rdp.rdp_privacy_accountant.compute_epsilon(RDP_ORDERS, curve, delta)
    return float(eps)


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_client_sampled_gaussian_matches_closed_form(rate: float) -> None:
    """Inner round: a Gaussian step, RDP α/(2σ²). The ⊥-mixture has RDP
    log(1 - C + C·exp((α - 1)·α/(2σ²)))/(α - 1) exactly."""
    sigma = 3.0
    orders = np.asarray(RDP_ORDERS)
    inner = orders / (2 * sigma**2)
    mixed = np.logaddexp(np.log(1 - rate), np.log(rate) + (orders - 1) * inner) / (orders - 1)
    expected = _rdp_to_epsilon(20 * mixed, 1e-5)
    event = events.repeat(events.client_sampled(rate, events.gaussian(sigma)), 20)
    assert epsilon(event, 1e-5, "rdp").epsilon == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("rate", "sigma"), [(0.1, 1.0), (0.5, 2.0), (0.9, 0.8)])
def test_client_sampled_pld_is_the_exact_mixture(rate: float, sigma: float) -> None:
    """One round, one Gaussian release: ⊥ w.p. 1 - C scales the hockey-stick divergence by
    C and leaves ε unamplified, so ε(δ) = ε_Gaussian(δ / C) exactly (Balle & Wang)."""
    report = epsilon(events.client_sampled(rate, events.gaussian(sigma)), 1e-5)
    assert report.accountant.value == "pld"
    exact = get_epsilon_gaussian(sigma, 1e-5 / rate)
    assert exact <= report.epsilon <= exact + 0.01


def test_client_sampled_rounds_pld_is_tighter_than_rdp() -> None:
    rounds = events.repeat(events.client_sampled(0.3, events.poisson_gaussian(0.02, 1.0)), 300)
    assert epsilon(rounds, 1e-5).epsilon < epsilon(rounds, 1e-5, "rdp").epsilon


def test_client_sampling_charges_at_least_kerkouche_for_one_step_rounds() -> None:
    """With one local step (FedSGD), Theorem 3.1 charges q1 = C·q; the exact charge for a
    silo that sends nothing when not sampled is larger (convexity), and rises with C."""
    q, sigma, rounds = 0.02, 1.0, 300
    previous = 0.0
    for rate in (0.1, 0.3, 0.6, 1.0):
        exact = events.repeat(
            events.client_sampled(rate, events.poisson_gaussian(q, sigma)), rounds
        )
        theirs = events.repeat(
            events.kerkouche_round(
                client_rate=rate,
                batch_size=20,
                min_silo_size=1000,
                noise_multiplier=sigma,
                local_steps=1,
            ),
            rounds,
        )
        ours = epsilon(exact, 1e-5, "rdp").epsilon
        assert ours >= epsilon(theirs, 1e-5, "rdp").epsilon - 1e-12
        assert ours > previous
        previous = ours


def test_errors_name_the_problem() -> None:
    event = events.poisson_gaussian(0.01, 1.0, steps=10)
    with pytest.raises(UnsupportedAccountingError, match="unknown accountant 'moments'"):
        epsilon(event, 1e-5, "moments")
    for delta in (0.0, 1.0, 1.5, -1e-5):
        with pytest.raises(PrivacyParameterError, match="δ must lie in"):
            epsilon(event, delta)
    with pytest.warns(DeltaTooLargeWarning, match="1/n = 0.001 for a silo of 1000 records"):
        check_delta(1e-2, dataset_size=1000)


def test_a_pld_past_its_size_limit_is_not_built_rdp_answers_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The report names the accountant that answered; asked for by name, PLD refuses."""
    monkeypatch.setattr(accounting, "PLD_MAX_POINTS", 2**14)
    event = events.poisson_gaussian(0.01, 1.0, steps=1000)  # about 97,000 grid points
    report = epsilon(event, 1e-5)
    assert report.accountant is Accountant.RDP
    assert report.epsilon == epsilon(event, 1e-5, "rdp").epsilon
    assert report.note.startswith("RDP answered: the PLD would need") and "16,384" in report.note
    with pytest.raises(PldTooLargeError, match=r"above the limit of 16,384.*the RDP accountant"):
        epsilon(event, 1e-5, "pld")
    small = epsilon(events.poisson_gaussian(0.01, 4.0, steps=10), 1e-5)
    assert small.accountant is Accountant.PLD and small.note == ""


@pytest.mark.parametrize(
    "event",
    [
        events.poisson_gaussian(0.5, 0.3, steps=1),  # one sampled step, built point by point
        events.gaussian(1.0, count=100),  # one Gaussian at σ/√100
        events.laplace(0.01, count=3),
        events.client_sampled(0.5, events.poisson_gaussian(0.01, 1.0, steps=1000)),
    ],
    ids=["sampled-step", "gaussian", "laplace", "client-sampled"],
)
def test_every_pld_is_sized_before_it_is_built(
    monkeypatch: pytest.MonkeyPatch, event: events.PrivacyEvent
) -> None:
    monkeypatch.setattr(accounting, "PLD_MAX_POINTS", 2**14)
    monkeypatch.setattr(accounting, "PLD_MAX_SAMPLED_STEP_POINTS", 2**12)
    with pytest.raises(PldTooLargeError):
        epsilon(event, 1e-5, "pld")
    assert epsilon(event, 1e-5).accountant is Accountant.RDP


@pytest.mark.parametrize(
    ("q", "sigma", "steps"), [(0.01, 1.0, 1000), (0.1, 2.0, 50), (0.01, 480.0, 10**5)]
)
def test_the_size_limit_is_checked_against_the_pld_dp_accounting_would_build(
    monkeypatch: pytest.MonkeyPatch, q: float, sigma: float, steps: int
) -> None:
    built = privacy_loss_distribution.from_gaussian_mechanism(
        sigma, value_discretization_interval=PLD_DISCRETISATION, sampling_prob=q
    ).self_compose(steps)
    size = max(built._pmf_remove.size, built._pmf_add.size)
    event = events.poisson_gaussian(q, sigma, steps=steps)
    monkeypatch.setattr(accounting, "PLD_MAX_POINTS", size + 1)  # + the identity it extends
    assert epsilon(event, 1e-5, "pld").epsilon == pytest.approx(built.get_epsilon_for_delta(1e-5))
    monkeypatch.setattr(accounting, "PLD_MAX_POINTS", size)
    with pytest.raises(PldTooLargeError):
        epsilon(event, 1e-5, "pld")


def test_more_runs_than_double_precision_can_add_up_are_refused() -> None:
    with pytest.raises(PrivacyParameterError, match=r"1e\+20 .* at most 1e\+09"):
        epsilon(events.poisson_gaussian(0.01, 1.0, steps=10**20), 1e-5)
    with pytest.raises(PrivacyParameterError, match="at most 1e\\+09"):
        epsilon(events.repeat(events.gaussian(1.0, count=10**5), 10**5), 1e-5)


@pytest.mark.parametrize("sigma", [1e-300, 1e300])
def test_noise_outside_floating_point_range_is_refused(sigma: float) -> None:
    with pytest.raises(UnsupportedAccountingError, match="cannot evaluate this event in floating"):
        epsilon(events.poisson_gaussian(0.5, sigma, steps=10), 1e-5)


def test_one_step_plds_are_kept_by_bytes_least_recently_used_first() -> None:
    """Kerkouche's 314 hospitals each have their own q: the cache of step PLDs is bounded
    by bytes, not by a count, and drops the least recently used first."""
    relation = NeighboringRelation.ADD_OR_REMOVE_ONE
    steps = [(2.0, rate, relation, PLD_DISCRETISATION) for rate in (0.01, 0.02, 0.03)]
    cache = _StepCache(limit=1 << 40)
    first = cache(*steps[0])
    assert cache(*steps[0]) is first  # kept, not rebuilt
    fresh = _gaussian_pld(*steps[0])
    assert first.get_epsilon_for_delta(1e-5) == fresh.get_epsilon_for_delta(1e-5)
    for step in steps[1:]:
        cache(*step)
    sizes = [cache._kept[step][1] for step in steps]
    assert min(sizes) > 0
    # room for steps 0 and 1, or 0 and 2, not all three
    small = _StepCache(limit=max(sizes[0] + sizes[1], sizes[0] + sizes[2]))
    kept = [small(*step) for step in steps[:2]]
    assert small(*steps[0]) is kept[0]  # steps[0] used last: steps[1] goes first
    small(*steps[2])
    assert list(small._kept) == [steps[0], steps[2]]
    assert small._bytes <= small.limit
