"""DP-SGD at one silo, and the same for K silos × R trials as one stacked computation.

One step (Owkin Alg. 1/2, Dopamine Alg. 1 lines 7-14): draw a batch with the sampler,
sum the per-example gradients clipped to C, add N(0, σ²C²) to the sum, divide by the
sampler's data-independent expected batch size (q·n for Poisson batches: the realised
size is a private count), then v ← βv + g̃ and θ ← θ − ηv. Momentum only re-uses noisy
gradients, so it is post-processing and costs nothing (Dopamine, App. C). So does Adam
(`optimizer="adam"`, FLamby's baselines' choice), which rescales the same g̃ per
coordinate: m ← β₁m + (1−β₁)g̃, s ← β₂s + (1−β₂)g̃², θ ← θ − η·m̂/(√ŝ + ε) with the bias
corrections m̂ = m/(1−β₁ᵗ), ŝ = s/(1−β₂ᵗ), as torch.optim.Adam's default; its state
restarts at each local training (t counts from 1 within one `run`).

The sampler declares the privacy event (docs/architecture.md's one rule); `run` asks for it
*before* the first step, so a sampler that cannot be accounted for (shuffled batches)
stops the run instead of being reported wrongly, and returns it with the result for the
caller to record in the silo's ledger.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from dpfl.data.sampling import BatchSampler
from dpfl.errors import InternalError
from dpfl.local.clipping import (
    ClippedGradientSum,
    Params,
    column_major_copy,
    column_major_weights,
)
from dpfl.local.device import Placement, current
from dpfl.local.lazy_noise import DeferredRows
from dpfl.local.losses import Loss
from dpfl.local.mechanisms import Correlation
from dpfl.local.noise import NoiseSource, SecureNoise
from dpfl.local.threads import torch_threads
from dpfl.privacy import events

__all__ = ["DPSGD", "DPSGDConfig", "LocalResult", "StackedResult", "parameters_of", "stack"]

ONE_THREAD_BELOW = 1 << 16
"""Steps whose work (members × expected batch × parameters per member) is below this run
on one intra-op thread, whatever torch's setting, which is restored afterwards. Their
tensors are far too small for threads to help, and each operation that enters a parallel
region waits at its barrier for the other threads, which on a loaded machine costs more
than the work (benchmarks/README.md). 0 leaves torch's setting alone."""


@dataclass(frozen=True)
class DPSGDConfig:
    """Clipping bound C, noise multiplier σ (noise std σ·C on the sum), step size, momentum,
    and the optimiser that turns each noisy gradient into a step: "sgd" (with `momentum`)
    or "adam" (with `betas` and `eps`, no momentum). Either is post-processing of the noisy
    gradient: the privacy event is the same.

    σ = 0 is the non-private reference (FL-STANDARD, FL-SIGN, F): no noise and no privacy
    event; `NON_PRIVATE` also sets C = ∞ so that nothing is clipped.
    """

    clip_norm: float
    noise_multiplier: float
    learning_rate: float
    momentum: float = 0.0
    optimizer: Literal["sgd", "adam"] = "sgd"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if (
            self.clip_norm <= 0
            or self.noise_multiplier < 0
            or self.learning_rate <= 0
            or not 0 <= self.momentum < 1
        ):
            raise ValueError(f"invalid DP-SGD configuration {self}")
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {self.optimizer!r}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"Adam's betas must be two numbers in [0, 1), got {self.betas}")
        if not self.eps > 0:
            raise ValueError(f"Adam's eps must be > 0, got {self.eps}")
        if self.optimizer == "adam" and self.momentum:
            raise ValueError(
                f"momentum must be 0 with optimizer 'adam' (got {self.momentum}): Adam's "
                "first moment, betas[0], is its momentum"
            )

    @property
    def private(self) -> bool:
        return self.noise_multiplier > 0

    @classmethod
    def non_private(
        cls,
        learning_rate: float,
        momentum: float = 0.0,
        *,
        optimizer: Literal["sgd", "adam"] = "sgd",
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> DPSGDConfig:
        """Plain minibatch SGD (or Adam) on the same Poisson batches: the non-private
        baseline."""
        return cls(math.inf, 0.0, learning_rate, momentum, optimizer, betas, eps)


@dataclass(frozen=True)
class LocalResult:
    """What one silo's local training produced and what it must record in its ledger."""

    params: Params
    velocity: Params
    event: events.PrivacyEvent | None  # None for a non-private run
    metadata: dict[str, Any]


@dataclass(frozen=True)
class StackedResult:
    """`params` and `velocity` carry a leading member axis; one event per member (none
    for a non-private run)."""

    params: Params
    velocity: Params
    events: list[events.PrivacyEvent]
    metadata: list[dict[str, Any]]


def parameters_of(model: nn.Module) -> Params:
    """Detached copies of a module's parameters, the state `DPSGD` trains."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def stack(members: Sequence[Params]) -> Params:
    """Stack parameter dicts of identical architecture along a new leading axis."""
    return {name: torch.stack([m[name] for m in members]) for name in members[0]}


class DPSGD:
    """DP-SGD for one architecture and loss; the parameters live outside the module.

    It trains on `device` ("cpu", "cuda", "auto"; None: the enclosing
    `dpfl.local.device.training_device`'s, the CPU outside one): parameters, batches and
    noise there, the results handed back on the CPU (`dpfl.local.device`)."""

    def __init__(
        self, model: nn.Module, loss: Loss, config: DPSGDConfig, device: str | None = None
    ) -> None:
        self.placement = current() if device is None else Placement(device)
        self.clipped_sum = ClippedGradientSum(self.placement.put(model), loss)
        self.config = config

    def run(
        self,
        params: Params,
        data: tuple[Tensor, Tensor],
        sampler: BatchSampler,
        steps: int,
        *,
        noise: NoiseSource | None = None,
        velocity: Params | None = None,
    ) -> LocalResult:
        """`steps` DP-SGD steps on one silo's (x, y); x may be a sparse COO tensor.

        Noise is cryptographically secure unless a `SeededNoise` is passed (research mode).
        `velocity` carries SGD's momentum over from an earlier run; with Adam the returned
        `velocity` is its first moment, and no velocity may be passed (its state restarts).
        """
        result = self._train(
            {k: v.unsqueeze(0) for k, v in params.items()},
            [data],
            [sampler],
            [noise or SecureNoise()],
            steps,
            None if velocity is None else {k: v.unsqueeze(0) for k, v in velocity.items()},
        )
        return LocalResult(
            {k: v[0] for k, v in result.params.items()},
            {k: v[0] for k, v in result.velocity.items()},
            result.events[0] if result.events else None,
            result.metadata[0],
        )

    def run_stacked(
        self,
        params: Params,
        datasets: Sequence[tuple[Tensor, Tensor]],
        samplers: Sequence[BatchSampler],
        noises: Sequence[NoiseSource],
        steps: int,
        velocity: Params | None = None,
        correlation: Correlation | None = None,
    ) -> StackedResult:
        """Members (silos or trials) stacked on axis 0 of `params`, each with its own data,
        sampler and noise; one `vmap`ped computation per step, or for convolutional models
        one per member (`ClippedGradientSum.stacks_members`). Each member draws its batch
        and noise exactly as a single `run` with the same sampler and noise would, and gets
        the same bits. `DPSGDAlgorithm.train` assembles the stack: members that do not
        match, or sparse ones stacked, are a bug in dpfl (`InternalError`). With a
        `correlation` each step's draws pass through its filter (correlated noise, from
        the members' cyclic samplers), and it declares the events."""
        members = len(datasets)
        if not members == len(samplers) == len(noises) == next(iter(params.values())).shape[0]:
            raise InternalError("need one dataset, sampler and noise source per stacked member")
        if members > 1 and any(x.is_sparse for x, _ in datasets):
            raise InternalError("stacked runs need dense inputs; run sparse silos one by one")
        return self._train(params, datasets, samplers, noises, steps, velocity, correlation)

    def _train(
        self,
        params: Params,
        datasets: Sequence[tuple[Tensor, Tensor]],
        samplers: Sequence[BatchSampler],
        noises: Sequence[NoiseSource],
        steps: int,
        velocity: Params | None,
        correlation: Correlation | None = None,
    ) -> StackedResult:
        cfg = self.config
        if cfg.optimizer == "adam" and velocity is not None:
            raise ValueError(
                "adam's state restarts at each local training; pass no velocity "
                "(its second moment and step count are not carried between runs)"
            )
        declared = declared_events(cfg, samplers, steps, correlation)
        put, device = self.placement.put, self.placement.device
        datasets = [(put(x), put(y)) for x, y in datasets]
        dtype = next(iter(params.values())).dtype
        scale = torch.tensor([s.expected_batch_size for s in samplers], dtype=dtype, device=device)
        transposed = column_major_weights(self.clipped_sum.model, datasets[0][0])
        params = {  # copies on the device; those in `transposed` held column-major
            k: column_major_copy(v.detach().to(device))
            if k in transposed
            else v.detach().to(device, copy=True)
            for k, v in params.items()
        }
        if velocity is not None:
            velocity = {k: v.to(device) for k, v in velocity.items()}
        elif cfg.momentum or cfg.optimizer == "adam" or steps == 0:
            velocity = {k: torch.zeros_like(v) for k, v in params.items()}
        else:  # v = g̃ at every step: zeros that no step reads are not made
            velocity = {}
        grouped = any(s.units is not None for s in samplers)
        pool = (  # patient-level batches are clipped by patient, member by member
            _Pool(datasets, _chunk_width(samplers), dtype, self.clipped_sum, params)
            if self.clipped_sum.stacks_members(datasets[0][0], _chunk_width(samplers))
            and not grouped
            else None
        )
        # per parameter: the normalisers shaped to broadcast over its stacked members
        scales = {k: scale.reshape(-1, *[1] * (v.dim() - 1)) for k, v in params.items()}
        std = cfg.noise_multiplier * cfg.clip_norm
        member_size = sum(v[0].numel() for v in params.values())
        work = len(samplers) * max(s.expected_batch_size for s in samplers) * member_size
        deferred = self._deferred(params, transposed, datasets, samplers, noises, std, correlation)
        with torch_threads(1 if work < ONE_THREAD_BELOW else None):
            self._steps(
                params,
                velocity,
                datasets,
                samplers,
                noises,
                steps,
                pool,
                scales,
                std,
                deferred,
                correlation,
            )
        for k in transposed:  # handed back row-major, as they came (velocity as it is)
            params[k] = params[k].contiguous()
        if not self.placement.on_cpu:  # handed back where the server half works
            params = {k: v.cpu() for k, v in params.items()}
            velocity = {k: v.cpu() for k, v in velocity.items()}
        metadata = [
            {
                "mechanism": (
                    ("dp-sgd" if cfg.private else "sgd (non-private)")
                    if cfg.optimizer == "sgd"
                    else ("dp-adam" if cfg.private else "adam (non-private)")
                ),
                "sampler": type(s).__name__,
                "expected_batch_size": s.expected_batch_size,
                "clip_norm": cfg.clip_norm,
                "noise_multiplier": cfg.noise_multiplier,
                "learning_rate": cfg.learning_rate,
                "momentum": cfg.momentum,
                **(
                    {"optimizer": "adam", "betas": list(cfg.betas), "eps": cfg.eps}
                    if cfg.optimizer == "adam"
                    else {}
                ),
                "steps": steps,
                "event": described,
                **({} if correlation is None else {"noise_mechanism": correlation.mechanism.name}),
                **n.metadata(),
            }
            for s, n, described in zip(
                samplers,
                noises,
                [e.describe() for e in declared] or ["none (non-private)"] * len(samplers),
                strict=True,
            )
        ]
        return StackedResult(params, velocity, declared, metadata)

    def _steps(
        self,
        params: Params,
        velocity: Params,
        datasets: Sequence[tuple[Tensor, Tensor]],
        samplers: Sequence[BatchSampler],
        noises: Sequence[NoiseSource],
        steps: int,
        pool: _Pool | None,
        scales: Params,
        std: float,
        deferred: DeferredRows | None = None,
        correlation: Correlation | None = None,
    ) -> None:
        """`steps` DP-SGD steps, updating `params` and `velocity` in place (with Adam,
        `velocity` is the first moment m; the second moment lives for this call only).
        The `deferred` weight's noise is drawn by `deferred` (see `_deferred`), and its
        velocity, which would lack that noise, is not handed back. A `correlation` filters
        each step's draws into correlated noise."""
        cfg = self.config
        clip_norm, rate, momentum = cfg.clip_norm, cfg.learning_rate, cfg.momentum
        adam = cfg.optimizer == "adam"
        beta1, beta2 = cfg.betas
        # Adam's second moment s, one row per member like m (= velocity, zeros here)
        second = {k: torch.zeros_like(v) for k, v in velocity.items()} if adam else {}
        dtype = next(iter(params.values())).dtype
        lone = len(samplers) == 1
        # a lone member is computed beside a masked twin (see `_with_twin`): its rows of
        # the twinned tensors are the member's own parameters, updated in place
        twinned = _with_twin(params) if lone and pool is not None else params
        own = {k: v[:1] for k, v in twinned.items()} if twinned is not params else params
        members = len(samplers)
        # with noise, one buffer [members, parameters]: each step, each member draws the
        # noise of all its parameters into its row at once (one draw, not one per tensor);
        # per parameter: its members' rows, their normalisers and its columns of the buffer
        lazy = None if deferred is None else deferred.name
        width = sum(v[0].numel() for k, v in own.items() if k != lazy)
        device = self.placement.device
        buffer = torch.empty(members, width, dtype=dtype, device=device) if cfg.private else None
        rows = [] if buffer is None else list(zip(buffer.unbind(0), noises, strict=True))
        if buffer is None:
            correlation = None
        elif correlation is not None:
            correlation.start(width, dtype, device)
        updates, offset = [], 0
        for name, value in own.items():
            size = 0 if name == lazy else value[0].numel()
            noise = (
                None
                if buffer is None or name == lazy
                else _laid_out_as(buffer[:, offset : offset + size], value)
            )
            updates.append((name, value, scales[name], noise))
            offset += size
        stacked = self.clipped_sum.stacked
        drawn = _drawn(samplers, steps) if pool is None else pool.batches(samplers, steps)
        for t, (indices, chunks) in enumerate(drawn, 1):
            if deferred is not None:  # the pending noise of the rows this batch reads
                deferred.materialise(indices[0], t - 1)
            if pool is None:  # member by member, each on its own batch as it is
                units = [s.units for s in samplers]
                sums = self._one_by_one(params, datasets, indices, dtype, clip_norm, units)
            else:
                x, y, mask, norms = chunks[0]
                sums, _ = stacked(twinned, x, y, mask, clip_norm, input_norms=norms)
                for x, y, mask, norms in chunks[1:]:
                    part, _ = stacked(twinned, x, y, mask, clip_norm, input_norms=norms)
                    sums = {k: sums[k].add_(part[k]) for k in sums}
            for row, source in rows:
                source.normal_into(row, std)
            if correlation is not None and buffer is not None:
                correlation.apply(buffer)
            for name, value, scale, noise in updates:
                g = sums[name]  # a fresh tensor per step: updated in place
                if lone:
                    g = g[:members]
                if noise is not None:
                    g.add_(noise)
                g.div_(scale)
                if adam:
                    _adam_step(
                        value, g, velocity[name], second[name], t, rate, beta1, beta2, cfg.eps
                    )
                    continue
                if momentum:
                    g.add_(velocity[name], alpha=momentum)
                velocity[name] = g
                value.sub_(g, alpha=rate)
        if deferred is not None:
            deferred.flush(steps)
            velocity.pop(deferred.name, None)
        if own is not params:
            for name, value in own.items():
                params[name].copy_(value)

    def _deferred(
        self,
        params: Params,
        transposed: list[str],
        datasets: Sequence[tuple[Tensor, Tensor]],
        samplers: Sequence[BatchSampler],
        noises: Sequence[NoiseSource],
        std: float,
        correlation: Correlation | None,
    ) -> DeferredRows | None:
        """The deferred noise of the first weight's untouched rows (`lazy_noise`) where
        that is exact: a lone member's private plain SGD (no momentum, no Adam, no weight
        decay) with a first `nn.Linear` over sparse records (`transposed`), whose loss
        reads only the model's outputs and which nothing reads between steps (a
        proximal pull acts between one-step runs, after the flush), and which is the
        model's first module (`_first_is_linear`), with independent noise (a correlated
        draw depends on the earlier ones of every row). None elsewhere."""
        cfg = self.config
        if correlation is not None or not (
            cfg.private and cfg.optimizer == "sgd" and not cfg.momentum
        ):
            return None
        if len(transposed) != 1 or len(datasets) != 1:
            return None
        name = transposed[0]
        if not _first_is_linear(self.clipped_sum.model, name):
            return None
        step_std = cfg.learning_rate * std / samplers[0].expected_batch_size
        return DeferredRows(name, params[name][0].t(), datasets[0][0], noises[0], step_std)

    def _one_by_one(
        self,
        params: Params,
        datasets: Sequence[tuple[Tensor, Tensor]],
        indices: Sequence[np.ndarray],
        dtype: torch.dtype,
        clip_norm: float,
        units: Sequence[np.ndarray | None],
    ) -> Params:
        """The members' clipped sums, stacked, each computed on its own batch alone: the
        same computation for a member alone or in any stack, so the same bits. A member
        whose sampler numbers its records' `units` (patients) is clipped by unit."""
        sums = []
        for i, (data, idx, unit) in enumerate(zip(datasets, indices, units, strict=True)):
            own = {k: v[i] for k, v in params.items()}
            if unit is None:
                sums.append(self.clipped_sum(own, *_batch(data, idx, dtype), clip_norm)[0])
            elif not len(idx):  # no patient sampled: a noise-only step
                sums.append({k: torch.zeros_like(v) for k, v in own.items()})
            else:
                x, y, _ = _batch(data, idx, dtype)
                _, groups = np.unique(unit[idx], return_inverse=True)
                rows = torch.from_numpy(groups.astype(np.int64)).to(x.device)
                sums.append(self.clipped_sum.grouped(own, x, y, rows, clip_norm)[0])
        if len(sums) == 1:  # a view, not a copy (Kerkouche's sums are 4.9M values)
            return {k: v.unsqueeze(0) for k, v in sums[0].items()}
        return stack(sums)


def declared_events(
    config: DPSGDConfig,
    samplers: Sequence[BatchSampler],
    steps: int,
    correlation: Correlation | None,
) -> list[events.PrivacyEvent]:
    """Each member's event for `steps` steps, known before the first: the samplers' for
    independent noise, the correlation's for correlated noise (none without noise)."""
    if not config.private:
        return []
    if correlation is not None:
        return correlation.events(config.noise_multiplier)
    return [s.privacy_event(config.noise_multiplier, steps) for s in samplers]


def _first_is_linear(model: nn.Module, weight: str) -> bool:
    """Whether `weight` is that of an `nn.Linear` that is `model` itself or the first
    child of an `nn.Sequential`: only then does an untouched row (a zero input
    feature) go unread. A parameterless layer before it (a shift) may map zeros to
    non-zeros, which would read every row."""
    if isinstance(model, nn.Linear):
        return weight == "weight"
    if not isinstance(model, nn.Sequential) or not len(model):
        return False
    name, first = next(iter(model.named_children()))
    return isinstance(first, nn.Linear) and weight == f"{name}.weight"


def _adam_step(
    value: Tensor,
    g: Tensor,
    m: Tensor,
    s: Tensor,
    t: int,
    rate: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> None:
    """Adam's t-th update of `value` (torch.optim.Adam's default: no weight decay, no
    amsgrad) from the noisy gradient `g`, with moments `m` and `s`; all in place, `g`
    used up. Only element-wise products, sums, quotients and square roots, each rounded
    once whatever the vector width: a member's bits do not depend on its stack."""
    square = torch.mul(g, g).mul_(1 - beta2)
    s.mul_(beta2).add_(square)
    m.mul_(beta1).add_(g.mul_(1 - beta1))
    denominator = torch.sqrt(s, out=square).div_(math.sqrt(1 - beta2**t)).add_(eps)
    step = torch.div(m, denominator, out=g).mul_(rate / (1 - beta1**t))
    value.sub_(step)


def _batch(
    data: tuple[Tensor, Tensor], idx: np.ndarray, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """One silo's batch; an empty Poisson batch becomes one masked row (a noise-only step)."""
    x, y = data
    mask = torch.ones(len(idx), dtype=dtype, device=x.device)
    if not len(idx):
        idx, mask = np.zeros(1, np.int64), torch.zeros(1, dtype=dtype, device=x.device)
    rows = torch.from_numpy(idx).to(x.device)
    return x.index_select(0, rows), y.index_select(0, rows), mask


_Chunk = tuple[Tensor, Tensor, Tensor, Tensor | None]
"""x, y, mask and the records' input norms (or None) of one chunk of stacked batches."""

_Drawn = Iterator[tuple[list[np.ndarray], list[_Chunk]]]
"""Per step: each member's batch (record indices) and, from a `_Pool`, their chunks."""

GATHER_ELEMENTS = 1 << 20
"""`_Pool.batches` gathers the batches of as many steps at once as keep the gathered
inputs under this many values (at least one step)."""


def _drawn(samplers: Sequence[BatchSampler], steps: int) -> _Drawn:
    """Each step's batches, drawn when the step comes, without chunks."""
    for _ in range(steps):
        yield [s.sample() for s in samplers], []


class _Pool:
    """The members' datasets laid end to end once per run, so that each step gathers every
    member's batch with one `index_select` (members that share one dataset, R trials on
    one silo, share it without copying).

    Batches come in chunks of one fixed width, padded with masked rows: every chunk has
    the same shape whoever else is stacked, and chunk sums add up in order (a padded
    chunk adds exact zeros), so a member's clipped sum has the same bits alone as in any
    stack (floating-point reductions over a batch depend on its padded width)."""

    def __init__(
        self,
        datasets: Sequence[tuple[Tensor, Tensor]],
        width: int,
        dtype: torch.dtype,
        clipped_sum: ClippedGradientSum,
        params: Params,
    ) -> None:
        x0, y0 = datasets[0]
        self.width = width
        if all(x is x0 and y is y0 for x, y in datasets):
            self.x, self.y = x0, y0
            offsets = np.zeros(len(datasets), np.int64)
        else:
            self.x = torch.cat([x for x, _ in datasets])
            self.y = torch.cat([y for _, y in datasets])
            sizes = [len(y) for _, y in datasets]
            offsets = np.concatenate([[0], np.cumsum(sizes[:-1])]).astype(np.int64)
        # the records' input norms where the clipped sum uses them, gathered with them
        self.norms = clipped_sum.input_norms(params, self.x)
        if len(datasets) == 1:  # a lone member and its twin
            offsets = np.repeat(offsets, 2)
        # a chunk's rows before its batches are written in: each member's first record
        self._rows = np.repeat(offsets[:, None], width, axis=1)
        self._columns = np.arange(width)
        self._mask_dtype = torch.empty(0, dtype=dtype).numpy().dtype
        self._x_shape = (*self._rows.shape, *self.x.shape[1:])
        self._y_shape = (*self._rows.shape, *self.y.shape[1:])

    def chunks(self, indices: Sequence[np.ndarray]) -> list[_Chunk]:
        """Members' batches in chunks of `width` rows, padding masked copies of their first
        record, stacked: x [members, width, ...], y [members, width], mask [members, width]
        and the records' input norms [members, width] (None if not used) (at least one
        chunk: an empty Poisson batch is a noise-only step). A lone member gets a masked
        twin (see `_with_twin`)."""
        width = self.width
        longest = max(len(i) for i in indices)
        chunks = []
        lengths = np.zeros(len(self._rows), np.int64)  # a twin's row stays empty
        for start in range(0, max(longest, 1), width):
            parts = [idx[start : start + width] for idx in indices]
            lengths[: len(parts)] = [len(part) for part in parts]
            filled = self._columns < lengths[:, None]  # each member's first len(part) slots
            rows = self._rows.copy()
            rows[filled] += np.concatenate(parts)  # row-major: member by member, in order
            mask = filled.astype(self._mask_dtype)
            flat = torch.from_numpy(rows.reshape(-1)).to(self.x.device)
            x = self.x.index_select(0, flat).reshape(self._x_shape)
            y = self.y.index_select(0, flat).reshape(self._y_shape)
            norms = None
            if self.norms is not None:
                norms = self.norms.index_select(0, flat).reshape(rows.shape)
            chunks.append((x, y, torch.from_numpy(mask).to(self.x.device), norms))
        return chunks

    def batches(self, samplers: Sequence[BatchSampler], steps: int) -> _Drawn:
        """Each step's batches and their `chunks`, for `steps` steps. The batches are
        drawn ahead, a block of steps at a time (`GATHER_ELEMENTS`), in the order the
        steps would draw them, and the block's one-chunk steps (nearly all) are gathered
        with one `index_select` per tensor: the same values as `chunks` per step, without
        its per-step cost, most of a small model's step (benchmarks/bench_vs_torch.py)."""
        per_step = math.prod(self._x_shape)
        block = max(1, GATHER_ELEMENTS // per_step)
        for first in range(0, steps, block):
            drawn = [[s.sample() for s in samplers] for _ in range(min(block, steps - first))]
            yield from self._gathered(drawn)

    def _gathered(self, drawn: list[list[np.ndarray]]) -> _Drawn:
        """`drawn`'s steps with their chunks: one gather for the steps whose batches fit
        one chunk, laid out as `chunks` lays out each (rows, padding and mask)."""
        lengths = np.zeros((len(drawn), len(self._rows)), np.int64)  # a twin's row: empty
        lengths[:, : len(drawn[0])] = [[len(idx) for idx in step] for step in drawn]
        single = lengths.max(1) <= self.width
        filled = self._columns < lengths[single][..., None]
        rows = np.broadcast_to(self._rows, filled.shape).copy()
        one = [idx for step, fits in zip(drawn, single, strict=True) if fits for idx in step]
        rows[filled] += np.concatenate(one or [np.zeros(0, np.int64)])
        flat = torch.from_numpy(rows.reshape(-1)).to(self.x.device)
        x = self.x.index_select(0, flat).reshape(-1, *self._x_shape)
        y = self.y.index_select(0, flat).reshape(-1, *self._y_shape)
        mask = torch.from_numpy(filled.astype(self._mask_dtype)).to(self.x.device)
        norms: Sequence[Tensor | None] = [None] * len(x)
        if self.norms is not None:
            norms = self.norms.index_select(0, flat).reshape(rows.shape).unbind(0)
        gathered = zip(x.unbind(0), y.unbind(0), mask.unbind(0), norms, strict=True)
        for step, fits in zip(drawn, single, strict=True):
            yield step, [next(gathered)] if fits else self.chunks(step)


def _laid_out_as(columns: Tensor, value: Tensor) -> Tensor:
    """Buffer columns [members, size] viewed with the shape and memory order of `value`
    (row-major, or column-major in its last two axes): elementwise updates of `value`
    then read both in one order."""
    if value.is_contiguous():
        return columns.view(value.shape)
    return columns.view(*value.shape[:-2], value.shape[-1], value.shape[-2]).transpose(-1, -2)


def _with_twin(params: Params) -> Params:
    """One member's parameters twice: torch runs batched products of a single member
    through other kernels (other bits) than those of two or more, so a lone member is
    computed beside a masked twin, as it would be in any stack."""
    return {k: torch.cat([v, v]) for k, v in params.items()}


def _chunk_width(samplers: Sequence[BatchSampler]) -> int:
    """Rows per chunk: the expected batch plus four standard deviations of a Poisson
    batch, rounded up to a multiple of 8, so nearly every batch is one chunk. From the
    samplers' public expected batch size only: the same for a member alone or stacked."""
    expected = max(s.expected_batch_size for s in samplers)
    return int(8 * math.ceil((expected + 4 * math.sqrt(expected) + 1) / 8))
