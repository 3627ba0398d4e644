"""The clinical recipes (Kerkouche, puffle, Dopamine) at smoke scale, end to end.

Each recipe runs once per test session on the shared real data (the same runs as
test_recipe_golden.py, which compares their rows with the golden ones); the tests here
read its results store: every private run stays within its ε budget by the ledger's own
accountant, FL-SIGN sends 1/32 of FL-STANDARD's upstream bytes, personalised runs are
scored per silo, and Dopamine's five methods carry the right privacy.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dpfl.experiments.recipes import recipe, reproduce
from dpfl.experiments.recipes.clinical_common import (
    private,
    setting,
    silo_mean,
    upstream_per_client,
    upstream_per_message,
)
from dpfl.experiments.recipes.dopamine import METHODS
from dpfl.experiments.results.store import ResultsStore, RunRow
from dpfl.experiments.study.config import Study
from dpfl.experiments.study.point import STORE
from dpfl.experiments.study.runner import run_study

from .test_recipe_golden import Ran, smoke


@pytest.fixture(scope="module")
def kerkouche(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Ran:
    return smoke("kerkouche-fl-sign", shared_data, tmp_path_factory)


@pytest.fixture(scope="module")
def puffle(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Ran:
    return smoke("puffle-mrmtl", shared_data, tmp_path_factory)


@pytest.fixture(scope="module")
def dopamine(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Ran:
    return smoke("dopamine-retinamnist", shared_data, tmp_path_factory)


def _store(out: Path) -> ResultsStore:
    return ResultsStore(out / STORE, create=False)


@pytest.mark.parametrize("name", ["kerkouche", "puffle", "dopamine"])
def test_every_run_finishes_within_its_budget(name: str, request: pytest.FixtureRequest) -> None:
    reproduction, out = request.getfixturevalue(name)
    assert reproduction.runs  # the rows and notes: test_recipe_golden.py
    with _store(out) as store:
        for run in reproduction.runs:
            assert run.status == "finished", run.error
            rows = [
                row
                for row in store.rows("privacy", run.id)
                if row["view"] is None and row["accountant"] == run.datasheet["accountant"]
            ]
            if not private(run):
                assert not store.rows("privacy", run.id)
                continue
            budget = setting(run, "privacy.epsilon")
            silos = {row["silo"] for row in store.rows("metrics", run.id) if row["silo"]}
            assert {row["silo"] for row in rows} == silos  # every silo has an account
            assert all(0 <= row["epsilon"] <= budget for row in rows)
            assert max(row["epsilon"] for row in rows) > 0


def test_fl_sign_sends_a_32nd_of_fl_standard_upstream(kerkouche: Ran) -> None:
    reproduction, out = kerkouche
    pairs: dict[tuple[str, bool], dict[str, RunRow]] = {}
    for run in reproduction.runs:
        key = (setting(run, "data.dataset"), private(run))
        pairs.setdefault(key, {})[run.algorithm] = run
    datasets = ("physionet2012", "synthetic_ehr")
    assert set(pairs) == {(d, p) for d in datasets for p in (True, False)}
    with _store(out) as store:
        for pair in pairs.values():
            sign, standard = pair["sign"], pair["fedavg"]
            # 4 bytes a parameter vs 1 bit, packed 8 to a byte (the last byte padded)
            parameters = upstream_per_message(store, standard) / 4
            assert upstream_per_message(store, sign) == math.ceil(parameters / 8)
            ratio = upstream_per_client(store, standard) / upstream_per_client(store, sign)
            assert ratio == pytest.approx(32, rel=1e-3)


def test_personalised_runs_are_scored_at_every_silo(puffle: Ran) -> None:
    reproduction, out = puffle
    algorithms = {run.algorithm for run in reproduction.runs}
    assert algorithms == {"mrmtl", "local", "fedavg"}
    with _store(out) as store:
        for run in reproduction.runs:
            last = run.rounds_completed - 1 if run.rounds_completed else -1
            silos = {
                row["silo"]
                for row in store.rows("metrics", run.id)
                if row["silo"] is not None and row["round"] == last
            }
            assert len(silos) == 4, (run.study, silos)
            assert len(silo_mean(store, run, "accuracy")) == run.trials
    strengths = {
        setting(run, "algorithm.strength") for run in reproduction.runs if run.algorithm == "mrmtl"
    }
    assert len(strengths) > 1  # a λ sweep, compared in the rows
    assert any("λ*" in row.setting for row in reproduction.rows)


def test_dopamine_runs_its_five_methods_with_the_right_privacy(dopamine: Ran) -> None:
    reproduction, out = dopamine
    methods = {(run.algorithm, private(run)) for run in reproduction.runs}
    assert methods == set(METHODS)
    (secure,) = [run for run in reproduction.runs if run.algorithm == "fedsgd_secure"]
    with _store(out) as store:
        views = {row["view"] for row in store.rows("privacy", secure.id)}
        assert views == {None, "hospitals"}
        # another hospital cancels its own noise share: it learns more than the server
        server = max(
            row["epsilon"]
            for row in store.rows("privacy", secure.id)
            if row["view"] is None
            and row["accountant"] == secure.datasheet["accountant"]
            and row["round"] == secure.rounds_completed - 1
        )
        assert store.epsilon_by_silo(secure, "hospitals").max > server
    budgets = {setting(run, "privacy.epsilon") for run in reproduction.runs if private(run)}
    assert len(budgets) == 1  # one budget for CDP, FPDP and Dopamine


def test_dopamine_is_encrypted_and_learns_what_the_sum_in_the_clear_learns(
    dopamine: Ran, shared_data: Path, tmp_path: Path
) -> None:
    """The same study with the ideal secure sum instead of BFV: the same batches and
    noise, sums that differ by the fixed point only, so the same accuracy."""
    reproduction, out = dopamine
    (secure,) = [run for run in reproduction.runs if run.algorithm == "fedsgd_secure"]
    assert secure.datasheet["secure_aggregation"].startswith("BFV homomorphic encryption")
    (study,) = [
        s
        for s in recipe("dopamine-retinamnist").studies(shared_data, "smoke").studies
        if s.points[0][1].algorithm.name == "fedsgd_secure"
    ]
    ((_, config),) = study.points
    assert config.secure_aggregation == "he"
    clear = config.model_copy(update={"secure_aggregation": "ideal"})
    (ideal,) = run_study(Study(clear.model_dump(mode="json"), source="test"), tmp_path)
    assert ideal.status == "finished", ideal.error
    with _store(out) as store, ResultsStore(tmp_path / STORE, create=False) as plain:
        assert store.final_metric(secure, "accuracy") == plain.final_metric(ideal, "accuracy")


def test_without_data_only_the_synthetic_study_runs_and_repeats_exactly(
    tmp_path: Path,
) -> None:
    first = reproduce("kerkouche-fl-sign", tmp_path / "a", data_dir=None, scale="smoke")
    again = reproduce("kerkouche-fl-sign", tmp_path / "b", data_dir=None, scale="smoke")
    assert {setting(run, "data.dataset") for run in first.runs} == {"synthetic_ehr"}
    assert any("PhysioNet" in note for note in first.notes)
    assert first.rows == again.rows


@pytest.mark.parametrize("name", ["puffle-mrmtl", "dopamine", "dopamine-retinamnist"])
def test_without_real_data_a_recipe_plans_nothing_and_says_why(name: str, tmp_path: Path) -> None:
    plan = recipe(name).studies(None, "smoke")
    assert not plan.studies and plan.notes
    reproduction = reproduce(name, tmp_path, data_dir=tmp_path / "absent", scale="smoke")
    assert not reproduction.runs and not reproduction.rows
    assert all(str(tmp_path / "absent") in note for note in reproduction.notes[:-1])
