"""The reference the clipping tests compare every faster path with: per-example gradients
from `vmap(grad)` of the whole model, clipped and summed."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from dpfl.local.dpsgd import parameters_of
from dpfl.local.losses import Loss


def clipped_by_vmap(
    model: nn.Module, loss: Loss, x: Tensor, y: Tensor, mask: Tensor, clip: float
) -> tuple[dict[str, Tensor], Tensor]:
    """Σ_i mask_i·min(1, C/‖g_i‖)·g_i and ‖g_i‖, with g_i from `vmap(grad)` of the model."""
    params = parameters_of(model)

    def one(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        return loss(functional_call(model, p, (xi.unsqueeze(0),)), yi.unsqueeze(0)).sum()

    grads = vmap(grad(one), in_dims=(None, 0, 0))(params, x, y)
    norms = torch.cat([g.flatten(1) for g in grads.values()], 1).norm(dim=1)
    factor = mask * (clip / norms).clamp(max=1.0)
    return {k: torch.einsum("b,b...->...", factor, g) for k, g in grads.items()}, norms
