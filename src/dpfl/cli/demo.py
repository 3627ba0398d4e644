"""`dpfl demo`: the privacy–utility trade-off of DP FedAvg over three hospitals.

scikit-learn's embedded breast-cancer table (569 patients, scaled by published ranges)
is split over three hospitals; each keeps about a fifth of its patients for testing.
FedAvg with local Poisson DP-SGD runs 20 rounds, three trials stacked, at each budget
ε ∈ {0.5, 1, 2, 4, 8} per hospital (δ = 1e-5), its noise calibrated so that every
hospital ends at ε ≤ the budget, and once more without privacy (the same algorithm on
the same batches, without clipping or noise: the reference, ε = ∞). The six points are
one results store: a study whose grid axis is `privacy.epsilon`, and the non-private
reference as a second study in the same directory (a grid axis varies one key, and the
reference differs in `private`, not in ε), run together in `-j` worker processes (by
default one per core). The table (one row per point: σ, accuracy and AUROC on the union
of the hospitals' test sets, the worst ε spent and each hospital's) is read from the
store, whose ε come from each run's ledger; `--json` prints it as JSON. The HTML report,
whose privacy–utility figure draws the curve, is written beside it. The noise is seeded
(research noise), so the table says that the model must not be released. About 45 s on
two cores.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from .common import console, errors, mean_std, print_json, reported_errors

if TYPE_CHECKING:
    from dpfl.experiments.results.store import RunRow

BUDGETS = (0.5, 1, 2, 4, 8)
"""ε per hospital of the private points."""
DELTA = 1e-5
_COMMON: dict[str, Any] = {
    "rounds": 20,
    "trials": 3,
    "seed": 0,
    "eval_every": 5,  # the test sets scored after rounds 5, 10, 15, 20, not every round
    "metrics": ["accuracy", "auroc"],
    "data": {
        "dataset": "breast_cancer",
        "partition": {"kind": "iid", "silos": 3},
        # 20.3 %, not 20 %, of each hospital's patients held out for testing: every
        # hospital then trains on 151 patients (not 152, 152, 151), so one noise
        # calibration, most of a private point's time, serves all three
        "test_fraction": 0.203,
    },
    "model": {"kind": "logistic_regression"},
    "algorithm": {"name": "fedavg", "learning_rate": 1.0, "clip_norm": 1.0},
}
STUDY: dict[str, Any] = {
    **_COMMON,
    "name": "demo: DP FedAvg over three hospitals",
    # largest ε first: its calibration is the slowest, so the workers end together
    "privacy": {"epsilon": sorted(BUDGETS, reverse=True), "delta": DELTA},
}
REFERENCE: dict[str, Any] = {
    **_COMMON,
    "name": "demo: non-private FedAvg over three hospitals",
    "privacy": {"private": False, "delta": DELTA},
}
METRICS_ON = "the union of the three hospitals' test sets"
POINTS = len(BUDGETS) + 1


def demo(
    out: Annotated[
        Path | None, typer.Option(help="Study directory (default: a temporary one).")
    ] = None,
    workers: Annotated[
        int,
        typer.Option("--workers", "-j", min=1, help="Points run at once, one per process."),
    ] = min(os.cpu_count() or 1, POINTS),
    json: Annotated[bool, typer.Option("--json", help="Print the table as one JSON object.")] = (
        False
    ),
) -> None:
    """DP FedAvg over three hospitals at ε = 0.5 to 8 and without privacy: print the
    privacy–utility table, write the report."""
    from dpfl.experiments.results.datasheet import RESEARCH_NOISE
    from dpfl.experiments.results.report import write_report
    from dpfl.experiments.study.config import Study
    from dpfl.experiments.study.runner import run_study

    directory = out or Path(tempfile.mkdtemp(prefix="dpfl-demo-"))
    with reported_errors():
        runs = run_study(
            [Study(STUDY, "dpfl demo"), Study(REFERENCE, "dpfl demo")],
            directory,
            workers=workers,
            progress=not json,
            report=(lambda line: None) if json else errors.print,
        )
        failed = [f"{_budget(run)}: {run.error}" for run in runs if run.status != "finished"]
        if failed:
            raise ValueError("demo points failed: " + "; ".join(failed))
        points = sorted(_points(directory, runs), key=_by_budget)
        report = write_report(directory)
        if json:
            seeded = any(p["research_noise"] for p in points)
            print_json(
                {
                    "study": STUDY["name"],
                    "directory": str(directory),
                    "report": str(report),
                    "metrics_on": METRICS_ON,
                    "epsilon": "read from each point's ledger at its δ: per hospital the "
                    "largest over its trials; per point the largest over hospitals and trials "
                    "(the worst case), by the accountant that enforced the budgets; null: ∞ "
                    "(the non-private reference)",
                    "caveat": RESEARCH_NOISE if seeded else None,
                    "points": points,
                }
            )
            return
        console.print(_table(points))
        console.print(f"report: {report}")
        console.print(
            f"ledgers: {directory / 'ledgers'}/<run>.sqlite, one per point "
            "(dpfl privacy ledger FILE; --json names each)"
        )


def _points(directory: Path, runs: list[RunRow]) -> list[dict[str, Any]]:
    """One JSON-ready dict per run: its budget, σ, metrics and ε, worst and per hospital."""
    from dpfl.experiments.results.datasheet import research_noise
    from dpfl.experiments.results.summary import run_summaries, silo_summaries

    summaries = {s["id"]: s for s in run_summaries(directory)}
    points = []
    for run in runs:
        s = summaries[run.id]
        private = s["epsilon"] is not None
        own = s["accountant"]
        points.append(
            {
                "run": run.id,
                "private": private,
                "epsilon_budget": run.config["privacy"]["epsilon"] if private else None,
                "delta": run.config["privacy"]["delta"] if private else None,
                "noise_multiplier": s["noise_multiplier"],
                "accountant": own if private else None,
                "epsilon": s["epsilon"][own] if private else None,
                "epsilon_by_accountant": s["epsilon"],
                "research_noise": private and research_noise(run),
                "metrics": s["metrics"],
                "spread": s["spread"],
                "trials": s["trials"],
                "rounds": s["rounds"],
                "ledger": str(directory / str(run.ledger)),
                "hospitals": [
                    {
                        "silo": silo["silo"],
                        "epsilon": silo["epsilon"].get(own) if private else None,
                        "epsilon_by_accountant": silo["epsilon"] or None,
                        "delta": silo["delta"],
                        "metrics": silo["metrics"],
                    }
                    for silo in silo_summaries(directory, run.id)
                ],
            }
        )
    return points


def _by_budget(point: dict[str, Any]) -> float:
    budget = point["epsilon_budget"]
    return math.inf if budget is None else float(budget)


def _budget(run: RunRow) -> str:
    privacy = run.config["privacy"]
    return f"ε = {privacy['epsilon']:g}" if privacy["private"] else "non-private"


def _table(points: list[dict[str, Any]]) -> Table:
    from dpfl.experiments.results.datasheet import RESEARCH_MARK, RESEARCH_NOISE

    private = [p for p in points if p["private"]]
    own = private[0]["accountant"] if private else "pld"
    other = "rdp" if own == "pld" else "pld"
    seeded = any(p["research_noise"] for p in points)
    mark = f" {RESEARCH_MARK}" if seeded else ""
    first = points[0]
    hospitals = [h["silo"] for h in first["hospitals"]]
    table = Table(
        title=f"{STUDY['name']}: privacy–utility, {first['trials']} trials × "
        f"{first['rounds']} rounds, δ = {_delta_text()} per hospital, σ calibrated to each budget",
        caption=f"accuracy, AUROC: on {METRICS_ON}, mean ± sample std over {first['spread']}. "
        f"ε spent: read from each point's ledger by {own.upper()}, which enforced the "
        "budgets, the largest over hospitals and trials (the worst case); per hospital "
        f"({', '.join(hospitals)}): each the largest over its trials; ε ({other.upper()}): "
        "the worst case by the accountant not enforced. "
        "ε = ∞: the non-private reference (no clipping, no noise)."
        + (f" {RESEARCH_MARK} {RESEARCH_NOISE}" if seeded else ""),
    )
    for column in (
        "ε budget",
        "σ",
        "accuracy",
        "AUROC",
        f"ε spent ({own.upper()}){mark}",
        f"per hospital ({own.upper()})",
        f"ε ({other.upper()})",
    ):
        table.add_column(column, justify="right", no_wrap=True)
    for p in points:
        if p["private"]:
            spent = p["epsilon_by_accountant"]
            row = [
                f"{p['epsilon_budget']:g}",
                f"{p['noise_multiplier']:.4f}",
                f"{spent[own]:.4f}",
                " · ".join(f"{h['epsilon']:.4f}" for h in p["hospitals"]),
                f"{spent[other]:.4f}",
            ]
        else:
            row = ["∞", "—", "∞", "∞", "∞"]
        table.add_row(
            *row[:2],
            mean_std(p["metrics"].get("accuracy")),
            mean_std(p["metrics"].get("auroc")),
            *row[2:],
        )
    return table


def _delta_text() -> str:
    return format(DELTA, "g").replace("e-0", "e-")  # 1e-5, not 1e-05
