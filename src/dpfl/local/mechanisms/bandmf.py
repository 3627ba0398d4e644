"""Banded matrix factorisation (DP-FTRL with a b-banded strategy), amplified by cyclic
Poisson sampling: Choquette-Choo, McMahan, Rush & Thakurta, "Amplified banded matrix
factorization: a unified approach to private training", NeurIPS 2023.

C is lower-triangular Toeplitz with b bands and ‖c‖₂ = 1 (`BandedToeplitz`), optimised
for the run's steps. The records are split into b partitions once per run and step t
samples partition t mod b at p = b·q, so each record takes part at most once in any b
consecutive steps and the expected batch stays q·n. Their Theorem 4: releasing C·x + z
with z ~ N(0, σ²C²) is then no less private than DP-SGD at rate p and noise σ for
⌈T/b⌉ steps, the most times one partition is sampled in T steps. One training of s
steps is charged ⌈s/b⌉ of them: exact where b divides s, and never less than the run's
⌈Rs/b⌉ over R trainings. Band 1 is DP-SGD itself (C = I, p = q)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from dpfl.data.sampling import CyclicPoissonSampler
from dpfl.local.mechanisms.base import CorrelatedNoise, NoiseSettings, Recursive, at_least_one
from dpfl.privacy import events
from dpfl.privacy.factorization import BandedToeplitz


@dataclass(frozen=True)
class BandedMF(CorrelatedNoise):
    band: int = 4
    """b: the strategy's bands, and the partitions a record is cycled through."""

    name: ClassVar[str] = "bandmf"
    described: ClassVar[str] = (
        "banded matrix factorisation (Choquette-Choo et al. 2023): noise correlated over "
        "b steps, cyclic Poisson batches over b partitions"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least_one(self.band, "bandmf's band")

    def separation(self, rate: float, who: str) -> int:
        return self.band

    def partition_rate(self, rate: float, who: str) -> float:
        p = self.band * rate
        if p > 1:
            raise ValueError(
                f"bandmf with band {self.band} samples each partition of {who!r} at b·q = "
                f"{p:.3g} > 1 (q = {rate:.3g}): choose band ≤ {int(1 / rate)} or a smaller "
                "expected batch"
            )
        return p

    def event(
        self, rate: float, noise_multiplier: float, steps: int, who: str = "the silo"
    ) -> events.PrivacyEvent:
        return CyclicPoissonSampler.event(
            self.partition_rate(rate, who), self.band, noise_multiplier, steps
        )

    def noise_filter(self, rate: float, steps: int) -> Recursive:
        """w_t = (z_t − Σ_{j≥1} c_j w_{t−j}) / c_0; with fewer steps than bands, all of them."""
        horizon = self.horizon(steps)
        strategy = BandedToeplitz.optimal(horizon, min(self.band, horizon))
        return Recursive(np.ones(1), strategy.coefficients)


class BandedMFSettings(NoiseSettings):
    mechanism: Literal["bandmf"]
    band: int = Field(4, ge=1)
    """b, the strategy's bands: each record is in at most one of any b consecutive
    batches, each partition sampled at b·q (so b ≤ 1/q)."""

    def build(self, trainings: int) -> BandedMF:
        return BandedMF(trainings, band=self.band)
