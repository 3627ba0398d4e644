"""PhysioNet 2012: counts per set and ICU type equal PROVENANCE.md; bad stays fail clearly."""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from dpfl.data import partition, preprocess
from dpfl.data.dataset import DataFormatError, Dataset
from dpfl.data.physionet import FEATURE_NAMES, physionet2012, public_ranges


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("physionet-cache")


@pytest.fixture(scope="module")
def physionet(shared_data: Path, cache_dir: Path) -> Dataset:
    return physionet2012(shared_data / "physionet2012", cache_dir=cache_dir)


def test_counts_match_provenance(physionet: Dataset) -> None:
    assert physionet.features.shape == (8000, 4 + 37 * 6) == (8000, len(FEATURE_NAMES))
    for name, sizes, deaths in (
        ("set-a", [577, 874, 1481, 1068], [81, 43, 275, 155]),
        ("set-b", [590, 782, 1436, 1192], [72, 34, 286, 176]),
    ):
        in_set = physionet.split == name
        assert np.bincount(physionet.site_ids[in_set]).tolist() == sizes
        assert [
            int(physionet.labels[in_set & (physionet.site_ids == k)].sum()) for k in range(4)
        ] == deaths
    assert physionet.class_counts().tolist() == [6878, 1122]  # 554 + 568 deaths


def test_features_follow_the_declared_missing_rule(physionet: Dataset) -> None:
    x = physionet.features
    count = x[:, FEATURE_NAMES.index("Cholesterol_count")]
    mean = x[:, FEATURE_NAMES.index("Cholesterol_mean")]
    assert np.array_equal(count == 0, np.isnan(mean))
    hr = [x[:, FEATURE_NAMES.index(f"HR_{s}")] for s in ("min", "mean", "max")]
    measured = ~np.isnan(hr[0])
    assert np.all(hr[0][measured] <= hr[1][measured] + 1e-3)
    assert np.all(hr[1][measured] <= hr[2][measured] + 1e-3)
    # Rows in the files: set-a 1,757,980 and set-b 1,762,535, of which 6 descriptor lines
    # per stay (header excluded) are not time-series measurements.
    counts = x[:, [FEATURE_NAMES.index(f) for f in FEATURE_NAMES if f.endswith("_count")]]
    assert counts.sum() == 1_757_980 + 1_762_535 - 8000 * 6
    assert np.isnan(x[:, FEATURE_NAMES.index("Gender")]).sum() == 8  # Gender -1


def test_cache_is_reused_and_identical(
    shared_data: Path, cache_dir: Path, physionet: Dataset
) -> None:
    start = time.perf_counter()
    again = physionet2012(shared_data / "physionet2012", cache_dir=cache_dir)
    assert time.perf_counter() - start < 1.0
    assert np.array_equal(again.features, physionet.features, equal_nan=True)
    assert np.array_equal(again.extra["record_id"], physionet.extra["record_id"])


def test_more_silos_by_seed(physionet: Dataset) -> None:
    silos = partition.subdivide(partition.natural(physionet.site_ids), physionet.labels, 3, 0)
    assert len(silos) == 12
    partition.check_partition(silos, len(physionet))


def _write_set(directory: Path, stays: dict[str, str], outcomes: str) -> None:
    with tarfile.open(directory / "set-a.tar.gz", "w:gz") as archive:
        for name, text in stays.items():
            data = text.encode()
            info = tarfile.TarInfo(f"set-a/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    (directory / "Outcomes-a.txt").write_text(outcomes)


GOOD = (
    "Time,Parameter,Value\n00:00,RecordID,1\n00:00,Age,50\n00:00,Gender,1\n00:00,Height,-1\n"
    "00:00,ICUType,2\n00:00,Weight,80\n00:05,HR,70\n01:00,HR,90\n"
)
OUTCOMES = "RecordID,SAPS-I,SOFA,Length_of_stay,Survival,In-hospital_death\n1,1,1,1,-1,0\n"


def test_small_set_is_parsed_exactly(tmp_path: Path) -> None:
    _write_set(tmp_path, {"1.txt": GOOD}, OUTCOMES)
    data = physionet2012(tmp_path, sets=("a",))
    row = dict(zip(FEATURE_NAMES, data.features[0].tolist(), strict=True))
    assert row["Age"] == 50 and np.isnan(row["Height"]) and row["Weight"] == 80
    assert [row[f"HR_{s}"] for s in ("first", "last", "min", "max", "mean", "count")] == [
        70,
        90,
        70,
        90,
        80,
        2,
    ]
    assert row["Weight_count"] == 0 and np.isnan(row["Weight_mean"])
    assert data.site_ids.tolist() == [1]


@pytest.mark.parametrize(
    ("text", "outcomes", "message"),
    [
        (
            GOOD + "02:00,HR,fast\n",
            OUTCOMES,
            r"1\.txt, line 10, column 'Value': cannot parse 'fast'",
        ),
        (
            GOOD + "02:00,Glucosee,5\n",
            OUTCOMES,
            r"line 10: unknown or repeated parameter 'Glucosee'",
        ),
        (GOOD.replace("00:00,Age,50\n", ""), OUTCOMES, r"missing descriptor\(s\) \['Age'\]"),
        (GOOD.replace("ICUType,2", "ICUType,7"), OUTCOMES, "ICUType must be 1..4"),
        (
            GOOD,
            OUTCOMES.replace(",0\n", ",2\n"),
            r"Outcomes-a\.txt, line 2, column 'In-hospital_death'",
        ),
        (
            GOOD,
            OUTCOMES.replace("\n1,", "\n2,"),
            "2 RecordIDs do not match set-a files, e.g. 1",
        ),
    ],
)
def test_bad_stays_are_named(tmp_path: Path, text: str, outcomes: str, message: str) -> None:
    _write_set(tmp_path, {"1.txt": text}, outcomes)
    with pytest.raises(DataFormatError, match=message):
        physionet2012(tmp_path, sets=("a",))


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sets must be distinct"):
        physionet2012(tmp_path, sets=("c",))
    with pytest.raises(DataFormatError, match=r"Outcomes-a\.txt: file not found"):
        physionet2012(tmp_path, sets=("a",))


def test_public_ranges_scale_every_feature(physionet: Dataset) -> None:
    ranges = public_ranges()
    assert list(ranges) == list(FEATURE_NAMES)
    scaled = preprocess.scale_to_ranges(physionet, ranges)
    ready = preprocess.require_finite(preprocess.zero_impute(scaled))
    assert ready.features.min() >= 0 and ready.features.max() <= 1
    assert "226 features in all" in ready.preprocessing[0]
    assert ready.privacy_caveats == ()


def test_empty_files_are_named(tmp_path: Path) -> None:
    _write_set(tmp_path, {"1.txt": GOOD}, "")
    with pytest.raises(DataFormatError, match=r"Outcomes-a\.txt: no outcomes"):
        physionet2012(tmp_path, sets=("a",))
    _write_set(tmp_path, {}, OUTCOMES.splitlines()[0] + "\n")
    with pytest.raises(DataFormatError, match=r"Outcomes-a\.txt: no outcomes"):
        physionet2012(tmp_path, sets=("a",))
    _write_set(tmp_path, {}, OUTCOMES)
    with pytest.raises(DataFormatError, match=r"set-a\.tar\.gz: no stay files"):
        physionet2012(tmp_path, sets=("a",))
    (tmp_path / "set-a.tar.gz").write_bytes(b"")
    with pytest.raises(DataFormatError, match=r"set-a\.tar\.gz: unreadable archive"):
        physionet2012(tmp_path, sets=("a",))


def test_a_nan_measurement_is_named(tmp_path: Path) -> None:
    _write_set(tmp_path, {"1.txt": GOOD + "02:00,HR,nan\n"}, OUTCOMES)
    with pytest.raises(DataFormatError, match=r"line 10, column 'Value': non-finite value 'nan'"):
        physionet2012(tmp_path, sets=("a",))
