"""Diabetes 130-US hospitals (UCI 296): 30-day readmission, the patient as the unit.

A patient has several encounters (101,766 of them for 71,518 patients), so a guarantee
about one record says little about one patient. We compare, on the same records:

* patient-level FedAvg (`data.patient_unit`): DP-SGD Poisson-samples patients
  and clips each one's records as one, at patient ε ∈ {1, 3, 4};
* record-level FedAvg at record ε ∈ {1, 4}, beside which we put its honest patient ε:
  group privacy for k records, (kε, k·e^((k−1)ε)·δ) (Vadhan, Lemma 2.2);
* non-private FedAvg on the same records and model, the reference row;
* a pooled, class-balanced scikit-learn logistic regression on the same training
  records, features and test sets: not federated, the ceiling FedAvg is measured against.

k = `MAX_RECORDS` = 3 is declared as a public fact of the design, not read off the data:
each patient's first 3 encounters in file order are kept and any later one is dropped,
a rule that reads no other patient. The data have no hospital id: the proxy hospitals
are 4 declared groups of `admission_source_id` (emergency, referral, transfer, other;
`tabular.DIABETES_ADMISSION_GROUPS`), each patient at the group of their first kept
encounter. Numbers are scaled by declared ranges (`tabular.DIABETES_RANGES`); the text
columns are declared in the study (`COLUMNS`, `[data.columns]`): the ICD-9-CM chapter of
each of the three diagnoses (`DIAGNOSIS_GROUPS`, diabetes 250.xx its own group as in
Strack et al. 2014, '?' its own), the 23 medications (No/Steady/Up/Down), admission type
and discharge disposition (IDs_mapping.csv's codes) and the dictionary's other
categories, each one-hot with an "other" indicator. The default scale keeps a quarter
of the patients by a hash of patient_nbr (a public rule). Every model predicts at a
threshold chosen on DP histograms of its training scores (sensitivity √2·k for a
patient-level silo), charged to each hospital's ledger; the loss weights the positives
by the published rate (11,357 of 101,766 encounters readmitted within 30 days, UCI).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.data import codes
from dpfl.data.public_tables import DIABETES_DRUGS
from dpfl.experiments.recipes.base import Plan, Recipe, Row, Scale, real_folder
from dpfl.experiments.recipes.clinical_common import (
    budget,
    by_scale,
    metric_text,
    private,
    setting,
)
from dpfl.experiments.results.datasheet import group_privacy
from dpfl.experiments.results.store import ResultsStore, RunRow
from dpfl.experiments.study.config import Study
from dpfl.experiments.study.datasets import build_silos, data_config

NAME = "diabetes-readmission"
TITLE = "Diabetes 130-US hospitals: patient-level vs record-level DP FedAvg, 30-day readmission"
DELTA = 1e-5
MAX_RECORDS = 3
"""k: the declared most encounters of one patient (later ones dropped in file order)."""
POSITIVE_WEIGHT = 8.0
"""≈ 90,409 : 11,357, the published share of encounters not readmitted within 30 days."""
THRESHOLD = {"choose": "balanced", "noise": 30.0}
"""N(0, 30²) on each count: a patient-level silo's release (sensitivity √2·k = 4.24) then
leaves room in ε = 1, where N(0, 10²) alone would spend 1.66."""
PATIENT_EPSILONS = [1.0, 3.0, 4.0]
"""The patient-level arm's ε: 1 and 4 as the record-level arm's, and 3, the patient ε of
record-level training at record ε = 1 (k = 3), so the two units meet at one patient ε."""
ROUNDS = 60
"""Rounds at the default and full scales, every arm: chosen on validation patients
(`VALIDATION`), where patient-level ε = 3 at η = 0.5 reached AUROC 0.571 after 30 rounds,
0.578 after 60 and 0.573 after 120 (σ 5.7, 7.9, 11.1), and the non-private arm 0.649 after
30 and 0.653 after 60."""
BATCH = 512
"""Expected batch: a larger batch divides the same noise over more clipped gradients
(the smallest proxy hospital holds about 1,000 training records at the default scale)."""
LEARNING_RATE = 0.5
"""The private arms' η (clip C = 1, one local epoch), chosen on validation patients at
patient ε = 3 after 30 rounds: η 0.0625, 0.125, 0.25, 0.5, 1, 2, 4 reached AUROC 0.542,
0.557, 0.568, 0.571, 0.564, 0.549, 0.533 (one local epoch; 5 local epochs 0.569 at η 0.5,
and 0.549 against 0.528 for 5 against 20 at η 2). The record-level arms and the other ε
take the same settings, not tuned apart."""
NONPRIVATE: dict[str, float] = {"learning_rate": 0.25, "local_epochs": 20.0}
"""The non-private arm's own η and local epochs (its rounds, batch and all else as the
private arms'), chosen on validation patients: AUROC after 30 rounds at 20 local epochs
η 0.125, 0.25, 0.5, 1, 2, 8, 32: 0.648, 0.649, 0.645, 0.643, 0.635, 0.570, 0.548; at
η = 2, 1, 5 and 20 local epochs: 0.587, 0.619, 0.635. Plain SGD (no clipping, no noise)
converges slowly on these features, whose range-scaled counts are small numbers."""
VALIDATION = {"patients_from": 0.25, "patients_fraction": 0.5}
"""Where the settings were chosen (`validation_study`): the patients whose patient_nbr
hashes into [0.25, 0.5), disjoint from the default scale's [0, 0.25) (not from the full
scale's), each study's own test records scored, one trial a setting; the pooled
logistic regression reaches AUROC 0.658 there."""

DIAGNOSIS_GROUPS: dict[str, list[str]] = {
    **codes.ICD9_CM_CHAPTERS,
    "endocrine": ["240-249", "251-279"],
    "diabetes": ["250-250"],
    "missing": ["?"],
}
"""A diagnosis's group: its ICD-9-CM chapter (`codes.ICD9_CM_CHAPTERS`), diabetes (250.xx)
apart from the rest of its chapter as in Strack et al. 2014, the file's missing marker
'?' its own group; a code in no range would be "other"."""
IDS = {"admission_type_id": 8, "discharge_disposition_id": 30}
"""The codes 1..n of IDs_mapping.csv (UCI), each its own category."""
COLUMNS: dict[str, dict[str, Any]] = {
    "race": {"categories": ["Caucasian", "AfricanAmerican", "Hispanic", "Asian", "Other"]},
    "gender": {"categories": ["Female", "Male", "Unknown/Invalid"]},
    **{name: {"categories": [str(i) for i in range(1, n + 1)]} for name, n in IDS.items()},
    **{f"diag_{i}": {"groups": DIAGNOSIS_GROUPS} for i in (1, 2, 3)},
    "max_glu_serum": {"categories": ["None", "Norm", ">200", ">300"]},
    "A1Cresult": {"categories": ["None", "Norm", ">7", ">8"]},
    **{drug: {"categories": ["No", "Steady", "Up", "Down"]} for drug in DIABETES_DRUGS},
    "change": {"categories": ["No", "Ch"]},
    "diabetesMed": {"categories": ["No", "Yes"]},
}
"""The text columns' declared preprocessing (`[data.columns]`), every category from the
UCI data dictionary and IDs_mapping.csv, none read off the records."""


def studies(data_dir: Path | None, scale: Scale) -> Plan:
    notes: list[str] = []
    folder = real_folder(data_dir, "diabetes130", "the Diabetes 130-US study", notes)
    if folder is None:
        return Plan([], notes)
    record = budget(scale, by_scale(scale, [4.0], [1.0, 4.0], [1.0, 4.0]), DELTA)
    patient = budget(scale, by_scale(scale, [4.0], PATIENT_EPSILONS, PATIENT_EPSILONS), DELTA)
    arms = [
        ("patient", "patient", patient),
        ("record", "record", record),
        ("nonprivate", "record", {"private": False}),
    ]
    own: dict[str, dict[str, float]] = {"nonprivate": by_scale(scale, {}, NONPRIVATE, NONPRIVATE)}
    return Plan(
        [
            Study(
                {
                    **_base(scale, own.get(arm, {})),
                    "name": f"diabetes-{arm}",
                    "data": _data(folder, scale, unit),
                    "privacy": p,
                },
                NAME,
            )
            for arm, unit, p in arms
        ],
        notes,
    )


def validation_study(
    folder: Path,
    privacy: dict[str, Any],
    *,
    rounds: int = ROUNDS,
    eval_every: int | str = "end",
    **algorithm: Any,
) -> Study:
    """A study of the recipe's default scale on the validation patients (`VALIDATION`):
    one trial, `privacy` ({"private": False}, or a patient-level ε and δ), the algorithm's
    settings changed by `algorithm` (a list is a grid axis). How `ROUNDS`,
    `LEARNING_RATE` and `NONPRIVATE` were chosen, never on the recipe's records."""
    patient = privacy.get("private", True)
    data = {**_data(folder, "default", "patient" if patient else "record"), **VALIDATION}
    base = _base("default", algorithm)
    return Study(
        {
            **base,
            "name": "diabetes-validation",
            "trials": 1,
            "rounds": rounds,
            "eval_every": eval_every,
            "data": data,
            "privacy": privacy,
        },
        NAME,
    )


def _base(scale: Scale, algorithm: dict[str, Any]) -> dict[str, Any]:
    """Every arm's settings but its name, data and privacy; `algorithm` changes some."""
    return {
        "trials": by_scale(scale, 1, 3, 3),
        "rounds": by_scale(scale, 2, ROUNDS, ROUNDS),
        "eval_every": "end",
        "metrics": ["balanced_accuracy", "auroc"],
        "model": {"kind": "logistic_regression"},
        "threshold": THRESHOLD,
        "algorithm": {
            "name": "fedavg",
            "loss": "weighted_bce",
            "positive_weight": POSITIVE_WEIGHT,
            "expected_batch_size": by_scale(scale, 32, BATCH, BATCH),
            "learning_rate": LEARNING_RATE,
            "clip_norm": 1.0,
            "local_epochs": 1.0,
            **algorithm,
        },
    }


def _data(folder: Path, scale: Scale, unit: str) -> dict[str, Any]:
    return {
        "dataset": "diabetes130",
        "path": str(folder),
        "one_encounter_per_patient": False,
        "proxy_site_column": "admission_source_group",
        "max_records": MAX_RECORDS,
        "patient_unit": unit == "patient",
        "patients_fraction": by_scale(scale, 0.05, 0.25, 1.0),
        "columns": COLUMNS,
        "partition": {"kind": "natural"},
    }


def compare(runs: list[RunRow], store: ResultsStore) -> list[Row]:
    finished = [run for run in runs if run.status == "finished"]
    rows = [_pooled_row(run) for run in finished if not private(run)]
    for run in sorted(
        finished, key=lambda r: (private(r), setting(r, "privacy.epsilon") or 0.0, r.study)
    ):
        scores = "; ".join(
            f"{label} {metric_text(store.final_metric(run, metric))}"
            for label, metric in (("AUROC", "auroc"), ("bal. acc.", "balanced_accuracy"))
        )
        setting_text, level = _level(run, store)
        rows.append(
            Row(
                setting_text,
                "—",
                f"{scores}; {level}",
                "4 proxy hospitals (admission source groups), not real sites; "
                f"a patient's first {MAX_RECORDS} encounters",
                trials=run.trials,
            )
        )
    return rows


def _pooled_row(run: RunRow) -> Row:
    """The non-federated reference: scikit-learn's class-balanced logistic regression on
    the non-private run's records (its silos' training records pooled), scored on the
    union of their test sets, as the runs are."""
    auroc, balanced = pooled_logistic_regression(run.config["data"], int(run.config["seed"]))
    return Row(
        "pooled logistic regression (scikit-learn, class-balanced; not federated, reference)",
        "—",
        f"AUROC {auroc:.3f}; bal. acc. {balanced:.3f}; no privacy",
        "every hospital's training records in one place; the same records, features and "
        "test sets as the FedAvg rows; deterministic (lbfgs), one fit",
        trials=1,
    )


def pooled_logistic_regression(data: dict[str, Any], seed: int) -> tuple[float, float]:
    """(AUROC, balanced accuracy at 0.5) on the pooled test sets of a class-balanced
    scikit-learn logistic regression fitted on the pooled training records."""
    return _pooled(json.dumps(data, sort_keys=False), seed)


@functools.lru_cache(maxsize=4)
def _pooled(data: str, seed: int) -> tuple[float, float]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import balanced_accuracy_score, roc_auc_score

    silos = build_silos(data_config(json.loads(data)), seed)
    x, y, x_test, y_test = (
        np.concatenate([getattr(s, part).numpy() for s in silos])
        for part in ("x", "y", "x_test", "y_test")
    )
    model = LogisticRegression(class_weight="balanced", max_iter=2000).fit(x, y)
    scores = model.predict_proba(x_test)[:, 1]
    return (
        float(roc_auc_score(y_test, scores)),
        float(balanced_accuracy_score(y_test, model.predict(x_test))),
    )


def _level(run: RunRow, store: ResultsStore) -> tuple[str, str]:
    """The run's setting and its privacy: the ledger's ε, and for a record-level run the
    group-privacy patient ε of it for the declared k."""
    if not private(run):
        return "non-private FedAvg (reference)", "no privacy"
    epsilon = setting(run, "privacy.epsilon")
    spent = store.epsilon_by_silo(run).max
    sigma = f"σ = {run.noise_multiplier:.3g}"
    if setting(run, "data.options.patient_unit"):
        level = f"patient ε = {spent:.3g} (budget {epsilon:g}), {sigma}"
        return f"patient-level FedAvg, ε = {epsilon:g}", level
    honest, delta = group_privacy(spent, DELTA, MAX_RECORDS)
    level = (
        f"record ε = {spent:.3g} (budget {epsilon:g}); patient ε = {honest:.3g}, "
        f"δ = {delta:.2g} (k = {MAX_RECORDS}), {sigma}"
    )
    return f"record-level FedAvg, ε = {epsilon:g}", level


RECIPE = Recipe(name=NAME, title=TITLE, studies=studies, compare=compare)
