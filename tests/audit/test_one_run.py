"""The one-run audit: 100 Dirac canaries, each planted with probability 1/2, one run."""

from __future__ import annotations

import dpfl
from dpfl.audit.canaries import dirac_canaries
from dpfl.audit.one_run import one_run_audit

from .common import calibrated, synthetic_silos

SILOS = synthetic_silos(unused=100)


def fedavg(sigma: float) -> dpfl.algorithms.FedAvg:
    config = dpfl.DPSGDConfig(clip_norm=1.0, noise_multiplier=sigma, learning_rate=1.0)
    return dpfl.algorithms.FedAvg(
        model=dpfl.models.logistic_regression(108),
        loss=dpfl.local.bce,
        dpsgd=config,
        expected_batch_size=100.0,
    )


CANARIES = dirac_canaries(SILOS[0], 100, 1000.0)


def test_power_at_sigma_one_tenth() -> None:
    audit = one_run_audit(fedavg(0.1), SILOS, CANARIES, rounds=1, guesses=100)
    assert audit.epsilon_ledger > 90
    assert audit.correct >= 95
    assert audit.epsilon_lower > 2.5  # 100 of 100 right would give 3.49


def test_never_above_the_ledger_at_a_calibrated_sigma() -> None:
    algorithm = calibrated(fedavg(1.0), SILOS, rounds=2, epsilon=1.0)
    audit = one_run_audit(algorithm, SILOS, CANARIES, rounds=2, guesses=20)
    assert audit.epsilon_ledger <= 1.0
    assert not audit.exceeds_ledger, audit
