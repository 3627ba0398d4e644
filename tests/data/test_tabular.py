"""Tabular loaders: shapes and class counts equal PROVENANCE.md; bad files fail clearly."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from dpfl.data import public_tables
from dpfl.data.dataset import DataFormatError


def test_breast_cancer_wisconsin_is_the_embedded_default() -> None:
    data = public_tables.breast_cancer_wisconsin()
    assert data.features.shape == (569, 30)
    assert data.class_counts().tolist() == [212, 357]
    assert not np.isnan(data.features).any()


def test_heart_disease_matches_provenance(shared_data: Path) -> None:
    data = public_tables.heart_disease(shared_data / "uci_heart_disease")
    assert data.features.shape == (920, 13)
    assert data.site_names == ("Cleveland", "Hungary", "Switzerland", "VA Long Beach")
    assert np.bincount(data.site_ids).tolist() == [303, 294, 123, 200]
    positives = [int(data.labels[data.site_ids == k].sum()) for k in range(4)]
    assert positives == [139, 106, 115, 149]
    # '?' cells per file: 6, 782, 273, 698.
    missing = [int(np.isnan(data.features[data.site_ids == k]).sum()) for k in range(4)]
    assert missing == [6, 782, 273, 698]
    assert np.bincount(data.extra["num"][data.site_ids == 0]).tolist() == [164, 55, 36, 35, 13]


def _copy_heart(shared_data: Path, tmp_path: Path) -> Path:
    target = tmp_path / "heart"
    shutil.copytree(shared_data / "uci_heart_disease", target)
    for path in target.iterdir():
        path.chmod(0o644)
    return target


def test_heart_disease_names_the_bad_cell(shared_data: Path, tmp_path: Path) -> None:
    directory = _copy_heart(shared_data, tmp_path)
    path = directory / "processed.va.data"
    lines = path.read_text().splitlines()
    lines[4] = lines[4].replace("1,", "x,", 1)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=r"processed\.va\.data, line 5, column 'sex'"):
        public_tables.heart_disease(directory)


def test_heart_disease_wrong_column_count_and_bad_label(shared_data: Path, tmp_path: Path) -> None:
    directory = _copy_heart(shared_data, tmp_path)
    path = directory / "processed.hungarian.data"
    original = path.read_text()
    path.write_text(original + "1,2,3\n")
    with pytest.raises(DataFormatError, match=r"line 295: expected 14 columns, got 3"):
        public_tables.heart_disease(directory)
    path.write_text(original.replace(",0\n", ",7\n", 1))
    with pytest.raises(DataFormatError, match=r"line 1, column 'num'"):
        public_tables.heart_disease(directory)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match=r"processed\.cleveland\.data: file not found"):
        public_tables.heart_disease(tmp_path)


def test_tcga_brca_matches_flamby_split(shared_data: Path) -> None:
    data = public_tables.tcga_brca_clinical(shared_data / "fed_tcga_brca")
    assert data.features.shape == (1088, 39)
    assert "8 patients of region 'Other' dropped" in data.description
    train = np.bincount(data.site_ids[data.split == "train"]).tolist()
    test = np.bincount(data.site_ids[data.split == "test"]).tolist()
    assert train == [248, 156, 164, 129, 129, 40]
    assert test == [63, 40, 42, 33, 33, 11]
    # brca.csv: 151 deaths, 945 censored; the 8 'Other' patients are all censored.
    assert data.class_counts().tolist() == [937, 151]
    assert np.array_equal(data.labels, data.extra["E"])


def test_diabetes130_counts_and_patient_unit(shared_data: Path) -> None:
    every = public_tables.diabetes130(
        shared_data / "diabetes130",
        one_encounter_per_patient=False,
        proxy_site_column="admission_source_id",
    )
    assert len(every) == 101_766
    assert every.labels.sum() == 11_357  # readmitted '<30'
    assert len(every.site_names) == 17
    assert "PROXY site split" in every.description
    counts = np.bincount(every.site_ids)
    assert counts[every.site_names.index("admission_source_id=7")] == 57_494
    patients = public_tables.diabetes130(shared_data / "diabetes130")
    assert len(patients) == 71_518  # distinct patient_nbr
    assert "30248 repeat encounters of a patient removed" in patients.description
    assert patients.site_ids is None and "synthetic" in patients.description
    assert not np.isnan(patients.features).any()


def test_diabetes130_bad_value_is_named(tmp_path: Path) -> None:
    header = "encounter_id,patient_nbr,age,readmitted," + ",".join(
        [*public_tables.DIABETES_NUMERIC, *public_tables.DIABETES_CATEGORIES]
    )
    n_other = len(public_tables.DIABETES_NUMERIC) + len(public_tables.DIABETES_CATEGORIES)
    good = "1,10,[50-60),NO," + ",".join(["1"] * n_other)
    bad = "2,11,[50-60),MAYBE," + ",".join(["1"] * n_other)
    with zipfile.ZipFile(tmp_path / "dataset_diabetes.zip", "w") as archive:
        archive.writestr(public_tables.DIABETES_MEMBER, "\n".join([header, good, bad]) + "\n")
    with pytest.raises(DataFormatError, match=r"line 3, column 'readmitted'"):
        public_tables.diabetes130(tmp_path)


def test_tcga_brca_centre_must_match_tss_region(shared_data: Path, tmp_path: Path) -> None:
    target = tmp_path / "tcga"
    shutil.copytree(shared_data / "fed_tcga_brca", target)
    split = target / "train_test_split.csv"
    split.chmod(0o644)
    lines = split.read_text().splitlines()
    assert lines[1] == "TCGA-AO-A1KO,train,train_0"  # AO: a Northeast site
    lines[1] = "TCGA-AO-A1KO,train,train_4"
    split.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        DataFormatError, match="fold centre Europe but TSS AO is in region Northeast"
    ):
        public_tables.tcga_brca_clinical(target)
    split.write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    with pytest.raises(
        DataFormatError, match="patient TCGA-AO-A1KO of region Northeast has no fold"
    ):
        public_tables.tcga_brca_clinical(target)


def test_empty_heart_files_are_named(tmp_path: Path) -> None:
    for filename, _ in public_tables.HEART_SITES:
        (tmp_path / filename).write_text("")
    with pytest.raises(
        DataFormatError, match=r"processed\.cleveland\.data: no records of Cleveland"
    ):
        public_tables.heart_disease(tmp_path)


def test_one_empty_heart_file_is_named(shared_data: Path, tmp_path: Path) -> None:
    directory = _copy_heart(shared_data, tmp_path)
    (directory / "processed.va.data").write_text("")
    with pytest.raises(DataFormatError, match=r"processed\.va\.data: no records of VA Long Beach"):
        public_tables.heart_disease(directory)


def test_header_only_csv_and_empty_diabetes_table_are_named(tmp_path: Path) -> None:
    (tmp_path / "brca.csv").write_text("pid," + ",".join(f"f{i}" for i in range(39)) + ",E,T\n")
    with pytest.raises(DataFormatError, match=r"brca\.csv: no rows after the header"):
        public_tables.tcga_brca_clinical(tmp_path)
    with zipfile.ZipFile(tmp_path / "dataset_diabetes.zip", "w") as archive:
        archive.writestr(public_tables.DIABETES_MEMBER, "")
    with pytest.raises(DataFormatError, match=r"diabetic_data\.csv: no encounters"):
        public_tables.diabetes130(tmp_path)


@pytest.mark.parametrize("cell", ["abc", "nan", "inf"])
def test_diabetes130_a_cell_that_is_not_a_number_is_named(tmp_path: Path, cell: str) -> None:
    """numpy reads "nan" as a number: the loader refuses it as `parse_float` does."""
    header = "encounter_id,patient_nbr,age,readmitted," + ",".join(
        [*public_tables.DIABETES_NUMERIC, *public_tables.DIABETES_CATEGORIES]
    )
    n_other = len(public_tables.DIABETES_NUMERIC) + len(public_tables.DIABETES_CATEGORIES)
    good = "1,10,[50-60),NO," + ",".join(["1"] * n_other)
    bad = "2,11,[50-60),NO," + ",".join([cell] + ["1"] * (n_other - 1))
    with zipfile.ZipFile(tmp_path / "dataset_diabetes.zip", "w") as archive:
        archive.writestr(public_tables.DIABETES_MEMBER, "\n".join([header, good, bad]) + "\n")
    first = public_tables.DIABETES_NUMERIC[0]
    with pytest.raises(DataFormatError, match=rf"line 3, column '{first}': .*'{cell}'"):
        public_tables.diabetes130(tmp_path)
