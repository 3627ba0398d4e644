"""Per-example losses: `loss(logits, target) -> one value per example`, never reduced.

DP-SGD needs the loss of each example separately (its gradient is clipped on its own),
so every loss here keeps the batch dimension. Binary losses take logits of shape
`(batch, 1)` and targets in {0, 1}; `cross_entropy` takes `(batch, classes)` and integer
class targets; the survival losses take (time, event) targets of shape `(batch, 2)`:
`logistic_hazard` (one logit per public time interval, a sum over patients) and `cox`
(one risk score; its terms couple the patients of a batch, see `couples_examples`).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

Loss = Callable[[Tensor, Tensor], Tensor]
OutputGradient = Callable[[Tensor, Tensor], Tensor]

__all__ = [
    "Loss",
    "OutputGradient",
    "bce",
    "couples_examples",
    "cox",
    "cross_entropy",
    "focal",
    "logistic_hazard",
    "output_gradient",
    "time_cuts",
    "weighted_bce",
]

_OUTPUT_GRADIENTS: weakref.WeakKeyDictionary[Loss, OutputGradient] = weakref.WeakKeyDictionary()
"""Losses (by identity) whose gradient in their logits has a closed form."""


def output_gradient(loss: Loss) -> OutputGradient | None:
    """`(logits, target) -> ∂ℓ_i/∂logits_i`, each example's own gradient in its logits
    (the shape of `logits`), written out for the losses of this module that have one:
    `bce` σ(z) − t, `weighted_bce` w_t·(σ(z) − t), `cross_entropy` softmax(z) − onehot(t),
    `focal`; None for any other loss (differentiate it instead).

    Every operation is elementwise or reduces within one example's row, each computed
    by the same kernel path wherever the row sits in a tensor (σ as 1/(1 + e^−z), not
    `torch.sigmoid`, whose vectorised and scalar paths round differently), so that an
    example's gradient has the same bits in any batch and at any position."""
    return _OUTPUT_GRADIENTS.get(loss)


def _sigmoid(z: Tensor) -> Tensor:
    """1/(1 + e^−z): exact to rounding (e^−z = inf gives 0), with the same bits at any
    position of a tensor (see `output_gradient`)."""
    return torch.exp(-z).add_(1.0).reciprocal_()


def bce(logits: Tensor, target: Tensor) -> Tensor:
    """Binary cross-entropy on one logit per example."""
    return F.binary_cross_entropy_with_logits(
        logits.squeeze(-1), target.to(logits.dtype), reduction="none"
    )


def _bce_gradient(logits: Tensor, target: Tensor) -> Tensor:
    return _sigmoid(logits).sub_(target.to(logits.dtype).unsqueeze(-1))


_OUTPUT_GRADIENTS[bce] = _bce_gradient


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

    def gradient(logits: Tensor, target: Tensor) -> Tensor:
        y = target.to(logits.dtype)
        weight = negative_weight + (positive_weight - negative_weight) * y
        return _bce_gradient(logits, y).mul_(weight.unsqueeze(-1))

    _OUTPUT_GRADIENTS[loss] = gradient
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

    def gradient(logits: Tensor, target: Tensor) -> Tensor:
        """With u = (2t − 1)z and p_t = σ(u): ∂ℓ/∂z = (2t − 1)·α_t (1 − p_t)^γ
        (γ p_t log p_t − (1 − p_t))."""
        y = target.to(logits.dtype).unsqueeze(-1)
        log_p_t = -bce(logits, target).unsqueeze(-1)
        p_t = torch.exp(log_p_t)
        miss = 1.0 - p_t
        alpha_t = (1.0 - alpha) + (2.0 * alpha - 1.0) * y
        inner = (gamma * p_t).mul_(log_p_t).sub_(miss)
        return (2.0 * y - 1.0).mul_(alpha_t).mul_(_power(miss, gamma)).mul_(inner)

    _OUTPUT_GRADIENTS[loss] = gradient
    return loss


def _power(base: Tensor, exponent: float) -> Tensor:
    """base^exponent for base in [0, 1], with the same bits at any position of a tensor
    (`torch.pow` with a fractional exponent rounds differently on its vectorised and
    scalar paths): repeated products for a small whole exponent, else e^(γ log base)."""
    if exponent == int(exponent) and exponent <= 8:
        result = torch.ones_like(base)
        for _ in range(int(exponent)):
            result.mul_(base)
        return result
    return torch.log(base).mul_(exponent).exp_()


def cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Multi-class cross-entropy on integer class labels."""
    return F.cross_entropy(logits, target.long(), reduction="none")


def _cross_entropy_gradient(logits: Tensor, target: Tensor) -> Tensor:
    index = target.long().unsqueeze(-1)
    minus_one = torch.full(index.shape, -1.0, dtype=logits.dtype, device=logits.device)
    return torch.softmax(logits, -1).scatter_add_(-1, index, minus_one)


_OUTPUT_GRADIENTS[cross_entropy] = _cross_entropy_gradient


_CUTS: weakref.WeakKeyDictionary[Loss, tuple[float, ...]] = weakref.WeakKeyDictionary()
"""Discrete-time survival losses (by identity) and the cut points of their intervals."""


def time_cuts(loss: Loss) -> tuple[float, ...] | None:
    """The interval cut points of a `logistic_hazard` loss (its outputs are one hazard
    logit per interval); None for any other loss."""
    return _CUTS.get(loss)


def logistic_hazard(cuts: tuple[float, ...] | list[float]) -> Loss:
    """Discrete-time survival: the negative log-likelihood of a logistic hazard model
    (Kvamme & Borgan 2019; nnet-survival, Gensheimer & Narasimhan 2019).

    The cut points 0 < c_1 < … < c_{K−1} (public: part of the study's design, never read
    from the records) make K intervals, the last open-ended; the model outputs one logit
    z_k per interval, the hazard h_k = σ(z_k) of the event in interval k given survival
    to its start. A patient whose time falls in interval j contributes Σ_{k<j} −log(1 −
    h_k) (survived those) plus −log h_j if the event was observed there; a censored
    patient is known to survive only the intervals before j. Each patient's term depends
    on their own record alone, so per-example clipping and Poisson DP-SGD stay sound."""
    boundaries = torch.tensor([float(c) for c in cuts], dtype=torch.float64)
    if (
        len(boundaries) == 0
        or bool((boundaries <= 0).any())
        or bool((boundaries[1:] <= boundaries[:-1]).any())
    ):
        raise ValueError(f"logistic_hazard needs increasing cut points above 0, got {cuts}")

    def targets(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        """Per interval: the event indicator y_k and which intervals count (w_k)."""
        if logits.shape[-1] != len(boundaries) + 1 or target.shape[-1] != 2:
            raise ValueError(
                f"logistic_hazard over {len(boundaries) + 1} intervals needs that many "
                f"logits and (time, event) targets, got {tuple(logits.shape)} and "
                f"{tuple(target.shape)}"
            )
        time, event = target[..., 0].double().contiguous(), target[..., 1].to(logits.dtype)
        cuts = boundaries.to(time.device)
        interval = torch.bucketize(time, cuts, right=True).unsqueeze(-1)
        k = torch.arange(logits.shape[-1], device=logits.device).expand_as(logits)
        at = (k == interval).to(logits.dtype)
        weight = (k < interval).to(logits.dtype).add_(at * event.unsqueeze(-1))
        return at.mul_(event.unsqueeze(-1)), weight

    def loss(logits: Tensor, target: Tensor) -> Tensor:
        y, weight = targets(logits, target)
        terms = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
        return (terms * weight).sum(-1)

    def gradient(logits: Tensor, target: Tensor) -> Tensor:
        y, weight = targets(logits, target)
        return _sigmoid(logits).sub_(y).mul_(weight)

    _OUTPUT_GRADIENTS[loss] = gradient
    _CUTS[loss] = tuple(float(c) for c in cuts)
    return loss


_COUPLED: weakref.WeakSet[Loss] = weakref.WeakSet()


def couples_examples(loss: Loss) -> bool:
    """Whether each example's term depends on the other examples of its batch (`cox`):
    such a loss has no per-example gradient to clip, so it cannot be trained with DP."""
    return loss in _COUPLED


def cox(logits: Tensor, target: Tensor, mask: Tensor | None = None) -> Tensor:
    """Cox's negative log partial likelihood within the batch (Breslow's ties), one term
    per patient: e_i·(log Σ_{j: t_j ≥ t_i} exp η_j − η_i), over the real rows of `mask`.

    The risk set of each patient holds the others, so one patient moves every term: not
    a sum of per-patient terms, and no per-example clipping bounds its sensitivity. For
    non-private references only (FLamby's Fed-TCGA-BRCA baseline)."""
    risk = logits.squeeze(-1)
    time, event = target[..., 0], target[..., 1].to(risk.dtype)
    real = torch.ones_like(risk) if mask is None else mask.to(risk.dtype)
    at_risk = (time.unsqueeze(-2) >= time.unsqueeze(-1)) & (real.unsqueeze(-2) > 0)
    at_risk |= torch.eye(len(risk), dtype=torch.bool)  # never empty, even for padding
    scores = risk.unsqueeze(-2).expand(at_risk.shape).masked_fill(~at_risk, -math.inf)
    log_sum = torch.logsumexp(scores, dim=-1)
    return real * event * (log_sum - risk)


_COUPLED.add(cox)
