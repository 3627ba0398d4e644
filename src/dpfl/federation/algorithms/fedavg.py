"""FedAvg with local DP-SGD: FL-STANDARD-DP (Kerkouche Alg. 5) and Dopamine's FPDP.

Each round the server sends the global model to the round's silos (all of them, a
Poisson sample at rate C, or K of N); each runs `local_epochs` epochs of Poisson DP-SGD
(steps = epochs × n_k / B) and returns its update, scaled by its share of the mean
(public size over the round's total, or 1/|K| as Kerkouche's), so that the server only
needs the sum. A silo is charged for the rounds it takes part in: the participation
pattern is drawn by the server without looking at any data, so accounting for the
realised pattern is exact for it (docs/privacy.md). Sizes (steps, weights) are the
silos' public sizes, never their true record counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from dpfl.federation.algorithms.base import (
    Algorithm,
    Instruction,
    Job,
    LocalEpochs,
    Member,
    Outcome,
    Reply,
    State,
    broadcast,
    check_weighting,
    flat,
    received,
    size_weights,
    unflat,
)
from dpfl.federation.algorithms.settings import LocalTrainingSettings, Parts, Weighting, weighted
from dpfl.federation.client_sampling import ClientSampler
from dpfl.federation.messages import SecureSum
from dpfl.federation.silo import SiloInfo
from dpfl.local.clipping import Params


def sampled_cohort(
    silos: Sequence[SiloInfo],
    rng: Callable[[], np.random.Generator],
    rate: float | None,
    per_round: int | None,
) -> tuple[SiloInfo, ...]:
    """The round's silos: all, each with probability `rate`, or `per_round` of them."""
    if rate is None and per_round is None:
        return tuple(silos)
    sampler = ClientSampler(len(silos), rate=rate, per_round=per_round)
    return tuple(silos[int(k)] for k in sampler.sample(rng()))


def update_replies(
    members: Sequence[Member], trained: Sequence[Params], weighting: str | None
) -> list[Reply]:
    """Each member's update from the model it was sent, times its share of the mean
    (None: unscaled, for an aggregator that needs every update as it is). Elementwise,
    written straight into one [members, parameters] tensor (no stacked copies of the
    models first), so each row has the bits it would have alone."""
    if not members:
        return []
    sent: dict[int, Tensor] = {}  # each model sent, flattened once (a trial's members share it)
    for member in members:
        model = received(member)
        if id(model) not in sent:
            sent[id(model)] = flat(model)
    first = next(iter(sent.values()))
    updates = first.new_empty(len(members), len(first))
    for row, params, member in zip(updates, trained, members, strict=True):
        # trained − sent, parameter by parameter, straight into the member's row (views)
        origin = unflat(sent[id(received(member))], params)
        for name, out in unflat(row, params).items():
            torch.sub(params[name], origin[name], out=out)
    if weighting is not None:
        shares: dict[int, dict[str, Tensor]] = {}  # each cohort's, computed once
        for member in members:
            cohort = member.instruction.cohort
            if id(cohort) not in shares:
                shares[id(cohort)] = size_weights(cohort, weighting)
        scale = [shares[id(m.instruction.cohort)][m.silo.name] for m in members]
        updates *= torch.stack(scale).to(updates.dtype).unsqueeze(1)
    return [Reply(update) for update in updates.unbind()]


def apply_sum(state: State, replies: Mapping[str, Reply], secure_sum: SecureSum) -> State:
    """The global model moved by the sum of the (pre-scaled) updates; no reply, no move."""
    if not replies:
        return state
    total = secure_sum({name: r.vector for name, r in replies.items()}).total
    glob: Params = state["global"]
    return {**state, "global": unflat(flat(glob) + total, glob)}


@dataclass(frozen=True)
class SampledClients(LocalEpochs):
    """Local DP-SGD whose rounds take all silos, each with probability `client_rate`, or
    `clients_per_round` of them (Kerkouche's FL-STANDARD-DP and FL-SIGN-DP)."""

    client_rate: float | None = None
    clients_per_round: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.client_rate is not None and self.clients_per_round is not None:
            raise ValueError("give client_rate or clients_per_round, not both")

    def cohort(
        self, round: int, silos: Sequence[SiloInfo], rng: Callable[[], np.random.Generator]
    ) -> tuple[SiloInfo, ...]:
        return sampled_cohort(silos, rng, self.client_rate, self.clients_per_round)

    def configure(
        self,
        state: State,
        round: int,
        silos: Sequence[SiloInfo],
        rng: Callable[[], np.random.Generator],
        exchange: int = 0,
    ) -> dict[str, Instruction]:
        return broadcast(state, self.cohort(round, silos, rng))


@dataclass(frozen=True)
class FedAvg(SampledClients):
    weighting: Literal["size", "uniform"] = "size"
    robust: Callable[[Tensor], Tensor] | None = None
    """A robust aggregator of the [K, P] model updates (e.g. `aggregators.coordinate_median`
    or `functools.partial(aggregators.trimmed_mean, trim_fraction=0.2)`), used instead of
    the weighted mean so one bad client moves the model less; post-processing, no ε. It
    needs every update in the clear."""

    name: ClassVar[str] = "fedavg"
    threat_model: ClassVar[str] = (
        "The server and every other hospital see each participating hospital's model "
        "update after its local DP-SGD; the guarantee holds against all of them together "
        "(honest-but-curious or colluding). With client sampling, who took part is public."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_weighting(self.weighting)

    def client_updates(self, members: Sequence[Member]) -> list[Outcome]:
        trained = self.train([Job(received(m), m) for m in members])
        weighting = None if self.robust is not None else self.weighting
        replies = update_replies(members, [t.params for t in trained], weighting)
        return [(reply, m.state) for reply, m in zip(replies, members, strict=True)]

    def aggregate(self, state: State, replies: Mapping[str, Reply], secure_sum: SecureSum) -> State:
        if self.robust is None or not replies:
            return apply_sum(state, replies, secure_sum)
        if not secure_sum.reveals_inputs:
            raise ValueError("a robust aggregator needs every update in the clear")
        glob: Params = state["global"]
        step = self.robust(torch.stack([r.vector for r in replies.values()]))
        return {**state, "global": unflat(flat(glob) + step, glob)}


class SampledSettings(LocalTrainingSettings):
    """Settings of local training with client sampling (at most one of the two)."""

    client_rate: float | None = Field(None, gt=0, le=1)
    """Each silo takes part in a round with this probability."""
    clients_per_round: int | None = Field(None, ge=1)
    """Exactly this many silos, drawn at random, take part in each round."""

    def sampled(self) -> dict[str, Any]:
        return {"client_rate": self.client_rate, "clients_per_round": self.clients_per_round}


class FedAvgSettings(SampledSettings):
    algorithm: ClassVar[type[Algorithm]] = FedAvg

    name: Literal["fedavg"]
    weighting: Weighting = None

    def build(self, parts: Parts) -> FedAvg:
        return FedAvg(
            **self.common(parts),
            local_epochs=self.local_epochs,
            **self.sampled(),
            **weighted(self.weighting),
        )
