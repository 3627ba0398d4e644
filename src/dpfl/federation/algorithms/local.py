"""Local training: each silo trains its own model on its own data and never communicates.

One end of puffle's personalisation spectrum (seed §1.2): no cost from heterogeneity,
no reduction of the silo's DP noise by averaging. Under silo-specific record-level DP a
round costs a silo exactly what a FedAvg round costs (the same local DP-SGD steps; being
averaged with others is post-processing), so it is the baseline that every personalised
algorithm must beat at equal ε.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dpfl.federation.algorithms.base import RoundContext, State
from dpfl.federation.algorithms.fedavg import FedAvg
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params


def every_silo(trials: int, silos: int) -> list[tuple[int, int]]:
    """(trial, silo) members of a round in which every silo takes part."""
    return [(r, k) for r in range(trials) for k in range(silos)]


def broadcast(params: Params, silos: int) -> Params:
    """[trials, ...] → [trials, silos, ...]: every silo starts from the same model."""
    return {
        name: v.unsqueeze(1).expand(v.shape[0], silos, *v.shape[1:]).clone()
        for name, v in params.items()
    }


def member_params(personal: Params, members: Sequence[tuple[int, int]]) -> list[Params]:
    """Each (trial, silo) member's own model out of the stacked personal models."""
    return [{name: v[r, k] for name, v in personal.items()} for r, k in members]


def restack(trained: Sequence[Params], trials: int, silos: int) -> Params:
    """Models of `every_silo(trials, silos)`, in that order, back to [trials, silos, ...]."""
    return {
        name: torch.stack([t[name] for t in trained]).reshape(trials, silos, *v.shape)
        for name, v in trained[0].items()
    }


@dataclass(frozen=True)
class Local(FedAvg):
    """FedAvg's local training (`local_epochs` of Poisson DP-SGD a round) without the
    server: no messages, so no traffic.

    The base of the personalised algorithms: the state keeps every silo's model as
    `personal[trial, silo]` and each silo is evaluated with its own. Here `global` stays
    the common initial model, as nothing is ever shared.
    """

    name = "local"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.client_rate is not None or self.clients_per_round is not None:
            raise ValueError(
                f"{self.name} trains every silo in every round (cross-silo); "
                "client sampling is not supported"
            )

    def initial_state(self, silos: Sequence[Silo], trials: int) -> State:
        start = self.initial_global(trials)
        return {"global": start, "personal": broadcast(start, len(silos))}

    def silo_params(self, state: State, k: int) -> Params:
        return {name: v[:, k] for name, v in state["personal"].items()}

    def run_round(self, state: State, silos: Sequence[Silo], context: RoundContext) -> State:
        members = every_silo(context.trials, len(silos))
        trained = self.train(member_params(state["personal"], members), members, silos, context)
        return {**state, "personal": restack(trained, context.trials, len(silos))}
