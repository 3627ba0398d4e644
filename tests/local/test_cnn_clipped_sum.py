"""The layer-by-layer clipped sum (issue 42's faster CNN step) against the reference:
`torch.func` per-example gradients of the whole model, clipped, summed."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from dpfl.local import clipping
from dpfl.local.clipping import ClippedGradientSum
from dpfl.local.dpsgd import parameters_of
from dpfl.local.losses import Loss, bce, cross_entropy
from dpfl.models import logistic_regression, small_cnn
from per_example import clipped_by_vmap


def _cnn(dtype: torch.dtype) -> tuple[nn.Module, Loss, Tensor, Tensor]:
    """The benchmark's small CNN (two conv–GroupNorm–ReLU–pool blocks) on 28×28×3."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 3, 28, 28, generator=g, dtype=dtype)
    return small_cnn(3, 28, 2).to(dtype), cross_entropy, x, torch.randint(0, 2, (9,), generator=g)


def _strided_cnn(dtype: torch.dtype) -> tuple[nn.Module, Loss, Tensor, Tensor]:
    """A first convolution with stride, dilation and a rectangular kernel, then GroupNorm,
    a max pooling with stride and padding, and a second convolution."""
    torch.manual_seed(4)
    g = torch.Generator().manual_seed(5)
    model = nn.Sequential(
        nn.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(2, 1), dilation=(2, 1)),
        nn.GroupNorm(2, 4),
        nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1),
        nn.Conv2d(4, 8, 3, padding=1),
        nn.Flatten(),
        nn.Linear(8 * 3 * 5, 3),
    )
    x = torch.randn(9, 3, 11, 9, generator=g, dtype=dtype)
    return model.to(dtype), cross_entropy, x, torch.randint(0, 3, (9,), generator=g)


def _linear(dtype: torch.dtype) -> tuple[nn.Module, Loss, Tensor, Tensor]:
    torch.manual_seed(2)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(9, 11, generator=g, dtype=dtype)
    return logistic_regression(11).to(dtype), bce, x, (x[:, 0] > 0).to(dtype)


@pytest.mark.parametrize("make", [_cnn, _strided_cnn, _linear], ids=["cnn", "strided", "linear"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("size", [0, 1, 9])
def test_the_clipped_sum_is_the_reference_for_any_batch_size(
    make: object, dtype: torch.dtype, size: int
) -> None:
    """A batch of 0 records is one masked row (`dpsgd._batch`): the sum is exactly zero."""
    model, loss, x, y = make(dtype)  # type: ignore[operator]
    rows = max(size, 1)
    x, y = x[:rows], y[:rows]
    mask = torch.full((rows,), float(size > 0), dtype=dtype)
    _, raw = clipped_by_vmap(model, loss, x, y, mask, 1.0)
    clip = float(raw.median())  # about half the examples are clipped
    sums, norms = ClippedGradientSum(model, loss)(parameters_of(model), x, y, mask, clip)
    expected, expected_norms = clipped_by_vmap(model, loss, x, y, mask, clip)
    tolerance = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {}
    torch.testing.assert_close(norms, expected_norms, **tolerance)
    for name, value in expected.items():
        torch.testing.assert_close(sums[name], value, **tolerance)
    if size == 0:
        assert all(not s.any() for s in sums.values())
    if size == 9:
        assert 0 < int((norms > clip).sum()) < 9


_POOLINGS = [
    {"kernel_size": 2},
    {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": 3, "stride": 1, "dilation": 2},
    {"kernel_size": 2, "ceil_mode": True},
    {"kernel_size": (2, 3), "stride": (1, 2), "padding": (1, 0), "ceil_mode": True},
]


@pytest.mark.parametrize("settings", _POOLINGS, ids=str)
def test_channels_last_max_pooling_is_max_pool2d_bit_for_bit(settings: dict[str, object]) -> None:
    """The same maxima, the same positions chosen among ties (few values: many ties) and
    so the same gradient, handed back contiguous."""
    g = torch.Generator().manual_seed(4)
    x = torch.randint(0, 3, (4, 5, 9, 11), generator=g).double()
    out_grad = None
    results = []
    for fast in (False, True):
        h = x.clone().requires_grad_()
        pool = nn.MaxPool2d(**settings)  # type: ignore[arg-type]
        out = clipping._ChannelsLastMaxPool.apply(h, pool) if fast else pool(h)
        if out_grad is None:
            out_grad = torch.randn(out.shape, generator=g, dtype=x.dtype)
        (h_grad,) = torch.autograd.grad(out, h, out_grad)
        assert out.is_contiguous() and h_grad.is_contiguous()
        results.append((out, h_grad))
    (slow_out, slow_grad), (fast_out, fast_grad) = results
    assert torch.equal(fast_out, slow_out)
    assert torch.equal(fast_grad, slow_grad)


def test_max_pooling_on_the_cpu_runs_channels_last_outside_vmap_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The small CNN's two poolings take the channels-last route in a plain call, and
    torch's own under `vmap` (stacked members), which the autograd.Function lacks."""
    calls = []
    apply = clipping._ChannelsLastMaxPool.apply
    monkeypatch.setattr(
        clipping._ChannelsLastMaxPool, "apply", lambda *a: calls.append(1) or apply(*a)
    )
    model, loss, x, y = _cnn(torch.float64)
    clipped = ClippedGradientSum(model, loss)
    params = parameters_of(model)
    mask = torch.ones(len(y), dtype=torch.float64)
    plain, _ = clipped(params, x, y, mask, 1.0)
    assert len(calls) == 2
    stacked = {k: v.unsqueeze(0) for k, v in params.items()}
    mapped, _ = clipped.stacked(stacked, x[None], y[None], mask[None], 1.0)
    assert len(calls) == 2
    for name, value in plain.items():
        torch.testing.assert_close(mapped[name][0], value, rtol=1e-10, atol=1e-12)
