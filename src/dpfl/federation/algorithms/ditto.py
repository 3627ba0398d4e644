"""Ditto (Li et al. 2021) under silo-specific record-level DP, the puffle seed's baseline.

Each round a silo does two things on its own data: FedAvg's local DP-SGD on the global
model w (its update averaged by the server as in FedAvg), and as many DP-SGD steps on
its personal model v_k ← v_k − η(g̃_k + λ(v_k − w)), the MR-MTL step with the global
model of the round as anchor; v_k never leaves the hospital. Both touch the silo's
records, so a participation costs twice a FedAvg round: the seed's point that Ditto
pays for its 2× local iterations (Fig. 3). The second pass asks the hospital's context
for its generators and noise again, and so gets fresh, independent streams: replaying
the first pass's would not be the two independent mechanisms the ledger composes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from dpfl.federation.algorithms.base import (
    Algorithm,
    Job,
    LocalEpochs,
    LocalState,
    Member,
    Outcome,
    Reply,
    State,
    check_weighting,
    received,
)
from dpfl.federation.algorithms.fedavg import apply_sum, update_replies
from dpfl.federation.algorithms.local import personal
from dpfl.federation.algorithms.mrmtl import PersonalisedSettings, train_personal
from dpfl.federation.algorithms.settings import Parts
from dpfl.federation.messages import SecureSum
from dpfl.federation.silo import SiloInfo
from dpfl.local.clipping import Params
from dpfl.local.regularised import check_strength
from dpfl.privacy import events


@dataclass(frozen=True)
class Ditto(LocalEpochs):
    strength: float = 1.0
    """λ, the personal model's pull towards the global one."""
    weighting: Literal["size", "uniform"] = "size"

    name: ClassVar[str] = "ditto"
    threat_model: ClassVar[str] = (
        "As MR-MTL; the personal model's extra local steps are charged too, since its "
        "outputs (predictions) may be released."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_weighting(self.weighting)
        check_strength(self.dpsgd, self.strength)

    def participation_event(self, silo: SiloInfo, silos: Sequence[SiloInfo]) -> events.PrivacyEvent:
        """The global model's local steps and as many personal ones, all on its data."""
        return events.repeat(self.training_event(silo), 2)

    def initial_local_state(self, start: Params) -> LocalState:
        return personal(start)

    def client_updates(self, members: Sequence[Member]) -> list[Outcome]:
        shared = self.train([Job(received(m), m) for m in members])
        replies = update_replies(members, [t.params for t in shared], self.weighting)
        mine = train_personal(self, members, self.strength)
        return [
            (reply, {**m.state, "model": t.params})
            for m, reply, t in zip(members, replies, mine, strict=True)
        ]

    def aggregate(self, state: State, replies: Mapping[str, Reply], secure_sum: SecureSum) -> State:
        return apply_sum(state, replies, secure_sum)


class DittoSettings(PersonalisedSettings):
    algorithm: ClassVar[type[Algorithm]] = Ditto

    name: Literal["ditto"]

    def build(self, parts: Parts) -> Ditto:
        return Ditto(**self.personalised(parts))
