"""MR-MTL: mean-regularised multi-task learning (puffle seed, §1.3).

Each silo k keeps its own model w_k across rounds, at the hospital, and takes DP-SGD
steps on F_k(w) + λ/2‖w − w̄‖²: w_k ← w_k − η(g̃_k + λ(w_k − w̄)), g̃_k its noisy
gradient. The server keeps w̄, the mean of the silos' models after each round (each
hospital sends its model times its share), and sends it back. λ = 0 is local training;
a large λ ties every w_k to w̄, FedAvg's end of the spectrum. The pull only uses w̄,
public to the silo, so a round costs what a FedAvg round costs (seed, footnote 3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field

from dpfl.federation.algorithms.base import (
    Algorithm,
    DPSGDAlgorithm,
    Job,
    LocalEpochs,
    LocalState,
    Member,
    Outcome,
    Reply,
    State,
    check_weighting,
    flat,
    received,
    size_weights,
    unflat,
)
from dpfl.federation.algorithms.local import personal
from dpfl.federation.algorithms.settings import LocalTrainingSettings, Parts, Weighting, weighted
from dpfl.federation.messages import SecureSum
from dpfl.local.clipping import Params
from dpfl.local.dpsgd import LocalResult
from dpfl.local.regularised import check_strength


def train_personal(
    algorithm: DPSGDAlgorithm, members: Sequence[Member], strength: float
) -> list[LocalResult]:
    """Each member's personal model, trained with its steps pulled towards the model it
    was sent (MR-MTL's w̄, Ditto's global model), continuing its own noise stream."""
    return algorithm.train(
        [Job(m.state["model"], m, anchor=received(m), stream="personal") for m in members],
        strength=strength,
    )


@dataclass(frozen=True)
class MRMTL(LocalEpochs):
    strength: float = 1.0
    """λ, the pull towards the anchor; η·λ must stay below 2(1 + momentum)."""
    weighting: Literal["size", "uniform"] = "size"

    name: ClassVar[str] = "mrmtl"
    threat_model: ClassVar[str] = (
        "The server sees each hospital's DP-SGD-trained model; the personalised models "
        "stay at their hospitals but are covered by the same steps (silo-level DP)."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_weighting(self.weighting)
        check_strength(self.dpsgd, self.strength)

    def initial_local_state(self, start: Params) -> LocalState:
        return personal(start)

    def client_updates(self, members: Sequence[Member]) -> list[Outcome]:
        trained = train_personal(self, members, self.strength)
        outcomes: list[Outcome] = []
        for m, t in zip(members, trained, strict=True):
            share = size_weights(m.instruction.cohort, self.weighting)[m.silo.name]
            outcomes.append((Reply(share * flat(t.params)), {**m.state, "model": t.params}))
        return outcomes

    def aggregate(self, state: State, replies: Mapping[str, Reply], secure_sum: SecureSum) -> State:
        """w̄: the sum of the silos' models times their shares."""
        total = secure_sum({name: r.vector for name, r in replies.items()}).total
        glob: Params = state["global"]
        return {**state, "global": unflat(total, glob)}


class PersonalisedSettings(LocalTrainingSettings):
    """Settings of personal models pulled towards the global one."""

    refuses_adam: ClassVar[str] = "its pull towards the global model joins SGD's velocity"

    weighting: Weighting = None
    strength: float = Field(1.0, ge=0)
    """The pull λ towards the global model."""

    def personalised(self, parts: Parts) -> dict[str, Any]:
        return {
            **self.common(parts),
            "local_epochs": self.local_epochs,
            **weighted(self.weighting),
            "strength": self.strength,
        }


class MRMTLSettings(PersonalisedSettings):
    algorithm: ClassVar[type[Algorithm]] = MRMTL

    name: Literal["mrmtl"]

    def build(self, parts: Parts) -> MRMTL:
        return MRMTL(**self.personalised(parts))
