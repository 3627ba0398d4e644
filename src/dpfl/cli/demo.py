"""`dpfl demo`: until the federated demo lands, a privacy dry run that shows the ledger.

Three hospitals share scikit-learn's breast-cancer table (569 patients). Each plans 20
rounds of one epoch of Poisson DP-SGD (expected batch 16) at ε = 1, δ = 1e-5; the
noise is calibrated to that budget, every round is recorded in a ledger, and the table
is read back from the ledger. No model is trained yet.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from dpfl.privacy import Accountant, Ledger, calibration, events

from .common import accounts_table, console, reported_errors

HOSPITAL_SIZES = {"hospital-a": 190, "hospital-b": 190, "hospital-c": 189}
EPSILON, DELTA, ROUNDS, EXPECTED_BATCH = 1.0, 1e-5, 20, 16


def demo(
    out: Annotated[
        Path | None, typer.Option(help="Directory for the ledger (default: a temporary one).")
    ] = None,
) -> None:
    """Privacy dry run over three hospitals: calibrate, record every round, show the ledger."""
    directory = out or Path(tempfile.mkdtemp(prefix="dpfl-demo-"))
    path = directory / "ledger.sqlite"
    path.unlink(missing_ok=True)
    with reported_errors(), Ledger(path) as ledger:
        for hospital, size in HOSPITAL_SIZES.items():
            q = EXPECTED_BATCH / size
            steps_per_round = round(1 / q)  # one epoch in expectation
            sigma = calibration.calibrate_dpsgd_noise(
                EPSILON, DELTA, sample_rate=q, steps=ROUNDS * steps_per_round
            )
            round_event = events.poisson_gaussian(q, sigma, steps=steps_per_round)
            ledger.register_silo(hospital, epsilon=EPSILON, delta=DELTA, size=size)
            if not ledger.can_afford(hospital, events.repeat(round_event, ROUNDS)):
                raise AssertionError("calibrated noise must fit the plan")  # never reached
            for r in range(ROUNDS):
                ledger.record(hospital, round_event, label="local DP-SGD epoch", round=r)
            console.print(
                f"{hospital}: n={size}, q={q:.4f}, σ={sigma:.4f}, "
                f"{ROUNDS} rounds × {steps_per_round} steps"
            )
        console.print(
            accounts_table(
                f"privacy ledger {path}",
                ledger.accounts(),
                ledger.accounts(accountant=Accountant.RDP),
            )
        )
