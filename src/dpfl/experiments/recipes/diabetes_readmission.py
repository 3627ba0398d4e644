"""Diabetes 130-US hospitals (UCI 296): 30-day readmission, the patient as the unit.

A patient has several encounters (101,766 of them for 71,518 patients), so a guarantee
about one record says little about one patient. We compare, on the same records:

* patient-level FedAvg (`data.patient_unit`): DP-SGD Poisson-samples patients
  and clips each one's records as one, at patient ε ∈ {1, 4};
* record-level FedAvg at the same record ε, beside which we put its honest patient ε:
  group privacy for k records, (kε, k·e^((k−1)ε)·δ) (Vadhan, Lemma 2.2);
* non-private FedAvg on the same records and model, the reference row.

k = `MAX_RECORDS` = 3 is declared as a public fact of the design, not read off the data:
each patient's first 3 encounters in file order are kept and any later one is dropped,
a rule that reads no other patient. The data have no hospital id: the proxy hospitals
are 4 declared groups of `admission_source_id` (emergency, referral, transfer, other;
`tabular.DIABETES_ADMISSION_GROUPS`), each patient at the group of their first kept
encounter. Numbers are scaled by declared ranges (`tabular.DIABETES_RANGES`), categories
one-hot over the UCI dictionary's. The default scale keeps a quarter of the patients by
a hash of patient_nbr (a public rule). Every model predicts at a threshold chosen on DP
histograms of its training scores (sensitivity √2·k for a patient-level silo), charged
to each hospital's ledger; the loss weights the positives by the published rate (11,357
of 101,766 encounters readmitted within 30 days, UCI).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
ROUNDS = 30
"""Rounds at the default and full scales: more steps at a fixed ε are what DP-SGD's noise
needs (De et al. 2022); chosen before any run, not on the test set."""
BATCH = 512
"""Expected batch: a larger batch divides the same noise over more clipped gradients."""
LEARNING_RATE = 2.0
"""Clipped gradients (C = 1) bound each step to η, so DP-SGD on a linear model takes a
larger η than unclipped SGD (puffle's published logistic regression uses η = 16 at
B = 2048); the same η for every arm, chosen before any run."""


def studies(data_dir: Path | None, scale: Scale) -> Plan:
    notes: list[str] = []
    folder = real_folder(data_dir, "diabetes130", "the Diabetes 130-US study", notes)
    if folder is None:
        return Plan([], notes)
    base = {
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
        },
    }
    record = budget(scale, by_scale(scale, [4.0], [1.0, 4.0], [1.0, 4.0]), DELTA)
    patient = budget(scale, by_scale(scale, [4.0], PATIENT_EPSILONS, PATIENT_EPSILONS), DELTA)
    arms = [
        ("patient", "patient", patient),
        ("record", "record", record),
        ("nonprivate", "record", {"private": False}),
    ]
    return Plan(
        [
            Study(
                {
                    **base,
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


def _data(folder: Path, scale: Scale, unit: str) -> dict[str, Any]:
    return {
        "dataset": "diabetes130",
        "path": str(folder),
        "one_encounter_per_patient": False,
        "proxy_site_column": "admission_source_group",
        "max_records": MAX_RECORDS,
        "patient_unit": unit == "patient",
        "patients_fraction": by_scale(scale, 0.05, 0.25, 1.0),
        "partition": {"kind": "natural"},
    }


def compare(runs: list[RunRow], store: ResultsStore) -> list[Row]:
    finished = [run for run in runs if run.status == "finished"]
    rows = []
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
