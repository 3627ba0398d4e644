"""Dopamine (Imperial): DP-FedSGD with secure aggregation (Algorithm 1, Lemma 1).

Every round each of the K hospitals of the algorithm's roster takes ONE Poisson DP-SGD
step from the global model, adding N(0, σ²C²/K) to its sum of clipped gradients
(normalised by the common expected batch size B), and the server averages the K models
through secure aggregation. Only the aggregate is seen, and it carries K shares of
noise, std σC: against the server each record is protected by noise multiplier σ at its
silo's rate q_k (`participation_event`, which binds the budget). Another hospital knows
its own share and can cancel it, leaving σ·√((K − 1)/K) (`view_events["hospitals"]`,
recorded beside it). The run stops before the round whose ε would pass a silo's budget
and returns the last model.

K is the roster's (`roster`: in a deployment the hospitals every hospital pins, over
which `Deployment.build` builds the algorithm), never the size of the cohort the server
sends: a server that padded the cohort with invented names would get replies carrying
a fraction of the charged noise. A cohort that is not exactly the roster is refused
before any noise is drawn or ε charged.

Momentum re-uses only released aggregates (post-processing, Dopamine App. C): it is the
server's. A hospital replies the model after its one plain noisy step, which carries
this round's fresh share and nothing else; the server recovers the released mean step
ḡ = (θ − mean)/η, keeps the velocity v ← βv + ḡ in its state and moves θ ← θ − ηv. With
every hospital in every sum this is Algorithm 1's mean of the hospitals' velocities; a
velocity kept at each hospital would instead carry its earlier shares into later sums
over other sets of replies, whose differences would expose part of a share that was
never in a revealed sum.

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
from typing import ClassVar, Literal, Self

import torch
from pydantic import Field, model_validator
from torch import Tensor

from dpfl.federation.algorithms.base import (
    Algorithm,
    DPSGDAlgorithm,
    Job,
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
from dpfl.federation.algorithms.settings import DPSGDSettings, Parts
from dpfl.federation.messages import SecureSum
from dpfl.federation.server_optimizers import AveragingSettings
from dpfl.federation.silo import SiloInfo
from dpfl.local.clipping import Params
from dpfl.privacy import events

CORRELATED_SHARES = (
    "each hospital's noise is a 1/√K share of the secure sum's, which stays noise "
    "correlated by one strategy only if every hospital's stream advances at every round, "
    "and a dropped reply breaks that: dpfl does not keep them in step"
)
"""Why fedsgd_secure's noise is independent (`algorithm.noise`)."""


@dataclass(frozen=True)
class FedSGDSecure(DPSGDAlgorithm):
    name: ClassVar[str] = "fedsgd_secure"
    threat_model: ClassVar[str] = (
        "Dopamine: the server sees only the secure sum of the hospitals' noisy gradients, "
        "which carries noise σ in all (the server view, bound by the budget). Another "
        "hospital that subtracts its own share still faces noise σ√((K−1)/K): the "
        "'hospitals' view. K is the hospitals of the roster each hospital holds (a "
        "cohort that is not exactly the roster is refused), and momentum is applied by the "
        "server to the released sums only. The sum must hold every hospital's reply but "
        "at most `tolerated_dropouts` (their noise shares are missing: the charged noise "
        "is σ√((K−d)/K)); secure aggregation by pairwise masking, homomorphic encryption "
        "or its ideal functionality in one process (the datasheet says which)."
    )
    stops_at_budget: ClassVar[bool] = True
    needs_secure_sum: ClassVar[bool] = True
    silo_noise_allowed: ClassVar[bool] = False
    balances_batches: ClassVar[bool] = False
    tolerated_dropouts: int = 0
    """d: a round's sum is revealed if at most d hospitals' replies are missing from it;
    every hospital is charged the noise of K − d shares."""
    roster: tuple[str, ...] = ()
    """The K hospitals by name (a deployment's study roster, which `Deployment.build`
    builds over): the run's silos and every round's cohort must be exactly these. Empty:
    the run's silos, for an engine that writes its own cohorts (the simulator's come
    from `configure` over its silos, checked against its schedule)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tolerated_dropouts < 0:
            raise ValueError(f"tolerated_dropouts must be ≥ 0, got {self.tolerated_dropouts}")
        if len(set(self.roster)) != len(self.roster):
            raise ValueError(f"fedsgd_secure's roster names a hospital twice: {self.roster}")
        if self.noise.correlated:
            raise ValueError(f"fedsgd_secure's noise must be independent: {CORRELATED_SHARES}")
        if self.dpsgd.optimizer != "sgd":
            raise ValueError(
                "fedsgd_secure's hospitals reply one plain noisy step for the secure sum to "
                f"add up (Lemma 1), and the server applies momentum: no {self.dpsgd.optimizer!r}"
            )

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

    def roster_size(self, names: Sequence[str], what: str = "the run's silos") -> int:
        """K, the roster's size; `names` (the run's silos, a round's cohort) must be
        exactly the roster, each once (without a roster: they are taken as it)."""
        roster = self.roster or tuple(dict.fromkeys(names))
        if sorted(names) != sorted(roster):
            raise ValueError(
                f"{what} ({', '.join(names)}) must be exactly fedsgd_secure's roster of "
                f"{len(roster)} hospitals ({', '.join(roster)}), each once: each hospital's "
                f"noise share is σ/√{len(roster)}"
            )
        return len(roster)

    def participation_event(self, silo: SiloInfo, silos: Sequence[SiloInfo]) -> events.PrivacyEvent:
        """One step at q_k, with the noise of the weakest sum that may be revealed."""
        return self._event(silo, self.roster_size([s.name for s in silos]))

    def _event(self, silo: SiloInfo, hospitals: int) -> events.PrivacyEvent:
        record_level(self.name, silo)
        fewest = self.fewest_replies(hospitals)
        return events.poisson_gaussian(self.sample_rate(silo), self.share_noise(hospitals, fewest))

    def view_events(
        self, silo: SiloInfo, silos: Sequence[SiloInfo]
    ) -> dict[str, events.PrivacyEvent]:
        return self._views(silo, self.roster_size([s.name for s in silos]))

    def _views(self, silo: SiloInfo, hospitals: int) -> dict[str, events.PrivacyEvent]:
        """Another hospital removes its own share from a sum it is in (a sum without it
        holds at least one other share)."""
        if hospitals < 2:
            return {}
        others = max(self.fewest_replies(hospitals) - 1, 1)
        remaining = self.share_noise(hospitals, others)
        return {"hospitals": events.poisson_gaussian(self.sample_rate(silo), remaining)}

    def initial_state(self, silos: Sequence[SiloInfo], start: Params | None = None) -> State:
        """The global model, K and the server's velocity (zero)."""
        state = super().initial_state(silos, start)
        hospitals = self.roster_size([s.name for s in silos])
        return {
            **state,
            "hospitals": hospitals,
            "velocity": torch.zeros_like(flat(state["global"])),
        }

    def client_updates(self, members: Sequence[Member]) -> list[Outcome]:
        """One plain noisy step with a 1/√K share of the noise, K the roster's; the reply
        carries this step alone (no momentum: the server's). The charge is the secure
        sum's event (each share alone is weak: the sum is what the server sees). A cohort
        other than the roster is refused before any noise is drawn or ε charged."""
        cohorts = {tuple(sorted(s.name for s in m.instruction.cohort)) for m in members}
        if len(cohorts) > 1:
            raise ValueError("every hospital of a Dopamine round shares its cohort")
        hospitals = self.roster_size(cohorts.pop(), "the cohort the server sent")
        share = dataclasses.replace(
            self.dpsgd,
            noise_multiplier=self.dpsgd.noise_multiplier / math.sqrt(hospitals),
            momentum=0.0,
        )
        results = self.train(
            [Job(received(m), m) for m in members], config=share, charge_events=False
        )
        if self.private:
            charge([(m.ctx, self._event(m.silo.info, hospitals)) for m in members])
            for m in members:
                for view, event in self._views(m.silo.info, hospitals).items():
                    m.ctx.charge(event, view)
        return [(Reply(flat(r.params)), {}) for r in results]

    def aggregate(self, state: State, replies: Mapping[str, Reply], secure_sum: SecureSum) -> State:
        """The mean of the models in the sum is the released step; the server's momentum
        re-uses it: v ← βv + (θ − mean)/η, θ ← θ − ηv = mean − ηβv (before the update)."""
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
        mean = summed.total / len(summed.included)
        velocity: Tensor = state["velocity"]
        rate, momentum = self.dpsgd.learning_rate, self.dpsgd.momentum
        moved = mean.sub(velocity, alpha=rate * momentum)
        velocity = (flat(glob) - mean).div_(rate).add_(velocity, alpha=momentum)
        return {**state, "global": unflat(moved, glob), "velocity": velocity}


class FedSGDSecureSettings(DPSGDSettings):
    algorithm: ClassVar[type[Algorithm]] = FedSGDSecure
    exclusive: ClassVar[frozenset[str]] = frozenset({"tolerated_dropouts"})
    refuses_adam: ClassVar[str] = "its hospitals reply one plain noisy step for the secure sum"
    refuses_noise: ClassVar[str] = CORRELATED_SHARES

    name: Literal["fedsgd_secure"]
    tolerated_dropouts: int = Field(0, ge=0)
    """d, the hospitals whose replies a round's sum may lack; every hospital is charged the
    noise of K − d shares, σ√((K − d)/K)."""

    @model_validator(mode="after")
    def _one_server_momentum(self) -> Self:
        if self.momentum and not isinstance(self.server, AveragingSettings):
            raise ValueError(
                "fedsgd_secure's algorithm.momentum is already the server's (Dopamine "
                f"App. C): set it to 0 to move by algorithm.server {self.server.optimizer!r}"
            )
        return self

    def build(self, parts: Parts) -> FedSGDSecure:
        return FedSGDSecure(  # K from its silos, never a cohort
            **self.common(parts),
            tolerated_dropouts=self.tolerated_dropouts,
            roster=tuple(s.name for s in parts.silos),
        )
