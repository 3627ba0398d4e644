"""A study's own table (dpfl.data.table): read with only its declared preprocessing, the
same from CSV and Parquet, and every bad cell refused naming the file, line and column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from dpfl.data import DataFormatError
from dpfl.data.table import Column, read_table

HEADER = "patient_nbr,hospital,age,race,creatinine,readmitted_30d"
ROWS = [
    "9001,north,50,Caucasian,1.0,0",
    "9002,south,120,Martian,2.718281828,1",
    "9003,north,,,0.5,1",
    "9004,east,-3,Asian,1.0,0",
    "9005,south,20,AfricanAmerican,1.5,0",
]
COLUMNS = {
    "age": Column(range=(0, 100), missing=40.0),
    "race": Column(categories=["Caucasian", "AfricanAmerican", "Asian"]),
    "creatinine": Column(range=(-1, 1), log=True),
}
FEATURES = ["age", "race", "creatinine"]
SITES = {"south": 2, "north": 2, "east": 1}


def _csv(tmp_path: Path, rows: list[str] = ROWS, header: str = HEADER) -> Path:
    path = tmp_path / "cohort.csv"
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


def _read(path: Path, **changes: Any) -> Any:
    kwargs: dict[str, Any] = {
        "columns": COLUMNS,
        "features": FEATURES,
        "label": "readmitted_30d",
        "site": "hospital",
        "sites": SITES,
    }
    return read_table(path, **(kwargs | changes))


def test_a_table_reads_with_only_its_declared_preprocessing(tmp_path: Path) -> None:
    data = _read(_csv(tmp_path))
    assert data.feature_names == (
        "age",
        "race=Caucasian",
        "race=AfricanAmerican",
        "race=Asian",
        "race=other",
        "creatinine",
    )
    np.testing.assert_allclose(
        data.features,
        [
            [0.5, 1, 0, 0, 0, 0.5],  # ln 1 = 0 on [-1, 1]
            [1.0, 0, 0, 0, 1, 1.0],  # 120 clipped; Martian is "other"; ln e = 1
            [0.4, 0, 0, 0, 0, (np.log(0.5) + 1) / 2],  # empty age → 40; empty race: missing
            [0.0, 0, 0, 1, 0, 0.5],  # -3 clipped
            [0.2, 0, 1, 0, 0, (np.log(1.5) + 1) / 2],
        ],
        rtol=1e-6,
    )
    assert data.features.dtype == np.float32
    assert data.labels.tolist() == [0, 1, 1, 0, 0]
    assert data.class_names == ("0", "1")
    assert data.site_names == ("south", "north", "east")  # the declared order
    assert data.site_ids.tolist() == [1, 0, 1, 2, 0]
    assert "patient_nbr" not in " ".join(data.feature_names)  # not a feature unless listed
    assert any("declared public ranges" in note for note in data.preprocessing)


def test_parquet_reads_to_the_same_dataset(tmp_path: Path) -> None:
    from_csv = _read(_csv(tmp_path))
    table = pa.table(
        {
            "patient_nbr": pa.array([9001, 9002, 9003, 9004, 9005], pa.int64()),
            "hospital": ["north", "south", "north", "east", "south"],
            "age": pa.array([50.0, 120.0, None, -3.0, 20.0], pa.float64()),
            "race": ["Caucasian", "Martian", None, "Asian", "AfricanAmerican"],
            "creatinine": [1.0, 2.718281828, 0.5, 1.0, 1.5],
            "readmitted_30d": pa.array([0, 1, 1, 0, 0], pa.int8()),
        }
    )
    pq.write_table(table, tmp_path / "cohort.parquet")
    from_parquet = _read(tmp_path / "cohort.parquet")
    np.testing.assert_array_equal(from_parquet.features, from_csv.features)
    for field in ("labels", "site_ids"):
        np.testing.assert_array_equal(getattr(from_parquet, field), getattr(from_csv, field))
    for field in ("feature_names", "class_names", "site_names", "preprocessing"):
        assert getattr(from_parquet, field) == getattr(from_csv, field)


def test_preprocessing_reads_nothing_from_the_records(tmp_path: Path) -> None:
    """One record's values changed to extremes change no other record's features."""
    before = _read(_csv(tmp_path)).features
    changed = [*ROWS]
    changed[1] = "9002,south,1e9,Zulu,1e-9,1"
    after = _read(_csv(tmp_path, changed)).features
    others = [0, 2, 3, 4]
    np.testing.assert_array_equal(after[others], before[others])
    assert not np.array_equal(after[1], before[1])


def test_every_other_column_is_a_feature_by_default_and_survival_labels(tmp_path: Path) -> None:
    header = "time,event,age"
    path = _csv(tmp_path, ["10.5,1,30", "3,0,60"], header)
    data = read_table(path, columns={"age": COLUMNS["age"]}, time="time", event="event")
    assert data.feature_names == ("age",)
    assert data.is_survival
    np.testing.assert_array_equal(data.labels, [[10.5, 1.0], [3.0, 0.0]])


def _row(index: int, text: str) -> list[str]:
    rows = [*ROWS]
    rows[index] = text
    return rows


BAD = {
    "a missing column": (ROWS, {"features": ["age", "weight"]}, None, "weight", "no such column"),
    "a label outside the classes": (
        _row(2, "9003,north,,,0.5,2"),
        {},
        4,
        "readmitted_30d",
        "label '2' is not one of the declared classes ['0', '1']",
    ),
    "a cell that does not parse": (
        _row(3, "9004,east,abc,Asian,1.0,0"),
        {},
        5,
        "age",
        "cannot parse 'abc' as a number",
    ),
    "a non-finite cell": (
        _row(0, "9001,north,50,Caucasian,inf,0"),
        {},
        2,
        "creatinine",
        "non-finite value 'inf'",
    ),
    "an empty number without a declared value": (
        _row(4, "9005,south,20,AfricanAmerican,,0"),
        {},
        6,
        "creatinine",
        "empty cell: declare what it stands for",
    ),
    "a log of zero": (_row(4, "9005,south,20,Asian,0,0"), {}, 6, "creatinine", "log of 0"),
    "a site not declared": (
        _row(4, "9005,west,20,Asian,1,0"),
        {},
        6,
        "hospital",
        "site 'west' is not declared",
    ),
    "a site with fewer records than its public size": (
        ROWS,
        {"sites": {"south": 2, "north": 3, "east": 1}},
        None,
        "hospital",
        "site 'north' holds 2 records, fewer than its declared public size 3",
    ),
    "a column without a declaration": (
        ROWS,
        {"features": ["age", "patient_nbr"]},
        None,
        "patient_nbr",
        "no public preprocessing declared: a number needs `range = [low, high]`",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_naming_the_file_line_and_column(tmp_path: Path, case: str) -> None:
    rows, changes, line, column, message = BAD[case]
    with pytest.raises(DataFormatError) as caught:
        _read(_csv(tmp_path, rows), **changes)
    text = str(caught.value)
    where = f"{tmp_path / 'cohort.csv'}" + (f", line {line}" if line else "")
    assert text.startswith(f"{where}, column {column!r}: "), text
    assert message in text and "\n" not in text


def test_a_parquet_cell_is_named_by_its_row(tmp_path: Path) -> None:
    table = pa.table({"age": ["50", "old"], "readmitted_30d": [0, 1]})
    pq.write_table(table, tmp_path / "t.parquet")
    with pytest.raises(DataFormatError, match=r"t\.parquet, row 2, column 'age': cannot parse"):
        read_table(tmp_path / "t.parquet", columns={"age": COLUMNS["age"]}, label="readmitted_30d")


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"range": ["?", "?"]}, "still '?': declare the range from a public source"),
        ({"categories": ["?"]}, "still '?': list the categories from the data dictionary"),
        ({}, "give a number's `range`, a text's `categories` or a code's `groups`"),
        ({"range": [5, 1]}, "low must be below high"),
        ({"categories": ["a"], "log": True}, "categories and groups take no `log` or `missing`"),
    ],
)
def test_a_column_declaration_is_checked(declared: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("?", r"\?")):
        Column.model_validate(declared)
