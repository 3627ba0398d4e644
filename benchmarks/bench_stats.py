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

Then, on two survival cohorts with ties (scikit-survival's FLCHAIN, bundled, in 3
hospitals by a fixed hash of the row; TCGA-BRCA), through the Query API (no ledger):
quantiles 0.1–0.9 by dpfl's noisy-histogram search against OpenDP's quantile mechanism at
the same ε (where `opendp` imports: PYTHONPATH=/tmp/opendp); Kaplan–Meier against
scikit-survival's on the raw times at ε 0.5, 1, 4 (mean errors over `--releases`); and
every statistic's 95% interval coverage over `--seeds` releases (asserted by
tests/analytics/test_coverage.py).

    PYTHONPATH=src:/tmp/opendp .venv/bin/python benchmarks/bench_stats.py --repeats 20
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
from sksurv.nonparametric import kaplan_meier_estimator

from dpfl.analytics import (
    Count,
    Figure,
    Histogram,
    KaplanMeier,
    Mean,
    Quantiles,
    Query,
    Records,
    curve,
    describe,
    figures_of,
    joint_exponential_quantiles,
)
from dpfl.analytics.coverage import coverage, flchain
from dpfl.experiments.study.analytics import cohort
from dpfl.experiments.study.config import StudyConfig
from dpfl.privacy import Budget, Ledger, calibrate_noise, events
from dpfl.secure import InTheClear

DATA = Path(
    os.environ.get("DPFL_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)
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


FLCHAIN_YEARS = tuple(365.0 * y for y in range(13))
PROBABILITIES = (0.1, 0.25, 0.5, 0.75, 0.9)


def _cases() -> dict[str, dict[str, Any]]:
    """The two survival cohorts, each with a column's declared domain and its bins."""
    return {
        "FLCHAIN": {
            "hospitals": flchain(),
            "column": "age",
            "range": (40.0, 110.0),
            "quantile bins": tuple(np.arange(39.5, 111.0)),  # whole years: bins centred on them
            "candidates": tuple(np.arange(40.0, 111.0)),  # OpenDP's: the whole years
            "histogram bins": tuple(np.arange(40.0, 111.0, 10.0)),
            "count": Count((0, 1), {"sex": (1.0,)}),
            "years": FLCHAIN_YEARS,
        },
        "TCGA-BRCA": {
            "hospitals": _cohort(DATASETS["TCGA-BRCA"]),
            "column": "age_at_index",
            "range": (0.0, 1.0),
            "quantile bins": tuple(np.linspace(0.0, 1.0, 51)),
            "candidates": tuple(np.linspace(0.0, 1.0, 51)),
            "histogram bins": tuple(np.linspace(0.0, 1.0, 11)),
            "count": Count((), {"race_white": (1.0,)}),
            "years": YEARS,
        },
    }


def _vectors(query: Query, hospitals: dict[str, Records]) -> list[np.ndarray]:
    return [query.vector(r, k, len(hospitals)) for k, r in enumerate(hospitals.values())]


def _released(
    query: Query, vectors: list[np.ndarray], sigma: float, rng: np.random.Generator
) -> list[Figure]:
    """One release through the Query API: each hospital's vector plus its noise of std
    σ·Δ, the server's figures of the sum."""
    total = sum(v + rng.normal(0.0, sigma * query.sensitivity, v.shape) for v in vectors)
    names = [str(k) for k in range(len(vectors))]
    return figures_of([query], [np.asarray(total)], sigma, 1, names, rng).figures


def _sigma(epsilon: float, releases: int = 1) -> float:
    """σ of `releases` Gaussian releases at (ε, δ) per hospital; 0 at ε = ∞ (no noise)."""
    if math.isinf(epsilon):
        return 0.0
    return calibrate_noise(epsilon, DELTA, lambda s: events.gaussian(s, count=releases))


def _opendp(
    x: np.ndarray, candidates: tuple[float, ...], epsilon: float
) -> Callable[[], list[float]] | None:
    """OpenDP's quantile mechanism (`make_private_quantile`: the exponential mechanism
    over the candidates, pure ε-DP), one per probability at ε/5 each (basic composition),
    on the pooled column (ε = ∞: scale 0, its noiseless answer); None where OpenDP is not
    importable."""
    try:
        import opendp.prelude as dp
    except ImportError:
        return None
    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.symmetric_distance()

    def quantile(p: float, scale: float) -> Any:
        return dp.m.make_private_quantile(*space, dp.max_divergence(), list(candidates), p, scale)

    measurements = [
        quantile(p, 0.0)
        if math.isinf(epsilon)
        else dp.binary_search_chain(
            lambda scale, p=p: quantile(p, scale), d_in=1, d_out=epsilon / len(PROBABILITIES)
        )
        for p in PROBABILITIES
    ]
    data = [float(v) for v in x]
    return lambda: [float(m(data)) for m in measurements]


def quantile_errors(case: dict[str, Any], epsilon: float, repeats: int) -> dict[str, Any]:
    """Mean absolute error, over quantiles 0.1–0.9 and `repeats` releases, of dpfl's
    quantiles (one histogram at (ε, δ): central on the pooled column, and federated over
    the hospitals, each at ε) and OpenDP's (pure ε over the five); against the exact
    quantile (`np.quantile`, inverted CDF, of the column clipped to its domain)."""
    hospitals, column = case["hospitals"], case["column"]
    low, high = case["range"]
    x = np.clip(np.concatenate([r.column(column) for r in hospitals.values()]), low, high)
    exact = np.array([np.quantile(x, p, method="inverted_cdf") for p in PROBABILITIES])
    query = Quantiles(column, case["quantile bins"], PROBABILITIES)
    pooled = [sum(_vectors(query, hospitals))]
    sigma, rng = _sigma(epsilon), np.random.default_rng(0)
    errors: dict[str, list[float]] = {"central": [], "federated": [], "exp": [], "opendp": []}
    opendp = _opendp(x, case["candidates"], epsilon)
    for _ in range(repeats if sigma > 0 else 1):
        for key, vectors in (("central", pooled), ("federated", _vectors(query, hospitals))):
            values = [f.value for f in _released(query, vectors, sigma, rng)]
            errors[key].append(float(np.mean(np.abs(np.array(values) - exact))))
        if math.isfinite(epsilon):  # dpfl's exponential mechanism, one site, pure ε
            drawn = joint_exponential_quantiles(x, PROBABILITIES, low, high, epsilon, rng)
            errors["exp"].append(float(np.mean(np.abs(drawn - exact))))
        if opendp is not None:
            errors["opendp"].append(float(np.mean(np.abs(np.array(opendp()) - exact))))
    return {k: float(np.mean(v)) if v else None for k, v in errors.items()} | {"sigma": sigma}


def km_errors(case: dict[str, Any], epsilon: float, repeats: int) -> dict[str, float]:
    """Kaplan–Meier at ε per hospital (one release; ∞: the bins alone) against
    scikit-survival's Kaplan–Meier on the raw times at every edge: the mean sup distance
    and the mean signed error at the last edge over `repeats` releases."""
    hospitals, edges = case["hospitals"], case["years"]
    time = np.concatenate([r.time for r in hospitals.values()])
    event = np.concatenate([r.event for r in hospitals.values()]).astype(bool)
    at, survival = kaplan_meier_estimator(event, time)
    exact = survival[np.searchsorted(at, edges[1:], side="right") - 1]
    query = KaplanMeier(edges)
    vectors = _vectors(query, hospitals)
    sigma, rng = _sigma(epsilon), np.random.default_rng(0)
    sup, last = [], []
    for _ in range(repeats if sigma > 0 else 1):
        error = np.array([f.value for f in _released(query, vectors, sigma, rng)]) - exact
        sup.append(float(np.max(np.abs(error))))
        last.append(float(error[-1]))
    return {"sigma": sigma, "sup": float(np.mean(sup)), "last": float(np.mean(last))}


def coverages(case: dict[str, Any], sigma: float, seeds: int) -> list[tuple[str, str, np.ndarray]]:
    """Each statistic's coverage over `seeds` releases (as in
    tests/analytics/test_coverage.py): (statistic, what it covers, coverage per figure)."""
    hospitals, column, domain = case["hospitals"], case["column"], case["range"]
    x = np.clip(np.concatenate([r.column(column) for r in hospitals.values()]), *domain)
    found = []
    for query in (case["count"], Histogram(column, case["histogram bins"])):
        vectors = _vectors(query, hospitals)
        noiseless = np.asarray(sum(vectors))
        exact = query.figures(noiseless, 0.0, list(hospitals), np.random.default_rng(0))
        covered = coverage(query, lambda rng, v=vectors: v, [f.value for f in exact], sigma, seeds)
        found.append((query.title, "raw ± 1.96 std: the exact count", covered))
    mean = Mean(column, domain)
    vectors = _vectors(mean, hospitals)
    covered = coverage(mean, lambda rng: vectors, [len(x), x.mean(), x.std()], sigma, seeds)
    found.append(("mean", "COHORT: the exact mean", covered[1:2]))
    found.append(("standard deviation", "COHORT: the exact one", covered[2:]))
    quantiles = Quantiles(column, case["quantile bins"], PROBABILITIES)
    vectors_q = _vectors(quantiles, hospitals)
    truth = [np.quantile(x, p, method="inverted_cdf") for p in PROBABILITIES]
    covered = coverage(quantiles, lambda rng: vectors_q, truth, sigma, seeds)
    found.append(("quantiles 0.1–0.9", "COHORT: the exact quantile (≥ 95% by design)", covered))
    km = KaplanMeier(case["years"])

    def resampled(rng: np.random.Generator) -> list[np.ndarray]:
        again = {n: r.take(rng.integers(0, len(r), len(r))) for n, r in hospitals.items()}
        return _vectors(km, again)

    truth = curve(sum(_vectors(km, hospitals)))[0][0]
    covered = coverage(km, resampled, truth, sigma, seeds)
    found.append(("Kaplan–Meier", "POPULATION: the cohort's curve over resamples", covered))
    return found


def _row(*cells: object) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def _header(*titles: str) -> None:
    _row(*titles)
    print("|" + "---|" * len(titles))


def _main_table(datasets: list[str], repeats: int) -> None:
    _header(
        "dataset",
        "ε",
        "σ",
        "records (hospitals)",
        "count error (std)",
        "mean error (std)",
        "median error (interval std)",
        "KM sup distance",
    )
    for name in datasets:
        for epsilon in (0.1, 1.0):
            r = measure(name, DATASETS[name], epsilon, repeats)
            _row(
                name,
                f"{epsilon:g}",
                f"{r['sigma']:.1f}",
                f"{r['records']} ({r['hospitals']})",
                f"{r['count']:.1f} ({r['count std']:.1f})",
                f"{r['mean']:.4f} ({r['mean std']:.4f})",
                f"{r['median']:.4f} ({r['median std']:.4f})",
                f"{r['km']:.3f}" if "km" in r else "—",
            )


def _comparisons(cases: dict[str, dict[str, Any]], releases: int, seeds: int) -> None:
    try:
        opendp = f"OpenDP {version('opendp')}"
    except PackageNotFoundError:
        opendp = "OpenDP (not installed)"
    print(
        "\nQuantiles 0.1, 0.25, 0.5, 0.75, 0.9: mean absolute error against the exact "
        "(inverted-CDF) quantile, in the column's units (TCGA-BRCA's age on [0, 1]). dpfl: "
        "one Gaussian histogram at (ε, δ = 1e-5) per hospital, central (the pooled column, "
        f"one site) and federated (each hospital its noise), bins centred on FLCHAIN's whole "
        "years; dpfl JointExp: the exponential mechanism on the pooled column (one site), pure "
        f"ε over the five; {opendp}: make_private_quantile at pure ε/5 each (ε over the five, "
        "δ = 0), candidates the whole years (TCGA-BRCA: dpfl's bin edges). ε = ∞: no noise "
        "(the bins' and the definitions' floor).\n"
    )
    _header("dataset", "ε", "dpfl σ", "dpfl central", "dpfl federated", "dpfl JointExp", "OpenDP")
    for name, case in cases.items():
        for epsilon in (math.inf, 0.5, 1.0, 4.0):
            r = quantile_errors(case, epsilon, releases)
            theirs = "OpenDP not installed" if r["opendp"] is None else f"{r['opendp']:.4f}"
            row = (f"{epsilon:g}", f"{r['sigma']:.2f}", f"{r['central']:.4f}")
            joint = "—" if r["exp"] is None else f"{r['exp']:.4f}"
            _row(name, *row, f"{r['federated']:.4f}", joint, theirs)
    print(
        "\nKaplan–Meier (federated, one release at ε per hospital, δ = 1e-5) against "
        "scikit-survival's Kaplan–Meier on the raw times at each edge (ε = ∞: the bins "
        "alone).\n"
    )
    _header("dataset", "ε", "σ", "mean sup error", "mean signed error at the last edge")
    for name, case in cases.items():
        for epsilon in (math.inf, 0.5, 1.0, 4.0):
            r = km_errors(case, epsilon, releases)
            _row(name, f"{epsilon:g}", f"{r['sigma']:.2f}", f"{r['sup']:.4f}", f"{r['last']:+.4f}")
    sigma = _sigma(1.0, releases=5)
    print(
        f"\nCoverage of the 95% intervals over {seeds} releases at ε = 1 per hospital for "
        f"the five statistics (σ = {sigma:.2f}, δ = 1e-5): min–max over each's figures.\n"
    )
    _header("dataset", "statistic", "figures", "nominal", "measured", "covers")
    for name, case in cases.items():
        for statistic, covers, c in coverages(case, sigma, seeds):
            _row(name, statistic, len(c), "95%", f"{c.min():.1%}–{c.max():.1%}", covers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--releases", type=int, default=200, help="per quantile and KM error")
    parser.add_argument("--seeds", type=int, default=2000, help="releases per coverage")
    parser.add_argument("--datasets", nargs="*", default=list(DATASETS))
    args = parser.parse_args()
    _main_table(args.datasets, args.repeats)
    _comparisons(_cases(), args.releases, args.seeds)


if __name__ == "__main__":
    main()
