"""Diabetes 130's patient unit (public_tables.diabetes130): a declared cap keeps each patient's
first k encounters in file order, each patient at the proxy site of their first, the
patient numbered as the unit; patients subsampled by a rule on their own number."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from dpfl.data import public_tables
from dpfl.data.table import Column
from dpfl.experiments.recipes.diabetes_readmission import DIAGNOSIS_GROUPS


def _zip(tmp_path: Path, encounters: list[tuple[int, str, str]]) -> Path:
    """(patient_nbr, admission_source_id, readmitted) per encounter, in file order."""
    header = "encounter_id,patient_nbr,admission_source_id,age,readmitted," + ",".join(
        [*public_tables.DIABETES_NUMERIC, *public_tables.DIABETES_CATEGORIES]
    )
    rest = ",".join(
        ["1"] * (len(public_tables.DIABETES_NUMERIC) + len(public_tables.DIABETES_CATEGORIES))
    )
    lines = [
        f"{i},{p},{source},[50-60),{label},{rest}"
        for i, (p, source, label) in enumerate(encounters)
    ]
    with zipfile.ZipFile(tmp_path / "dataset_diabetes.zip", "w") as archive:
        archive.writestr(public_tables.DIABETES_MEMBER, "\n".join([header, *lines]) + "\n")
    return tmp_path


ENCOUNTERS = [
    (10, "7", "NO"),
    (20, "1", "<30"),
    (10, "4", "<30"),
    (10, "1", ">30"),
    (30, "11", "NO"),
    (10, "7", "<30"),
]


def test_a_declared_cap_keeps_each_patients_first_encounters(tmp_path: Path) -> None:
    data = public_tables.diabetes130(
        _zip(tmp_path, ENCOUNTERS),
        one_encounter_per_patient=False,
        proxy_site_column="admission_source_group",
        max_records=2,
        patient_unit=True,
    )
    # patient 10's third and fourth encounters are dropped: records 0, 1, 2, 4 stay
    assert data.labels.tolist() == [0, 1, 1, 0]
    assert data.units is not None and data.units.tolist() == [0, 1, 0, 2]
    assert data.max_records == 2
    sites = [data.site_names[k] for k in data.site_ids.tolist()]  # type: ignore[union-attr]
    group = "admission_source_group="
    # patient 10 stays at "emergency", their first encounter's, though the second is a transfer
    assert sites == [f"{group}emergency", f"{group}referral", f"{group}emergency", f"{group}other"]
    recorded = public_tables.diabetes130(tmp_path, one_encounter_per_patient=False, max_records=2)
    assert recorded.units is None and recorded.labels.tolist() == [0, 1, 1, 0]
    with pytest.raises(ValueError, match="patient_unit needs a declared max_records"):
        public_tables.diabetes130(tmp_path, one_encounter_per_patient=False, patient_unit=True)


def test_patients_are_subsampled_by_their_own_number(tmp_path: Path) -> None:
    many = [(p, "7", "NO") for p in range(400) for _ in range(2)]
    half = public_tables.diabetes130(
        _zip(tmp_path, many),
        one_encounter_per_patient=False,
        max_records=2,
        patient_unit=True,
        patients_fraction=0.5,
    )
    assert half.units is not None
    kept = len(np.unique(half.units))
    assert 150 < kept < 250 and len(half.labels) == 2 * kept  # all of a kept patient's
    again = public_tables.diabetes130(
        _zip(tmp_path, many[: len(many) // 2]),
        one_encounter_per_patient=False,
        max_records=2,
        patient_unit=True,
        patients_fraction=0.5,
    )
    assert again.units is not None  # a patient's fate does not depend on the others
    assert set(public_tables._hashed(np.asarray([str(p) for p in range(200)])) < 0.5) == {
        True,
        False,
    }
    assert len(np.unique(again.units)) == int(
        (public_tables._hashed(np.asarray([str(p) for p in range(200)])) < 0.5).sum()
    )


def test_disjoint_shares_of_patients_by_the_same_rule(tmp_path: Path) -> None:
    folder = _zip(tmp_path, [(p, "7", "NO") for p in range(400)])
    hashed = public_tables._hashed(np.asarray([str(p) for p in range(400)]))

    def kept(**share: float) -> int:
        data = public_tables.diabetes130(folder, one_encounter_per_patient=False, **share)
        return len(data.labels)

    assert kept(patients_fraction=0.25) == int((hashed < 0.25).sum())
    assert kept(patients_from=0.25, patients_fraction=0.5) == int(
        ((hashed >= 0.25) & (hashed < 0.5)).sum()
    )
    assert kept(patients_from=0.25, patients_fraction=0.5) + kept(patients_fraction=0.25) == kept(
        patients_fraction=0.5
    )
    with pytest.raises(ValueError, match="patients_from < patients_fraction"):
        public_tables.diabetes130(folder, patients_from=0.5, patients_fraction=0.5)


def test_declared_columns_replace_the_built_in_categories(tmp_path: Path) -> None:
    """The recipe's `[data.columns]`: its ICD-9 groups and categories, read from the
    file as a table's; a column that is not text, or is the loader's own, refused."""
    header = "encounter_id,patient_nbr,admission_source_id,age,readmitted,diag_1,metformin,"
    header += ",".join(public_tables.DIABETES_NUMERIC)
    numbers = ",".join(["1"] * len(public_tables.DIABETES_NUMERIC))
    cells = [("V57", "No"), ("250.83", "Up"), ("?", "Steady"), ("1000", "Sideways")]
    lines = [f"{i},{i},7,[50-60),NO,{d},{m},{numbers}" for i, (d, m) in enumerate(cells)]
    with zipfile.ZipFile(tmp_path / "dataset_diabetes.zip", "w") as archive:
        archive.writestr(public_tables.DIABETES_MEMBER, "\n".join([header, *lines]) + "\n")
    columns = {
        "diag_1": Column(groups=DIAGNOSIS_GROUPS),
        "metformin": Column(categories=["No", "Steady", "Up", "Down"]),
    }
    data = public_tables.diabetes130(tmp_path, columns=columns)
    names = data.feature_names
    assert names[: 1 + len(public_tables.DIABETES_NUMERIC)] == (
        "age",
        *public_tables.DIABETES_NUMERIC,
    )
    assert names[-5:] == tuple(f"metformin={c}" for c in ("No", "Steady", "Up", "Down", "other"))
    on = [[n for n, v in zip(names, row, strict=True) if v and "=" in n] for row in data.features]
    assert on == [
        ["diag_1=supplementary", "metformin=No"],
        ["diag_1=diabetes", "metformin=Up"],
        ["diag_1=missing", "metformin=Steady"],
        ["diag_1=other", "metformin=other"],
    ]
    with pytest.raises(ValueError, match="'age' is read as declared by diabetes130"):
        public_tables.diabetes130(tmp_path, columns={"age": Column(categories=["[50-60)"])})
    with pytest.raises(ValueError, match="declare `categories` or `groups`"):
        public_tables.diabetes130(tmp_path, columns={"diag_1": Column(range=(0, 1000))})
