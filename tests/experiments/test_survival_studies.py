"""Survival through the whole stack: (time, event) labels from the data to the silos, a
DP study charged to its ledgers, survival metrics in the store and the report, and the
configurations that cannot be sound refused before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dpfl.data import Dataset, preprocess
from dpfl.data.dataset import survival_labels
from dpfl.experiments.results import best
from dpfl.experiments.results.report import write_report
from dpfl.experiments.results.store import ResultsStore
from dpfl.experiments.study.build import build_algorithm
from dpfl.experiments.study.config import ConfigError, Study
from dpfl.experiments.study.datasets import build_silos, data_config
from dpfl.experiments.study.point import STORE
from dpfl.experiments.study.runner import run_study
from dpfl.federation.silo import Silo

BINS = [365.0, 730.0, 1095.0, 1825.0, 2555.0, 3650.0]


def gse7390_study(shared: Path, **changes: Any) -> dict[str, Any]:
    study: dict[str, Any] = {
        "name": "gse7390-survival",
        "rounds": 3,
        "eval_every": "end",
        "metrics": ["c_index", "c_index_uno", "ibs", "td_auc"],
        "data": {
            "dataset": "gse7390",
            "path": str(shared / "gse7390"),
            "options": {"task": "survival"},
            "partition": {"kind": "iid", "silos": 2},
        },
        "model": {"time_bins": BINS},
        "algorithm": {"name": "fedavg", "learning_rate": 0.5, "expected_batch_size": 16},
        "privacy": {"epsilon": 1.0, "delta": 1e-5},
    }
    for key, value in changes.items():
        study[key] = {**study[key], **value} if isinstance(value, dict) else value
    return study


def test_tcga_brca_has_flambys_six_centres_and_split_with_survival_labels(
    shared_data: Path,
) -> None:
    config = data_config(
        {"dataset": "tcga_brca", "path": shared_data / "fed_tcga_brca", "split": "official"}
    )
    silos = build_silos(config, seed=0)
    assert [s.name for s in silos] == ["northeast", "south", "west", "midwest", "europe", "canada"]
    # FLamby's per-centre train/test sizes (PROVENANCE.md of fed_tcga_brca)
    assert [s.size for s in silos] == [248, 156, 164, 129, 129, 40]
    assert [len(s.y_test) for s in silos if s.y_test is not None] == [63, 40, 42, 33, 33, 11]
    assert all(s.survival and s.y.dtype == torch.float32 for s in silos)
    events = sum(int(s.y[:, 1].sum()) + int(s.y_test[:, 1].sum()) for s in silos)  # type: ignore[index]
    assert events == 151  # every observed death of brca.csv is in one of FLamby's centres


def test_a_dp_survival_study_is_charged_to_its_ledgers_and_reported_by_c_index(
    shared_data: Path, tmp_path: Path
) -> None:
    (run,) = run_study(Study(gse7390_study(shared_data)), tmp_path)
    assert run.status == "finished", run.error
    with ResultsStore(tmp_path / STORE) as store:
        spent = store.epsilon_by_silo(run)
        assert 0.9 < max(spent.by_silo.values()) <= 1.0  # calibrated to the budget
        final = {
            (row["silo"], row["metric"]): row["value"]
            for row in store.rows("metrics", run.id)
            if row["round"] == 2
        }
    assert {m for _, m in final} == {"c_index", "c_index_uno", "ibs", "td_auc"}
    assert 0.0 <= final[(None, "c_index")] <= 1.0 and 0.0 < final[(None, "ibs")] < 1.0
    assert {s for s, _ in final} == {None, "hospital-0", "hospital-1"}
    page = write_report(tmp_path).read_text(encoding="utf-8")
    assert "C-index (Harrell)" in page and "integrated Brier score" in page


def test_a_non_private_cox_reference_runs_and_has_no_brier_score(
    shared_data: Path, tmp_path: Path
) -> None:
    study = gse7390_study(shared_data, algorithm={"loss": "cox", "learning_rate": 0.05})
    study["model"] = {}
    study["privacy"] = {"private": False}
    (run,) = run_study(Study(study), tmp_path)
    assert run.status == "finished", run.error
    with ResultsStore(tmp_path / STORE) as store:
        union = {
            row["metric"]: row["value"]
            for row in store.rows("metrics", run.id)
            if row["silo"] is None and row["round"] == 2
        }
    assert 0.5 < union["c_index"] <= 1.0
    assert union["ibs"] is None  # undefined (NaN) is stored as NULL
    (chosen, *_) = best.candidates(tmp_path, epsilon=1.0, delta=0.5, metric="c_index")
    assert chosen.mean == pytest.approx(union["c_index"])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"algorithm": {"loss": "cox"}}, "not DP"),
        ({"model": {"time_bins": None}, "algorithm": {"loss": "logistic_hazard"}}, "needs model"),
        ({"model": {"time_bins": [730.0, 365.0]}}, "must increase"),
    ],
)
def test_survival_configs_that_cannot_be_sound_are_refused_at_load(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    study = gse7390_study(tmp_path, **changes)
    study["data"] = {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 2}}
    with pytest.raises(ConfigError, match=message):
        Study(study)


def test_losses_must_fit_the_labels() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 3))
    survival = Silo.from_arrays("s", x, np.column_stack([rng.uniform(1, 900, 20), np.ones(20)]))
    classes = Silo.from_arrays("c", x, rng.integers(0, 2, 20))
    base = {
        "rounds": 1,
        "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 1}},
        "model": {"time_bins": BINS},
        "algorithm": {"name": "fedavg"},
        "privacy": {"private": False},
    }
    ((_, plain),) = Study(base).points
    assert build_algorithm(plain, [survival]).loss is not None  # logistic_hazard by default
    with pytest.raises(ValueError, match="needs survival"):
        ((_, hazard),) = Study({**base, "algorithm": {"name": "fedavg", "loss": "cox"}}).points
        build_algorithm(hazard, [classes])
    with pytest.raises(ValueError, match="classification loss"):
        ((_, bce),) = Study({**base, "algorithm": {"name": "fedavg", "loss": "bce"}}).points
        build_algorithm(bce, [survival])


def test_survival_labels_are_checked_and_stratify_by_event() -> None:
    with pytest.raises(ValueError, match="events must be 0"):
        survival_labels(np.array([1.0, 2.0]), np.array([0.0, 2.0]))
    with pytest.raises(ValueError, match="non-negative"):
        survival_labels(np.array([-1.0, 2.0]), np.array([0.0, 1.0]))
    base = Dataset(
        name="toy",
        features=np.zeros((4, 1), np.float32),
        labels=np.array([0, 1, 0, 1]),
        feature_names=("f",),
        description="toy",
        class_names=("alive", "dead"),
        extra={"T": np.array([5.0, 3.0, 9.0, 1.0]), "E": np.array([0, 1, 0, 1])},
    )
    data = preprocess.as_survival(base, "T", "E")
    assert data.is_survival and data.labels.shape == (4, 2) and not data.class_names
    assert data.strata.tolist() == [0, 1, 0, 1] and data.class_counts().tolist() == [2, 2]
    assert data.extra["class"].tolist() == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="no column"):
        preprocess.as_survival(base, "T", "missing")
    with pytest.raises(ValueError, match="must be finite"):
        Silo.from_arrays("s", np.zeros((2, 1)), np.array([[np.nan, 1.0], [2.0, 0.0]]))


def test_an_official_split_needs_a_dataset_that_has_one() -> None:
    config = data_config(
        {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 2}, "split": "official"}
    )
    with pytest.raises(ValueError, match="no official split"):
        build_silos(config, seed=0)


def test_a_deployment_builds_the_survival_model_from_the_hospitals_announcement(
    tmp_path: Path,
) -> None:
    from dpfl.engines import flower
    from dpfl.experiments.study.deployment import algorithm_for
    from dpfl.federation.silo import SiloInfo
    from dpfl.local.losses import time_cuts

    study = gse7390_study(tmp_path)
    study["data"] = {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 2}}
    ((_, config),) = Study(study).points
    infos = [SiloInfo("hospital-0", 90), SiloInfo("hospital-1", 90)]
    algorithm = algorithm_for(config, infos, [76], flower.SURVIVAL)
    assert time_cuts(algorithm.loss) == tuple(BINS)
    assert algorithm.model(torch.zeros(1, 76)).shape == (1, len(BINS) + 1)
