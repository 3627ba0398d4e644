"""Codes grouped by declared ranges (dpfl.data.codes): the diabetes recipe's ICD-9-CM
chapters on the codes at their edges, a table column's `groups`, and every bad
declaration refused in one clear line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from dpfl.data import codes
from dpfl.data.table import Column, read_table
from dpfl.experiments.recipes.diabetes_readmission import COLUMNS, DIAGNOSIS_GROUPS, IDS

CHAPTERS = codes.grouping(DIAGNOSIS_GROUPS)


@pytest.mark.parametrize(
    ("code", "group"),
    [
        ("V57", "supplementary"),
        ("V01", "supplementary"),
        ("V91", "supplementary"),
        ("E909", "external"),
        ("E000", "external"),
        ("250.83", "diabetes"),
        ("250", "diabetes"),
        ("250.01", "diabetes"),
        ("249.9", "endocrine"),
        ("251", "endocrine"),
        ("?", "missing"),
        ("390", "circulatory"),
        ("389.9", "nervous"),
        ("459.81", "circulatory"),
        ("460", "respiratory"),
        ("001", "infectious"),
        ("8", "infectious"),  # the file writes 008 as 8
        ("139.8", "infectious"),
        ("140", "neoplasms"),
        ("999", "injury"),
        ("799.9", "ill_defined"),
    ],
)
def test_an_icd9_code_is_in_its_chapter(code: str, group: str) -> None:
    assert CHAPTERS.names[CHAPTERS.group_of(code)] == group


@pytest.mark.parametrize("code", ["V99", "E1000", "1000", "0", "V", "250x", "None", "v57"])
def test_a_code_outside_every_range_is_other(code: str) -> None:
    assert CHAPTERS.group_of(code) == -1


def test_one_hot_has_other_last_and_an_empty_cell_all_zero() -> None:
    block = CHAPTERS.one_hot(np.asarray(["V57", "1000", "", "250.83", "V57"]))
    assert block.shape == (5, len(DIAGNOSIS_GROUPS) + 1)
    assert block.sum(axis=1).tolist() == [1, 1, 0, 1, 1]
    assert block[1, -1] == 1  # "1000": other
    assert block[3, list(DIAGNOSIS_GROUPS).index("diabetes")] == 1
    assert (block[0] == block[4]).all()


def test_the_chapters_cover_every_three_digit_code_once() -> None:
    """ICD-9-CM's 001-999, V01-V91 and E000-E999: each in exactly one group."""
    every = [f"{n:03d}" for n in range(1, 1000)] + [f"V{n:02d}" for n in range(1, 92)]
    every += [f"E{n:03d}" for n in range(1000)]
    assert all(CHAPTERS.group_of(code) >= 0 for code in every)
    assert CHAPTERS.group_of("000") == -1


def test_a_decimal_bound_covers_only_up_to_itself() -> None:
    grouped = codes.grouping({"type1": ["250.01-250.03"], "other_diabetes": ["250.00-250.00"]})
    assert [grouped.group_of(c) for c in ("250.01", "250.03", "250.00", "250.04", "250")] == [
        0,
        0,
        1,
        -1,
        1,
    ]


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ({}, "at least one group"),
        ({"a": []}, "no members"),
        ({"other": ["001-139"]}, "'other' is the column's undeclared values"),
        ({"a": ["001-139-2"]}, "no code range"),
        ({"a": ["001-abc"]}, "no code range"),
        ({"a": ["V01-E99"]}, "the same letter"),
        ({"a": ["139-001"]}, "low must not be above high"),
        ({"a": ["240-279"], "b": ["250-250"]}, "overlap"),
        ({"a": ["001-139", "139.5-140"]}, "overlap"),
        ({"a": ["?"], "b": ["?"]}, "listed twice"),
        ({"a": ["250.83"], "b": ["250-250"]}, "also in '250-250'"),
    ],
)
def test_a_bad_grouping_is_a_clear_error(groups: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        codes.grouping(groups)
    with pytest.raises(ValidationError, match=message):
        Column(groups=groups)


def test_a_column_is_one_kind() -> None:
    with pytest.raises(ValidationError, match="one of them"):
        Column(groups={"a": ["?"]}, categories=["x"])
    with pytest.raises(ValidationError, match="take no `log` or `missing`"):
        Column(groups={"a": ["?"]}, missing="zero")


def test_a_tables_column_reads_its_declared_groups(tmp_path: Path) -> None:
    path = tmp_path / "cohort.csv"
    path.write_text("diag,y\nV57,0\n250.83,1\n?,0\n,1\n1000,0\n", encoding="utf-8")
    data = read_table(path, columns={"diag": Column(groups=DIAGNOSIS_GROUPS)}, label="y")
    assert data.feature_names[-1] == "diag=other"
    names = [n.removeprefix("diag=") for n in data.feature_names]
    chosen = [names[row.argmax()] if row.any() else None for row in data.features]
    assert chosen == ["supplementary", "diabetes", "missing", None, "other"]
    assert any("groups of codes" in note for note in data.preprocessing)


def test_the_recipes_medications_and_ids_are_the_dictionarys() -> None:
    levels = ["No", "Steady", "Up", "Down"]
    drugs = [name for name, c in COLUMNS.items() if c.get("categories") == levels]
    assert len(drugs) == 23
    assert COLUMNS["admission_type_id"]["categories"] == [str(i) for i in range(1, 9)]
    assert COLUMNS["discharge_disposition_id"]["categories"] == [str(i) for i in range(1, 31)]
    assert IDS == {"admission_type_id": 8, "discharge_disposition_id": 30}
    assert [COLUMNS[f"diag_{i}"]["groups"] for i in (1, 2, 3)] == [DIAGNOSIS_GROUPS] * 3
    for declared in COLUMNS.values():
        Column(**declared)  # each a valid declaration
