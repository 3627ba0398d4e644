"""Dopamine (Imperial): DP-FedSGD with secure aggregation (Algorithm 1, Lemma 1).

Every round each of the K hospitals takes ONE Poisson DP-SGD step from the global model,
adding N(0, σ²C²/K) to its sum of clipped gradients (normalised by the common expected
batch size B), keeps its own momentum, and the server averages the K models through
secure aggregation. Only the aggregate is seen, and it carries K shares of noise, std σC:
against the server each record is protected by noise multiplier σ at its silo's rate q_k
(`participation_event`, which binds the budget). Another hospital knows its own share and
can cancel it, leaving σ·√((K − 1)/K) (`view_events["hospitals"]`, recorded beside it).
Momentum re-uses only released noisy aggregates: post-processing (Dopamine, App. C). The
run stops before the round whose ε would pass a silo's budget and returns the last model.

Secure aggregation itself (masking or HE) is `dpfl.secure`'s; this module sums in the
clear behind the same interface, and its server-view ε assumes the secure sum.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from dpfl.federation.algorithms.base import DPSGDAlgorithm, RoundContext, State
from dpfl.federation.messages import Encoding, payload_bytes
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params
from dpfl.privacy import events


@dataclass(frozen=True)
class FedSGDSecure(DPSGDAlgorithm):
    name = "fedsgd_secure"
    stops_at_budget = True

    def local_steps(self, silo: Silo) -> int:
        return 1

    def view_events(self, silo: Silo, silos: Sequence[Silo]) -> dict[str, events.PrivacyEvent]:
        if len(silos) < 2:
            return {}
        remaining = self.dpsgd.noise_multiplier * math.sqrt((len(silos) - 1) / len(silos))
        return {"hospitals": events.poisson_gaussian(self.sample_rate(silo), remaining)}

    def initial_state(self, silos: Sequence[Silo], trials: int) -> State:
        glob = self.initial_global(trials)
        zeros = {
            name: v.new_zeros(v.shape[0], len(silos), *v.shape[1:]) for name, v in glob.items()
        }
        return {"global": glob, "momentum": zeros}

    def run_round(self, state: State, silos: Sequence[Silo], context: RoundContext) -> State:
        glob: Params = state["global"]
        momentum: Params = state["momentum"]
        k_silos = len(silos)
        members = [(r, k) for r in range(context.trials) for k in range(k_silos)]
        share = dataclasses.replace(
            self.dpsgd, noise_multiplier=self.dpsgd.noise_multiplier / math.sqrt(k_silos)
        )
        trained = self.train_local(
            [{n: v[r] for n, v in glob.items()} for r, _ in members],
            members,
            silos,
            context,
            config=share,
            velocities=[{n: v[r, k] for n, v in momentum.items()} for r, k in members],
            charge=False,  # each share alone is weak: the secure sum is what is released
        )
        message = payload_bytes(Encoding.FLOAT32, sum(v[0].numel() for v in glob.values()))
        if self.private:
            context.charge_many(
                [(r, k, self.participation_event(silos[k], silos)) for r, k in members]
            )
        for r, k in members:
            if self.private:
                for view, event in self.view_events(silos[k], silos).items():
                    context.charge_view(r, k, view, event)
            context.traffic(r, k, message, message)
        new_global = {n: v.clone() for n, v in glob.items()}
        new_momentum = {n: v.clone() for n, v in momentum.items()}
        for i, (r, k) in enumerate(members):
            for n in new_momentum:
                new_momentum[n][r, k] = trained[i].velocity[n]
        for r in range(context.trials):
            mine = [trained[i].params for i, (t, _) in enumerate(members) if t == r]
            for n in new_global:
                new_global[n][r] = sum(p[n] for p in mine) / k_silos
        return {"global": new_global, "momentum": new_momentum}
