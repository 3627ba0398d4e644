"""What every federated algorithm provides: a server half and a hospital half.

An algorithm is a small frozen object with pure, seedable functions over parameters
(docs/architecture.md, "One algorithm, two engines"):

* server half: `configure` says what each silo of a round gets (an `Instruction`),
  `aggregate` turns the silos' `Reply`s into the next state through `secure_sum`, the
  seam where secure aggregation plugs in;
* hospital half: `client_updates` does the silos' work. Each member sees only its own
  silo, its own local state (momentum, personal models) and its own `HospitalContext`,
  which hands it seeded randomness and charges its hospital's own ledger before the
  reply exists. The simulator passes many (trial, silo) members at once so they train
  as one stacked computation; a deployment passes one (`client_update`); both give the
  same result bit for bit;
* both: `participation_event`, what a round costs a silo, from public facts only.

The engines call `next_state`: `aggregate`, then the server's optimiser
(`dpfl.federation.server_optimizers`) moves the global model by the aggregate's step.

Server state is one trial's; the simulator keeps one per trial. Facts that other layers
need about an algorithm (does it pool data, stop at its budget, need a secure sum, what
does each party see) are attributes here, never looked up by name.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import numpy as np
import torch
from torch import Tensor, nn

from dpfl.data.sampling import (
    BalancedPoissonSampler,
    CyclicPoissonSampler,
    PatientPoissonSampler,
    PoissonSampler,
)
from dpfl.errors import InternalError
from dpfl.federation.messages import Encoding, SecureSum
from dpfl.federation.server_optimizers import AVERAGING, Averaging, ServerOptimizer
from dpfl.federation.silo import Silo, SiloInfo
from dpfl.local.clipping import Params
from dpfl.local.dpsgd import DPSGD, DPSGDConfig, LocalResult, parameters_of, stack
from dpfl.local.losses import Loss
from dpfl.local.mechanisms import (
    STREAMS,
    CorrelatedNoise,
    Correlation,
    Independent,
    NoiseMechanism,
    Stream,
)
from dpfl.local.noise import NoiseSource
from dpfl.local.regularised import ProximalDPSGD
from dpfl.privacy import events

State = dict[str, Any]
"""The server's state of one trial (at least `"global"`, the shared model)."""
SERVER_OPTIMIZER = "server_optimizer"
"""The state's key of the server optimiser's memory."""
LocalState = dict[str, Any]
"""What one hospital keeps between rounds of one trial (`"model"`: its personal model)."""
Charges = Callable[[Sequence[tuple[Any, str | None, events.PrivacyEvent]]], None]
"""A hospital's ledger: records (account key, view, event) triples in one write; view
None is the server's view, which the budget binds."""


@dataclass(frozen=True)
class HospitalContext:
    """What one hospital's half may use in one round besides its data and state."""

    round: int
    rng: Callable[[], np.random.Generator]
    """A new independent stream at every call (batches, coins), seeded per round."""
    noise: Callable[[], NoiseSource]
    """A new independent noise source at every call."""
    ledger: Charges
    """The hospital's own ledger (`charge` below writes many members at once)."""
    account: Any = None
    """Which of the ledger's accounts is this member's (the engine's key)."""

    def charge(self, event: events.PrivacyEvent, view: str | None = None) -> None:
        self.ledger([(self.account, view, event)])


def charge(members: Sequence[tuple[HospitalContext, events.PrivacyEvent]]) -> None:
    """Record each member's event in its hospital's ledger, one write per ledger."""
    grouped: dict[int, tuple[Charges, list[tuple[Any, str | None, events.PrivacyEvent]]]] = {}
    for ctx, event in members:
        grouped.setdefault(id(ctx.ledger), (ctx.ledger, []))[1].append((ctx.account, None, event))
    for ledger, charges in grouped.values():
        ledger(charges)


@dataclass(frozen=True)
class Instruction:
    """What the server sends one silo for one exchange of a round."""

    params: Params | None
    """The model sent down (None: nothing is sent, the silo works on its own state)."""
    cohort: tuple[SiloInfo, ...]
    """The exchange's participants (public: drawn by the server from no data)."""


@dataclass(frozen=True)
class Reply:
    """What one silo sends back: a flat vector and its wire encoding."""

    vector: Tensor
    encoding: Encoding = Encoding.FLOAT32


@dataclass(frozen=True)
class Member:
    """One (trial, silo) of a round's hospital work."""

    instruction: Instruction
    silo: Silo
    state: LocalState
    ctx: HospitalContext


def refuse_non_finite(members: Sequence[Member]) -> None:
    """Refuse (ValueError) the members' work if a model sent to one holds NaN or ±∞, before
    anything is computed from it or charged: where an instruction reaches the hospital
    half, in either engine (each model sent once checked once)."""
    seen: set[int] = set()
    for member in members:
        params = member.instruction.params
        if params is not None and id(params) not in seen:
            seen.add(id(params))
            finite(params, f"the model sent to silo {member.silo.name!r}")


def finite(params: Params, what: str) -> None:
    """Refuse (ValueError, naming `what` and the parameter) a model holding NaN or ±∞:
    0·∞ is NaN, so a server's ∞ in one input weight would turn a whole reply to NaN
    exactly when a record holds a 0 there, whatever the noise, a bit about that record
    that no ε covers. A finite sum is proof enough (NaN and ∞ do not cancel), and much
    cheaper than testing each value, which only a sum that overflowed needs."""
    for name, value in params.items():
        if not torch.isfinite(value.sum()) and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{what} holds NaN or infinity (in {name!r}): refused")


def broadcast(state: State, cohort: Sequence[SiloInfo]) -> dict[str, Instruction]:
    """Every silo of the cohort gets the global model."""
    return {s.name: Instruction(state["global"], tuple(cohort)) for s in cohort}


def record_level(
    algorithm: str, silo: SiloInfo, *, group_bound: str = "", capped: bool = False
) -> None:
    """Refuse a silo whose persons are in several records, for an algorithm whose events
    are analysed for one record per person; `group_bound` says what the algorithm's
    sensitivity would become for one patient's records. `capped`: the algorithm
    calibrates to a patient's declared cap (max_records), so it refuses a patient-level
    silo only without one."""
    if capped and silo.patient_level and silo.max_records is None:
        raise ValueError(
            f"{algorithm}: silo {silo.name!r} protects a patient, whose records {group_bound}, "
            "with no declared cap on their number (data.max_records = k), so a patient moves "
            "it without bound: declare one"
        )
    if silo.patient_level and not capped:
        cap = (
            f"up to max_records = {silo.max_records} records"
            if silo.max_records is not None
            else "a number of records with no declared cap (data.max_records), so unbounded"
        )
        raise ValueError(
            f"{algorithm} is analysed for one record, but silo {silo.name!r} protects a "
            f"patient, whose {cap} {group_bound or 'each move its release'}; dpfl does not "
            "calibrate it to that: use an algorithm whose silos train with local DP-SGD"
        )
    if silo.appearances > 1:
        raise ValueError(
            f"{algorithm} accounts for one record per person, but in silo {silo.name!r} a "
            f"person is in up to {silo.appearances} (node-level privacy): use an algorithm "
            "whose silos train with local DP-SGD"
        )


def check_weighting(weighting: str) -> None:
    if weighting not in ("size", "uniform"):
        raise ValueError(f"weighting must be 'size' or 'uniform', got {weighting!r}")


def received(member: Member) -> Params:
    """The model the member was sent (refuses an instruction that sent none)."""
    if member.instruction.params is None:
        raise ValueError(f"silo {member.silo.name!r} was sent no model to work on")
    return member.instruction.params


Outcome = tuple[Reply | None, LocalState]
"""A hospital's reply (None: nothing is sent) and its new local state."""


class Algorithm(ABC):
    """What the engines need of any algorithm."""

    name: ClassVar[str] = "abstract"
    threat_model: ClassVar[str] = ""
    """Who sees what, for the datasheet."""
    mechanism: ClassVar[str] = (
        "DP-SGD: per-example clipping to C, Gaussian noise σC on Poisson-sampled batches"
    )
    stops_at_budget: ClassVar[bool] = False
    """True: run until a silo's next round would pass its budget, then return the last
    model (Dopamine); False: the whole plan must fit the budget before round 0."""
    pools_data: ClassVar[bool] = False
    """True: a reference that trains on every silo's records pooled at a curator; it
    cannot be deployed, and every silo is charged the curator's event."""
    needs_secure_sum: ClassVar[bool] = False
    """True: the accounting assumes the server sees only the sum of all silos' replies."""
    sums_replies: ClassVar[bool] = True
    """True: the server learns a sum of several silos' replies each exchange, which secure
    aggregation can hide (False: a hand-off, local training or a pooled reference)."""
    silo_noise_allowed: ClassVar[bool] = False
    """True: each silo may train with its own σ (`with_silo_noise`), as its noise touches
    only its own records' guarantee."""
    sets_own_noise: ClassVar[bool] = False
    """True: the noise follows from the ε budget inside the mechanism: there is no σ to
    set or calibrate, and no non-private form."""
    needs_linear_model: ClassVar[bool] = False
    """True: the mechanism's guarantee holds for a linear (convex) model only."""
    patient_bound: ClassVar[str] = ""
    """How the algorithm bounds one patient's records, for the datasheet, where it is not
    DP-SGD's user-level sampling."""
    model: nn.Module
    loss: Loss
    server_optimizer: ServerOptimizer = AVERAGING
    """How the server moves the global model by each aggregate (post-processing)."""

    @property
    @abstractmethod
    def private(self) -> bool:
        """False for non-private references: nothing is charged and ε is unbounded."""

    @property
    def noise_multiplier(self) -> float | None:
        """σ of the silos' Gaussian noise, where there is one."""
        return None

    def with_noise(self, noise_multiplier: float) -> Self:
        """The same algorithm with another σ, for calibration to a budget."""
        raise ValueError(f"{self.name} has no noise multiplier to calibrate")

    def with_silo_noise(self, noise_multipliers: Mapping[str, float]) -> Self:
        """The same algorithm with σ_k for silo k (per-silo calibration)."""
        raise ValueError(f"{self.name}'s silos cannot have noise multipliers of their own")

    def noise_of(self, silo: str) -> float | None:
        """σ of one silo's noise, where there is one."""
        return self.noise_multiplier

    @abstractmethod
    def participation_event(self, silo: SiloInfo, silos: Sequence[SiloInfo]) -> events.PrivacyEvent:
        """What one round of taking part costs `silo`, one of the run's `silos` (the engine
        checks the whole plan of such events against its budget before round 0)."""

    def view_events(
        self, silo: SiloInfo, silos: Sequence[SiloInfo]
    ) -> dict[str, events.PrivacyEvent]:
        """Per round, what observers other than the server learn, when that differs from
        `participation_event` (which binds the budget). Recorded, never enforced."""
        return {}

    def fewest_replies(self, hospitals: int) -> int:
        """The fewest of `hospitals` replies a revealed sum may hold: the charged events
        assume that many noise shares in it (Dopamine); the parties that can reveal a
        secure sum refuse one with fewer."""
        return 1

    # -- server half -------------------------------------------------------------------

    def initial_state(self, silos: Sequence[SiloInfo], start: Params | None = None) -> State:
        """The server's state before round 0, from the initial model `start` (default:
        the parameters of `model`)."""
        return {"global": parameters_of(self.model) if start is None else dict(start)}

    def exchanges(self, silos: Sequence[SiloInfo]) -> int:
        """Configure-train-aggregate exchanges in one round (cyclic training: one per
        silo, each a hand-off of the model)."""
        return 1

    def cohort(
        self, round: int, silos: Sequence[SiloInfo], rng: Callable[[], np.random.Generator]
    ) -> tuple[SiloInfo, ...]:
        """The silos that take part in `round`, drawn by the server's first `rng()` stream
        and from nothing else (no state, no data): the engine draws the whole schedule
        before round 0 and plans each silo's budget on its own rounds. Default: all."""
        return tuple(silos)

    def configure(
        self,
        state: State,
        round: int,
        silos: Sequence[SiloInfo],
        rng: Callable[[], np.random.Generator],
        exchange: int = 0,
    ) -> dict[str, Instruction]:
        """Instructions for the silos of `exchange` of `round`, by silo name; `rng()` gives
        the server a new independent stream. By default every silo gets the global model."""
        return broadcast(state, silos)

    @abstractmethod
    def aggregate(self, state: State, replies: Mapping[str, Reply], secure_sum: SecureSum) -> State:
        """The next state from the step's replies (possibly none)."""

    def next_state(
        self, state: State, replies: Mapping[str, Reply], secure_sum: SecureSum
    ) -> State:
        """`aggregate`, the global model then moved from where it was by the server's
        optimiser, whose memory is kept in the state; no replies, no step."""
        new = self.aggregate(state, replies, secure_sum)
        if not replies or isinstance(self.server_optimizer, Averaging):
            return new
        glob: Params = state["global"]
        moved, memory = self.server_optimizer.moved(
            flat(glob), flat(new["global"]), state.get(SERVER_OPTIMIZER, {})
        )
        return {**new, "global": unflat(moved, glob), SERVER_OPTIMIZER: memory}

    # -- hospital half ------------------------------------------------------------------

    def initial_local_state(self, start: Params) -> LocalState:
        """What a hospital keeps before round 0, given the initial model."""
        return {}

    @abstractmethod
    def client_updates(self, members: Sequence[Member]) -> list[Outcome]:
        """Each member's reply and new local state; members never see each other."""

    def client_update(
        self, instruction: Instruction, silo: Silo, state: LocalState, ctx: HospitalContext
    ) -> Outcome:
        """One hospital's half of an exchange (what a deployment runs at the hospital)."""
        member = Member(instruction, silo, state, ctx)
        refuse_non_finite([member])
        return self.client_updates([member])[0]

    def model_of(self, state: State, local: LocalState) -> Params:
        """The model a silo uses: its personal one if it keeps one, else the shared one."""
        params: Params = local["model"] if "model" in local else state["global"]
        return params


def flat(params: Params) -> Tensor:
    """Parameters as one flat vector, in the model's parameter order (a message)."""
    return torch.cat([v.flatten() for v in params.values()])


def unflat(vector: Tensor, like: Params) -> Params:
    """The inverse of `flat`, shaped as `like`."""
    out, offset = {}, 0
    for name, v in like.items():
        out[name] = vector[offset : offset + v.numel()].reshape(v.shape)
        offset += v.numel()
    return out


def size_weights(cohort: Sequence[SiloInfo], weighting: str) -> dict[str, Tensor]:
    """Each participant's share of a weighted mean: public size over the cohort's total
    (or 1/K), computed at every hospital alike, so that the server only needs a sum."""
    raw = torch.tensor([float(s.public_size) if weighting == "size" else 1.0 for s in cohort])
    shares = raw / raw.sum()
    return {s.name: shares[i] for i, s in enumerate(cohort)}


@dataclass(frozen=True)
class Job:
    """One member's local DP-SGD: from `start`, with its momentum and anchor if any."""

    start: Params
    member: Member
    velocity: Params | None = None
    anchor: Params | None = None
    stream: str = "model"
    """Which of the member's noise streams the training continues (correlated noise)."""


@dataclass(frozen=True)
class DPSGDAlgorithm(Algorithm):
    """An algorithm whose silos train locally with Poisson DP-SGD."""

    model: nn.Module
    loss: Loss
    dpsgd: DPSGDConfig
    expected_batch_size: float = 16.0
    silo_noise: tuple[tuple[str, float], ...] = ()
    """(silo, σ_k) pairs that override `dpsgd.noise_multiplier` for those silos."""
    balanced: bool = False
    """Kerkouche's downsampling (Alg. 7): each Poisson batch keeps as many records of each
    of the two classes as the rarer one has (`BalancedPoissonSampler`). One record then
    moves the clipped sum by up to 2C, so each step is charged at σ/2."""
    noise: NoiseMechanism = dataclasses.field(default_factory=Independent)
    """How each step's Gaussian noise is drawn (`dpfl.local.mechanisms`): independent, or
    correlated over the run with the batches the mechanism needs."""
    server_optimizer: ServerOptimizer = AVERAGING

    silo_noise_allowed: ClassVar[bool] = True
    balances_batches: ClassVar[bool] = True
    """False: the algorithm declares its events itself (Dopamine's shares of noise), so
    its batches cannot be downsampled without changing them."""

    def __post_init__(self) -> None:
        if self.expected_batch_size <= 0:
            raise ValueError(f"expected batch size must be > 0, got {self.expected_batch_size}")
        if self.balanced and not self.balances_batches:
            raise ValueError(f"{self.name} declares its own events: no balanced batches")
        if self.silo_noise and not self.silo_noise_allowed:
            raise ValueError(f"{self.name}'s silos cannot have noise multipliers of their own")
        if any(not sigma > 0 for _, sigma in self.silo_noise):
            raise ValueError(f"every silo's noise multiplier must be > 0, got {self.silo_noise}")
        if self.balanced and self.noise.correlated:
            raise ValueError(
                f"{self.noise.name} noise needs cyclic batches: balanced batches downsample "
                "them, which its analysis does not cover"
            )

    @property
    def private(self) -> bool:
        return self.dpsgd.private

    @property
    def noise_multiplier(self) -> float | None:
        return self.dpsgd.noise_multiplier

    def sample_rate(self, silo: SiloInfo | Silo) -> float:
        """q = B / n: the expected batch of B records (patients, where the unit is the
        patient) over the silo's public size n (the true count would make q, and so every
        record's privacy, depend on a private fact)."""
        size = silo.public_size if isinstance(silo, SiloInfo) else silo.declared_size
        return self.rate_for(size, silo.name)

    def rate_for(self, public_size: int, who: str) -> float:
        """q = B / n for a public size n (of a silo, or of a pool of silos)."""
        rate = self.expected_batch_size / public_size
        if rate > 1:
            raise ValueError(
                f"{who!r} declares {public_size} records, fewer than the expected batch "
                f"size {self.expected_batch_size:g}"
            )
        return rate

    def with_noise(self, noise_multiplier: float) -> Self:
        return dataclasses.replace(
            self,
            dpsgd=dataclasses.replace(self.dpsgd, noise_multiplier=noise_multiplier),
            silo_noise=(),
        )

    def with_silo_noise(self, noise_multipliers: Mapping[str, float]) -> Self:
        """σ_k for silo k; `noise_multiplier` becomes the largest (any other silo's σ)."""
        if not self.silo_noise_allowed:
            raise ValueError(f"{self.name}'s silos cannot have noise multipliers of their own")
        return dataclasses.replace(
            self.with_noise(max(noise_multipliers.values())),
            silo_noise=tuple(sorted(noise_multipliers.items())),
        )

    def noise_of(self, silo: str) -> float:
        return dict(self.silo_noise).get(silo, self.dpsgd.noise_multiplier)

    def config_of(self, silo: str) -> DPSGDConfig:
        """The DP-SGD configuration of one silo's local training (its own σ)."""
        sigma = self.noise_of(silo)
        if sigma == self.dpsgd.noise_multiplier:
            return self.dpsgd
        return dataclasses.replace(self.dpsgd, noise_multiplier=sigma)

    @abstractmethod
    def local_steps(self, silo: SiloInfo) -> int:
        """DP-SGD steps a silo runs each time it trains."""

    def participation_event(self, silo: SiloInfo, silos: Sequence[SiloInfo]) -> events.PrivacyEvent:
        """What one participation costs the silo: `local_steps` Poisson DP-SGD steps."""
        return self.training_event(silo)

    def training_event(self, silo: SiloInfo) -> events.PrivacyEvent:
        """One `train` of the silo: `local_steps` Poisson DP-SGD steps, as its sampler
        will declare them (over patients where the unit is the patient)."""
        if isinstance(self.noise, CorrelatedNoise):
            self._check_correlated(silo)
            return self.noise.event(
                self.sample_rate(silo), self.noise_of(silo.name), self.local_steps(silo), silo.name
            )
        if silo.patient_level:
            self._check_patient_level(silo.name)
            return PatientPoissonSampler.event(
                self.sample_rate(silo), self.noise_of(silo.name), self.local_steps(silo)
            )
        return self.sampler.event(
            self.sample_rate(silo),
            self.noise_of(silo.name),
            self.local_steps(silo),
            appearances=silo.appearances,
        )

    @property
    def sampler(self) -> type[PoissonSampler]:
        """The sampler of every local batch (balanced or plain Poisson)."""
        return BalancedPoissonSampler if self.balanced else PoissonSampler

    def _check_patient_level(self, silo: str) -> None:
        if self.balanced:
            raise ValueError(
                f"silo {silo!r} is patient-level: balanced batches downsample records, which "
                "has no patient-level analysis"
            )

    def _check_correlated(self, silo: SiloInfo) -> None:
        """Refuse a silo that correlated noise's min-separated analysis does not cover."""
        if silo.patient_level or silo.appearances > 1:
            raise ValueError(
                f"{self.noise.name} noise is analysed for one record per person in cyclic "
                f"batches, but silo {silo.name!r} protects a person with several records: "
                'use independent noise (algorithm.noise = "independent")'
            )

    def sampler_of(
        self, silo: Silo, rng: np.random.Generator
    ) -> PoissonSampler | PatientPoissonSampler:
        """The silo's batch sampler: q from its public size, records its own; patients,
        each clipped as one, where the unit of privacy is the patient."""
        rate, public = self.sample_rate(silo), silo.declared_size
        if silo.units is not None:
            self._check_patient_level(silo.name)
            return PatientPoissonSampler(
                silo.units, rate, rng, public_size=public, max_records=silo.max_records
            )
        if self.balanced:
            if silo.survival:
                raise ValueError("balanced batches need class labels, not survival pairs")
            return BalancedPoissonSampler(silo.y.numpy(), rate, rng, public_size=public)
        return PoissonSampler(
            silo.size, rate, rng, public_size=public, appearances=silo.appearances
        )

    def _correlated(self, jobs: Sequence[Job], steps: int) -> _Correlated | None:
        """The correlated noise of the jobs' training (None for independent noise): each
        member's stream from its hospital's state, begun on its first training; the
        member's state then holds the stream that `_Correlated.advance` moves on."""
        noise = self.noise
        if not isinstance(noise, CorrelatedNoise):
            return None
        streams, samplers, rates = [], [], []
        for job in jobs:
            silo, ctx = job.member.silo, job.member.ctx
            self._check_correlated(silo.info)
            rate, rng = self.sample_rate(silo), ctx.rng()
            # copied on write: the streams the member was given stay as they were (a
            # hospital keeps them as its state before the exchange)
            kept: dict[str, Stream] = dict(job.member.state.get(STREAMS, {}))
            begun = kept.get(job.stream)
            stream = (
                noise.new_stream(silo.size, rate, silo.name, rng) if begun is None else dict(begun)
            )
            kept[job.stream] = stream
            job.member.state[STREAMS] = kept
            if len(stream["partitions"]) != silo.size:
                raise ValueError(
                    f"silo {silo.name!r} holds {silo.size} records, but its noise stream was "
                    f"begun on {len(stream['partitions'])}: a run's records cannot change"
                )
            noise.check_stream(stream["step"], steps)
            streams.append(stream)
            rates.append(rate)
            samplers.append(
                noise.sampler(stream, rate, rng, public_size=silo.declared_size, who=silo.name)
            )
        names = [job.member.silo.name for job in jobs]
        memories = [stream["memory"] for stream in streams]
        return _Correlated(streams, samplers, Correlation(noise, rates, names, steps, memories))

    def train(
        self,
        jobs: Sequence[Job],
        *,
        config: DPSGDConfig | None = None,
        strength: float = 0.0,
        charge_events: bool = True,
    ) -> list[LocalResult]:
        """Local DP-SGD for each job; jobs with the same number of steps and dense data run
        as one stacked computation, each exactly as it would alone. With anchors, every
        noisy gradient is pulled towards the job's anchor with `strength` λ (MR-MTL,
        Ditto). Each job's declared event is charged to its hospital before its result
        exists, unless `charge_events=False` for an algorithm that charges another event
        itself (Dopamine's share of noise). `config` replaces every silo's own."""
        results: list[LocalResult | None] = [None] * len(jobs)
        groups: dict[tuple[int, bool, DPSGDConfig], list[int]] = defaultdict(list)
        for i, job in enumerate(jobs):
            silo = job.member.silo
            own = config or self.config_of(silo.name)
            groups[self.local_steps(silo.info), silo.x.is_sparse, own].append(i)
        for (steps, sparse, own), indices in groups.items():
            trainer = DPSGD(self.model, self.loss, own)
            proximal = None if jobs[0].anchor is None else ProximalDPSGD(trainer, strength)
            for batch in [[i] for i in indices] if sparse else [indices]:
                chosen = [jobs[i] for i in batch]
                silos = [job.member.silo for job in chosen]
                ctxs = [job.member.ctx for job in chosen]
                start = stack([job.start for job in chosen])
                data = [(silo.x, silo.y) for silo in silos]
                correlated = self._correlated(chosen, steps) if own.private else None
                samplers = (
                    [self.sampler_of(s, ctx.rng()) for s, ctx in zip(silos, ctxs, strict=True)]
                    if correlated is None
                    else correlated.samplers
                )
                correlation = None if correlated is None else correlated.correlation
                noises = [ctx.noise() for ctx in ctxs]
                if proximal is None:
                    velocity = _stacked([job.velocity for job in chosen])
                    outcome = trainer.run_stacked(
                        start, data, samplers, noises, steps, velocity, correlation
                    )
                else:
                    anchors = _stacked([job.anchor for job in chosen])
                    assert anchors is not None  # every job of an anchored run has one
                    outcome = proximal.run_stacked(
                        start, anchors, data, samplers, noises, steps, correlation
                    )
                if correlated is not None:
                    correlated.advance()
                if charge_events and outcome.events:
                    charge(list(zip(ctxs, outcome.events, strict=True)))
                for j, i in enumerate(batch):
                    results[i] = LocalResult(
                        {name: v[j] for name, v in outcome.params.items()},
                        {name: v[j] for name, v in outcome.velocity.items()},
                        outcome.events[j] if outcome.events else None,
                        outcome.metadata[j],
                    )
        done = [r for r in results if r is not None]
        if len(done) != len(jobs):
            raise InternalError(f"{len(jobs) - len(done)} of {len(jobs)} jobs were not trained")
        return done


@dataclass
class _Correlated:
    """One stacked training's correlated noise: the members' streams, the cyclic samplers
    that continue them and the filter that carries their memory."""

    streams: list[Stream]
    samplers: list[CyclicPoissonSampler]
    correlation: Correlation

    def advance(self) -> None:
        """Write each member's progress back into its stream (its hospital's state)."""
        memories = self.correlation.memories()
        for stream, sampler, memory in zip(self.streams, self.samplers, memories, strict=True):
            stream["step"], stream["memory"] = sampler.step, memory


@dataclass(frozen=True)
class LocalEpochs(DPSGDAlgorithm):
    """A DP-SGD algorithm whose silos run `local_epochs` passes of Poisson DP-SGD each time
    they train (steps = epochs × n_k / B, from the public size n_k)."""

    local_epochs: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.local_epochs <= 0:
            raise ValueError(f"local_epochs must be > 0, got {self.local_epochs}")

    def local_steps(self, silo: SiloInfo) -> int:
        return epoch_steps(self.local_epochs, self.sample_rate(silo))


def epoch_steps(epochs: float, rate: float) -> int:
    """Poisson DP-SGD steps of `epochs` passes at sampling rate q: round(epochs / q)."""
    return max(1, round(epochs / rate))


def _stacked(members: Sequence[Params | None]) -> Params | None:
    """The members' parameters stacked, or None if they have none (all or none must)."""
    present = [m for m in members if m is not None]
    if not present:
        return None
    if len(present) != len(members):
        raise InternalError("either every job of a batch carries these parameters or none does")
    return stack(present)
