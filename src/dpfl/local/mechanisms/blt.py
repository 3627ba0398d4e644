"""BLT, the buffered linear Toeplitz mechanism: Dvijotham, McMahan, Pillutla, Steinke &
Thakurta, "Efficient and near-optimal noise generation for streaming differential
privacy", FOCS 2024; McMahan, Xu & Zhang (?), "A hassle-free algorithm for private
learning in practice: don't use tree aggregation, use BLTs", 2024.

C is Toeplitz with c_0 = 1 and c_k = Σᵢ ωᵢθᵢ^(k−1) (`BufferedToeplitz`): C⁻¹z is a
recursive filter with a few buffers of state, whatever the run's length. C is not banded,
so there is no amplification by sampling: the records are split into b = ⌊1/q⌋
partitions once per run, step t takes all of partition t mod b (an expected batch of
n/b ≈ q·n), and a record takes part exactly every b-th step. With C ≥ 0 and its columns
non-increasing, the record whose partition comes first moves C·x the most, by
√S(T)·C after T steps (`sensitivity_squared`): the run is one Gaussian mechanism of
noise σ/√S(T). Each of R trainings of s steps is charged the Gaussian of noise σ/ρ,
ρ² = max_{r ≤ R} S(rs)/r: after any r trainings the charges compose to σ/(ρ√r) ≤
σ/√S(rs), so the ledger is never behind the stream; steps past the R trainings are
refused (the sensitivity was bounded for R)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from dpfl.local.mechanisms.base import Buffered, CorrelatedNoise, NoiseSettings, at_least_one
from dpfl.privacy import events
from dpfl.privacy.factorization import BufferedToeplitz


@dataclass(frozen=True)
class BLT(CorrelatedNoise):
    buffers: int = 4
    """d: the filter's buffers (its state is d vectors of the model's size)."""

    name: ClassVar[str] = "blt"
    described: ClassVar[str] = (
        "buffered linear Toeplitz noise (Dvijotham et al. 2024): noise correlated over the "
        "whole run, each record in every b-th batch (b = ⌊1/q⌋), no amplification"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least_one(self.buffers, "blt's buffers")

    def separation(self, rate: float, who: str = "the silo") -> int:
        """⌊1/q⌋ (to a relative 1e-9: q = B/n with n a multiple of B gives n/B)."""
        return max(1, math.floor(1 / rate * (1 + 1e-9)))

    def partition_rate(self, rate: float, who: str) -> float:
        return 1.0

    def strategy(self, rate: float, steps: int) -> BufferedToeplitz:
        return BufferedToeplitz.optimal(self.horizon(steps), self.separation(rate), self.buffers)

    def event(
        self, rate: float, noise_multiplier: float, steps: int, who: str = "the silo"
    ) -> events.PrivacyEvent:
        horizon, separation = self.horizon(steps), self.separation(rate)
        squared = self.strategy(rate, steps).sensitivity_squared(horizon, separation)
        trainings = np.arange(1, self.trainings + 1)
        rho = math.sqrt(float(np.max(squared[trainings * steps - 1] / trainings)))
        return events.gaussian(noise_multiplier / rho)

    def noise_filter(self, rate: float, steps: int) -> Buffered:
        return Buffered(*self.strategy(rate, steps).inverse_buffers())

    def check_stream(self, step: int, steps: int) -> None:
        if step + steps > self.horizon(steps):
            raise ValueError(
                f"blt's noise was planned and charged for {self.trainings} trainings of "
                f"{steps} steps; step {step + steps} would pass them (plan more rounds)"
            )


class BLTSettings(NoiseSettings):
    mechanism: Literal["blt"]
    buffers: int = Field(4, ge=1, le=16)
    """d, the filter's buffers: its state is d copies of the model's size."""

    def build(self, trainings: int) -> BLT:
        return BLT(trainings, buffers=self.buffers)
