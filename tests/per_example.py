"""The reference the clipping tests compare every faster path with: per-example gradients
from `vmap(grad)` of the whole model, clipped and summed; and a count of the calls of ghost
clipping, for the tests that check which path a study takes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from dpfl.local.dpsgd import parameters_of
from dpfl.local.ghost import GhostClipping
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


def ghost_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at each call of ghost clipping, for this test."""
    calls: list[int] = []
    original = GhostClipping.__call__

    def counted(self: GhostClipping, *args: Any) -> Any:
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(GhostClipping, "__call__", counted)
    return calls
