"""A run's plan: what stays the same through a run, and the public schedule drawn from it.

`RunPlan` is what an engine is asked to run (rounds, trials, seed, budgets, calibration,
evaluation, where it trains); a study builds one from its file once
(`dpfl.experiments.study.plan.plan_of`). σ has one meaning here: with `calibrate`
None the algorithm's own σ is the run's (fixed σ, its ε read off the ledger); with
"common" or "per-silo" the engine replaces it, before round 0, by the least σ that keeps
every silo's planned releases within its budget. The schedule (every round's cohorts)
is drawn from the seed alone, before round 0, by every engine alike.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dpfl.engines.accounts import DEFAULT_SIZE_NOISE, Budgets
from dpfl.engines.streams import Streams, stream_rng
from dpfl.federation.algorithms.base import Algorithm, Reply, State
from dpfl.federation.messages import SecureSum
from dpfl.federation.silo import SiloInfo
from dpfl.federation.threshold import FIXED, BalancedThreshold
from dpfl.local.device import DeviceName

__all__ = [
    "Calibrate",
    "Init",
    "Observer",
    "RunPlan",
    "Schedule",
    "drawn_schedule",
    "participations",
]

Init = Literal["per-trial", "shared"]
Calibrate = Literal["common", "per-silo"]
Observer = Callable[[int, int, Sequence[State], Sequence[Mapping[str, Reply]], bool], None]
"""Called after each exchange: (round, exchange, states per trial, replies per trial,
whether the server saw the replies)."""


@dataclass(frozen=True)
class RunPlan:
    """What a run is asked for, the same from its first round to its last.

    Attributes:
        rounds: Rounds to run (fewer if the algorithm stops at its budget).
        trials: Independent repetitions, run stacked together.
        seed: Keys every random stream (`dpfl.engines.streams`) and initial model.
        epsilon: Every silo's ε, unless `budgets` names it; None: each account's budget
            is what its plan spends (a fixed-σ run, its ε read off afterwards).
        delta: Every silo's δ, unless `budgets` names it.
        budgets: Per silo name, its (ε, δ).
        calibrate: None: the algorithm's σ is the run's. "common": every silo gets the
            most constrained silo's σ; "per-silo": each the least σ that keeps its
            scheduled rounds in its budget.
        consortium: (h, ε): with `calibrate`, σ also keeps a patient seen by up to h
            silos within ε at `delta` (`calibration.calibrate_consortium_noise`); silos
            without an ε budget are then held to this one only.
        research_noise: Seeded noise (reproducible, for research); False draws a silo's
            noise and batches from the CSPRNG and the OS.
        secure_sum: How the server learns the sum of the replies; None: in the clear, or
            the ideal secure sum for an algorithm that needs one.
        eval_every: Evaluate every this many rounds (and after the last).
        cross_silo: Also score every silo's final model on every silo's test set.
        threshold: Binary models' decision threshold: a public number, or a
            `BalancedThreshold` released (and charged) at every evaluation.
        init: "per-trial": trial 0 from the model as given, every other from its own
            seeded initialisation; "shared": every trial from the model as given.
        device: Where local training runs (`dpfl.local.device`): "cpu", "cuda" (refused
            where there is none) or "auto"; the noise is the same values on every device,
            and the server half, secure sums and evaluation stay on the CPU.
        threads: torch's thread count during the run, restored after (None keeps it).
        checkpoint: A file the run is saved to after every round, and resumed from if
            it holds this run.
        size_noise: The std, in records, of the DP count's Gaussian noise for a silo that
            declares no public size, charged first (a non-private run uses the true count).
        progress: Show a progress bar with the worst ε and the latest accuracy.
        observe: For audits (`dpfl.audit`): called after every exchange as
            `observe(round, exchange, states, replies, revealed)`; it copies what it keeps.
    """

    rounds: int
    trials: int = 1
    seed: int = 0
    epsilon: float | None = None
    delta: float = 1e-5
    budgets: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    calibrate: Calibrate | None = None
    consortium: tuple[int, float] | None = None
    research_noise: bool = True
    secure_sum: SecureSum | None = None
    eval_every: int = 1
    cross_silo: bool = False
    threshold: float | BalancedThreshold = FIXED
    init: Init = "per-trial"
    device: DeviceName = "cpu"
    threads: int | None = 1
    checkpoint: str | Path | None = None
    size_noise: float = DEFAULT_SIZE_NOISE
    progress: bool = True
    observe: Observer | None = None

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.trials < 1 or self.eval_every < 1:
            raise ValueError("rounds, trials and eval_every must be ≥ 1")
        if self.calibrate not in (None, "common", "per-silo"):
            raise ValueError(f"calibrate must be 'common' or 'per-silo', got {self.calibrate!r}")
        if self.consortium is not None and self.calibrate == "per-silo":
            raise ValueError("a consortium budget calibrates one σ: calibrate 'common'")

    @property
    def checkpoint_file(self) -> Path | None:
        return None if self.checkpoint is None else Path(self.checkpoint)

    def targets(self, names: Sequence[str]) -> Budgets:
        """Each named silo's (ε, δ): its own budget, else the run's."""
        return {name: self.budgets.get(name, (self.epsilon, self.delta)) for name in names}

    def evaluations(self, rounds: int) -> list[int]:
        """The rounds of a run of `rounds` rounds that are evaluated."""
        return [r for r in range(rounds) if (r + 1) % self.eval_every == 0 or r == rounds - 1]


Schedule = dict[tuple[int, int], frozenset[str]]
"""(round, trial) -> the names of the silos the server's `cohort` takes that round."""


def drawn_schedule(
    algorithm: Algorithm, silos: Sequence[SiloInfo], trials: int, seed: int, rounds: int
) -> Schedule:
    """Every round's cohort, drawn before round 0 from the very stream `configure` will
    draw it from (the server's first stream of the round): public, from the seed alone."""
    return {
        (round_, trial): frozenset(
            s.name for s in algorithm.cohort(round_, silos, functools.partial(streams, trial, -1))
        )
        for round_ in range(rounds)
        for streams in [Streams(seed, round_, stream_rng)]
        for trial in range(trials)
    }


def participations(schedule: Schedule, first: int, last: int) -> Counter[tuple[str, int]]:
    """Rounds in [first, last) each (silo, trial) is scheduled for."""
    return Counter(
        (name, trial)
        for (round_, trial), names in schedule.items()
        if first <= round_ < last
        for name in names
    )
