"""Batch samplers: Poisson batch sizes, shuffled epochs, balanced downsampling and the
privacy events each one declares."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from dpfl.data.sampling import BalancedPoissonSampler, PoissonSampler, ShuffledSampler
from dpfl.local.clipping import ClippedGradientSum
from dpfl.privacy import events
from dpfl.privacy.errors import PrivacyParameterError, UnsupportedAccountingError


def test_poisson_batch_sizes_are_binomial() -> None:
    n, q, draws = 300, 0.05, 4000
    sampler = PoissonSampler(n, q, np.random.default_rng(0), public_size=n)
    sizes = np.array([len(sampler.sample()) for _ in range(draws)])
    # Chi-square goodness of fit, pooling the tails so every expected count is ≥ 5.
    lo, hi = int(stats.binom.ppf(0.002, n, q)), int(stats.binom.ppf(0.998, n, q))
    edges = np.arange(lo, hi + 1)
    observed = np.array(
        [(sizes < lo + 1).sum(), *[(sizes == k).sum() for k in edges[1:-1]], (sizes >= hi).sum()]
    )
    pmf = stats.binom(n, q)
    expected = draws * np.array([pmf.cdf(lo), *[pmf.pmf(k) for k in edges[1:-1]], pmf.sf(hi - 1)])
    assert expected.min() >= 5
    assert stats.chisquare(observed, expected).pvalue > 0.01


def test_poisson_includes_each_record_independently_with_rate_q() -> None:
    n, q, draws = 50, 0.2, 3000
    sampler = PoissonSampler(n, q, np.random.default_rng(1), public_size=n)
    counts = np.zeros(n)
    for _ in range(draws):
        batch = sampler.sample()
        assert len(np.unique(batch)) == len(batch)
        counts[batch] += 1
    # Each count is Binomial(draws, q); all within 4.5 standard deviations.
    assert np.abs(counts - draws * q).max() < 4.5 * np.sqrt(draws * q * (1 - q))


def test_poisson_declares_the_sampled_gaussian_event() -> None:
    sampler = PoissonSampler(1000, 0.01, np.random.default_rng(0), public_size=1000)
    assert sampler.expected_batch_size == pytest.approx(10.0)
    event = sampler.privacy_event(1.1, 300)
    assert event == events.poisson_gaussian(0.01, 1.1, steps=300)
    with pytest.raises(PrivacyParameterError):
        PoissonSampler(10, 1.5, np.random.default_rng(0), public_size=10)


def test_shuffled_sampler_covers_each_epoch_once_and_refuses_accounting() -> None:
    sampler = ShuffledSampler(12, 4, np.random.default_rng(0))
    epoch = np.concatenate([sampler.sample() for _ in range(3)])
    assert sorted(epoch.tolist()) == list(range(12))
    with pytest.raises(UnsupportedAccountingError, match="PoissonSampler"):
        sampler.privacy_event(1.0, 10)


def test_balanced_batches_have_equal_classes_drawn_from_the_poisson_batch() -> None:
    labels = np.array([0] * 270 + [1] * 30)
    sampler = BalancedPoissonSampler(labels, 0.2, np.random.default_rng(0), public_size=len(labels))
    for _ in range(50):
        batch = sampler.sample()
        assert (labels[batch] == 1).sum() == (labels[batch] == 0).sum()
        assert len(np.unique(batch)) == len(batch)


def test_balanced_downsampling_has_sensitivity_2c_and_declares_sigma_over_2() -> None:
    """The worst case of the docstring, built exactly: q = 1, one minority record r whose
    clipped gradient points the same way as the majority's. Removing r also removes the
    majority record kept to balance it, so the clipped sum moves by 2C, not C."""
    clip = 1.0
    labels = np.array([1, 0, 0, 0])
    x = torch.tensor([[5.0], [5.0], [5.0], [5.0]], dtype=torch.float64)
    y = torch.tensor(labels, dtype=torch.float64)
    clipped = ClippedGradientSum(torch.nn.Linear(1, 1, bias=False).double(), _identity_loss)
    params = {"weight": torch.ones(1, 1, dtype=torch.float64)}

    def downsampled_sum(keep: np.ndarray) -> torch.Tensor:
        batch = BalancedPoissonSampler(
            labels[keep], 1.0, np.random.default_rng(0), public_size=len(labels[keep])
        ).sample()
        idx = torch.from_numpy(keep[batch])
        sums, _ = clipped(params, x[idx], y[idx], torch.ones(len(idx), dtype=torch.float64), clip)
        return sums["weight"]

    with_r = downsampled_sum(np.arange(4))
    without_r = downsampled_sum(np.arange(1, 4))
    assert float((with_r - without_r).norm()) == pytest.approx(2 * clip)
    sampler = BalancedPoissonSampler(labels, 0.3, np.random.default_rng(0), public_size=len(labels))
    assert sampler.privacy_event(1.08, 5) == events.poisson_gaussian(0.3, 0.54, steps=5)


def _identity_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """ℓ = z: every example's gradient is its x, so clipping gives each a norm of exactly C."""
    return logits.squeeze(-1)
