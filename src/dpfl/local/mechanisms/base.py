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
from scipy import signal
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


def at_least_one(value: object, what: str) -> None:
    """Refuse (ValueError) anything but an integer ≥ 1 for a mechanism's count `what`."""
    if isinstance(value, bool) or not (isinstance(value, int) and value >= 1):
        raise ValueError(f"{what} must be an integer ≥ 1, got {value!r}")


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
        at_least_one(self.trainings, "a run's trainings")

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
class Recursive:
    """C⁻¹ as `scipy.signal.lfilter(numerator, denominator)` runs it: banded MF's 1/c(x),
    whose b − 1 past outputs are its state."""

    numerator: np.ndarray
    denominator: np.ndarray

    @property
    def order(self) -> int:
        return max(len(self.numerator), len(self.denominator)) - 1

    def impulse_response(self, n: int) -> np.ndarray:
        """The first n coefficients of C⁻¹ (float64)."""
        impulse = np.zeros(n)
        impulse[0] = 1.0
        return np.asarray(signal.lfilter(self.numerator, self.denominator, impulse))


@dataclass(frozen=True)
class Buffered:
    """C⁻¹(x) = 1 + Σ_j ω̂_j x / (1 − λ_j x) (`weights` ω̂, `rates` λ): d first-order
    recursions, s_j ← λ_j s_j + z and w = z + Σ_j ω̂_j s_j, exact to rounding in float32
    (BLT: the inverse of a BLT is one; as one product polynomial its rates near 1 cancel,
    `BufferedToeplitz.inverse_buffers`)."""

    weights: np.ndarray
    rates: np.ndarray

    @property
    def order(self) -> int:
        return len(self.weights)

    def impulse_response(self, n: int) -> np.ndarray:
        """The first n coefficients of C⁻¹ (float64)."""
        powers = np.arange(n - 1)
        out = np.ones(n)
        out[1:] = np.sum(self.weights[:, None] * self.rates[:, None] ** powers, axis=0)
        return out


NoiseFilter = Recursive | Buffered
"""How a correlated mechanism's C⁻¹ is run step by step."""


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
    def noise_filter(self, rate: float, steps: int) -> NoiseFilter:
        """C⁻¹ as a filter over the run's steps, for trainings of `steps` steps at rate q."""

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
    filter and memory, and `events` is what the training costs each. Every operation is
    elementwise: a member's bits are the same alone as in any stack."""

    def __init__(
        self,
        mechanism: CorrelatedNoise,
        rates: Sequence[float],
        names: Sequence[str],
        steps: int,
        memories: Sequence[Tensor | None],
    ) -> None:
        self.filters = [mechanism.noise_filter(rate, steps) for rate in rates]
        if len({type(f) for f in self.filters}) != 1:
            raise InternalError("a mechanism's members must share one form of noise filter")
        self.order = max(f.order for f in self.filters)
        self.mechanism, self.steps = mechanism, steps
        self.members = list(zip(rates, names, strict=True))
        self._memories = list(memories)
        self._kernel: _Ring | _Buffers | None = None
        self.memory: Tensor | None = None
        """[members, order, width] from `start` on (`memories` hands it back in order)."""

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
        kernel = _Buffers if isinstance(self.filters[0], Buffered) else _Ring
        self._kernel = kernel(self.filters, self.memory)  # type: ignore[arg-type]

    def apply(self, rows: Tensor) -> None:
        """Replace the draws `rows` [members, width] by the correlated noise, in place."""
        if self._kernel is None:
            raise InternalError("Correlation.apply before start")
        self._kernel.apply(rows)

    def memories(self) -> list[Tensor | None]:
        """Each member's memory, on the CPU, for its stream."""
        if self._kernel is None:
            return list(self._memories)
        return [m.cpu().clone() for m in self._kernel.ordered().unbind(0)]


def _padded(rows: Sequence[np.ndarray], width: int) -> np.ndarray:
    out = np.zeros((len(rows), width))
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


class _Ring:
    """`Recursive` filters, transposed direct form II as `scipy.signal.lfilter` runs
    them: w = n₀z + s₁, sᵢ ← nᵢz − dᵢw + sᵢ₊₁ (the denominator's d₀ scaled to 1).

    The memory is a ring: sᵢ lies in slot (head + i − 1) mod order, so that a step moves
    no state (sᵢ₊₁ already lies where sᵢ must go) and updates every slot in one fused
    pass per term, skipping the numerator's where it is n₀ alone (banded MF). Those
    passes over order × width values per member are what a correlated step costs more
    (benchmarks/README.md, "dpfl.local.mechanisms")."""

    def __init__(self, filters: Sequence[Recursive], memory: Tensor) -> None:
        order = memory.shape[1]
        if any(not f.denominator[0] for f in filters):
            raise InternalError("a noise filter's leading denominator is zero")
        leading = np.array([f.denominator[0] for f in filters])[:, None]
        numerator = _padded([f.numerator for f in filters], order + 1) / leading
        denominator = _padded([f.denominator for f in filters], order + 1) / leading
        coefficients = torch.from_numpy(np.stack([numerator, denominator]))
        coefficients = coefficients.to(memory.device, memory.dtype)
        self.memory, self.order, self.head = memory, order, 0
        self.slots = memory.unbind(1)
        self.gain = coefficients[0, :, :1]  # n₀, [members, 1]
        taps = coefficients[:, :, 1:].unsqueeze(-1)  # [2, members, order, 1]
        # per head h, slot k's taps: slot k holds s_i, i = (k − h) mod order + 1
        self.ring = [taps.roll(h, dims=2).unbind(0) for h in range(order)]
        # the draws [members, 1, width], kept for the numerator's pass where it has more
        # than n₀
        self.draws = torch.empty_like(memory[:, :1]) if bool(taps[0].any()) else None

    def apply(self, rows: Tensor) -> None:
        if not self.order:
            rows.mul_(self.gain)
            return
        if self.draws is not None:
            self.draws[:, 0].copy_(rows)
        first = self.slots[self.head]
        torch.addcmul(first, self.gain, rows, out=rows)  # w = n₀z + s₁
        first.zero_()  # s₁'s slot becomes s_order's, which has no sᵢ₊₁
        self.head = (self.head + 1) % self.order
        numerator, denominator = self.ring[self.head]
        if self.draws is not None:
            self.memory.addcmul_(numerator, self.draws)
        self.memory.addcmul_(denominator, rows.unsqueeze(1), value=-1)

    def ordered(self) -> Tensor:
        """The memory with s₁ first (lfilter's state)."""
        return self.memory.roll(-self.head, dims=1) if self.order else self.memory


class _Buffers:
    """`Buffered` filters: w = z + Σ_j ω̂_j s_j, then s_j ← λ_j s_j + z (a member with
    fewer buffers than the order has zero weights in the rest)."""

    def __init__(self, filters: Sequence[Buffered], memory: Tensor) -> None:
        order = memory.shape[1]
        weights = torch.from_numpy(_padded([f.weights for f in filters], order))
        rates = torch.from_numpy(_padded([f.rates for f in filters], order))
        self.memory = memory
        self.slots = memory.unbind(1)
        self.weights = weights.to(memory.device, memory.dtype).unsqueeze(-1).unbind(1)
        self.rates = rates.to(memory.device, memory.dtype).unsqueeze(-1)  # [members, d, 1]
        self.draws = torch.empty_like(memory[:, :1])

    def apply(self, rows: Tensor) -> None:
        self.draws[:, 0].copy_(rows)
        for weight, slot in zip(self.weights, self.slots, strict=True):
            rows.addcmul_(weight, slot)
        self.memory.mul_(self.rates).add_(self.draws)

    def ordered(self) -> Tensor:
        return self.memory
