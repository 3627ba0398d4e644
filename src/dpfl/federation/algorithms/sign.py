"""FL-SIGN and FL-SIGN-DP (Kerkouche et al., CHIL 2021, Alg. 3 and 4).

As FedAvg (Alg. 1 / 5), the round's silos run local SGD (DP-SGD for FL-SIGN-DP) from the
global model, but each returns only s_k = sign(w_k − w) ∈ {−1, 1}ⁿ, a uniformly random
sign where the update is exactly zero (§3.1), packed one bit a parameter: 32× less
upstream traffic. The server moves the model by γ·sign(Σ_k s_k), a majority vote that is
not weighted by silo size (a client could otherwise inflate its vote by claiming more
records); it needs only the sum of the votes. The sign and the tie-breaking coin are
post-processing of the DP-SGD output, so a silo's charge is its local DP-SGD steps, for
the rounds it takes part in, as in FedAvg.

`votes = "ternary"`: a silo votes 0 where its update is exactly 0, so a weight that no
silo's batch touched does not move (with binary votes, a code absent from every record
of a batch gets a coin, and its weights random-walk by γ a round). A vote in {−1, 0, 1}
costs 1.6 bits (five to a byte). It is the same post-processing of the same update;
under DP the noise leaves no coordinate exactly 0, so a DP silo's ternary votes equal
its binary ones. On sparse records with rare positives it does not help: the sign drops
the class weight of a weighted loss, and balanced batches (`sampling = "balanced"`,
Kerkouche's Alg. 7) are what bring FL-SIGN(-DP) level with FL-STANDARD(-DP)
(docs/reproductions/kerkouche.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, field_validator
from torch import Tensor

from dpfl.federation.algorithms.base import (
    Algorithm,
    Job,
    Member,
    Outcome,
    Reply,
    State,
    flat,
    received,
    unflat,
)
from dpfl.federation.algorithms.fedavg import SampledClients, SampledSettings
from dpfl.federation.algorithms.settings import Parts, Weighting
from dpfl.federation.messages import Encoding, SecureSum
from dpfl.local.clipping import Params


def random_signs(update: Tensor, rng: np.random.Generator) -> Tensor:
    """sign(update) with exact zeros replaced by ±1 with probability 1/2 each (§3.1), so
    that every entry is one bit on the wire."""
    signs = torch.sign(update)
    zeros = signs == 0
    coins = rng.integers(0, 2, size=int(zeros.sum()))
    signs[zeros] = torch.from_numpy(2.0 * coins - 1.0).to(signs.dtype)
    return signs


@dataclass(frozen=True)
class Sign(SampledClients):
    """FL-SIGN (σ = 0) or FL-SIGN-DP; `server_learning_rate` is Kerkouche's γ
    (0.001 for FL-SIGN, 0.005 for FL-SIGN-DP in their Table 5); `votes`: "binary" (§3.1,
    a coin for an exact zero) or "ternary" (0 for an exact zero)."""

    server_learning_rate: float = 0.005
    votes: Literal["binary", "ternary"] = "binary"

    name: ClassVar[str] = "sign"
    threat_model: ClassVar[str] = (
        "As FL-STANDARD-DP: the server sees each hospital's sign vector, computed from a "
        "DP-SGD update, so it is covered by that hospital's DP-SGD guarantee."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.server_learning_rate <= 0:
            raise ValueError(f"server_learning_rate must be > 0, got {self.server_learning_rate}")
        if self.votes not in ("binary", "ternary"):
            raise ValueError(f"votes must be 'binary' or 'ternary', got {self.votes!r}")

    def client_updates(self, members: Sequence[Member]) -> list[Outcome]:
        trained = self.train([Job(received(m), m) for m in members])
        outcomes: list[Outcome] = []
        for m, t in zip(members, trained, strict=True):
            update = flat(t.params) - flat(received(m))
            if self.votes == "ternary":
                reply = Reply(torch.sign(update), Encoding.TERNARY)
            else:  # a fresh stream: reusing the sampler's would tie the coins to the batches
                reply = Reply(random_signs(update, m.ctx.rng()), Encoding.SIGN)
            outcomes.append((reply, m.state))
        return outcomes

    def aggregate(self, state: State, replies: Mapping[str, Reply], secure_sum: SecureSum) -> State:
        if not replies:  # nobody sampled: the model stays
            return state
        votes = secure_sum({name: r.vector for name, r in replies.items()}).total
        glob: Params = state["global"]
        step = self.server_learning_rate * torch.sign(votes)
        return {**state, "global": unflat(flat(glob) + step, glob)}


class SignSettings(SampledSettings):
    algorithm: ClassVar[type[Algorithm]] = Sign
    exclusive: ClassVar[frozenset[str]] = frozenset({"votes"})
    refuses_adam: ClassVar[str] = "it sends the signs of one gradient"

    name: Literal["sign"]
    server_learning_rate: float = Field(0.005, gt=0)
    """The server's step γ."""
    votes: Literal["binary", "ternary"] = "binary"
    """"binary", a coin where the update is exactly 0 (§3.1); "ternary", a 0 there (1.6
    bits a parameter), so that weights no batch touched stay put."""
    weighting: Weighting = None
    """The votes are always uniform: "uniform" says so, "size" is refused."""

    @field_validator("weighting")
    @classmethod
    def _uniform(cls, weighting: str | None) -> str | None:
        if weighting == "size":
            raise ValueError("sign's votes are not weighted by silo size (Kerkouche §3.1)")
        return weighting

    def build(self, parts: Parts) -> Sign:
        return Sign(
            **self.common(parts),
            local_epochs=self.local_epochs,
            **self.sampled(),
            server_learning_rate=self.server_learning_rate,
            votes=self.votes,
        )
