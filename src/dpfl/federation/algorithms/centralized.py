"""The pooled references C and CDP (Dopamine §3 "Baselines"; Kerkouche's CENTRALIZED).

Every silo hands its training records to a trusted curator, who trains one model on the
pooled dataset: plain minibatch SGD for C (σ = 0), Poisson DP-SGD for CDP. CDP's records
are sampled at q = B / N over the pool of N records, so one record's privacy is that of
the pooled run; every silo has records in the pool, so every silo is charged the pooled
run's event each round, and its ε is CDP's (not a silo-sized q and step count).

No model messages are exchanged, so no traffic is recorded; the one-off transfer of the
raw records to the curator is what this reference gives up, and is not a model message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from dpfl.federation.algorithms.base import DPSGDAlgorithm, RoundContext, State
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params


def pool(silos: Sequence[Silo]) -> Silo:
    """All silos' training records as one dataset (test sets stay with their silos)."""
    return Silo(
        "pooled",
        torch.cat([s.x for s in silos]),
        torch.cat([s.y for s in silos]),
    )


@dataclass(frozen=True)
class Centralized(DPSGDAlgorithm):
    """`pool_size` is N, the number of pooled training records. The engine asks for a
    silo's per-round charge (`participation_event`) with that silo alone, and the charge
    is the pooled run's, which depends on N: so `sample_rate` and `local_steps` ignore the
    silo they are given and describe the pool."""

    pool_size: int = field(kw_only=True)
    epochs_per_round: float = 1.0

    name = "centralized"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pool_size < 1:
            raise ValueError(f"pool_size must be ≥ 1, got {self.pool_size}")
        if self.epochs_per_round <= 0:
            raise ValueError(f"epochs_per_round must be > 0, got {self.epochs_per_round}")

    def sample_rate(self, silo: Silo) -> float:
        """q = B / N over the pool, whichever silo a record came from."""
        if self.expected_batch_size > self.pool_size:
            raise ValueError(
                f"the pool has {self.pool_size} records, fewer than the expected batch size "
                f"{self.expected_batch_size:g}"
            )
        return self.expected_batch_size / self.pool_size

    def local_steps(self, silo: Silo) -> int:
        """Steps of the pooled run per round: `epochs_per_round` passes over the pool."""
        return max(1, round(self.epochs_per_round / self.sample_rate(silo)))

    def initial_state(self, silos: Sequence[Silo], trials: int) -> State:
        self._check_pool(silos)
        return {"global": self.initial_global(trials)}

    def run_round(self, state: State, silos: Sequence[Silo], context: RoundContext) -> State:
        self._check_pool(silos)
        glob: Params = state["global"]
        curator = dataclasses.replace(  # the curator's (server's) randomness, not a silo's
            context,
            rng=lambda trial, _: context.rng(trial, -1),
            noise=lambda trial, _: context.noise(trial, -1),
        )
        results = self.train_local(
            [{name: v[r] for name, v in glob.items()} for r in range(context.trials)],
            [(r, 0) for r in range(context.trials)],
            [pool(silos)],
            curator,
            charge=False,
        )
        for r, result in enumerate(results):
            if result.event is not None:
                for k in range(len(silos)):  # every silo has records in every batch draw
                    context.charge(r, k, result.event)
        return {
            "global": {name: torch.stack([res.params[name] for res in results]) for name in glob}
        }

    def _check_pool(self, silos: Sequence[Silo]) -> None:
        total = sum(s.size for s in silos)
        if total != self.pool_size:
            raise ValueError(f"pool_size is {self.pool_size} but the silos hold {total} records")
