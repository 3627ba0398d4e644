"""Per-example losses: `loss(logits, target) -> one value per example`, never reduced.

DP-SGD needs the loss of each example separately (its gradient is clipped on its own),
so every loss here keeps the batch dimension. Binary losses take logits of shape
`(batch, 1)` and targets in {0, 1}; `cross_entropy` takes `(batch, classes)` and integer
class targets.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

Loss = Callable[[Tensor, Tensor], Tensor]

__all__ = ["Loss", "bce", "cross_entropy", "focal", "weighted_bce"]


def bce(logits: Tensor, target: Tensor) -> Tensor:
    """Binary cross-entropy on one logit per example."""
    return F.binary_cross_entropy_with_logits(
        logits.squeeze(-1), target.to(logits.dtype), reduction="none"
    )


def weighted_bce(positive_weight: float, negative_weight: float = 1.0) -> Loss:
    """BCE with class weights (Kerkouche's non-private baseline for 3% positives).

    Under DP the weights scale the minority's gradients up to the clipping bound, which
    is why Kerkouche use downsampling instead; the weights must be public constants
    (weights fitted on the silo's own class counts would read private data).
    """

    def loss(logits: Tensor, target: Tensor) -> Tensor:
        y = target.to(logits.dtype)
        weight = negative_weight + (positive_weight - negative_weight) * y
        return weight * bce(logits, y)

    return loss


def focal(alpha: float = 0.75, gamma: float = 2.0) -> Loss:
    """Binary focal loss −α_t (1 − p_t)^γ log p_t (Lin et al. 2017; puffle's PETs entry).

    `alpha` weighs the positive class and 1 − α the negative one; puffle found α = 0.75
    best for rare infections. Computed from log-probabilities so that it is finite for
    confident wrong predictions.
    """
    if not 0.0 <= alpha <= 1.0 or gamma < 0:
        raise ValueError(f"focal loss needs 0 ≤ alpha ≤ 1 and gamma ≥ 0, got {alpha}, {gamma}")

    def loss(logits: Tensor, target: Tensor) -> Tensor:
        y = target.to(logits.dtype)
        log_p_t = -bce(logits, y)
        alpha_t = (1.0 - alpha) + (2.0 * alpha - 1.0) * y
        return -alpha_t * (1.0 - torch.exp(log_p_t)) ** gamma * log_p_t

    return loss


def cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Multi-class cross-entropy on integer class labels."""
    return F.cross_entropy(logits, target.long(), reduction="none")
