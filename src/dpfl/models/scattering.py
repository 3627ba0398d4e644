"""Tramèr & Boneh's ScatterNet models: a fixed 2-D wavelet scattering transform, a
parameter-free normalisation, then a linear model or a small CNN.

Tramèr & Boneh, "Differentially Private Learning Needs Better Features (or Much More
Data)", ICLR 2021: DP-SGD learns more from the scattering coefficients of Oyallon &
Mallat (Morlet wavelets, J = 2 scales, L = 8 orientations, order 2: 81 coefficients a
channel on a grid 4 times coarser) than end to end from the pixels, because the fixed
front needs no gradient and the model DP-SGD trains is small.

`Scattering2D` is that transform, computed as kymatio's `Scattering2D(J, shape, L)` does
(its Morlet filter bank, kymatio's own function, the same reflection padding, Fourier
periodisation and moduli; `tests/models/test_scattering.py` compares the outputs) but
written out of place and batched over the orientations. Why not kymatio's module itself:

* it does not run under `torch.func.vmap` (its in-place writes into a fresh zero tensor
  are refused there), which `factories.check_model` and the generic per-example path
  of `local.clipping` use, and which would stack a linear head's silos;
* its module would have to be memoised anyway (below), and written out the transform
  is one batched product per scale instead of one per filter: about as fast as
  kymatio's on this machine (the same FFTs; per 64 images on one core of the shared
  2-core machine: 176 ms against kymatio's 182 ms grayscale, 936 ms against 463 ms RGB
  under a load of 6, 62 ms against 112 ms grayscale under a load of 1);
* `import kymatio.torch` imports its 3-D transform, which fails on SciPy ≥ 1.15
  (`scipy.special.sph_harm` is gone); only its 2-D filter bank is imported here.

Where the front runs. It has no parameters, so in the layer-by-layer per-example
gradient pass of `local.clipping` it is one batched forward per step, outside the
per-example work and outside the backward pass (nothing before it needs a gradient).
Even so, transforming every batch again adds about half to a step's cost, so the
module memoises each image's coefficients by its bytes (`_MEMO`): every image is
transformed once per process, and a memo hit costs 0.14 ms per 64 grayscale images
(1.1 ms RGB). Measured on PneumoniaMNIST, CDP, 2 epochs at ε = 3 (2026-12-07, load 2-3):
10.6 s with the memo, 16.4 s without it, 111.6 s stacked under `vmap` without it (which
is why such a model's silos train one by one: `trains_unstacked`); the end-to-end
`small_cnn` took 11.9 s. It is not precomputed once per silo by the data pipeline: that
would make the records a hospital holds depend on the model, where now the Flower
hospital and the simulator read the same pixels and build the same model from the study
file, and the memo gets the same saving without it.

Normalisation is data-independent: a `GroupNorm` without affine parameters normalises
each example's coefficients within groups of channels, reading no statistic of the
private data (Tramèr & Boneh's data-independent choice), so it costs no ε.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = [
    "SCATTER_GROUPS",
    "Scattering2D",
    "coefficients",
    "scatternet_cnn",
    "scatternet_linear",
]

SCATTER_GROUPS = 27
"""GroupNorm's groups over the scattering channels (Tramèr & Boneh's value for CIFAR-10;
27 divides the 81 channels of a grayscale image and the 243 of an RGB one)."""


def coefficients(J: int, L: int) -> int:
    """Scattering coefficients per input channel at order 2: 1 + JL + L²J(J−1)/2."""
    return 1 + J * L + L * L * J * (J - 1) // 2


def _filter_bank(m: int, n: int, J: int, L: int) -> dict[str, Any]:
    """kymatio's Morlet filter bank in the Fourier domain (numpy), imported from its
    2-D module alone (its `kymatio.torch` imports the 3-D transform, see above)."""
    from kymatio.scattering2d.filter_bank import filter_bank

    bank: dict[str, Any] = filter_bank(m, n, J, L)
    return bank


def _padded(size: int, J: int) -> int:
    """kymatio's padded size (`compute_padding`): a multiple of 2**J with room for the
    reflection."""
    step = 1 << J
    return ((size + step) // step + 1) * step


def _float32(array: Any) -> Tensor:
    return torch.from_numpy(np.asarray(array, dtype=np.float32))


def _periodise(x: Tensor, k: int) -> Tensor:
    """Subsampling by k in space as a periodisation in Fourier: the mean of the k×k
    tiles, summed tile by tile (torch's complex mean over strided dimensions took most
    of the transform's time)."""
    if k == 1:
        return x
    m, n = x.shape[-2:]
    rows = x.reshape(*x.shape[:-2], k, m // k, n).unbind(-3)
    summed = rows[0]
    for row in rows[1:]:
        summed = summed + row
    columns = summed.reshape(*x.shape[:-2], m // k, k, n // k).unbind(-2)
    total = columns[0]
    for column in columns[1:]:
        total = total + column
    return total / (k * k)


class Scattering2D(nn.Module):
    """The order-2 scattering transform of (channels, height, width) images:
    (batch, channels, h, w) → (batch, channels · `coefficients(J, L)`, h', w'), h' =
    padded h / 2**J − 2 (7 for 28). The coefficients are in kymatio's order (the
    low-pass, then the first order by scale and angle, then the second order by its
    first path), each input channel's together. No parameters: the filters are
    non-persistent buffers, so they are no part of the state a federation sends or a
    checkpoint stores. Every operation is out of place, so it runs under `vmap`."""

    trains_unstacked = True
    """DP-SGD trains the silos of a model with this front one by one, not stacked under
    `vmap` (`local.clipping.ClippedGradientSum.stacks_members`), so that the memo sees
    plain batches."""

    def __init__(self, shape: Sequence[int], J: int = 2, L: int = 8) -> None:
        super().__init__()
        if len(shape) != 3:
            raise ValueError(f"scattering needs (channels, height, width) images, got {shape}")
        channels, height, width = (int(s) for s in shape)
        if min(height, width) < 2**J:
            raise ValueError(f"scattering at J = {J} needs images of at least {2**J}×{2**J}")
        self.shape, self.J, self.L = (channels, height, width), J, L
        m, n = _padded(height, J), _padded(width, J)
        self._pad = (
            (n - width) // 2,
            (n - width + 1) // 2,
            (m - height) // 2,
            (m - height + 1) // 2,
        )
        bank = _filter_bank(m, n, J, L)
        for j in range(J):  # φ at resolution 2**-j; ψ of scale j at every resolution used
            self.register_buffer(f"phi{j}", _float32(bank["phi"]["levels"][j]), persistent=False)
            wavelets = [p for p in bank["psi"] if p["j"] == j]
            for level in range(len(wavelets[0]["levels"])):
                stacked = np.stack([p["levels"][level] for p in wavelets])
                self.register_buffer(f"psi{j}_{level}", _float32(stacked), persistent=False)
        self.out_channels = channels * coefficients(J, L)
        self.out_side = (m // 2**J - 2, n // 2**J - 2)

    def _filter(self, name: str) -> Tensor:
        buffer: Tensor = self.get_buffer(name)
        return buffer

    def forward(self, x: Tensor) -> Tensor:
        if tuple(x.shape[1:]) != self.shape:
            raise ValueError(
                f"scattering built for images of shape {self.shape}, got {tuple(x.shape[1:])}"
            )
        if not _memoisable(x):
            return self.transform(x)
        return self._memoised(x)

    def _memoised(self, x: Tensor) -> Tensor:
        """The transform of each image, from `_MEMO` where an image of the same bytes was
        transformed before (in any model of the same J, L and shape), the rest computed
        in one batch and kept. The result of one image does not depend on the others in
        its batch (`test_scattering.py` checks the bits), so the memo changes no bit."""
        rows = x.detach().contiguous().numpy()
        tag = (self.J, self.L, self.shape, str(x.dtype))
        keys = [(tag, row.tobytes()) for row in rows]
        missing = [i for i, key in enumerate(keys) if key not in _MEMO]
        for start in range(0, len(missing), CHUNK):
            part = missing[start : start + CHUNK]
            for i, features in zip(part, self.transform(x[part]), strict=True):
                _remember(keys[i], features)
        return torch.stack([_MEMO[key] for key in keys])

    def transform(self, x: Tensor) -> Tensor:
        """The transform itself, without the memo (and under `vmap` or a gradient)."""
        batch = x.shape[0]
        J = self.J
        padded = nn.functional.pad(x.reshape(-1, 1, *self.shape[1:]), self._pad, mode="reflect")
        u0 = torch.fft.fft2(padded[:, 0])  # (B·C, m, n)

        def low_pass(u: Tensor, j: int) -> Tensor:
            """The real part of the low-pass φ at level j, periodised to 2**J, unpadded."""
            s: Tensor = torch.fft.ifft2(_periodise(u * self._filter(f"phi{j}"), 2 ** (J - j))).real
            return s[..., 1:-1, 1:-1]

        def modulus(u: Tensor, k: int) -> Tensor:
            """Fourier of |ifft(periodised u)|: one wavelet modulus, subsampled by k."""
            moduli: Tensor = torch.fft.fft2(torch.fft.ifft2(_periodise(u, k)).abs())
            return moduli

        first, second = [], []
        for j1 in range(J):
            u1 = modulus(u0.unsqueeze(1) * self._filter(f"psi{j1}_0"), 2**j1)  # (B·C, L, ·, ·)
            first.append(low_pass(u1, j1))
            later = [
                low_pass(
                    modulus(u1.unsqueeze(2) * self._filter(f"psi{j2}_{j1}"), 2 ** (j2 - j1)),
                    j2,
                )  # (B·C, L, L, h', w') for each j2 > j1, θ1 outer
                for j2 in range(j1 + 1, J)
            ]
            if later:
                second.append(torch.stack(later, dim=2).flatten(1, 3))
        parts = [low_pass(u0, 0).unsqueeze(1), *first, *second]
        out = torch.cat(parts, dim=1)
        return out.reshape(batch, self.out_channels, *out.shape[-2:]).to(x.dtype)


CHUNK = 64
"""Images transformed at once by the memo: the second order holds L² complex maps of
the padded size an image (5 MB for 28×28 at L = 8), so a whole test set at once would
take gigabytes."""
_MEMO: dict[tuple[Any, bytes], Tensor] = {}
"""Scattering coefficients by (J, L, shape, dtype) and image bytes, shared by the models
of a process: the tuner's candidates and the federation's copies of one model see the
same images, so each is transformed once per process instead of once per step."""
MEMO_BYTES = 1 << 30
"""The most bytes of coefficients kept (1 GiB); past it, the memo starts again empty."""
_memo_bytes = [0]


def _memoisable(x: Tensor) -> bool:
    """A plain CPU batch that needs no gradient: not inside `vmap` or `grad` (whose
    wrapped tensors have no bytes to read), not a sparse or meta tensor."""
    return (
        x.device.type == "cpu"
        and x.layout == torch.strided
        and not x.requires_grad
        and not torch._C._functorch.is_functorch_wrapped_tensor(x)
    )


def _remember(key: tuple[Any, bytes], features: Tensor) -> None:
    size = features.numel() * features.element_size() + len(key[1])
    if _memo_bytes[0] + size > MEMO_BYTES:
        _MEMO.clear()
        _memo_bytes[0] = 0
    _MEMO[key] = features.clone()  # not a view that would keep the whole batch alive
    _memo_bytes[0] += size


def _front(input_shape: Sequence[int], J: int, L: int) -> tuple[Scattering2D, nn.GroupNorm]:
    front = Scattering2D(input_shape, J, L)
    channels = front.out_channels
    groups = SCATTER_GROUPS if channels % SCATTER_GROUPS == 0 else 1
    return front, nn.GroupNorm(groups, channels, affine=False)


def scatternet_linear(
    input_shape: Sequence[int], n_outputs: int, J: int = 2, L: int = 8
) -> nn.Sequential:
    """ScatterNet + linear (Tramèr & Boneh): scattering, GroupNorm without parameters,
    one linear layer on the flattened coefficients: the only parameters."""
    front, norm = _front(input_shape, J, L)
    side = front.out_side
    return nn.Sequential(
        front, norm, nn.Flatten(), nn.Linear(front.out_channels * side[0] * side[1], n_outputs)
    )


def scatternet_cnn(
    input_shape: Sequence[int],
    n_outputs: int,
    J: int = 2,
    L: int = 8,
    width: int = 32,
    groups: int = 4,
) -> nn.Sequential:
    """ScatterNet + CNN: scattering, GroupNorm without parameters, then one
    conv-GroupNorm-ReLU-pool block (3×3, `width` channels) and a linear head, a small
    version of Tramèr & Boneh's CNN on scattering features for 28×28 images."""
    front, norm = _front(input_shape, J, L)
    h, w = (s // 2 for s in front.out_side)
    return nn.Sequential(
        front,
        norm,
        nn.Conv2d(front.out_channels, width, kernel_size=3, padding=1),
        nn.GroupNorm(min(groups, width), width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(width * h * w, n_outputs),
    )
