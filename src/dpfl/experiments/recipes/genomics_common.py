"""What the two gene-expression recipes (Owkin, A*STAR) share: their data and their table.

Both seeds train logistic regression on BC-TCGA (590 samples, tumour vs normal) split
between two centres. We have GSE7390 (real, 198 patients, distant metastasis: a smaller
and much harder task), the BC-TCGA-shaped generator, and the real BC-TCGA when a user
has the files. Each study splits the records IID into two silos, 80/20 train/test in
each; every seed is a new split (and, for the generator, a new draw of the data).
"""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.experiments.recipes.base import Row, Scale, mean_std, real_folder
from dpfl.experiments.results.store import ResultsStore, RunRow
from dpfl.experiments.study.datasets import build_silos, data_config

SILOS = 2
TEST_FRACTION = 0.2
SYNTHETIC_OPTIONS: dict[Scale, dict[str, Any]] = {
    "smoke": {"n_normal": 30, "n_tumour": 150, "n_genes": 300, "n_signal": 60},
    "default": {"n_signal": 60},
    "full": {"n_signal": 60},
}
"""BC-TCGA's shape (61 normal, 529 tumour, 17,814 genes) except in smoke tests; 60 signal
genes (the size of Wang's gene list) shifted by the generator's default ±1 sd."""

DATA_NOTES = {
    "gse7390": "GSE7390 is not BC-TCGA: 198 patients, label = distant metastasis "
    "(51 of 198), 76 Wang probesets; a smaller and much harder task than tumour vs normal",
    "synthetic_bc_tcga": "SYNTHETIC stand-in with BC-TCGA's shape; its difficulty (60 "
    "signal genes at ±1 sd) is the generator's, not BC-TCGA's",
    "bc_tcga": "real BC-TCGA, as the paper; splits and signature matching may differ",
}
DATA_LABELS = {
    "gse7390": "GSE7390",
    "synthetic_bc_tcga": "synthetic BC-TCGA",
    "bc_tcga": "BC-TCGA",
}


@dataclass(frozen=True)
class GenomicsData:
    """One dataset a recipe runs on: its registry name, folder, options and size."""

    name: str
    records: int
    path: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def section(self, **options: Any) -> dict[str, Any]:
        """The study's `data` table; `options` add to the dataset's own keys."""
        section: dict[str, Any] = {
            "dataset": self.name,
            **self.options,
            **options,
            "partition": {"kind": "iid", "silos": SILOS},
            "test_fraction": TEST_FRACTION,
        }
        if self.path is not None:
            section["path"] = str(self.path)
        return section

    def batch_size(self, sample_rate: float) -> float:
        """The expected batch B = q·n of a silo's n training records (q as the paper's)."""
        return round(sample_rate * self.records * (1 - TEST_FRACTION) / SILOS, 1)


def genomics_data(data_dir: Path | None, scale: Scale) -> tuple[list[GenomicsData], list[str]]:
    """The datasets to run (real ones only where their folder exists) and why any is left
    out; the synthetic stand-in always runs."""
    chosen: list[GenomicsData] = []
    notes: list[str] = []
    real = (("gse7390", 198, "GSE7390"), ("bc_tcga", 590, "real BC-TCGA"))
    for name, records, label in real:
        folder = real_folder(data_dir, name, label, notes)
        if folder is not None:
            chosen.append(GenomicsData(name, records, folder))
    synthetic = SYNTHETIC_OPTIONS[scale]
    size = synthetic.get("n_normal", 61) + synthetic.get("n_tumour", 529)
    chosen.append(GenomicsData("synthetic_bc_tcga", size, options=synthetic))
    return chosen, notes


def repeated(scale: Scale, repeats: dict[Scale, tuple[int, int]]) -> dict[str, Any]:
    """`seed` (a grid axis: one split per seed) and `trials` (noise draws per split)."""
    seeds, trials = repeats[scale]
    return {"seed": list(range(seeds)), "trials": trials}


PaperFigure = Callable[[float | None, bool], str]
"""(ε or None for non-private, whether ε is the largest run) -> the paper's figure."""
Describe = Callable[[dict[str, Any]], str]
"""A run's config -> its hyper-parameters, as the setting column shows them."""


def compare_rows(
    runs: Sequence[RunRow], store: ResultsStore, paper: PaperFigure, describe: Describe
) -> list[Row]:
    """One row per dataset and ε (non-private last), pooling every seed and trial. Where
    several settings ran at one ε (e.g. a grid over Λ), the row shows the one with the
    best mean accuracy, as the papers chose theirs; that choice is not in the ε."""
    rows = []
    for dataset, of_dataset in _group(runs, lambda r: r.config["data"]["dataset"]).items():
        by_epsilon = _group(of_dataset, _epsilon)
        budgets = sorted(e for e in by_epsilon if e is not None)
        for eps in [*budgets, *([None] if None in by_epsilon else [])]:
            figure = paper(eps, eps is not None and eps == budgets[-1])
            rows.append(_row(dataset, eps, by_epsilon[eps], store, figure, describe))
    return rows


def _row(
    dataset: str,
    eps: float | None,
    runs: list[RunRow],
    store: ResultsStore,
    figure: str,
    describe: Describe,
) -> Row:
    delta = runs[0].config["privacy"]["delta"]
    privacy = f"ε = {eps:g}, δ = {delta:g}" if eps is not None else "non-private"
    finished = [r for r in runs if r.status == "finished"]
    failed = len(runs) - len(finished)
    if not finished:
        return Row(f"{DATA_LABELS[dataset]} · {privacy}", figure, "failed", runs[0].error or "")
    variants = _group(finished, _variant)
    best = max(variants.values(), key=lambda rs: statistics.fmean(_pooled(store, rs)))
    accuracy, auroc = _pooled(store, best), _pooled(store, best, "auroc")
    spent = max(store.epsilon_by_silo(r).max for r in best)
    ours = f"{mean_std(accuracy)} (AUROC {mean_std(auroc)})"
    if eps is not None:
        ours += f", ε ≤ {spent:.3f}"
    share = statistics.fmean(majority(r.config) for r in best)
    notes = [f"majority class {100 * share:.1f} %"]
    if best[0].noise_multiplier is not None:
        notes.append(f"σ = {best[0].noise_multiplier:.3g}")
    if len(variants) > 1:
        notes.append(f"best of {len(variants)} settings by mean test accuracy")
    if failed:
        notes.append(f"{failed} run(s) failed")
    notes.append(DATA_NOTES[dataset])
    setting = f"{DATA_LABELS[dataset]} · {describe(best[0].config)} · {privacy}"
    return Row(setting, figure, ours, "; ".join(notes), trials=len(accuracy))


def _group(runs: Sequence[RunRow], key: Callable[[RunRow], Any]) -> dict[Any, list[RunRow]]:
    groups: dict[Any, list[RunRow]] = {}
    for run in runs:
        groups.setdefault(key(run), []).append(run)
    return groups


def _epsilon(run: RunRow) -> float | None:
    privacy = run.config["privacy"]
    return float(privacy["epsilon"]) if privacy["private"] else None


def _variant(run: RunRow) -> str:
    """The run's grid point without its seed and ε: the setting the seeds repeat."""
    axes = {k: v for k, v in run.grid.items() if k not in ("seed", "privacy.epsilon")}
    return json.dumps([run.study, axes], sort_keys=True)


def _pooled(store: ResultsStore, runs: Sequence[RunRow], metric: str = "accuracy") -> list[float]:
    return [value for run in runs for value in store.final_metric(run, metric)]


def majority(config: dict[str, Any]) -> float:
    """Accuracy of always predicting the most common class on the run's test sets."""
    return _majority(json.dumps(config["data"], sort_keys=True), int(config["seed"]))


@functools.lru_cache(maxsize=64)
def _majority(data: str, seed: int) -> float:
    silos = build_silos(data_config(json.loads(data)), seed)
    labels = np.concatenate([s.y_test.numpy() for s in silos if s.y_test is not None])
    return float(np.bincount(labels).max() / len(labels))
