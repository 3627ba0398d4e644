"""Noise sources, losses and model builders."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats
from torch import nn

from dpfl.local.losses import bce, cross_entropy, focal, weighted_bce
from dpfl.local.noise import SecureNoise, SeededNoise
from dpfl.models import MixesExamplesError, check_per_example, logistic_regression, mlp, small_cnn


def test_seeded_noise_repeats_and_seeds_differ() -> None:
    a = SeededNoise(3).normal((100,), 2.0, torch.float64)
    assert torch.equal(a, SeededNoise(3).normal((100,), 2.0, torch.float64))
    assert not torch.equal(a, SeededNoise(4).normal((100,), 2.0, torch.float64))


def test_secure_noise_has_the_requested_std_and_never_repeats() -> None:
    """Not seedable by design, so the thresholds are loose (false alarm rate ~1e-6)."""
    source = SecureNoise()
    draws = source.normal((200_001,), 3.0, torch.float64).numpy() / 3.0
    assert draws.shape == (200_001,)
    assert stats.kstest(draws, "norm").pvalue > 1e-6
    lo, hi = stats.chi2.ppf([5e-7, 1 - 5e-7], len(draws) - 1)
    assert lo < (len(draws) - 1) * draws.var(ddof=1) < hi
    assert not np.array_equal(draws[:10], source.normal((10,), 1.0, torch.float64).numpy())


def test_secure_noise_keeps_shape_and_dtype() -> None:
    out = SecureNoise().normal((3, 4, 5), 1.0, torch.float32)
    assert out.shape == (3, 4, 5) and out.dtype == torch.float32


def test_bce_and_cross_entropy_match_torch_per_example() -> None:
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(9, 1, generator=g), (torch.rand(9, generator=g) < 0.5).float()
    expected = F.binary_cross_entropy_with_logits(logits[:, 0], y, reduction="none")
    torch.testing.assert_close(bce(logits, y), expected)
    multi, labels = torch.randn(9, 4, generator=g), torch.randint(0, 4, (9,), generator=g)
    torch.testing.assert_close(
        cross_entropy(multi, labels), F.cross_entropy(multi, labels, reduction="none")
    )


def test_weighted_bce_weights_each_class() -> None:
    logits, y = torch.tensor([[0.3], [-1.2]]), torch.tensor([1.0, 0.0])
    torch.testing.assert_close(
        weighted_bce(5.0, 0.5)(logits, y), bce(logits, y) * torch.tensor([5.0, 0.5])
    )


def test_focal_loss_matches_its_definition_and_reduces_to_weighted_bce() -> None:
    logits = torch.tensor([[2.0], [-1.0], [0.5], [-30.0]], dtype=torch.float64)
    y = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    p = torch.sigmoid(logits[:, 0])
    p_t = torch.where(y == 1, p, 1 - p)
    alpha_t = torch.where(y == 1, 0.75, 0.25)
    expected = -alpha_t * (1 - p_t) ** 2 * torch.log(p_t)
    torch.testing.assert_close(focal(0.75, 2.0)(logits, y), expected)
    torch.testing.assert_close(focal(0.75, 0.0)(logits, y), weighted_bce(0.75, 0.25)(logits, y))
    assert torch.isfinite(focal()(torch.tensor([[-200.0]]), torch.tensor([1.0]))).all()


def test_builders_have_the_seed_shapes() -> None:
    assert logistic_regression(240).weight.shape == (1, 240)
    assert logistic_regression(240, 5).weight.shape == (5, 240)
    kerkouche = mlp(24_428)
    assert sum(p.numel() for p in kerkouche.parameters()) == 4_926_201  # Kerkouche, Sec. 4.3.3
    for size in (28, 64):
        assert small_cnn(3, size, 7)(torch.randn(2, 3, size, size)).shape == (2, 7)
    assert any(isinstance(m, nn.GroupNorm) for m in small_cnn().modules())
    check_per_example(small_cnn())


@pytest.mark.parametrize("norm", [nn.BatchNorm1d(4), nn.SyncBatchNorm(4)])
def test_batchnorm_is_refused_with_a_clear_error(norm: nn.Module) -> None:
    with pytest.raises(MixesExamplesError, match="mixes the examples"):
        check_per_example(nn.Sequential(nn.Linear(3, 4), norm))
