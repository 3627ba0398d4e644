"""Client sampling behaves as its declared participation rate says."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpfl.federation.client_sampling import ClientSampler
from dpfl.privacy import events


def test_poisson_client_sampling_is_binomial() -> None:
    sampler = ClientSampler(n_silos=20, rate=0.15)
    rng = np.random.default_rng(7)
    draws = [sampler.sample(rng) for _ in range(4000)]
    sizes = np.array([len(d) for d in draws])
    observed = np.bincount(sizes, minlength=21)
    expected = stats.binom.pmf(np.arange(21), 20, 0.15) * len(draws)
    keep = expected >= 5  # pool the sparse tail into one bin
    observed = np.append(observed[keep], observed[~keep].sum())
    expected = np.append(expected[keep], expected[~keep].sum())
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    assert sampler.participation == 0.15


def test_fixed_count_sampling_takes_each_silo_with_probability_k_over_n() -> None:
    sampler = ClientSampler(n_silos=5, per_round=3)  # Kerkouche: 3 of 5 hospitals a round
    rng = np.random.default_rng(11)
    counts = np.zeros(5)
    for _ in range(3000):
        chosen = sampler.sample(rng)
        assert len(chosen) == 3 and len(set(chosen.tolist())) == 3
        counts[chosen] += 1
    assert sampler.participation == pytest.approx(0.6)
    assert stats.chisquare(counts, np.full(5, 3000 * 3 / 5)).pvalue > 1e-3


def test_round_event_is_the_exact_client_sampled_charge() -> None:
    local = events.poisson_gaussian(0.02, 1.1, steps=5)
    sampler = ClientSampler(n_silos=5, per_round=3)
    assert sampler.round_event(local) == events.client_sampled(0.6, local)
    assert ClientSampler(n_silos=4, per_round=4).round_event(local) == local


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_silos": 0, "rate": 0.5},
        {"n_silos": 5},
        {"n_silos": 5, "rate": 0.5, "per_round": 2},
        {"n_silos": 5, "rate": 0.0},
        {"n_silos": 5, "per_round": 6},
    ],
)
def test_impossible_sampling_is_refused(kwargs: dict[str, int | float]) -> None:
    with pytest.raises(ValueError):
        ClientSampler(**kwargs)  # type: ignore[arg-type]
