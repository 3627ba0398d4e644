"""DP statistics (`dpfl stats`) against the exact ones, on the real datasets.

For each dataset in ../shared/data (UCI heart disease, PhysioNet 2012, diabetes-130,
FLamby TCGA-BRCA's survival) and each ε in {0.1, 1} (per hospital, the whole stats run:
σ calibrated to it, δ = 1e-5), releases the pooled count, the mean of a column over its
declared range, its median by the noisy-histogram search (50 bins over the range) and,
for TCGA-BRCA, the Kaplan–Meier curve on yearly bins, `--repeats` times (seeds 0, 1, …),
and prints the mean absolute error against the exact figure: the count in records, the
mean and median as a fraction of the declared range (the datasets serve each column
scaled onto [0, 1] by its declared range), the KM curve as the sup distance to the exact
curve on the same bins. Also prints each figure's declared noise std beside its error.

    .venv/bin/python benchmarks/bench_stats.py --repeats 20
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.analytics import Count, KaplanMeier, Mean, Quantiles, Query, Records, curve, describe
from dpfl.experiments.study.analytics import cohort
from dpfl.experiments.study.config import StudyConfig
from dpfl.privacy import Budget, Ledger, calibrate_noise, events
from dpfl.secure import InTheClear

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
DELTA = 1e-5
YEARS = tuple(365.0 * y for y in (0, 1, 2, 3, 4, 5, 7, 10, 20))
DATASETS: dict[str, dict[str, Any]] = {
    "heart disease": {"dataset": "heart_disease", "path": "uci_heart_disease", "column": "age"},
    "PhysioNet 2012": {"dataset": "physionet2012", "path": "physionet2012", "column": "Age"},
    "diabetes-130": {
        "dataset": "diabetes130",
        "path": "diabetes130",
        "column": "age",
        "partition": {"kind": "iid", "silos": 5},
    },
    "TCGA-BRCA": {
        "dataset": "tcga_brca",
        "path": "fed_tcga_brca",
        "column": "age_at_index",
        "split": "official",
    },
}


def _cohort(spec: dict[str, Any]) -> dict[str, Records]:
    data = {
        "dataset": spec["dataset"],
        "path": str(DATA / spec["path"]),
        "partition": spec.get("partition", {"kind": "natural"}),
        "split": spec.get("split", "stratified"),
    }
    config = StudyConfig.model_validate(
        {"rounds": 1, "data": data, "algorithm": {"name": "fedavg"}, "privacy": {"epsilon": 1}}
    )
    return cohort(config)[0]


def _exact(records: dict[str, Records], column: str, km: KaplanMeier | None) -> dict[str, Any]:
    values = np.concatenate([r.column(column) for r in records.values()])
    exact = {"count": len(values), "mean": float(np.clip(values, 0, 1).mean())}
    exact["median"] = float(np.median(values))
    if km is not None:
        exact["km"] = curve(sum(km.vector(r, 0, 1) for r in records.values()))[0][0]
    return exact


def measure(name: str, spec: dict[str, Any], epsilon: float, repeats: int) -> dict[str, Any]:
    """Mean absolute errors (and declared stds) of one dataset's figures at ε."""
    records = _cohort(spec)
    column = spec["column"]
    survival = next(iter(records.values())).time is not None
    km = KaplanMeier(YEARS) if survival else None
    queries: list[Query] = [
        Count(),
        Mean(column, (0.0, 1.0)),
        Quantiles(column, tuple(np.linspace(0, 1, 51)), (0.5,)),
    ]
    queries += [km] if km is not None else []
    sigma = calibrate_noise(epsilon, DELTA, lambda s: events.gaussian(s, count=len(queries)))
    exact = _exact(records, column, km)
    errors: dict[str, list[float]] = {"count": [], "mean": [], "median": [], "km": []}
    stds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder, Ledger(Path(folder) / "l.sqlite") as book:
        book.register_silos(
            {n: Budget(math.inf, DELTA, events.Neighbouring.ADD_REMOVE, None) for n in records}
        )
        for seed in range(repeats):
            run = describe(
                records,
                queries,
                sigma,
                ledger=book,
                accounts={n: [n] for n in records},
                summing=InTheClear(),
                rng=np.random.default_rng(seed),
            )
            by = {(f.statistic, f.name): f for f in run.figures}
            shown = {
                "count": by[("counts", "pooled")],
                "mean": by[(f"mean of {column}", "mean")],
                "median": by[(f"quantiles of {column}", "quantile 0.5")],
            }
            for key, figure in shown.items():
                errors[key].append(abs(figure.value - exact[key]))
                stds[key] = figure.std
            if km is not None:
                curve = [f.value for f in run.figures if f.statistic == km.title]
                errors["km"].append(float(np.max(np.abs(np.array(curve) - exact["km"]))))
    return {
        "dataset": name,
        "epsilon": epsilon,
        "sigma": sigma,
        "records": exact["count"],
        "hospitals": len(records),
        **{k: float(np.mean(v)) for k, v in errors.items() if v},
        **{f"{k} std": v for k, v in stds.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--datasets", nargs="*", default=list(DATASETS))
    args = parser.parse_args()
    print(
        "| dataset | ε | σ | records (hospitals) | count error (std) | mean error (std) "
        "| median error (interval std) | KM sup distance |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.datasets:
        for epsilon in (0.1, 1.0):
            r = measure(name, DATASETS[name], epsilon, args.repeats)
            km = f"{r['km']:.3f}" if "km" in r else "—"
            print(
                f"| {name} | {epsilon:g} | {r['sigma']:.1f} | {r['records']} ({r['hospitals']}) "
                f"| {r['count']:.1f} ({r['count std']:.1f}) "
                f"| {r['mean']:.4f} ({r['mean std']:.4f}) "
                f"| {r['median']:.4f} ({r['median std']:.4f}) | {km} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
