"""What a noise mechanism of DP-SGD is: how it correlates each step's Gaussian draw with
the earlier ones, how the batches must be drawn for that, and the privacy event the two
together cause.

A DP-SGD run is three pieces: the sampler (which records a step reads), the clipping
(how far one of them moves the sum) and the noise mechanism. Independent Gaussian noise,
`σ·C` on each step's sum, leaves the sampler's own event
(`dpfl.local.mechanisms.independent`). A correlated mechanism (matrix factorisation,
DP-FTRL) releases C·x + z over the run's steps, x the clipped sums, z independent draws
and C a lower-triangular Toeplitz strategy: the model sees x + C⁻¹z, whose running sums
carry less noise than x + z. It needs min-separated participation
(`dpfl.data.sampling.CyclicPoissonSampler`) and declares its own event (docs/privacy.md,
"Correlated noise").

A hospital's correlated noise has state that lives across its rounds: each record's
partition, the step the run has reached, and the filter's memory of earlier draws. It is
secret (with it the server could take the noise back out): a stream is kept in the
hospital's local state, which never leaves it, and in its checkpoint; a hospital that
must train a round again from an older state starts a new stream (`forget_streams`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from torch import Tensor

from dpfl.data.sampling import CyclicPoissonSampler
from dpfl.errors import InternalError
from dpfl.privacy import events

STREAMS = "noise"
"""The local-state key of a hospital's noise streams, by the model each belongs to (a
hospital that trains two models, as Ditto's, keeps two)."""

Stream = dict[str, Any]
"""One model's correlated noise at one hospital, in its local state (plain tensors and
ints, as a checkpoint loads them): `partitions` (each record's, drawn once), `step` (the
run's steps so far) and `memory` (the filter's state, [order, parameters])."""


def forget_streams(local: dict[str, Any]) -> dict[str, Any]:
    """The local state without its noise streams: training again from an older state, whose
    later noise was already released, must not continue that stream (its memory would
    take released noise back out); a new stream is a new mechanism, charged anew."""
    return {k: v for k, v in local.items() if k != STREAMS}


@dataclass(frozen=True)
class NoiseMechanism(ABC):
    """How a DP-SGD run's noise is drawn: frozen and public. `trainings` is the most
    trainings of one model the run plans (its rounds): the horizon a correlated strategy
    is optimised, and charged, for."""

    name: ClassVar[str]
    correlated: ClassVar[bool]
    described: ClassVar[str]
    """One line for the datasheet."""
    trainings: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.trainings, bool) or not (
            isinstance(self.trainings, int) and self.trainings >= 1
        ):
            raise ValueError(f"a run plans at least one training, got {self.trainings!r}")

    @abstractmethod
    def event(
        self, rate: float, noise_multiplier: float, steps: int, who: str = "the silo"
    ) -> events.PrivacyEvent:
        """What one training of `steps` steps costs a record of a silo `who` whose records
        are sampled at q = `rate` (one record per person, each in one record)."""


class NoiseSettings(BaseModel, ABC):
    """A study's `algorithm.noise`: the mechanism by name (`mechanism`) and its settings,
    declared in the mechanism's own module; `build` makes it for a run of `trainings`."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    mechanism: str

    @abstractmethod
    def build(self, trainings: int) -> NoiseMechanism:
        """The mechanism, for a run that trains each model up to `trainings` times."""


@dataclass(frozen=True)
class CorrelatedNoise(NoiseMechanism):
    """A mechanism that filters each step's draws through C⁻¹ over the run's steps."""

    correlated: ClassVar[bool] = True

    @abstractmethod
    def separation(self, rate: float, who: str) -> int:
        """b: each record takes part at most once in any b consecutive steps, for a silo
        `who` whose records independent noise would sample at q = `rate`."""

    @abstractmethod
    def partition_rate(self, rate: float, who: str) -> float:
        """p: the probability that a record of the step's partition is in its batch."""

    @abstractmethod
    def noise_filter(self, rate: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """(numerator, denominator) of C⁻¹ as a recursive filter over the steps, as
        `scipy.signal.lfilter` reads them, for trainings of `steps` steps at rate q."""

    def check_stream(self, step: int, steps: int) -> None:
        """Refuse to go on from the run's `step` for `steps` more, if the mechanism's
        event does not cover them."""

    def horizon(self, steps: int) -> int:
        """The steps of the whole run, for trainings of `steps` steps."""
        return self.trainings * steps

    def new_stream(self, size: int, rate: float, who: str, rng: np.random.Generator) -> Stream:
        """A stream for a silo of `size` records (each record's partition drawn on its own
        from the hospital's secret `rng`)."""
        partitions = CyclicPoissonSampler.draw_partitions(size, self.separation(rate, who), rng)
        return {"partitions": torch.from_numpy(partitions), "step": 0, "memory": None}

    def sampler(
        self, stream: Stream, rate: float, rng: np.random.Generator, *, public_size: int, who: str
    ) -> CyclicPoissonSampler:
        """The cyclic sampler that continues `stream`."""
        return CyclicPoissonSampler(
            stream["partitions"].numpy(),
            self.separation(rate, who),
            self.partition_rate(rate, who),
            rng,
            public_size=public_size,
            start=stream["step"],
        )


class Correlation:
    """The noise of one training of stacked members: `apply` turns each step's independent
    draws (one row per member) into the correlated noise, each member through its own
    filter and memory, and `events` is what the training costs each. Transposed direct
    form II, as `scipy.signal.lfilter`: w = n₀z + s₁, sᵢ ← nᵢz − dᵢw + sᵢ₊₁.

    `memory` is a ring: sᵢ lies in slot (head + i − 1) mod order, so that a step moves no
    state (sᵢ₊₁ already lies where sᵢ must go) and updates every slot in one fused pass
    per term, skipping the numerator's where it is n₀ alone (banded MF). Those passes over
    order × width values per member are what a correlated step costs more
    (benchmarks/README.md, "dpfl.local.mechanisms")."""

    def __init__(
        self,
        mechanism: CorrelatedNoise,
        rates: Sequence[float],
        names: Sequence[str],
        steps: int,
        memories: Sequence[Tensor | None],
    ) -> None:
        filters = [mechanism.noise_filter(rate, steps) for rate in rates]
        self.order = max(max(len(n), len(d)) for n, d in filters) - 1
        coefficients = np.zeros((2, len(rates), self.order + 1))
        for i, (numerator, denominator) in enumerate(filters):
            if not denominator[0]:
                raise InternalError("a noise filter's leading denominator is zero")
            coefficients[0, i, : len(numerator)] = np.asarray(numerator) / denominator[0]
            coefficients[1, i, : len(denominator)] = np.asarray(denominator) / denominator[0]
        self.mechanism, self.steps = mechanism, steps
        self.members = list(zip(rates, names, strict=True))
        self._coefficients = torch.from_numpy(coefficients)
        self._memories = list(memories)
        self.memory: Tensor | None = None
        """[members, order, width] from `start` on, a ring (`memories` puts s₁ first)."""

    def events(self, noise_multiplier: float) -> list[events.PrivacyEvent]:
        """Each member's event for this training, declared before its first step."""
        return [
            self.mechanism.event(rate, noise_multiplier, self.steps, who)
            for rate, who in self.members
        ]

    def start(self, width: int, dtype: torch.dtype, device: torch.device) -> None:
        """Take up the members' memories for draws of `width` values on `device`."""
        if self.memory is not None:
            return
        zeros = torch.zeros(self.order, width, dtype=dtype, device=device)
        memory = [zeros if m is None else m.to(device, dtype) for m in self._memories]
        if any(m.shape != (self.order, width) for m in memory):
            raise InternalError(
                f"a noise stream's memory is not the filter's ({self.order}, {width}): "
                "it belongs to another mechanism or model"
            )
        self.memory = torch.stack(memory)
        self._head = 0
        self._slots = self.memory.unbind(1)
        coefficients = self._coefficients.to(device, dtype)
        self._gain = coefficients[0, :, :1]  # n₀, [members, 1]
        taps = coefficients[:, :, 1:].unsqueeze(-1)  # [2, members, order, 1]
        # per head h, slot k's taps: slot k holds s_i, i = (k − h) mod order + 1
        self._ring = [taps.roll(h, dims=2).unbind(0) for h in range(self.order)]
        # the draws [members, 1, width], kept for the numerator's pass where it has more
        # than n₀
        self._draws = torch.empty_like(self.memory[:, :1]) if bool(taps[0].any()) else None

    def apply(self, rows: Tensor) -> None:
        """Replace the draws `rows` [members, width] by the correlated noise, in place."""
        if self.memory is None:
            raise InternalError("Correlation.apply before start")
        if not self.order:
            rows.mul_(self._gain)
            return
        if self._draws is not None:
            self._draws[:, 0].copy_(rows)
        first = self._slots[self._head]
        torch.addcmul(first, self._gain, rows, out=rows)  # w = n₀z + s₁
        first.zero_()  # s₁'s slot becomes s_order's, which has no sᵢ₊₁
        self._head = (self._head + 1) % self.order
        numerator, denominator = self._ring[self._head]
        if self._draws is not None:
            self.memory.addcmul_(numerator, self._draws)
        self.memory.addcmul_(denominator, rows.unsqueeze(1), value=-1)

    def memories(self) -> list[Tensor | None]:
        """Each member's memory, on the CPU, for its stream (s₁ first)."""
        if self.memory is None:
            return list(self._memories)
        ordered = self.memory.roll(-self._head, dims=1) if self.order else self.memory
        return [m.cpu().clone() for m in ordered.unbind(0)]
