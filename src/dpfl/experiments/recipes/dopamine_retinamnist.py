"""Dopamine's five methods on RetinaMNIST, untuned: the comparison `dpfl reproduce
dopamine` ran before PneumoniaMNIST (`dopamine` has the paper and the methods).

It runs them on RetinaMNIST (28×28 DR grades 0-4, MedMNIST from DeepDRiD; the paper
used the APTOS-2019 images) split iid over 10 hospitals, with dpfl's small CNN, at one
shared step size.
Every private method gets the same ε budget and samples each record with the same
probability q per step (CDP's batch over the pool, the hospitals' batches over their own
records), so their steps are the same Poisson-Gaussian events and only the noise each
step needs (σ, calibrated to ε over the whole run by the runner) and where it is added
differ. F and FPDP follow the paper: half of the hospitals a round, local epochs. C and
F are plain SGD (no clipping) with the same step size and momentum.

Dopamine's sum is encrypted, as in the paper's Appendix D: BFV homomorphic encryption
(TenSEAL, N = 8192; the paper used PySEAL with N = 4096), hospitals encrypt, the server
adds ciphertexts, a key holder that is not the server decrypts the sum. Its fixed point
(2^-30 a value) changes the model by less than 10 × 2^-31 a parameter a round, so the
accuracy is that of the sum in the clear (tests/federation/test_fedsgd_secure.py).
"""

from __future__ import annotations

from pathlib import Path

from dpfl.experiments.recipes.base import Plan, Recipe, Row, Scale, fewest_trials, real_folder
from dpfl.experiments.recipes.clinical_common import (
    budget,
    by_scale,
    epsilon_text,
    metric_text,
    private,
    setting,
)
from dpfl.experiments.recipes.dopamine import (
    CLAIMS,
    DELTA,
    HOSPITALS,
    METHODS,
    TRAINING,
    methods,
    order,
)
from dpfl.experiments.results.store import ResultsStore, RunRow
from dpfl.experiments.study.config import Study

NAME = "dopamine-retinamnist"
TITLE = "Dopamine (Imperial) on RetinaMNIST, untuned: DP-FedSGD with secure aggregation"
POOL = 1280
"""RetinaMNIST's 1,600 images less the 20 % test split of each hospital: q = 64/1,280."""


def studies(data_dir: Path | None, scale: Scale) -> Plan:
    """The five methods on RetinaMNIST at one shared step size, untuned."""
    notes: list[str] = []
    folder = real_folder(data_dir, "retinamnist", "the RetinaMNIST study", notes)
    if folder is None:
        notes.append("no RetinaMNIST: nothing to run")
        return Plan([], notes)
    epochs = by_scale(scale, 1, 15, 100)
    base = {
        "trials": by_scale(scale, 1, 3, 5),
        "metrics": ["accuracy", "balanced_accuracy"],
        "data": {
            "dataset": "retinamnist",
            "path": str(folder),
            "partition": {"kind": "iid", "silos": HOSPITALS},
        },
        "model": {"kind": "small_cnn"},
    }
    epsilons = by_scale(scale, [4.0], [3.0], [1.0, 3.0])
    encrypted = {"dopamine": {"secure_aggregation": "he"}}
    plan = Plan([], notes)
    for tag, rounds, algorithm in methods(epochs, POOL):
        raw = {
            **base,
            **encrypted.get(tag, {}),
            "name": f"dopamine-{tag}",
            "rounds": rounds,
            "eval_every": rounds,
        }
        trained = {**algorithm, **TRAINING, "learning_rate": 0.05}
        dp = {**raw, "algorithm": trained, "privacy": budget(scale, epsilons, DELTA)}
        plan.studies.append(Study(dp, source=NAME))
        if tag != "dopamine":
            plain = {
                **raw,
                "name": f"dopamine-{tag}-plain",
                "algorithm": trained,
                "privacy": {"private": False},
            }
            plan.studies.append(Study(plain, source=NAME))
    return plan


def compare(runs: list[RunRow], store: ResultsStore) -> list[Row]:
    finished = [run for run in runs if run.status == "finished"]
    by_method: dict[tuple[str, float | None], RunRow] = {}
    for run in finished:
        method = METHODS[run.algorithm, private(run)]
        by_method[method, setting(run, "privacy.epsilon") if private(run) else None] = run
    rows = [
        _method_row(method, epsilon, run, store)
        for (method, epsilon), run in sorted(by_method.items(), key=order)
    ]
    for epsilon in sorted({e for _, e in by_method if e is not None}):
        dopamine, cdp, fpdp = (by_method.get((m, epsilon)) for m in ("Dopamine", "CDP", "FPDP"))
        if dopamine and cdp and fpdp:
            rows.append(_claim_row(epsilon, dopamine, cdp, fpdp, store))
    return rows


def _accuracy(store: ResultsStore, run: RunRow) -> str:
    return metric_text(store.final_metric(run, "accuracy"), percent=True)


def _method_row(method: str, epsilon: float | None, run: RunRow, store: ResultsStore) -> Row:
    ours = f"accuracy {_accuracy(store, run)}; {epsilon_text(store, [run])}"
    if private(run):
        ours += f", σ = {run.noise_multiplier:.3g}"
    if run.algorithm == "fedsgd_secure":
        summing = run.datasheet.get("secure_aggregation", "not recorded").split(" (")[0]
        ours += (
            f"; other hospitals' view ε = {store.epsilon_by_silo(run, 'hospitals').max:.3g}; "
            f"{run.rounds_completed} of {run.rounds} rounds"
            + (" (stopped at the budget)" if run.stopped_by_budget else "")
            + f"; secure sum: {summing}"
        )
    level = "" if epsilon is None else f", ε budget {epsilon:g}"
    return Row(
        f"RetinaMNIST, {HOSPITALS} iid hospitals: {method}{level}",
        CLAIMS[method],
        ours,
        "APTOS-2019 at 224×224 with SqueezeNet (paper) vs RetinaMNIST 28×28, small CNN",
        trials=run.trials,
    )


def _claim_row(
    epsilon: float, dopamine: RunRow, cdp: RunRow, fpdp: RunRow, store: ResultsStore
) -> Row:
    return Row(
        f"RetinaMNIST, ε budget {epsilon:g}: Dopamine vs CDP (ε) and vs FPDP (accuracy)",
        CLAIMS["Dopamine"],
        f"{epsilon_text(store, [dopamine])} vs {epsilon_text(store, [cdp])}; "
        f"accuracy {_accuracy(store, dopamine)} vs {_accuracy(store, fpdp)}",
        "all three calibrated to the same budget, so ε alone cannot separate them here",
        trials=fewest_trials([dopamine, cdp, fpdp]),
    )


RECIPE = Recipe(name=NAME, title=TITLE, studies=studies, compare=compare)
