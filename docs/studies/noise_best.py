"""`dpfl best`'s choice, made once per noise mechanism, regime and ε of a noise study
(docs/studies/noise-*.toml; docs/reproductions/correlated-noise.md).

`dpfl best` picks one run of a whole directory; a noise study needs one per mechanism, so
that each is tuned alike: among the finished runs of that mechanism, regime (the grid's
other axes) and ε, the best mean test metric within (ε, δ), ranked by
`dpfl.experiments.results.best.candidates`, `dpfl best`'s own ranking. Like `dpfl best` on
a sweep it reads the test sets, so the choice is not in ε (alike for every mechanism).

Beside the metrics, "running-sum noise": the RMS over the run's T steps of the noise in
the running sum of the noisy gradients (what SGD's model accumulates), per unit clip
norm, σ ‖A C⁻¹‖_F / √T with A the prefix sums and C the strategy the mechanism runs (the
identity for independent noise), as a ratio to the independent run's at the same regime
and ε: its range over the hospitals (each has its own T and q).
benchmarks/bench_noise.py computes the same quantity at q = 0.01.

    python docs/studies/noise_best.py DIR --metric accuracy
"""

from __future__ import annotations

import math
from typing import Any

from choices import swept
from pydantic import TypeAdapter

from dpfl.experiments.results.best import Candidate
from dpfl.federation.algorithms.base import epoch_steps
from dpfl.local.mechanisms import MechanismSettings, NoiseMechanism
from dpfl.local.mechanisms.bandmf import BandedMF
from dpfl.local.mechanisms.blt import BLT
from dpfl.privacy.factorization import BandedToeplitz

TUNED = ("algorithm.learning_rate", "algorithm.noise")
"""The axes chosen over; every other axis (but ε) is a regime."""


def mechanism(noise: Any) -> tuple[str, str]:
    """(the mechanism's name, its settings chosen: `b=4`, or empty)."""
    if isinstance(noise, str):
        return noise, ""
    return noise["mechanism"], ", ".join(f"b={v}" for k, v in noise.items() if k == "band")


def schedule(run: Any) -> dict[str, tuple[float, int]]:
    """Each hospital's (q, local steps per round), as fedavg plans them."""
    algorithm = run.config["algorithm"]
    found = {}
    for name, silo in run.datasheet["silos"].items():
        rate = algorithm["expected_batch_size"] / silo["public_size"]
        found[name] = rate, epoch_steps(algorithm["local_epochs"], rate)
    return found


def unit_noise(noise: NoiseMechanism, rate: float, steps: int, horizon: int) -> float:
    """‖A C⁻¹‖_F / √T of the strategy the mechanism runs (C = I for independent noise)."""
    if isinstance(noise, BLT):
        return noise.strategy(rate, steps).prefix_rmse(horizon)
    if isinstance(noise, BandedMF):
        return BandedToeplitz.optimal(horizon, min(noise.band, horizon)).prefix_rmse(horizon)
    return math.sqrt((horizon + 1) / 2)


def running_noise(run: Any) -> dict[str, float]:
    """Each hospital's RMS running-sum noise per unit C (see the module docstring)."""
    settings = TypeAdapter(MechanismSettings).validate_python(run.config["algorithm"]["noise"])
    noise = settings.build(run.rounds)
    return {
        name: run.datasheet["silos"][name]["noise_multiplier"]
        * unit_noise(noise, rate, steps, run.rounds * steps)
        for name, (rate, steps) in schedule(run).items()
    }


def kind(c: Candidate) -> str:
    """The run's mechanism."""
    return mechanism(c.run.grid.get("algorithm.noise", "independent"))[0]


def regime_of(c: Candidate) -> str:
    """The grid's other axes, and the steps T of the run per hospital (their range)."""
    axes = [
        f"{k.split('.')[-1]}={v}"
        for k, v in c.run.grid.items()
        if k not in TUNED and k != "privacy.epsilon"
    ]
    steps = [c.run.rounds * s for _, s in schedule(c.run).values()]
    span = f"{min(steps)}" if min(steps) == max(steps) else f"{min(steps)}–{max(steps)}"
    return ", ".join([*axes, f"T={span}"])


def main() -> None:
    with swept(__doc__.splitlines()[0]) as sweep:
        print(
            sweep.header("regime | ε | noise | chosen | σ | running-sum noise ÷ independent's", "n")
        )
        for epsilon, delta in sweep.levels:
            best = sweep.best(epsilon, delta, lambda c: (regime_of(c), kind(c)))
            for (regime, name), c in sorted(best.items()):
                _, settings = mechanism(c.run.grid.get("algorithm.noise", "independent"))
                ours = running_noise(c.run)
                theirs = running_noise(best[(regime, "independent")].run)
                ratios = [ours[s] / theirs[s] for s in ours]
                lr = c.run.config["algorithm"]["learning_rate"]
                print(
                    f"| {regime} | {epsilon:g} | {name} | lr={lr:g}"
                    + (f", {settings}" if settings else "")
                    + f" | {c.run.noise_multiplier:.3g} | {min(ratios):.2f}–{max(ratios):.2f} | "
                    + " | ".join(sweep.cells(c.run))
                    + f" | {c.run.trials} |"
                )


if __name__ == "__main__":
    main()
