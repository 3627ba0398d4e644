"""Where the Gaussian noise of DP-SGD and output perturbation comes from.

Two sources, and the run records which one it used (`metadata()`):

* `SecureNoise` (the default for deployment): uniform bits from the operating system's
  CSPRNG (`os.urandom`), turned into normals by Box–Muller in float64. A seeded PRNG
  such as Mersenne Twister or Philox can be predicted from its outputs, and whoever
  predicts the noise can subtract it. Following Opacus' secure mode (Holohan & Braghin
  2021), each value is the sum of four normals of half the standard deviation, which
  blunts floating-point attacks on the low bits of a single Box–Muller draw.
* `SeededNoise` (research mode): a seeded `torch.Generator`, so that runs repeat exactly
  and stacked trials can be compared with single ones. Not private against anyone who
  knows or guesses the seed.
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["NoiseSource", "SecureNoise", "SeededNoise"]


class NoiseSource(ABC):
    """A source of N(0, std²) tensors."""

    @abstractmethod
    def normal(self, shape: tuple[int, ...], std: float, dtype: torch.dtype) -> Tensor:
        """A tensor of independent N(0, std²) values."""

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

    def metadata(self) -> dict[str, Any]:
        return {"noise": "seeded", "secure": False, "seed": self.seed}


class SecureNoise(NoiseSource):
    """Noise from the operating system's CSPRNG; cannot be replayed, by design."""

    def normal(self, shape: tuple[int, ...], std: float, dtype: torch.dtype) -> Tensor:
        count = math.prod(shape)
        total = np.zeros(count)
        for _ in range(4):
            total += _box_muller(count)
        return torch.from_numpy(total * (std / 2.0)).to(dtype).reshape(shape)

    def metadata(self) -> dict[str, Any]:
        return {"noise": "secure", "secure": True, "source": "os.urandom, Box-Muller, 4-sum"}


def _box_muller(count: int) -> np.ndarray:
    """`count` standard normals from 53-bit uniforms read from os.urandom."""
    pairs = (count + 1) // 2
    bits = np.frombuffer(os.urandom(16 * pairs), dtype=np.uint64) >> np.uint64(11)
    uniform = (bits.astype(np.float64) + 1.0) * 2.0**-53  # in (0, 1]: log is finite
    u1, u2 = uniform[:pairs], uniform[pairs:]
    radius = np.sqrt(-2.0 * np.log(u1))
    angle = 2.0 * np.pi * u2
    return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count]
