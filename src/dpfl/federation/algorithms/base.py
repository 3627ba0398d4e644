"""What every federated algorithm provides, and what an engine gives it each round.

An algorithm owns its state (stacked over independent trials on axis 0) and one
`run_round`. It never touches a ledger or an RNG directly: the engine's `RoundContext`
hands it seeded generators and noise sources derived from (seed, trial, silo, round),
so a run repeats bit for bit and can resume from any round, and a `charge` callback
that records a silo's event in the ledger. The one rule: charge a silo's event before
its update is used by anyone else.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
from torch import nn

from dpfl.data.sampling import PoissonSampler
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params
from dpfl.local.dpsgd import DPSGD, DPSGDConfig, LocalResult, parameters_of, stack
from dpfl.local.losses import Loss
from dpfl.local.noise import NoiseSource
from dpfl.local.regularised import ProximalDPSGD
from dpfl.privacy import events

State = dict[str, Any]


@dataclass(frozen=True)
class RoundContext:
    """Everything an algorithm may use in one round besides its state and the silos."""

    round: int
    trials: int
    rng: Callable[[int, int], np.random.Generator]
    """rng(trial, silo index): a new independent stream at every call (silo -1: server)."""
    noise: Callable[[int, int], NoiseSource]
    """noise(trial, silo index): a new independent noise source at every call."""
    charge: Callable[[int, int, events.PrivacyEvent], None]
    """charge(trial, silo index, event): record in the silo's account (its budget binds)."""
    charge_many: Callable[[Sequence[tuple[int, int, events.PrivacyEvent]]], None]
    """charge_many([(trial, silo index, event), ...]): the same for many, in one commit."""
    charge_view: Callable[[int, int, str, events.PrivacyEvent], None]
    """charge_view(trial, silo index, view, event): record what another observer (e.g. the
    other hospitals) can learn, in the silo's account for that view."""
    traffic: Callable[[int, int, int, int], None]
    """traffic(trial, silo index, bytes down, bytes up) of this round's messages."""


class Algorithm(ABC):
    """What the engines need of any algorithm."""

    name = "abstract"
    model: nn.Module
    stops_at_budget = False
    """True: run until a silo's next round would pass its budget, then return the last
    model (Dopamine); False: the whole plan must fit the budget before round 0."""

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

    @abstractmethod
    def participation_event(self, silo: Silo, silos: Sequence[Silo]) -> events.PrivacyEvent:
        """What one round of taking part costs `silo`, one of the run's `silos` (the engine
        checks the whole plan of `rounds` such events against its budget before round 0)."""

    def view_events(self, silo: Silo, silos: Sequence[Silo]) -> dict[str, events.PrivacyEvent]:
        """Per round, what observers other than the server learn, when that differs from
        `participation_event` (which binds the budget). Recorded, never enforced."""
        return {}

    @abstractmethod
    def initial_state(self, silos: Sequence[Silo], trials: int) -> State:
        """State before round 0, stacked over `trials`."""

    @abstractmethod
    def run_round(self, state: State, silos: Sequence[Silo], context: RoundContext) -> State:
        """One round for every trial; charge each silo's event before its update is used."""

    def initial_global(self, trials: int) -> Params:
        """The model's initial parameters, identical in every trial."""
        start = parameters_of(self.model)
        return {k: v.unsqueeze(0).repeat(trials, *[1] * v.dim()) for k, v in start.items()}

    def global_params(self, state: State) -> Params:
        """The shared model, stacked over trials."""
        params: Params = state["global"]
        return params

    def silo_params(self, state: State, k: int) -> Params:
        """The model silo k uses, stacked over trials: the shared one unless the algorithm
        personalises (MR-MTL, Ditto, finetuning, local training override this)."""
        return self.global_params(state)


@dataclass(frozen=True)
class DPSGDAlgorithm(Algorithm):
    """An algorithm whose silos train locally with Poisson DP-SGD."""

    model: nn.Module
    loss: Loss
    dpsgd: DPSGDConfig
    expected_batch_size: float = 16.0

    def __post_init__(self) -> None:
        if self.expected_batch_size <= 0:
            raise ValueError(f"expected batch size must be > 0, got {self.expected_batch_size}")

    @property
    def private(self) -> bool:
        return self.dpsgd.private

    @property
    def noise_multiplier(self) -> float | None:
        return self.dpsgd.noise_multiplier

    def sample_rate(self, silo: Silo) -> float:
        """q = B / n: the expected batch of B records over the silo's public size n (the
        true count would make q, and so every record's privacy, depend on a private fact)."""
        return self.rate_for(silo.declared_size, silo.name)

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
            self, dpsgd=dataclasses.replace(self.dpsgd, noise_multiplier=noise_multiplier)
        )

    @abstractmethod
    def local_steps(self, silo: Silo) -> int:
        """DP-SGD steps a silo runs each time it takes part in a round."""

    def participation_event(self, silo: Silo, silos: Sequence[Silo]) -> events.PrivacyEvent:
        """What one participation costs the silo: `local_steps` Poisson DP-SGD steps."""
        return events.poisson_gaussian(
            self.sample_rate(silo), self.dpsgd.noise_multiplier, steps=self.local_steps(silo)
        )

    def train(
        self,
        starts: Sequence[Params],
        members: Sequence[tuple[int, int]],
        silos: Sequence[Silo],
        context: RoundContext,
    ) -> list[Params]:
        """Local DP-SGD for each (trial, silo) member; each member's declared event is
        charged before its parameters are returned (see `train_local`)."""
        return [result.params for result in self.train_local(starts, members, silos, context)]

    def train_local(
        self,
        starts: Sequence[Params],
        members: Sequence[tuple[int, int]],
        silos: Sequence[Silo],
        context: RoundContext,
        *,
        config: DPSGDConfig | None = None,
        velocities: Sequence[Params] | None = None,
        anchors: Sequence[Params] | None = None,
        strength: float = 0.0,
        charge: bool = True,
    ) -> list[LocalResult]:
        """Local DP-SGD for each (trial, silo) member from its start parameters (and
        momentum); members with the same number of steps and dense data run as one stacked
        computation. With `anchors`, every noisy gradient is pulled towards the member's
        anchor with `strength` λ (MR-MTL, Ditto: `ProximalDPSGD`). Each member's declared
        event is charged before it is returned, unless `charge=False` for an algorithm
        that charges an aggregate-level event itself."""
        trainer = DPSGD(self.model, self.loss, config or self.dpsgd)
        proximal = None if anchors is None else ProximalDPSGD(trainer, strength)
        results: list[LocalResult | None] = [None] * len(members)
        groups: dict[tuple[int, bool], list[int]] = {}
        for i, (_, k) in enumerate(members):
            sparse = silos[k].x.is_sparse
            groups.setdefault((self.local_steps(silos[k]), sparse), []).append(i)
        for (steps, sparse), indices in groups.items():
            batches = [[i] for i in indices] if sparse else [indices]
            for batch in batches:
                chosen = [members[i] for i in batch]
                start = stack([starts[i] for i in batch])
                data = [(silos[k].x, silos[k].y) for _, k in chosen]
                samplers = [
                    PoissonSampler(
                        silos[k].size,
                        self.sample_rate(silos[k]),
                        context.rng(r, k),
                        public_size=silos[k].declared_size,
                    )
                    for r, k in chosen
                ]
                noises = [context.noise(r, k) for r, k in chosen]
                velocity = None if velocities is None else stack([velocities[i] for i in batch])
                outcome = (
                    trainer.run_stacked(start, data, samplers, noises, steps, velocity)
                    if proximal is None or anchors is None
                    else proximal.run_stacked(
                        start, stack([anchors[i] for i in batch]), data, samplers, noises, steps
                    )
                )
                if charge and outcome.events:
                    context.charge_many(
                        [(r, k, e) for (r, k), e in zip(chosen, outcome.events, strict=True)]
                    )
                for j, i in enumerate(batch):
                    event = outcome.events[j] if outcome.events else None
                    results[i] = LocalResult(
                        {name: v[j] for name, v in outcome.params.items()},
                        {name: v[j] for name, v in outcome.velocity.items()},
                        event,
                        outcome.metadata[j],
                    )
        assert all(r is not None for r in results)  # every member belongs to one group
        return [r for r in results if r is not None]
