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
from dataclasses import dataclass

import torch

from dpfl.federation.algorithms.base import DPSGDAlgorithm, RoundContext, State
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params
from dpfl.privacy import events


def pool(silos: Sequence[Silo]) -> Silo:
    """All silos' training records as one dataset (test sets stay with their silos); its
    public size is the sum of theirs."""
    return Silo(
        "pooled",
        torch.cat([s.x for s in silos]),
        torch.cat([s.y for s in silos]),
        public_size=pooled_size(silos),
    )


def pooled_size(silos: Sequence[Silo]) -> int:
    """N: the pool's public size, from the silos' public sizes (no data is pooled)."""
    return sum(s.declared_size for s in silos)


@dataclass(frozen=True)
class Centralized(DPSGDAlgorithm):
    epochs_per_round: float = 1.0

    name = "centralized"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.epochs_per_round <= 0:
            raise ValueError(f"epochs_per_round must be > 0, got {self.epochs_per_round}")

    def local_steps(self, silo: Silo) -> int:
        """Steps of the pooled run per round: `epochs_per_round` passes over the pool."""
        return self._steps(self.sample_rate(silo))

    def _steps(self, rate: float) -> int:
        return max(1, round(self.epochs_per_round / rate))

    def participation_event(self, silo: Silo, silos: Sequence[Silo]) -> events.PrivacyEvent:
        """The pooled run's event (q = B / N over the N pooled records' public size),
        whichever silo; from public sizes only, without pooling any data."""
        rate = self.rate_for(pooled_size(silos), "pooled")
        return events.poisson_gaussian(rate, self.dpsgd.noise_multiplier, steps=self._steps(rate))

    def initial_state(self, silos: Sequence[Silo], trials: int) -> State:
        return {"global": self.initial_global(trials)}

    def run_round(self, state: State, silos: Sequence[Silo], context: RoundContext) -> State:
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
