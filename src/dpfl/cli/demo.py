"""`dpfl demo`: three hospitals train DP FedAvg on breast cancer at ε = 1 each.

scikit-learn's embedded breast-cancer table (569 patients, scaled by published ranges)
is split over three hospitals; each keeps 20 % of its patients for testing. FedAvg with
local Poisson DP-SGD runs 20 rounds, its noise calibrated so that every hospital ends
at ε ≤ 1, δ = 1e-5, three trials stacked. The table is read from the study's results
store, whose ε come from each run's ledger (per hospital, the largest over its trials);
the HTML report is written beside it. The noise is seeded (research noise), so the table
says that the model must not be released.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from .common import console, errors, reported_errors

STUDY: dict[str, Any] = {
    "name": "demo: DP FedAvg over three hospitals",
    "rounds": 20,
    "trials": 3,
    "seed": 0,
    "metrics": ["accuracy", "auroc"],
    "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 3}},
    "model": {"kind": "logistic_regression"},
    "algorithm": {"name": "fedavg", "learning_rate": 1.0, "clip_norm": 1.0},
    "privacy": {"epsilon": 1.0, "delta": 1e-5},
}


def demo(
    out: Annotated[
        Path | None, typer.Option(help="Study directory (default: a temporary one).")
    ] = None,
) -> None:
    """Train DP FedAvg over three hospitals at ε = 1 each; print the table, write the report."""
    from dpfl.experiments.config import Study
    from dpfl.experiments.datasheet import RESEARCH_MARK, RESEARCH_NOISE, research_noise
    from dpfl.experiments.report import write_report
    from dpfl.experiments.runner import run_study
    from dpfl.experiments.store import enforcing_accountant
    from dpfl.experiments.summary import silo_summaries

    directory = out or Path(tempfile.mkdtemp(prefix="dpfl-demo-"))
    with reported_errors():
        (run,) = run_study(Study(STUDY, "dpfl demo"), directory, progress=True, report=errors.print)
        if run.status != "finished":
            raise ValueError(f"the demo run failed: {run.error}")
        seeded = research_noise(run)
        table = Table(
            title=f"{STUDY['name']}: {run.trials} trials, {run.rounds_completed} rounds, "
            f"σ = {run.noise_multiplier:.4f} (calibrated)",
            caption=f"accuracy, AUROC: mean ± sample std over {run.trials} trials × 1 seed; "
            "ε: per hospital, the largest over its trials."
            + (f" {RESEARCH_MARK} {RESEARCH_NOISE}" if seeded else ""),
        )
        own = enforcing_accountant(run)
        other = "rdp" if own == "pld" else "pld"
        mark = f" {RESEARCH_MARK}" if seeded else ""
        for column in (
            "hospital",
            "accuracy",
            "AUROC",
            f"ε ({own.upper()}, enforced){mark}",
            f"ε ({other.upper()}, not enforced)",
            "δ",
            "bytes up",
            "bytes down",
        ):
            table.add_column(column, justify="left" if column == "hospital" else "right")
        for silo in silo_summaries(directory, run.id):
            table.add_row(
                silo["silo"],
                _mean(silo["metrics"], "accuracy"),
                _mean(silo["metrics"], "auroc"),
                f"{silo['epsilon'][own]:.4f}",
                f"{silo['epsilon'][other]:.4f}",
                f"{silo['delta']:g}",
                f"{silo['bytes_up']:,.0f}",
                f"{silo['bytes_down']:,.0f}",
            )
        console.print(table)
        console.print(f"report: {write_report(directory)}")
        console.print(f"ledger: {directory / str(run.ledger)}  (dpfl privacy ledger FILE)")


def _mean(metrics: dict[str, dict[str, float]], name: str) -> str:
    value = metrics.get(name)
    return "—" if value is None else f"{value['mean']:.3f} ± {value['std']:.3f}"
