"""The diabetes-readmission recipe at smoke scale (the run test_recipe_golden.py also
compares with its golden rows): the patient-level run's silos are patient-level, sample
patients and keep within their ε; the record-level run's row puts the group-privacy
patient ε of its ledger's record ε beside it, for the declared k, never the data's."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpfl.experiments.recipes.clinical_common import setting
from dpfl.experiments.recipes.diabetes_readmission import DELTA, MAX_RECORDS, studies
from dpfl.experiments.results.datasheet import PATIENT_LEVEL_UNIT, group_privacy
from dpfl.experiments.results.store import ResultsStore
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
    reference = reproduction.rows[0]
    assert reference.setting == "non-private FedAvg (reference)"
    assert reference.ours.endswith("no privacy")


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
