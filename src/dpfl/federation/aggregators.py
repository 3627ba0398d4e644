"""Server-side aggregators: K client updates in, one update out.

Updates are flat parameter vectors stacked as the rows of a `[..., K, P]` tensor; any
leading dimensions (independent trials) are kept, so R trials aggregate in one call.
Aggregating noisy updates is post-processing: no aggregator here costs privacy.
The robust ones (median, trimmed mean, norm-bounded mean) limit what one bad client can
do to the model; they do not change anybody's ε.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def mean(updates: Tensor) -> Tensor:
    """Unweighted mean (Kerkouche's FL-STANDARD-DP line 8, Dopamine's FedSGD)."""
    _check(updates)
    return updates.mean(dim=-2)


def weighted_mean(updates: Tensor, weights: Tensor) -> Tensor:
    """Mean weighted by, e.g., silo sizes (FedAvg). Sizes are public in this setting."""
    _check(updates)
    if weights.shape[-1] != updates.shape[-2] or bool((weights < 0).any()):
        raise ValueError(f"need {updates.shape[-2]} non-negative weights, got {weights.shape}")
    total = weights.sum(dim=-1, keepdim=True)
    if bool((total <= 0).any()):
        raise ValueError("weights must not all be zero")
    normalised = (weights / total).to(updates.dtype)
    return (normalised.unsqueeze(-1) * updates).sum(dim=-2)


def sign_majority(signs: Tensor) -> Tensor:
    """sign(Σ_k s_k): the coordinate-wise majority vote of FL-SIGN (Kerkouche Alg. 3, 4).

    A tied coordinate gives 0 (no move). Votes are not weighted by silo size: a client
    could otherwise inflate its vote by claiming a larger dataset.
    """
    _check(signs)
    if not bool(((signs == 1) | (signs == -1)).all()):
        raise ValueError("sign votes must be exactly ±1")
    return torch.sign(signs.sum(dim=-2))


def coordinate_median(updates: Tensor) -> Tensor:
    """Coordinate-wise median (the mean of the two middle values for even K)."""
    _check(updates)
    return torch.quantile(updates, 0.5, dim=-2)


def trimmed_mean(updates: Tensor, trim_fraction: float) -> Tensor:
    """Coordinate-wise mean after dropping the ⌊βK⌋ largest and smallest values."""
    _check(updates)
    k = updates.shape[-2]
    cut = math.floor(trim_fraction * k)
    if not 0 <= trim_fraction < 0.5 or k - 2 * cut < 1:
        raise ValueError(
            f"trim fraction must be in [0, 0.5) and leave a client, got {trim_fraction}"
        )
    ordered = torch.sort(updates, dim=-2).values
    return ordered[..., cut : k - cut, :].mean(dim=-2)


def norm_bounded_mean(updates: Tensor, max_norm: float) -> Tensor:
    """Mean after scaling each update to L2 norm at most `max_norm`: one client moves the
    result by at most max_norm / K."""
    _check(updates)
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    norms = torch.linalg.vector_norm(updates, dim=-1, keepdim=True)
    scale = torch.clamp(max_norm / norms.clamp_min(torch.finfo(updates.dtype).tiny), max=1.0)
    return (updates * scale).mean(dim=-2)


def _check(updates: Tensor) -> None:
    if updates.ndim < 2 or updates.shape[-2] == 0:
        raise ValueError(
            f"updates must be [..., K, P] with K ≥ 1, got shape {tuple(updates.shape)}"
        )
    if not bool(torch.isfinite(updates).all()):
        raise ValueError("an update contains NaN or infinity; refusing to aggregate it")
