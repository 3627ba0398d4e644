"""Independent Gaussian noise: DP-SGD's own, N(0, σ²C²) on each step's clipped sum,
drawn afresh at every step. It adds nothing to the sampler, whose event is the run's
(the default mechanism: a run that names none is exactly DP-SGD)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from dpfl.data.sampling import PoissonSampler
from dpfl.local.mechanisms.base import NoiseMechanism, NoiseSettings
from dpfl.privacy import events


@dataclass(frozen=True)
class Independent(NoiseMechanism):
    name: ClassVar[str] = "independent"
    correlated: ClassVar[bool] = False
    described: ClassVar[str] = "independent Gaussian noise σC on each step's sum (DP-SGD)"

    def event(
        self, rate: float, noise_multiplier: float, steps: int, who: str = "the silo"
    ) -> events.PrivacyEvent:
        """Poisson DP-SGD's (the algorithm's own sampler declares its variants: balanced
        batches, patients, records in several rows)."""
        return PoissonSampler.event(rate, noise_multiplier, steps)


class IndependentSettings(NoiseSettings):
    mechanism: Literal["independent"] = "independent"

    def build(self, trainings: int) -> Independent:
        return Independent(trainings)
