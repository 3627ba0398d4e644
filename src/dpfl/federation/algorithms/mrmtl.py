"""MR-MTL: mean-regularised multi-task learning (puffle seed, §1.3).

Each silo k keeps its own model w_k across rounds and takes DP-SGD steps on
F_k(w) + λ/2‖w − w̄‖²: w_k ← w_k − η(g̃_k + λ(w_k − w̄)), g̃_k its noisy gradient. The
server keeps w̄, the mean of the silos' models after each round, and sends it back.
λ = 0 is local training; a large λ ties every w_k to w̄, FedAvg's end of the spectrum.
The pull only uses w̄, public to the silo, so a round costs what a FedAvg round costs
(seed, footnote 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dpfl.data.sampling import PoissonSampler
from dpfl.federation import aggregators
from dpfl.federation.algorithms.base import RoundContext, State
from dpfl.federation.algorithms.local import Local, every_silo, member_params, restack
from dpfl.federation.messages import Encoding, payload_bytes
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params
from dpfl.local.dpsgd import DPSGD, stack
from dpfl.local.regularised import ProximalDPSGD, check_strength


@dataclass(frozen=True)
class MRMTL(Local):
    strength: float = 1.0
    """λ, the pull towards the anchor; η·λ must stay below 2(1 + momentum)."""

    name = "mrmtl"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_strength(self.dpsgd, self.strength)

    def run_round(self, state: State, silos: Sequence[Silo], context: RoundContext) -> State:
        members = every_silo(context.trials, len(silos))
        mean: Params = state["global"]
        trained = self.train_towards(
            member_params(state["personal"], members),
            [{name: v[r] for name, v in mean.items()} for r, _ in members],
            members,
            silos,
            context,
        )
        personal = restack(trained, context.trials, len(silos))
        message = payload_bytes(Encoding.FLOAT32, sum(v[0].numel() for v in mean.values()))
        for r, k in members:
            context.traffic(r, k, message, message)  # receives w̄, sends w_k
        weights = torch.tensor([float(s.size) if self.weighting == "size" else 1.0 for s in silos])
        return {
            "global": {
                name: aggregators.weighted_mean(v.flatten(2), weights).reshape(mean[name].shape)
                for name, v in personal.items()
            },
            "personal": personal,
        }

    def train_towards(
        self,
        starts: Sequence[Params],
        anchors: Sequence[Params],
        members: Sequence[tuple[int, int]],
        silos: Sequence[Silo],
        context: RoundContext,
    ) -> list[Params]:
        """`DPSGDAlgorithm.train` with each member's gradient pulled towards its anchor
        (`ProximalDPSGD`): grouped, stacked and charged the same way, so that λ = 0
        reproduces `Local` bit for bit."""
        trainer = ProximalDPSGD(DPSGD(self.model, self.loss, self.dpsgd), self.strength)
        results: dict[int, Params] = {}
        groups: dict[tuple[int, bool], list[int]] = {}
        for i, (_, k) in enumerate(members):
            groups.setdefault((self.local_steps(silos[k]), silos[k].x.is_sparse), []).append(i)
        for (steps, sparse), indices in groups.items():
            for batch in [[i] for i in indices] if sparse else [indices]:
                chosen = [members[i] for i in batch]
                outcome = trainer.run_stacked(
                    stack([starts[i] for i in batch]),
                    stack([anchors[i] for i in batch]),
                    [(silos[k].x, silos[k].y) for _, k in chosen],
                    [
                        PoissonSampler(silos[k].size, self.sample_rate(silos[k]), context.rng(r, k))
                        for r, k in chosen
                    ],
                    [context.noise(r, k) for r, k in chosen],
                    steps,
                )
                for j, (i, (r, k)) in enumerate(zip(batch, chosen, strict=True)):
                    if outcome.events:
                        context.charge(r, k, outcome.events[j])
                    results[i] = {name: v[j] for name, v in outcome.params.items()}
        return [results[i] for i in range(len(members))]
