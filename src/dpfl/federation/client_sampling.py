"""Which silos take part in a round, and what that does to each silo's privacy.

Two schemes from the seeds: each silo independently with probability C (Poisson), or
exactly K of the N silos uniformly (Kerkouche's "3 hospitals per round"). For silo k's
records only its own participation matters: the choice of the others does not depend on
its data, so under either scheme silo k's round is "its round mechanism with
probability C_k, nothing otherwise", with C_k = C or K/N. `round_event` charges exactly
that (`events.client_sampled`), not Kerkouche et al.'s q1 = C·q (see docs/privacy.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpfl.privacy import events


@dataclass(frozen=True)
class ClientSampler:
    """Draws the silos of each round. `per_round=None`: Poisson at `rate`; otherwise
    exactly `per_round` silos uniformly without replacement."""

    n_silos: int
    rate: float | None = None
    per_round: int | None = None

    def __post_init__(self) -> None:
        if self.n_silos < 1:
            raise ValueError(f"need at least one silo, got {self.n_silos}")
        if (self.rate is None) == (self.per_round is None):
            raise ValueError("give exactly one of rate (Poisson) or per_round (fixed count)")
        if self.rate is not None and not 0 < self.rate <= 1:
            raise ValueError(f"client sampling rate must lie in (0, 1], got {self.rate}")
        if self.per_round is not None and not 1 <= self.per_round <= self.n_silos:
            raise ValueError(f"per_round must be in 1..{self.n_silos}, got {self.per_round}")

    @property
    def participation(self) -> float:
        """Probability that a given silo takes part in a round."""
        if self.rate is not None:
            return self.rate
        assert self.per_round is not None
        return self.per_round / self.n_silos

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """Sorted indices of this round's silos (possibly none under Poisson sampling)."""
        if self.rate is not None:
            return np.flatnonzero(rng.random(self.n_silos) < self.rate)
        return np.sort(rng.choice(self.n_silos, self.per_round, replace=False))

    def round_event(self, local_event: events.PrivacyEvent) -> events.PrivacyEvent:
        """A silo's charge for one round whose local work, if it takes part, is `local_event`."""
        return events.client_sampled(self.participation, local_event)
