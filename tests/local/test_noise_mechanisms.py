"""The noise mechanisms: the cyclic sampler does what its event assumes, each
mechanism's event equals one computed independently with dp_accounting, the correlated
noise is C⁻¹z exactly (the filter against a dense inverse, its memory carried between
trainings), and a study names a mechanism with one key."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event as dpe
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import stats

from dpfl.data.sampling import CyclicPoissonSampler
from dpfl.federation.algorithms import SETTINGS
from dpfl.local.mechanisms import (
    SETTINGS as MECHANISMS,
)
from dpfl.local.mechanisms import (
    Correlation,
    Independent,
    mechanism,
)
from dpfl.local.mechanisms.bandmf import BandedMF
from dpfl.local.mechanisms.blt import BLT
from dpfl.privacy import epsilon, events
from dpfl.privacy.factorization import BandedToeplitz

DELTA = 1e-5


def test_cyclic_batches_are_binomial_within_one_partition_and_min_separated() -> None:
    rng = np.random.default_rng(0)
    size, band, p = 4000, 5, 0.3
    partitions = CyclicPoissonSampler.draw_partitions(size, band, rng)
    sampler = CyclicPoissonSampler(partitions, band, p, rng, public_size=size, start=3)
    last = np.full(size, -(10**6))
    sizes: dict[int, list[int]] = {k: [] for k in range(band)}
    for t in range(3, 3 + 500):
        batch = sampler.sample()
        assert np.all(partitions[batch] == t % band)  # only the step's partition
        assert np.all(t - last[batch] >= band)  # at most once in any b consecutive steps
        last[batch] = t
        sizes[t % band].append(len(batch))
    assert sampler.step == 503
    for k, drawn in sizes.items():
        members = int(np.sum(partitions == k))
        # a Binomial(members, p): a two-sided test of its mean, and its variance's ratio
        z = (np.mean(drawn) - members * p) / math.sqrt(members * p * (1 - p) / len(drawn))
        assert abs(z) < 4
        assert 0.7 < np.var(drawn) / (members * p * (1 - p)) < 1.4
    assert sampler.expected_batch_size == pytest.approx(p * size / band)
    counts = np.bincount(partitions, minlength=band)  # each record's partition uniform
    assert stats.chisquare(counts).pvalue > 1e-3


def _rdp_epsilon(event: dpe.DpEvent) -> float:
    accountant = rdp_privacy_accountant.RdpAccountant()
    accountant.compose(event)
    return float(accountant.get_epsilon(DELTA))


@pytest.mark.parametrize(("band", "steps", "charged"), [(1, 10, 10), (4, 12, 3), (4, 10, 3)])
def test_bandmf_charges_a_training_ceil_steps_over_band_sampled_gaussians_at_bq(
    band: int, steps: int, charged: int
) -> None:
    """Choquette-Choo et al. 2023, Thm 4, computed by hand with dp_accounting: ⌈s/b⌉
    Poisson-sampled Gaussians at b·q (band 1: DP-SGD itself)."""
    q, sigma = 0.02, 1.1
    event = BandedMF(3, band=band).event(q, sigma, steps)
    by_hand = dpe.SelfComposedDpEvent(
        dpe.PoissonSampledDpEvent(band * q, dpe.GaussianDpEvent(sigma)), charged
    )
    assert _rdp_epsilon(event.dp_event) == pytest.approx(_rdp_epsilon(by_hand), rel=1e-12)
    assert epsilon(event, DELTA, "rdp").epsilon == pytest.approx(_rdp_epsilon(by_hand), rel=1e-3)
    if band == 1:
        assert event == events.poisson_gaussian(q, sigma, steps=steps)


def _dense_toeplitz(coefficients: np.ndarray, n: int) -> np.ndarray:
    column = np.zeros(n)
    column[: min(n, len(coefficients))] = coefficients[:n]
    return np.array([[column[i - j] if i >= j else 0.0 for j in range(n)] for i in range(n)])


def test_blt_charges_each_training_the_gaussian_of_its_worst_prefix() -> None:
    """The run's sensitivity from the dense C over every record's phase: after any r of
    the R trainings, r charges compose to no less than the Gaussian of that prefix."""
    q, sigma, steps, trainings = 0.25, 3.0, 5, 6
    blt = BLT(trainings, buffers=2)
    separation = blt.separation(q)
    assert separation == 4
    strategy = blt.strategy(q, steps)
    n = steps * trainings
    dense = _dense_toeplitz(strategy.coefficients(n), n)
    worst = []
    for r in range(1, trainings + 1):
        rows = r * steps
        phases = [dense[:rows, phase:rows:separation].sum(axis=1) for phase in range(separation)]
        worst.append(max(float(v @ v) for v in phases))
    event = blt.event(q, sigma, steps)
    charged = event.dp_event.noise_multiplier
    for r, squared in enumerate(worst, 1):  # r charges of σ/ρ ≤ one of σ/√S(rs)
        assert charged / math.sqrt(r) <= sigma / math.sqrt(squared) * (1 + 1e-9)
    assert charged / math.sqrt(max(s / r for r, s in enumerate(worst, 1))) == pytest.approx(
        charged / math.sqrt(max(worst[r - 1] / r for r in range(1, trainings + 1)))
    )
    assert charged == pytest.approx(sigma / math.sqrt(max(s / r for r, s in enumerate(worst, 1))))
    pld = pld_privacy_accountant.PLDAccountant()
    pld.compose(dpe.GaussianDpEvent(charged), trainings)
    assert epsilon(events.repeat(event, trainings), DELTA, "pld").epsilon == pytest.approx(
        pld.get_epsilon(DELTA), rel=1e-6
    )
    with pytest.raises(ValueError, match="planned and charged for 6 trainings"):
        blt.check_stream(n - steps + 1, steps)


@pytest.mark.parametrize("noise", [BandedMF(4, band=3), BLT(4, buffers=3)])
def test_the_correlated_noise_is_the_inverse_strategy_of_the_draws_across_trainings(
    noise: BandedMF | BLT,
) -> None:
    """Two members at different rates (their own filters), two trainings of 5 steps with
    the memory carried between them: each member's noise is C⁻¹z, C from the dense
    strategy of the whole run."""
    rates, steps, width = [0.1, 0.3], 5, 3
    draws = torch.randn(
        2 * steps, 2, width, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    out, memories = [], [None, None]
    for training in range(2):
        correlation = Correlation(noise, rates, ["a", "b"], steps, memories)
        correlation.start(width, torch.float64, torch.device("cpu"))
        for t in range(steps):
            rows = draws[training * steps + t].clone()
            correlation.apply(rows)
            out.append(rows)
        memories = correlation.memories()
    noise_of = torch.stack(out).numpy()  # [steps, members, width]
    for member, rate in enumerate(rates):
        n = 2 * steps
        inverse = _dense_toeplitz(noise.noise_filter(rate, steps).impulse_response(n), n)
        strategy = (
            BandedToeplitz.optimal(noise.horizon(steps), 3).coefficients
            if isinstance(noise, BandedMF)
            else noise.strategy(rate, steps).coefficients(n)
        )
        np.testing.assert_allclose(inverse @ _dense_toeplitz(strategy, n), np.eye(n), atol=1e-10)
        expected = inverse @ draws[:, member].numpy()
        np.testing.assert_allclose(noise_of[:, member], expected, rtol=1e-10, atol=1e-12)


def test_a_study_names_a_mechanism_with_one_key_and_its_settings_are_checked() -> None:
    fedavg = SETTINGS["fedavg"]
    assert (
        fedavg.model_validate({"name": "fedavg"}).noise
        == fedavg.model_validate({"name": "fedavg", "noise": "independent"}).noise
    )
    chosen = fedavg.model_validate({"name": "fedavg", "noise": "bandmf"}).noise
    assert chosen.build(7) == BandedMF(7, band=4)
    table = {"mechanism": "blt", "buffers": 2}
    assert fedavg.model_validate({"name": "fedavg", "noise": table}).noise.build(3) == BLT(
        3, buffers=2
    )
    with pytest.raises(ValueError, match="tree"):
        fedavg.model_validate({"name": "fedavg", "noise": "tree"})
    with pytest.raises(ValueError, match="band"):
        fedavg.model_validate({"name": "fedavg", "noise": {"mechanism": "bandmf", "band": 0}})
    for refuses in ("fedsgd_secure", "aop"):
        with pytest.raises(ValueError, match=r"algorithm\.noise 'bandmf' is not for"):
            SETTINGS[refuses].model_validate({"name": refuses, "noise": "bandmf"})
    assert set(MECHANISMS) == {"independent", "bandmf", "blt"}
    assert mechanism("independent") == Independent()
    with pytest.raises(ValueError, match="band must be an integer"):
        BandedMF(2, band=0)
    with pytest.raises(ValueError, match=r"b·q = 2 > 1"):
        BandedMF(1, band=20).event(0.1, 1.0, 20)


def test_the_datasheet_names_the_noise_where_it_is_not_independent() -> None:
    from dpfl.experiments.results.datasheet import mechanism as datasheet_mechanism
    from dpfl.experiments.study.config import Study
    from dpfl.federation.algorithms import FedAvg

    def sheet(noise: object) -> str:
        algorithm = {"name": "fedavg"} if noise is None else {"name": "fedavg", "noise": noise}
        study = Study(
            {
                "name": "sheet",
                "rounds": 2,
                "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 2}},
                "algorithm": algorithm,
                "privacy": {"epsilon": 1.0, "delta": 1e-5},
            }
        )
        return datasheet_mechanism(study.points[0][1], FedAvg)

    assert sheet(None) == sheet("independent") == FedAvg.mechanism
    banded = sheet({"mechanism": "bandmf", "band": 8})
    assert banded.startswith(FedAvg.mechanism) and "(bandmf: band = 8)" in banded
    assert BLT.described in sheet("blt")
