"""Dopamine (Malekzadeh et al., Imperial, 2021): DP-FedSGD with secure aggregation.

The paper grades diabetic retinopathy (5 classes) with SqueezeNet over 10 iid hospitals
and compares five ways to train: C (pooled, non-private), CDP (pooled, DP-SGD), F
(FedAvg, non-private), FPDP (FedAvg with each hospital running DP-SGD on its own) and
Dopamine (one DP-SGD step per round at every hospital, each adding 1/K of the noise,
summed securely). Claims (their Fig. 1, δ = 1e-4): Dopamine's ε is close to CDP's and
its accuracy above FPDP's, whose per-hospital noise "makes learning impossible".

`dpfl reproduce dopamine` runs the five on PneumoniaMNIST (pediatric chest X-rays,
pneumonia vs normal, 28×28): the 5,856 images split iid over 10 hospitals, each keeping
its share of the official splits: about 471 training images, 52 validation, 62 test.
Each method is tuned alike by `dpfl tune` (`Tuning`): the same grid of step sizes, the
same law of the number of candidates K, drawn from the same seed for every method, each
candidate validated on the hospitals' shares of the official val split (never training
or test records), the selection charged in ε; the released model is tested on the 624
official test images. The candidates' Dopamine sums in the clear within one process
("ideal"): the BFV sum equals it to 1e-8 a parameter (below) and is far slower.

The untuned comparison on RetinaMNIST is `dpfl reproduce dopamine-retinamnist`
(`dopamine_retinamnist`).
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

from dpfl.experiments.recipes.base import Plan, Recipe, Row, Scale, Selected, Tuning, real_folder
from dpfl.experiments.recipes.clinical_common import (
    by_scale,
    metric_text,
)
from dpfl.experiments.study.config import Study

NAME = "dopamine"
TITLE = "Dopamine (Imperial): DP-FedSGD with secure aggregation vs C, CDP, F, FPDP"
HOSPITALS = 10
DELTA = 1e-4
"""The paper's δ for every DP method."""
PNEUMONIA_POOL = 4708
"""PneumoniaMNIST's official training images: each DP-SGD step samples a record with
q = 64/4,708 (CDP's 64 of the pool, a hospital's 6.4 of its ~471)."""
LEARNING_RATES = [0.01, 0.02, 0.05, 0.1]
"""The tuned methods' one grid (the RetinaMNIST tuned studies' too)."""

METHODS = {
    ("centralized", False): "C",
    ("centralized", True): "CDP",
    ("fedavg", False): "F",
    ("fedavg", True): "FPDP",
    ("fedsgd_secure", True): "Dopamine",
}
TAGS = {"C": "c", "F": "f", "CDP": "cdp", "FPDP": "fpdp", "Dopamine": "dopamine"}
"""Each method's tag in the tuned studies' names."""
TRAINING = {
    "momentum": 0.9,
    "clip_norm": 1.0,
    "local_epochs": 1.0,
    "epochs_per_round": 1.0,
}
"""Shared by all five (C and F drop the clipping): one local epoch a round for FedAvg, one
pooled epoch a round for C and CDP, one step a round for Dopamine (whose rounds are
epochs / q): the same number of DP-SGD steps per record. Momentum as in Dopamine's
Algorithm 1."""
CLAIMS = {
    "C": "best accuracy, no privacy (SqueezeNet reaches about 80 % on APTOS)",
    "CDP": "the DP reference: Dopamine's ε should be close to CDP's",
    "F": "competitive with C",
    "FPDP": "K times CDP's noise per hospital for the same ε; learning 'impossible'",
    "Dopamine": "ε close to CDP's, accuracy above FPDP's",
}
ORDER = ("C", "F", "Dopamine", "FPDP")
"""The paper's ordering by accuracy: C ≥ F > Dopamine > FPDP."""


def methods(epochs: int, pool: int) -> list[tuple[str, int, dict[str, object]]]:
    """(tag, rounds, algorithm) of the pooled, FedAvg and Dopamine runs of `epochs`
    epochs, each DP-SGD step at q = 64 / `pool`."""
    rate = 64 / pool
    local = 64 / HOSPITALS
    return [
        ("pooled", epochs, {"name": "centralized", "expected_batch_size": 64.0}),
        ("fedavg", epochs, {"name": "fedavg", "expected_batch_size": local, "client_rate": 0.5}),
        (
            "dopamine",
            round(epochs / rate),
            {"name": "fedsgd_secure", "expected_batch_size": local},
        ),
    ]


def pneumonia_folder(data_dir: Path | None, notes: list[str]) -> Path | None:
    """PneumoniaMNIST's folder in `data_dir`; None, said in `notes`, where it is absent."""
    folder = real_folder(data_dir, "pneumoniamnist", "the PneumoniaMNIST study", notes)
    if folder is None:
        notes.append("no PneumoniaMNIST: nothing to run")
    return folder


def studies(data_dir: Path | None, scale: Scale) -> Plan:
    """The five methods on PneumoniaMNIST, each tuned alike (`Tuning`) at every ε and
    seed: C and F once a seed, CDP, FPDP and Dopamine once a seed and budget."""
    notes: list[str] = []
    folder = pneumonia_folder(data_dir, notes)
    if folder is None:
        return Plan([], notes)
    epochs = by_scale(scale, 1, 5, 20)
    mean = by_scale(scale, 1.0, 3.0, 4.0)
    base = {
        "metrics": ["accuracy", "auroc"],
        "data": {
            "dataset": "pneumoniamnist",
            "path": str(folder),
            "partition": {"kind": "iid", "silos": HOSPITALS},
            "split": "official",
        },
        "tune": {"validation": "official"},
        "model": {"kind": "small_cnn"},
    }  # Dopamine sums in the clear: fedsgd_secure's default, "ideal"
    plain: list[dict[str, object]] = [{"private": False}]
    budgets = [
        {"epsilon": e, "delta": DELTA} for e in by_scale(scale, [3.0], [3.0, 1.0], [3.0, 1.0])
    ]
    plan = Plan([], notes)
    for seed in range(by_scale(scale, 1, 3, 5)):
        for tag, rounds, algorithm in methods(epochs, PNEUMONIA_POOL):
            trained = {**algorithm, **TRAINING, "learning_rate": LEARNING_RATES}
            for privacy in budgets if tag == "dopamine" else plain + budgets:
                method = METHODS[str(algorithm["name"]), "epsilon" in privacy]
                level = f"-eps{privacy['epsilon']:g}" if "epsilon" in privacy else ""
                raw = {
                    **base,
                    "name": f"dopamine-pneumonia-{TAGS[method]}{level}-seed{seed}",
                    "seed": seed,
                    "rounds": rounds,
                    "eval_every": "end",
                    "algorithm": trained,
                    "privacy": privacy,
                }
                plan.tuned.append(Tuning(Study(raw, source=NAME), "accuracy", mean))
    return plan


def order(item: tuple[tuple[str, float | None], object]) -> tuple[float, int]:
    (method, epsilon), _ = item
    return (epsilon or 0.0, list(CLAIMS).index(method))


def compare_tuned(selected: list[Selected]) -> list[Row]:
    """A row per method and budget (its seeds together), then per budget whether the
    paper's ordering C ≥ F > Dopamine > FPDP holds, in accuracy and in AUROC."""
    groups: dict[tuple[str, float | None], list[Selected]] = {}
    for one in selected:
        config = one.tuning.study.points[0][1]
        method = METHODS[config.algorithm.name, config.privacy.private]
        groups.setdefault((method, config.privacy.epsilon), []).append(one)
    rows = [
        _tuned_row(method, epsilon, chosen)
        for (method, epsilon), chosen in sorted(groups.items(), key=order)
    ]
    for epsilon in sorted({e for _, e in groups if e is not None}):
        keys = [(m, None if m in ("C", "F") else epsilon) for m in ORDER]
        if all(key in groups for key in keys):
            rows.append(_ordering_row(epsilon, [groups[key] for key in keys]))
    return rows


def _values(chosen: list[Selected], metric: str) -> list[float]:
    """The metric on the test set, one value per seed."""
    return [one.tuned.test_metrics[metric] for one in chosen]


def _tuned_row(method: str, epsilon: float | None, chosen: list[Selected]) -> Row:
    rates = ", ".join(f"{one.tuned.point['algorithm.learning_rate']:g}" for one in chosen)
    ours = f"accuracy {metric_text(_values(chosen, 'accuracy'), percent=True)}, AUROC "
    ours += f"{metric_text(_values(chosen, 'auroc'))}; η chosen {rates}"
    if epsilon is not None:
        spent = max(one.epsilon for one in chosen)
        sigmas = sorted({f"{one.tuned.noise_multiplier:.3g}" for one in chosen})
        ours += f"; ε = {spent:.3g} (budget {epsilon:g}), σ = {', '.join(sigmas)}"
    level = "" if epsilon is None else f", ε budget {epsilon:g}"
    mean = chosen[0].tuned.mean
    return Row(
        f"PneumoniaMNIST, {HOSPITALS} iid hospitals, tuned: {method}{level}",
        CLAIMS[method],
        ours,
        f"{len(chosen)} seed{'s' * (len(chosen) > 1)}; the best of K candidates (mean "
        f"{mean:g}), validated on the official val split, tested on the official 624 "
        "test images",
        trials=len(chosen),
    )


def _ordering_row(epsilon: float, methods: list[list[Selected]]) -> Row:
    """Each step of the ordering (`ORDER`, the methods' selections in that order) by its
    means over seeds: 'holds' or 'not', and 'within one sd' where the two means are
    closer than the larger of their sds."""
    parts = []
    for metric, shown in (("accuracy", 100.0), ("auroc", 1.0)):
        values = [_values(chosen, metric) for chosen in methods]
        steps = []
        for (a, b), sign, (x, y) in zip(
            itertools.pairwise(ORDER), ("≥", ">", ">"), itertools.pairwise(values), strict=True
        ):
            gap = statistics.fmean(x) - statistics.fmean(y)
            verdict = "holds" if gap > 0 or (sign == "≥" and gap == 0) else "not"
            spread = max((statistics.stdev(v) for v in (x, y) if len(v) > 1), default=0.0)
            close = " (within one sd)" if abs(gap) < spread else ""
            mean_a, mean_b = (f"{shown * statistics.fmean(v):.3g}" for v in (x, y))
            steps.append(f"{a} {mean_a} {sign} {b} {mean_b}: {verdict}{close}")
        parts.append(f"{metric}: " + "; ".join(steps))
    return Row(
        f"PneumoniaMNIST, ε budget {epsilon:g}: the ordering C ≥ F > Dopamine > FPDP",
        "C ≥ F > Dopamine > FPDP in accuracy (their Fig. 1)",
        " | ".join(parts),
        "means over seeds (accuracy in %); C and F are non-private, the same at every budget",
        trials=min(len(chosen) for chosen in methods),
    )


RECIPE = Recipe(
    name=NAME,
    title=TITLE,
    studies=studies,
    compare=lambda runs, store: [],  # every study is tuned: `compare_tuned`
    compare_tuned=compare_tuned,
)
