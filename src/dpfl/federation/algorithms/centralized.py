"""The pooled references C and CDP (Dopamine §3 "Baselines"; Kerkouche's CENTRALIZED).

Every silo hands its training records to a trusted curator, who trains one model on the
pooled dataset: plain minibatch SGD for C (σ = 0), Poisson DP-SGD for CDP. CDP's records
are sampled at q = B / N over the pool of N records, so one record's privacy is that of
the pooled run; every silo has records in the pool, so every silo is charged the pooled
run's event each round, and its ε is CDP's (not a silo-sized q and step count).

The curator is the one "hospital" of this algorithm (`pools_data`): the simulator hands
its half the pooled silo, the server's randomness, and a ledger that charges every
silo. No model messages are exchanged, so no traffic is recorded; the one-off transfer of
the raw records to the curator is what this reference gives up. It cannot be deployed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from dpfl.federation.algorithms.base import (
    Algorithm,
    DPSGDAlgorithm,
    Instruction,
    Job,
    Member,
    Outcome,
    Reply,
    State,
    epoch_steps,
    flat,
    received,
    unflat,
)
from dpfl.federation.algorithms.settings import DPSGDSettings, Parts
from dpfl.federation.messages import SecureSum
from dpfl.federation.silo import Silo, SiloInfo
from dpfl.local.clipping import Params
from dpfl.privacy import events

POOL = "pooled"
"""The curator's name, the one silo a pooled algorithm instructs."""


def pool(silos: Sequence[Silo]) -> Silo:
    """All silos' training records as one dataset (test sets stay with their silos); its
    public facts are `pooled`'s."""
    info = pooled([s.info for s in silos])
    return Silo(
        POOL,
        torch.cat([s.x for s in silos]),
        torch.cat([s.y for s in silos]),
        public_size=info.public_size,
        appearances=info.appearances,
    )


def pooled(silos: Sequence[SiloInfo]) -> SiloInfo:
    """The pool's public facts, from the silos' (no data is pooled): N, the sum of their
    public sizes, and a person's most records, the largest of theirs (a person's records
    are all in one silo). The pool samples records: a patient-level silo is refused."""
    for silo in silos:
        if silo.patient_level:
            raise ValueError(
                f"centralized pools records and samples them one by one, but silo "
                f"{silo.name!r} protects a patient with all their records: use an algorithm "
                "whose silos train with local DP-SGD"
            )
    return SiloInfo(POOL, sum(s.public_size for s in silos), max(s.appearances for s in silos))


@dataclass(frozen=True)
class Centralized(DPSGDAlgorithm):
    epochs_per_round: float = 1.0

    name: ClassVar[str] = "centralized"
    threat_model: ClassVar[str] = (
        "The pooled reference: a trusted curator holds all records and releases a "
        "DP-SGD-trained model (CDP), or a non-private one (C)."
    )
    pools_data: ClassVar[bool] = True
    silo_noise_allowed: ClassVar[bool] = False
    sums_replies: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.epochs_per_round <= 0:
            raise ValueError(f"epochs_per_round must be > 0, got {self.epochs_per_round}")

    def local_steps(self, silo: SiloInfo) -> int:
        """Steps of the pooled run per round: `epochs_per_round` passes over the pool."""
        return epoch_steps(self.epochs_per_round, self.sample_rate(silo))

    def participation_event(self, silo: SiloInfo, silos: Sequence[SiloInfo]) -> events.PrivacyEvent:
        """The pooled run's event (q = B / N over the N pooled records' public size),
        whichever silo; from public sizes only, without pooling any data."""
        return self.training_event(pooled(silos))

    def configure(
        self,
        state: State,
        round: int,
        silos: Sequence[SiloInfo],
        rng: Callable[[], np.random.Generator],
        exchange: int = 0,
    ) -> dict[str, Instruction]:
        return {POOL: Instruction(state["global"], tuple(silos))}

    def client_updates(self, members: Sequence[Member]) -> list[Outcome]:
        trained = self.train([Job(received(m), m) for m in members])
        return [(Reply(flat(t.params)), m.state) for m, t in zip(members, trained, strict=True)]

    def aggregate(self, state: State, replies: Mapping[str, Reply], secure_sum: SecureSum) -> State:
        glob: Params = state["global"]
        return {**state, "global": unflat(replies[POOL].vector, glob)}


class CentralizedSettings(DPSGDSettings):
    algorithm: ClassVar[type[Algorithm]] = Centralized
    refuses_server: ClassVar[str] = "it trains on the pooled records and averages nothing"

    name: Literal["centralized"]
    epochs_per_round: float = Field(1.0, gt=0)
    """Epochs over the pooled data per round."""

    def build(self, parts: Parts) -> Centralized:
        return Centralized(**self.common(parts), epochs_per_round=self.epochs_per_round)
