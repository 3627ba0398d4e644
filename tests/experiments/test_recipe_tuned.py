"""A recipe's tuned studies (`Plan.tuned`): each selected by `dpfl tune` into
`DIR/tuned/NAME/`, in worker processes with `workers` > 1, handed to `compare_tuned`,
and read back, never selected again, on a rerun (a selection is released once)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dpfl.experiments import recipes
from dpfl.experiments.recipes import RECIPES, Plan, Recipe, Row, Selected, Tuning, reproduce
from dpfl.experiments.study.config import Study
from dpfl.experiments.study.tune import RESULT


def _study(name: str) -> Study:
    return Study(
        {
            "name": name,
            "rounds": 2,
            "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 2}},
            "algorithm": {"name": "fedavg", "learning_rate": [0.1, 1.0]},
            "privacy": {"epsilon": 2.0, "delta": 1e-5},
        }
    )


def _rows(selected: list[Selected]) -> list[Row]:
    return [Row(s.tuning.study.name, "", f"ε = {s.epsilon:.4f}") for s in selected]


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> Recipe:
    tunings = [Tuning(_study(name), "auroc", 2.0) for name in ("tiny-a", "tiny-b")]
    recipe = Recipe(
        name="tiny",
        title="two tuned studies",
        studies=lambda data_dir, scale: Plan([], ["no swept study"], tunings),
        compare=lambda runs, store: [],
        compare_tuned=_rows,
    )
    monkeypatch.setitem(RECIPES, "tiny", recipe)
    return recipe


def test_tuned_studies_are_selected_once_and_read_again_on_a_rerun(
    tiny: Recipe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = reproduce("tiny", tmp_path, workers=2)
    assert [s.tuning.study.name for s in first.selected] == ["tiny-a", "tiny-b"]
    for name in ("tiny-a", "tiny-b"):
        assert (tmp_path / recipes.TUNED / name / RESULT).exists()
    assert all(0 < s.epsilon <= 2.0 for s in first.selected)  # the selection, in ε
    assert [row.setting for row in first.rows] == ["tiny-a", "tiny-b"] and not first.runs

    def refused(*args: Any, **options: Any) -> None:
        raise AssertionError("a released selection was selected again")

    monkeypatch.setattr(recipes, "tune", refused)
    again = reproduce("tiny", tmp_path)
    assert again.rows == first.rows
    assert [s.tuned for s in again.selected] == [s.tuned for s in first.selected]
