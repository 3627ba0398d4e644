"""The FLamby Fed-Heart-Disease recipe at smoke scale, end to end, on the shared data.

It runs once per test session (`smoke`, shared with test_recipe_golden.py): every run
finishes, the studies use FLamby's split and settings, and the table has a row per
FLamby strategy with FLamby's published figure next to ours.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dpfl.data.flamby import published_results
from dpfl.experiments.recipes import recipe, reproduce
from dpfl.experiments.recipes.clinical_common import private, setting
from dpfl.experiments.recipes.flamby_heart import CENTRES
from dpfl.experiments.results.store import ResultsStore
from dpfl.experiments.study.point import STORE

from .test_recipe_golden import Ran, smoke

FIGURE = re.compile(r"\d+\.\d %|\d+\.\d ± \d+\.\d %")


@pytest.fixture(scope="module")
def flamby(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Ran:
    return smoke("flamby-heart-disease", shared_data, tmp_path_factory)


def test_every_run_finishes_on_flambys_split(flamby: Ran) -> None:
    reproduction, out = flamby
    assert reproduction.runs and not reproduction.notes
    for run in reproduction.runs:
        assert run.status == "finished", (run.study, run.error)
        assert setting(run, "data.dataset") == "flamby_heart_disease"
        assert setting(run, "data.split") == "official"
        assert setting(run, "data.partition.names") == list(CENTRES)
        scaling = {
            "flamby-heart-pooled": "flamby-pooled",
            "flamby-heart-fedavg-public": "public",
            "flamby-heart-dp-fedavg": "public",
        }.get(run.study, "flamby")
        assert setting(run, "data.options") == {"scaling": scaling}, run.study
        assert setting(run, "algorithm.expected_batch_size") == 4
    algorithms = {run.algorithm for run in reproduction.runs}
    assert algorithms == {"centralized", "local", "fedavg", "cyclic"}
    with ResultsStore(out / STORE, create=False) as store:
        for run in reproduction.runs:
            if private(run):
                spent = store.epsilon_by_silo(run).max
                assert 0 < spent <= setting(run, "privacy.epsilon")


def test_a_row_per_strategy_with_flambys_figure_and_ours(flamby: Ran, shared_data: Path) -> None:
    reproduction, _ = flamby
    rows = {row.setting.split(" (")[0]: row for row in reproduction.rows}
    strategies = ["Pooled training", *(f"Local {k}" for k in range(4)), "FedAvg", "Cyclic"]
    published = published_results(shared_data / "flamby_results", "heart")
    names = {"Pooled training": "Pooled Training"}
    for strategy in strategies:
        row = rows[strategy]
        assert FIGURE.fullmatch(row.paper), row
        assert FIGURE.fullmatch(row.ours), row
        expected = published[names.get(strategy, strategy)]
        assert row.paper.startswith(f"{100 * expected.mean:.1f} ± {100 * expected.std:.1f}")
        assert "ours − FLamby" in row.note
    assert "heart_seed" in rows["Pooled training"].note
    dp = [row for row in reproduction.rows if row.setting.startswith("DP FedAvg")]
    assert [row.setting.split(",")[0] for row in dp] == [
        "DP FedAvg at ε = 4",
        "DP FedAvg at ε = 10",
    ]
    assert all("per silo" in row.ours for row in dp)


def test_without_the_data_nothing_is_planned_and_the_notes_say_why(tmp_path: Path) -> None:
    plan = recipe("flamby-heart-disease").studies(None, "smoke")
    assert not plan.studies and plan.notes
    reproduction = reproduce("flamby-heart-disease", tmp_path, data_dir=tmp_path / "absent")
    assert not reproduction.runs and not reproduction.rows
    assert all(str(tmp_path / "absent") in note for note in reproduction.notes)
