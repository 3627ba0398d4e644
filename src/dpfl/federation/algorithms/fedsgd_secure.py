"""Dopamine (Imperial): DP-FedSGD with secure aggregation (Algorithm 1, Lemma 1).

Every round each of the K hospitals takes ONE Poisson DP-SGD step from the global model,
adding N(0, σ²C²/K) to its sum of clipped gradients (normalised by the common expected
batch size B), keeps its own momentum, and the server averages the K models through
secure aggregation. Only the aggregate is seen, and it carries K shares of noise, std σC:
against the server each record is protected by noise multiplier σ at its silo's rate q_k
(`participation_event`, which binds the budget). Another hospital knows its own share and
can cancel it, leaving σ·√((K − 1)/K) (`view_events["hospitals"]`, recorded beside it).
Momentum re-uses only released noisy aggregates: post-processing (Dopamine, App. C), and
it stays at the hospital. The run stops before the round whose ε would pass a silo's
budget and returns the last model.

That accounting holds only if the server learns nothing but the sum of the replies:
`aggregate` refuses a sum that shows them (each alone carries σ/√K). A hospital that drops
out takes its share of the noise with it: a sum of K′ < K replies carries only σ√(K′/K).
So the hospitals charge, before replying, the event of the weakest sum they let be
revealed: with `tolerated_dropouts` d, noise σ√((K − d)/K) (d = 0, the default: the full
σ, and a round that loses a reply is not revealed). The secure sum is asked for at least
K − d replies (`at_least`): the parties that can reveal it (the masking clients, the key
holder) refuse a smaller one, so no revealed sum carries less noise than the ledgers
recorded. A hospital that drops after its masked input was received is in the sum: that
costs nothing. The server averages the models that are in the sum.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from dpfl.federation.algorithms.base import (
    DPSGDAlgorithm,
    Job,
    LocalState,
    Member,
    Outcome,
    Reply,
    State,
    charge,
    flat,
    received,
    record_level,
    unflat,
)
from dpfl.federation.messages import SecureSum
from dpfl.federation.silo import SiloInfo
from dpfl.local.clipping import Params
from dpfl.privacy import events


@dataclass(frozen=True)
class FedSGDSecure(DPSGDAlgorithm):
    name: ClassVar[str] = "fedsgd_secure"
    threat_model: ClassVar[str] = (
        "Dopamine: the server sees only the secure sum of the hospitals' noisy gradients, "
        "which carries noise σ in all (the server view, bound by the budget). Another "
        "hospital that subtracts its own share still faces noise σ√((K−1)/K): the "
        "'hospitals' view. The sum must hold every hospital's reply but at most "
        "`tolerated_dropouts` (their noise shares are missing: the charged noise is "
        "σ√((K−d)/K)); secure aggregation by pairwise masking, homomorphic encryption or "
        "its ideal functionality in one process (the datasheet says which)."
    )
    stops_at_budget: ClassVar[bool] = True
    needs_secure_sum: ClassVar[bool] = True
    silo_noise_allowed: ClassVar[bool] = False
    balances_batches: ClassVar[bool] = False
    tolerated_dropouts: int = 0
    """d: a round's sum is revealed if at most d hospitals' replies are missing from it;
    every hospital is charged the noise of K − d shares."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tolerated_dropouts < 0:
            raise ValueError(f"tolerated_dropouts must be ≥ 0, got {self.tolerated_dropouts}")

    def local_steps(self, silo: SiloInfo) -> int:
        return 1

    def fewest_replies(self, hospitals: int) -> int:
        """K − d."""
        fewest = hospitals - self.tolerated_dropouts
        if fewest < 1:
            raise ValueError(
                f"tolerating {self.tolerated_dropouts} dropouts of {hospitals} hospitals "
                "would allow a sum of no reply; tolerate fewer"
            )
        return fewest

    def share_noise(self, hospitals: int, shares: int) -> float:
        """σ√(m/K): the noise multiplier of m of the K hospitals' shares."""
        return self.dpsgd.noise_multiplier * math.sqrt(shares / hospitals)

    def participation_event(self, silo: SiloInfo, silos: Sequence[SiloInfo]) -> events.PrivacyEvent:
        """One step at q_k, with the noise of the weakest sum that may be revealed."""
        record_level(self.name, silo)
        fewest = self.fewest_replies(len(silos))
        return events.poisson_gaussian(self.sample_rate(silo), self.share_noise(len(silos), fewest))

    def view_events(
        self, silo: SiloInfo, silos: Sequence[SiloInfo]
    ) -> dict[str, events.PrivacyEvent]:
        """Another hospital removes its own share from a sum it is in (a sum without it
        holds at least one other share)."""
        if len(silos) < 2:
            return {}
        others = max(self.fewest_replies(len(silos)) - 1, 1)
        remaining = self.share_noise(len(silos), others)
        return {"hospitals": events.poisson_gaussian(self.sample_rate(silo), remaining)}

    def initial_state(self, silos: Sequence[SiloInfo], start: Params | None = None) -> State:
        return {**super().initial_state(silos, start), "hospitals": len(silos)}

    def initial_local_state(self, start: Params) -> LocalState:
        return {"velocity": {name: torch.zeros_like(v) for name, v in start.items()}}

    def client_updates(self, members: Sequence[Member]) -> list[Outcome]:
        """One step with a 1/√K share of the noise; the charge is the secure sum's event
        (each share alone is weak: the sum is what the server sees)."""
        cohort = members[0].instruction.cohort
        if any(m.instruction.cohort != cohort for m in members):
            raise ValueError("every hospital of a Dopamine round shares its cohort")
        share = dataclasses.replace(
            self.dpsgd, noise_multiplier=self.dpsgd.noise_multiplier / math.sqrt(len(cohort))
        )
        results = self.train(
            [Job(received(m), m, velocity=m.state["velocity"]) for m in members],
            config=share,
            charge_events=False,
        )
        if self.private:
            charge([(m.ctx, self.participation_event(m.silo.info, cohort)) for m in members])
            for m in members:
                for view, event in self.view_events(m.silo.info, cohort).items():
                    m.ctx.charge(event, view)
        return [(Reply(flat(r.params)), {"velocity": r.velocity}) for r in results]

    def aggregate(self, state: State, replies: Mapping[str, Reply], secure_sum: SecureSum) -> State:
        if secure_sum.reveals_inputs:
            raise ValueError(
                "fedsgd_secure's ε assumes the server sees only the sum of the replies; "
                "in the clear each reply carries only σ/√K of the noise"
            )
        hospitals: int = state["hospitals"]
        fewest = self.fewest_replies(hospitals)
        summed = secure_sum({name: r.vector for name, r in replies.items()}, at_least=fewest)
        if len(summed.included) < fewest:  # the secure sum must have refused it
            raise ValueError(
                f"the secure sum holds {len(summed.included)} of {hospitals} replies: it "
                f"carries noise σ√({len(summed.included)}/{hospitals}), less than was charged"
            )
        glob: Params = state["global"]
        return {**state, "global": unflat(summed.total / len(summed.included), glob)}
