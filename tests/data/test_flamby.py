"""FLamby's Fed-Heart-Disease rebuilt from the UCI files, and FLamby's published results.

The expected figures are FLamby's own: the per-centre train/test sizes of its README
(flamby/datasets/fed_heart_disease/README.md: 199/104, 172/89, 30/16, 85/45), the MD5
sums of its download script, the normalisation its test checks
(tests/datasets/test_heart_disease.py), and test-record positions produced by FLamby's
dataset.py code itself (pandas, sklearn) on these files.
"""

from __future__ import annotations

import csv
import hashlib
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest

from dpfl.data.dataset import NONPRIVATE_MARK, DataFormatError
from dpfl.data.flamby import (
    FLAMBY_FEATURES,
    FLAMBY_MD5,
    flamby_heart_disease,
    published_results,
)

SIZES = [(199, 104), (172, 89), (30, 16), (85, 45)]
"""FLamby's README: records per centre, train/test."""
FIRST_TEST_POSITIONS = [
    [5, 13, 16, 24, 26, 34, 40, 42],
    [3, 7, 16, 21, 25, 26, 27, 28],
    [5, 6, 7, 8, 13, 14, 18, 19],
    [1, 5, 6, 9, 12, 26, 29, 33],
]
"""Per centre, the first test records' positions among the centre's kept records, as
FLamby's HeartDiseaseRaw assigns them (run with pandas on these files)."""


@pytest.fixture(scope="module")
def heart(shared_data: Path) -> Path:
    return shared_data / "uci_heart_disease"


@pytest.fixture(scope="module")
def results(shared_data: Path) -> Path:
    return shared_data / "flamby_results"


def test_files_are_the_ones_flamby_downloads(heart: Path) -> None:
    for name, md5 in FLAMBY_MD5.items():
        assert hashlib.md5((heart / name).read_bytes()).hexdigest() == md5, name


@pytest.mark.parametrize("scaling", ["flamby", "flamby-pooled", "public"])
def test_740_patients_13_features_flamby_split(heart: Path, scaling: str) -> None:
    data = flamby_heart_disease(heart, scaling=scaling)  # type: ignore[arg-type]
    assert data.features.shape == (740, 13)
    assert data.feature_names == FLAMBY_FEATURES
    assert FLAMBY_FEATURES[-5:] == ("cp=2", "cp=3", "cp=4", "restecg=1", "restecg=2")
    assert not any(n in data.feature_names for n in ("slope", "ca", "thal", "cp=1", "restecg=0"))
    assert not np.isnan(data.features).any()
    assert data.site_names == ("Cleveland", "Hungary", "Switzerland", "VA Long Beach")
    assert data.split is not None and data.site_ids is not None
    sizes = [
        (int(np.sum(own & (data.split == "train"))), int(np.sum(own & (data.split == "test"))))
        for own in (data.site_ids == k for k in range(4))
    ]
    assert sizes == SIZES
    for k, expected in enumerate(FIRST_TEST_POSITIONS):
        own_split = data.split[data.site_ids == k]
        assert np.flatnonzero(own_split == "test")[:8].tolist() == expected
    # label num > 0; positives per centre among the kept records
    assert [int(data.labels[data.site_ids == k].sum()) for k in range(4)] == [139, 98, 45, 101]
    assert np.array_equal(data.labels, (data.extra["num"] > 0).astype(np.int64))


def test_flamby_scaling_standardises_with_each_centres_training_records(heart: Path) -> None:
    data = flamby_heart_disease(heart)
    assert data.preprocessing[-1].startswith(NONPRIVATE_MARK)
    assert data.privacy_caveats
    assert data.site_ids is not None and data.split is not None
    for k in range(4):
        train = data.features[(data.site_ids == k) & (data.split == "train")].astype(np.float64)
        assert np.allclose(train.mean(axis=0), 0, atol=1e-5)
        std = train.std(axis=0, ddof=1)
        # Switzerland records chol = 0 throughout: a constant column stays 0
        assert np.allclose(std[std > 0], 1, atol=1e-5)


def test_flamby_pooled_scaling_is_flambys_pooled_baseline(heart: Path) -> None:
    pooled = flamby_heart_disease(heart, scaling="flamby-pooled")
    per_centre = flamby_heart_disease(heart, scaling="flamby")
    assert pooled.preprocessing[-1].startswith(NONPRIVATE_MARK)
    assert pooled.split is not None
    train = pooled.split == "train"
    x = pooled.features[train].astype(np.float64)
    assert np.allclose(x.mean(axis=0), 0, atol=1e-5)
    assert np.allclose(x.std(axis=0, ddof=1), 1, atol=1e-5)
    # FLamby scores its pooled model on the per-centre test sets
    assert np.array_equal(pooled.features[~train], per_centre.features[~train])


def test_public_scaling_reads_no_record(heart: Path) -> None:
    data = flamby_heart_disease(heart, scaling="public")
    assert not data.privacy_caveats
    assert not any(NONPRIVATE_MARK in note for note in data.preprocessing)
    assert data.features.min() >= 0 and data.features.max() <= 1
    dummies = data.features[:, -5:]
    assert set(np.unique(dummies).tolist()) == {0.0, 1.0}


def test_an_unknown_scaling_is_refused(heart: Path) -> None:
    with pytest.raises(ValueError, match="scaling"):
        flamby_heart_disease(heart, scaling="minmax")  # type: ignore[arg-type]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_published_means_are_the_client_averaged_metric_over_seeds(results: Path) -> None:
    published = published_results(results, "heart")
    expected_methods = {"Pooled Training", "Local 0", "Local 1", "Local 2", "Local 3"}
    assert expected_methods | {"FedAvg", "Cyclic", "FedProx", "Scaffold"} <= set(published)
    per_seed, pooled = [], []
    for seed in range(42, 47):
        rows = [r for r in _rows(results / f"heart_seed{seed}.csv") if r["Method"] == "FedAvg100"]
        clients = [float(r["Metric"]) for r in rows if r["Test"].startswith("client_test_")]
        assert len(clients) == 4
        per_seed.append(sum(clients) / 4)
        pooled += [float(r["Metric"]) for r in rows if r["Test"] == "Pooled Test"]
    fedavg = published["FedAvg"]
    assert fedavg.label == "FedAvg100"
    assert fedavg.seeds == (42, 43, 44, 45, 46)
    assert fedavg.mean == pytest.approx(statistics.fmean(per_seed), abs=1e-12)
    assert fedavg.std == pytest.approx(statistics.stdev(per_seed), abs=1e-12)
    assert fedavg.pooled_test_mean == pytest.approx(statistics.fmean(pooled), abs=1e-12)
    assert published["Pooled Training"].mean == pytest.approx(0.7353, abs=1e-4)


def test_tcga_results_have_six_locals(results: Path) -> None:
    published = published_results(results, "tcga")
    assert {f"Local {k}" for k in range(6)} <= set(published)
    assert all(len(p.seeds) == 5 for p in published.values())


def _copy(results: Path, tmp_path: Path) -> Path:
    target = tmp_path / "flamby_results"
    target.mkdir()
    for seed in range(42, 47):
        shutil.copy(results / f"heart_seed{seed}.csv", target / f"heart_seed{seed}.csv")
    return target


def test_a_malformed_metric_is_refused_naming_file_and_line(results: Path, tmp_path: Path) -> None:
    folder = _copy(results, tmp_path)
    path = folder / "heart_seed44.csv"
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[0].split(",")
    cells = lines[6].split(",")
    cells[header.index("Metric")] = "0.7x"
    lines[6] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"heart_seed44\.csv, line 7, column 'Metric'"):
        published_results(folder, "heart")


def test_a_file_without_a_needed_column_is_refused(results: Path, tmp_path: Path) -> None:
    folder = _copy(results, tmp_path)
    path = folder / "heart_seed43.csv"
    path.write_text(
        path.read_text(encoding="utf-8").replace("Method", "Strategy", 1), encoding="utf-8"
    )
    with pytest.raises(DataFormatError, match=r"heart_seed43\.csv, line 1: .*Method"):
        published_results(folder, "heart")


def test_a_row_of_another_seed_is_refused(results: Path, tmp_path: Path) -> None:
    folder = _copy(results, tmp_path)
    shutil.copy(folder / "heart_seed42.csv", folder / "heart_seed45.csv")
    with pytest.raises(DataFormatError, match=r"heart_seed45\.csv, line 2, column 'seed'"):
        published_results(folder, "heart")


def test_no_result_files_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="no such files"):
        published_results(tmp_path, "heart")


def test_an_undeclared_category_is_refused(heart: Path, tmp_path: Path) -> None:
    folder = tmp_path / "heart"
    shutil.copytree(heart, folder)
    path = folder / "processed.cleveland.data"
    path.chmod(0o644)
    lines = path.read_text(encoding="ascii").splitlines()
    cells = lines[0].split(",")
    cells[2] = "5.0"  # cp is 1..4
    lines[0] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n", encoding="ascii")
    with pytest.raises(DataFormatError, match=r"column 'cp'.*cp = 5"):
        flamby_heart_disease(folder)
