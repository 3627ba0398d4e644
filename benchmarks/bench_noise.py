"""The error of the noisy prefix sums (what training accumulates) per unit clip norm, of
correlated noise against DP-SGD's independent noise, at the same (ε, δ) and batch size.

For `--steps` T in (100, 1000, 10000), sample rate q = 0.01 and (ε, δ) = (1, 1e-5) and
(8, 1e-5), the RMS error over the T prefix sums of:

* independent noise: Poisson sampling at q, σ from `calibrate_dpsgd_noise`, error
  σ √((T+1)/2);
* banded MF (`BandedToeplitz.optimal(T, b)`) for b in 2, 4, …, 64 and min(T, 100) with
  b q ≤ 1: a record falls in one of b cyclic groups and is Poisson-sampled at b q in its
  group's steps (⌈T/b⌉ of them), σ_b from `calibrate_noise` of that event, error σ_b
  ‖A C⁻¹‖_F / √T; the best band is named;
* BLT (`BufferedToeplitz.optimal(T, ⌊1/q⌋)`): every record in every ⌊1/q⌋-th step, no
  amplification claimed, σ = the Gaussian mechanism's σ at (ε, δ) times √S(T), error
  σ ‖A C⁻¹‖_F / √T.

Prints a markdown table, then where correlated noise meets the goal of half the
independent error (2×) and where not.

    .venv/bin/python benchmarks/bench_noise.py
"""

from __future__ import annotations

import argparse
import math
import time

from dpfl.privacy import (
    calibrate_dpsgd_noise,
    calibrate_noise,
    events,
    gaussian_noise_multiplier,
)
from dpfl.privacy.factorization import BandedToeplitz, BufferedToeplitz

DELTA = 1e-5
BANDS = (2, 4, 8, 16, 32, 64)
GOAL = 2.0


def independent(epsilon: float, q: float, steps: int) -> float:
    sigma = calibrate_dpsgd_noise(epsilon, DELTA, sample_rate=q, steps=steps)
    return sigma * math.sqrt((steps + 1) / 2)


def banded(epsilon: float, q: float, steps: int) -> tuple[int, float]:
    """(b, error) of the band with the least error."""
    best: tuple[int, float] | None = None
    for band in sorted({*BANDS, min(steps, 100)}):
        if band * q > 1 or band > steps:
            continue
        sigma = calibrate_noise(
            epsilon,
            DELTA,
            lambda s, b=band: events.poisson_gaussian(b * q, s, steps=math.ceil(steps / b)),
        )
        error = sigma * BandedToeplitz.optimal(steps, band).prefix_rmse(steps)
        if best is None or error < best[1]:
            best = (band, error)
    assert best is not None
    return best


def blt(epsilon: float, q: float, steps: int) -> float:
    separation = math.floor(1 / q)
    strategy = BufferedToeplitz.optimal(steps, separation)
    sensitivity = math.sqrt(strategy.sensitivity_squared(steps, separation)[-1])
    return gaussian_noise_multiplier(epsilon, DELTA) * sensitivity * strategy.prefix_rmse(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 8.0])
    parser.add_argument("--sample-rate", type=float, default=0.01)
    args = parser.parse_args()
    q = args.sample_rate
    print(
        f"| T | ε | independent | best band: b, error (ratio) | BLT, separation {math.floor(1 / q)}"
        f" (ratio) | goal ≤ 1/{GOAL:g} |"
    )
    print("|---|---|---|---|---|---|")
    met, missed = [], []
    start = time.perf_counter()
    for steps in args.steps:
        for epsilon in args.epsilons:
            base = independent(epsilon, q, steps)
            band, band_error = banded(epsilon, q, steps)
            blt_error = blt(epsilon, q, steps)
            best = min(band_error, blt_error) / base
            (met if best <= 1 / GOAL else missed).append(f"T = {steps}, ε = {epsilon:g}")
            print(
                f"| {steps} | {epsilon:g} | {base:.3g} | b = {band}: {band_error:.3g} "
                f"({band_error / base:.2f}) | {blt_error:.3g} ({blt_error / base:.2f}) | "
                f"{'met' if best <= 1 / GOAL else 'missed'} ({best:.2f}) |",
                flush=True,
            )
    print(f"\nGoal ({GOAL:g}× below independent) met at: {'; '.join(met) or 'none'}")
    print(f"Missed at: {'; '.join(missed) or 'none'}")
    print(f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
