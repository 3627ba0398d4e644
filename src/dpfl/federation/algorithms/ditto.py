"""Ditto (Li et al. 2021) under silo-specific record-level DP, the puffle seed's baseline.

Each round a silo does two things on its own data: FedAvg's local DP-SGD on the global
model w (averaged by the server as in FedAvg), and as many DP-SGD steps on its personal
model v_k ← v_k − η(g̃_k + λ(v_k − w)), the MR-MTL step with the global model of the
round as anchor. Both touch the silo's records, so a participation costs twice a FedAvg
round: the seed's point that Ditto pays for its 2× local iterations (Fig. 3). The
second pass asks the round's context for its generators and noise again, and so gets
fresh, independent streams: replaying the first pass's batches and noise would not be
the two independently sampled Gaussian mechanisms that the ledger composes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dpfl.federation.algorithms.base import RoundContext, State
from dpfl.federation.algorithms.fedavg import FedAvg
from dpfl.federation.algorithms.local import every_silo, member_params, restack
from dpfl.federation.algorithms.mrmtl import MRMTL
from dpfl.federation.silo import Silo
from dpfl.privacy import events


@dataclass(frozen=True)
class Ditto(MRMTL):
    name = "ditto"

    def participation_event(self, silo: Silo, silos: Sequence[Silo]) -> events.PrivacyEvent:
        """The global model's local steps and as many personal ones, all on its data."""
        return events.repeat(super().participation_event(silo, silos), 2)

    def run_round(self, state: State, silos: Sequence[Silo], context: RoundContext) -> State:
        members = every_silo(context.trials, len(silos))
        global_model = FedAvg.run_round(self, state, silos, context)["global"]
        personal = self.train_local(
            member_params(state["personal"], members),
            members,
            silos,
            context,
            anchors=[{name: v[r] for name, v in state["global"].items()} for r, _ in members],
            strength=self.strength,
        )
        return {
            "global": global_model,
            "personal": restack([p.params for p in personal], context.trials, len(silos)),
        }
