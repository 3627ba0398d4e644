"""Cyclic DP federated learning (Owkin, iDASH 2020, Algorithm 2).

The silos train in turn: each runs E Poisson DP-SGD steps on the current model and
passes it to the next; N such rounds. A round is K exchanges of the server half, one
per silo: the model goes to one silo and its trained model comes back as the new state (a
deployment routes it through the server; the hand-off is what the next silo sees). For
a silo, the other silos' steps are post-processing, so its account composes only its
own N·E steps (Owkin, Theorem 9).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from dpfl.errors import InternalError
from dpfl.federation.algorithms.base import (
    Algorithm,
    DPSGDAlgorithm,
    Instruction,
    Job,
    Member,
    Outcome,
    Reply,
    State,
    flat,
    received,
    unflat,
)
from dpfl.federation.algorithms.settings import DPSGDSettings, Parts
from dpfl.federation.messages import SecureSum
from dpfl.federation.silo import SiloInfo
from dpfl.local.clipping import Params


@dataclass(frozen=True)
class Cyclic(DPSGDAlgorithm):
    steps_per_visit: int = 10

    name: ClassVar[str] = "cyclic"
    threat_model: ClassVar[str] = (
        "Each hospital passes its model to the next in turn; the next hospital (and "
        "anyone who sees the model) learns only what E DP-SGD steps release. Steps at "
        "other hospitals are post-processing for this one."
    )
    sums_replies: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps_per_visit < 1:
            raise ValueError(f"steps_per_visit must be ≥ 1, got {self.steps_per_visit}")

    def local_steps(self, silo: SiloInfo) -> int:
        return self.steps_per_visit

    def exchanges(self, silos: Sequence[SiloInfo]) -> int:
        return len(silos)

    def configure(
        self,
        state: State,
        round: int,
        silos: Sequence[SiloInfo],
        rng: Callable[[], np.random.Generator],
        exchange: int = 0,
    ) -> dict[str, Instruction]:
        visited = silos[exchange]
        return {visited.name: Instruction(state["global"], (visited,))}

    def client_updates(self, members: Sequence[Member]) -> list[Outcome]:
        trained = self.train([Job(received(m), m) for m in members])
        return [(Reply(flat(t.params)), m.state) for m, t in zip(members, trained, strict=True)]

    def aggregate(self, state: State, replies: Mapping[str, Reply], secure_sum: SecureSum) -> State:
        """The visited silo's model is the next state (the sum of one reply)."""
        if len(replies) != 1:
            raise InternalError(f"a cyclic exchange visits one silo, got {len(replies)} replies")
        glob: Params = state["global"]
        model = secure_sum({name: r.vector for name, r in replies.items()}).total
        return {**state, "global": unflat(model, glob)}


class CyclicSettings(DPSGDSettings):
    algorithm: ClassVar[type[Algorithm]] = Cyclic
    refuses_server: ClassVar[str] = "it hands the model on and averages nothing"

    name: Literal["cyclic"]
    steps_per_visit: int = Field(10, ge=1)
    """DP-SGD steps at each silo per visit (Owkin's E)."""

    def build(self, parts: Parts) -> Cyclic:
        return Cyclic(**self.common(parts), steps_per_visit=self.steps_per_visit)
