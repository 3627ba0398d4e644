"""Where the Gaussian noise of DP-SGD and output perturbation comes from.

Two sources, and the run records which one it used (`metadata()`):

* `SecureNoise` (the default for deployment): uniform bits from a ChaCha20 keystream
  keyed by the operating system's CSPRNG (`os.urandom`) — the construction behind
  /dev/urandom itself, at a few GB/s — turned into normals by Box–Muller at the
  precision of the requested dtype. A seeded PRNG such as Mersenne Twister or Philox can
  be predicted from its outputs, and whoever predicts the noise can subtract it.
  Following Opacus' secure mode (Holohan & Braghin 2021), each value is the sum of four
  normals of half the standard deviation, which blunts floating-point attacks on the
  low bits of a single Box–Muller draw.
* `SeededNoise` (research mode): a seeded `torch.Generator`, so that runs repeat exactly
  and stacked trials can be compared with single ones. Not private against anyone who
  knows or guesses the seed.
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from typing import Any

import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from torch import Tensor

__all__ = ["NoiseSource", "SecureNoise", "SeededNoise"]


class NoiseSource(ABC):
    """A source of N(0, std²) tensors."""

    @abstractmethod
    def normal(self, shape: tuple[int, ...], std: float, dtype: torch.dtype) -> Tensor:
        """A tensor of independent N(0, std²) values."""

    def normal_into(self, out: Tensor, std: float) -> None:
        """Overwrite `out` with the values `normal(out.shape, std, out.dtype)` would give
        (the same draws from the same stream); sources may write them in place."""
        out.copy_(self.normal(tuple(out.shape), std, out.dtype))

    @abstractmethod
    def metadata(self) -> dict[str, Any]:
        """What a run's record should say about its noise."""


class SeededNoise(NoiseSource):
    """Reproducible noise from a seeded generator: research mode only."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._generator = torch.Generator().manual_seed(seed)

    def normal(self, shape: tuple[int, ...], std: float, dtype: torch.dtype) -> Tensor:
        return torch.empty(shape, dtype=dtype).normal_(0.0, std, generator=self._generator)

    def normal_into(self, out: Tensor, std: float) -> None:
        if not out.is_contiguous():  # `normal_` draws strided tensors in another order
            super().normal_into(out, std)
            return
        out.normal_(0.0, std, generator=self._generator)

    def metadata(self) -> dict[str, Any]:
        return {"noise": "seeded", "secure": False, "seed": self.seed}


class SecureNoise(NoiseSource):
    """Noise from a CSPRNG keyed by the operating system; cannot be replayed, by design."""

    def __init__(self) -> None:
        cipher = Cipher(algorithms.ChaCha20(os.urandom(32), os.urandom(16)), mode=None)
        self._keystream = cipher.encryptor()

    def normal(self, shape: tuple[int, ...], std: float, dtype: torch.dtype) -> Tensor:
        count = math.prod(shape)
        work = torch.float32 if torch.finfo(dtype).bits <= 32 else torch.float64
        total = self._box_muller(count, work)
        for _ in range(3):
            total += self._box_muller(count, work)
        return total.mul_(std / 2.0).to(dtype).reshape(shape)

    def metadata(self) -> dict[str, Any]:
        return {
            "noise": "secure",
            "secure": True,
            "source": "ChaCha20 keyed by os.urandom, Box-Muller, 4-sum",
        }

    def _box_muller(self, count: int, dtype: torch.dtype) -> Tensor:
        """`count` standard normals from uniforms with the dtype's mantissa precision."""
        pairs = (count + 1) // 2
        # the dtype's significand bits, read from 32- or 64-bit words of the keystream
        mantissa, word = (24, torch.int32) if dtype == torch.float32 else (53, torch.int64)
        width = torch.iinfo(word).bits
        raw = bytearray(self._keystream.update(bytes(2 * pairs * width // 8)))
        bits = torch.frombuffer(raw, dtype=word) >> (width - mantissa)
        bits &= (1 << mantissa) - 1  # the shift of a signed integer keeps the sign
        uniform = bits.to(dtype).add_(1.0).mul_(2.0**-mantissa)  # in (0, 1]: log is finite
        radius = torch.sqrt(-2.0 * torch.log(uniform[:pairs]))
        angle = (2.0 * math.pi) * uniform[pairs:]
        return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:count]
