"""Small seeded studies for the audit tests: logistic regression over silos whose last
features no record uses (rare codes never seen), so a Dirac canary's direction is hidden
by the mechanism's noise alone."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import dpfl
from dpfl.federation.algorithms.base import Algorithm
from dpfl.federation.silo import Silo
from dpfl.privacy import calibrate_noise, events


def synthetic_silos(
    silos: int = 3, records: int = 100, informative: int = 8, unused: int = 4, seed: int = 0
) -> list[Silo]:
    """`silos` silos of `records` training records and a quarter as many test records."""
    rng = np.random.default_rng(seed)
    coefficients = rng.normal(size=informative)
    made = []
    for k in range(silos):
        n = records + records // 4
        x = np.zeros((n, informative + unused))
        x[:, :informative] = rng.normal(size=(n, informative)) / np.sqrt(informative)
        y = (rng.random(n) < 1 / (1 + np.exp(-3 * x[:, :informative] @ coefficients))).astype(int)
        made.append(
            Silo.from_arrays(
                f"silo-{k}",
                x[:records],
                y[:records],
                x[records:],
                y[records:],
                public_size=records,
            )
        )
    return made


def fedavg(sigma: float, **options: object) -> dpfl.algorithms.FedAvg:
    config = dpfl.DPSGDConfig(clip_norm=1.0, noise_multiplier=sigma, learning_rate=1.0)
    return dpfl.algorithms.FedAvg(
        model=dpfl.models.logistic_regression(12), loss=dpfl.local.bce, dpsgd=config, **options
    )


def calibrated(algorithm: Algorithm, silos: list[Silo], rounds: int, epsilon: float) -> Algorithm:
    """The algorithm at the least σ (by RDP, to 0.01) that keeps every silo's plan within
    ε at δ = 1e-5; the audits' ledgers account it by PLD, tighter still, so ε ≤ 1 there
    too. AOP sets its own noise from its configured budget."""
    if algorithm.sets_own_noise:
        return algorithm
    infos = [s.info for s in silos]
    smallest = min(infos, key=lambda s: s.public_size)  # the largest sampling rate

    def plan(sigma: float) -> events.PrivacyEvent:
        one = algorithm.with_noise(sigma).participation_event(smallest, infos)
        return events.repeat(one, rounds)

    return algorithm.with_noise(_least_sigma(plan(1.0).to_json(), epsilon, plan))


_SIGMAS: dict[tuple[str, float], float] = {}


def _least_sigma(key: str, epsilon: float, plan: Callable[[float], events.PrivacyEvent]) -> float:
    """One RDP calibration per plan (the tests share plans: each costs seconds)."""
    if (key, epsilon) not in _SIGMAS:
        _SIGMAS[key, epsilon] = calibrate_noise(
            epsilon, 1e-5, plan, accountant="rdp", tolerance=0.01
        )
    return _SIGMAS[key, epsilon]
