"""The diabetes-readmission recipe at smoke scale (the run test_recipe_golden.py also
compares with its golden rows): the patient-level run's silos are patient-level, sample
patients and keep within their ε; the record-level run's row puts the group-privacy
patient ε of its ledger's record ε beside it, for the declared k, never the data's."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpfl.data.public_tables import DIABETES_NUMERIC
from dpfl.experiments.recipes.clinical_common import setting
from dpfl.experiments.recipes.diabetes_readmission import (
    COLUMNS,
    DELTA,
    DIAGNOSIS_GROUPS,
    LEARNING_RATE,
    MAX_RECORDS,
    NONPRIVATE,
    VALIDATION,
    pooled_logistic_regression,
    studies,
    validation_study,
)
from dpfl.experiments.results.datasheet import PATIENT_LEVEL_UNIT, group_privacy
from dpfl.experiments.results.store import ResultsStore
from dpfl.experiments.study.datasets import data_config
from dpfl.experiments.study.point import STORE

from .test_recipe_golden import Ran, smoke


@pytest.fixture(scope="module")
def diabetes(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Ran:
    return smoke("diabetes-readmission", shared_data, tmp_path_factory)


def test_patient_and_record_level_runs_keep_their_budgets(diabetes: Ran) -> None:
    reproduction, out = diabetes
    dp = [run for run in reproduction.runs if setting(run, "privacy.private")]
    units = {bool(setting(run, "data.options.patient_unit")): run for run in dp}
    assert set(units) == {True, False}
    assert units[True].datasheet["unit"] == PATIENT_LEVEL_UNIT
    assert units[False].datasheet["unit"] != PATIENT_LEVEL_UNIT
    with ResultsStore(out / STORE, create=False) as store:
        for run in dp:
            assert run.status == "finished", run.error
            spent = store.epsilon_by_silo(run).max
            assert 0 < spent <= setting(run, "privacy.epsilon")
        record = store.epsilon_by_silo(units[False]).max
    honest, delta = group_privacy(record, DELTA, MAX_RECORDS)
    (row,) = [row for row in reproduction.rows if row.setting.startswith("record-level")]
    assert f"patient ε = {honest:.3g}, δ = {delta:.2g} (k = {MAX_RECORDS})" in row.ours
    assert honest == pytest.approx(MAX_RECORDS * record)


def test_a_non_private_reference_row_beside_the_private_ones(diabetes: Ran) -> None:
    reproduction, _ = diabetes
    plain = [run for run in reproduction.runs if not setting(run, "privacy.private")]
    assert [run.study for run in plain] == ["diabetes-nonprivate"]
    assert setting(plain[0], "model.kind") == "logistic_regression"
    pooled, reference = reproduction.rows[:2]
    assert reference.setting == "non-private FedAvg (reference)"
    assert reference.ours.endswith("no privacy")
    assert pooled.setting.startswith("pooled logistic regression (scikit-learn")
    assert "not federated" in pooled.setting and pooled.trials == 1
    auroc, balanced = pooled_logistic_regression(plain[0].config["data"], plain[0].config["seed"])
    assert pooled.ours == f"AUROC {auroc:.3f}; bal. acc. {balanced:.3f}; no privacy"
    assert 0.5 < auroc <= 1


def test_the_features_are_declared_in_the_study(diabetes: Ran) -> None:
    """The text columns, ICD-9 chapters included, are the study's `[data.columns]`, stored
    with every run, and the model's input is as wide as they declare."""
    reproduction, _ = diabetes
    for run in reproduction.runs:
        declared = setting(run, "data.options.columns")
        assert set(declared) == set(COLUMNS)
        assert declared["diag_2"]["groups"] == DIAGNOSIS_GROUPS
    data = data_config(reproduction.runs[0].config["data"]).load(0)
    width = sum(len(c.get("categories") or c.get("groups") or ()) + 1 for c in COLUMNS.values())
    assert data.features.shape[1] == 1 + len(DIABETES_NUMERIC) + width
    assert "diag_1=diabetes" in data.feature_names


def test_settings_were_chosen_on_other_patients(shared_data: Path) -> None:
    """The validation patients lie outside the default scale's share by the same hash,
    and the non-private arm alone takes its own η and local epochs."""
    plan = studies(shared_data, "default")
    for study in plan.studies:
        for _, config in study.points:
            kept = config.data.patients_fraction  # type: ignore[union-attr]
            assert kept <= VALIDATION["patients_from"]
            algorithm = config.algorithm
            own = NONPRIVATE if not config.privacy.private else {}
            assert algorithm.learning_rate == own.get("learning_rate", LEARNING_RATE)
            assert algorithm.local_epochs == own.get("local_epochs", 1.0)
    study = validation_study(shared_data / "diabetes130", {"private": False}, learning_rate=[1, 2])
    assert study.axes == {"algorithm.learning_rate": [1, 2]}
    ((_, config), _) = study.points
    assert config.data.patients_from == VALIDATION["patients_from"]  # type: ignore[union-attr]


def test_the_two_units_meet_at_one_patient_epsilon(shared_data: Path) -> None:
    """At the default scale the patient-level arm runs at the patient ε that record-level
    training at record ε = 1 gives a patient with k records, so the page compares them."""
    plan = studies(shared_data, "default")
    epsilons = {
        study.name: {config.privacy.epsilon for _, config in study.points} for study in plan.studies
    }
    assert MAX_RECORDS * 1.0 in epsilons["diabetes-patient"]
    assert 1.0 in epsilons["diabetes-record"]
    assert epsilons["diabetes-patient"] >= epsilons["diabetes-record"]
