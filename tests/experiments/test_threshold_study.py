"""A study's decision threshold: a default that leaves old run keys alone, a balanced
one whose releases show in the store (the threshold among each silo's metrics), the
ledger and the datasheet, and refusals where it cannot apply or is not deployed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dpfl.experiments.results.store import ResultsStore
from dpfl.experiments.study.config import Study, StudyConfig
from dpfl.experiments.study.deployment import check_deployable
from dpfl.experiments.study.point import STORE
from dpfl.experiments.study.runner import run_study
from dpfl.privacy import Ledger, events
from dpfl.privacy.accounts import account

STUDY: dict[str, Any] = {
    "name": "cut",
    "rounds": 3,
    "trials": 2,
    "eval_every": 2,
    "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 3}},
    "algorithm": {"name": "fedavg", "learning_rate": 1.0},
    "privacy": {"noise_multiplier": 1.0, "delta": 1e-5},
}
BALANCED = {"choose": "balanced", "noise": 8.0}


def test_the_default_threshold_leaves_a_run_key_as_it_was() -> None:
    plain = StudyConfig.model_validate(STUDY)
    explicit = StudyConfig.model_validate({**STUDY, "threshold": {"value": 0.5}})
    assert plain.key() == explicit.key()
    assert StudyConfig.model_validate({**STUDY, "threshold": BALANCED}).key() != plain.key()


def test_a_balanced_threshold_is_charged_stored_and_described(tmp_path: Path) -> None:
    (run,) = run_study(Study({**STUDY, "threshold": BALANCED}), tmp_path)
    assert run.status == "finished", run.error
    with ResultsStore(tmp_path / STORE) as store:
        cuts = {
            (row["trial"], row["round"]): row["value"]
            for row in store.rows("metrics", run.id)
            if row["metric"] == "threshold" and row["silo"] == "hospital-0"
        }
        assert set(cuts) == {(0, 1), (0, 2), (1, 1), (1, 2)}  # rounds 2 and 3 evaluated
        assert all(0 < value < 1 for value in cuts.values())
        with Ledger(store.ledger_of(run), create=False) as book:
            entries = book.entries(account("hospital-0", 1))
    releases = [e.round for e in entries if e.event == events.gaussian(8.0)]
    assert releases == [1, 2]
    sheet = run.datasheet
    assert "maximises TPR − FPR" in sheet["evaluation"]
    assert "std 8 records" in sheet["evaluation"]
    assert sheet["silos"]["hospital-0"]["participations"] == [3, 3]  # releases are no rounds
    assert any("Gaussian(σ=8)" in text for text in sheet["silos"]["hospital-0"]["events"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"algorithm": {"name": "fedsgd_secure"}, "privacy": {"epsilon": 4.0}},
            "runs until its budget is spent",
        ),
        ({"algorithm": {"name": "fedavg", "loss": "logistic_hazard"}}, "binary classifiers"),
        ({"threshold": {"value": 1.0}}, "threshold.value"),
        ({"threshold": {"choose": "balanced", "noise": 0}}, "threshold.noise"),
    ],
)
def test_a_threshold_the_study_cannot_use_is_refused(change: dict[str, Any], message: str) -> None:
    raw = {**STUDY, "threshold": BALANCED, **change}
    if change.get("algorithm", {}).get("loss") == "logistic_hazard":
        raw["model"] = {"time_bins": [1.0, 2.0]}
    with pytest.raises(ValueError, match=message):
        Study(raw)


def test_a_deployment_refuses_a_chosen_threshold() -> None:
    config = StudyConfig.model_validate({**STUDY, "trials": 1, "threshold": {"value": 0.3}})
    with pytest.raises(ValueError, match=r"deployed models predict at 0\.5"):
        check_deployable(config)
