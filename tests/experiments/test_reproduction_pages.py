"""The reproduction pages' tables are their recipes' output (issue 47): each page's table
blocks equal the rendering of the stored `dpfl reproduce --json` runs they name,
`dpfl reproduce --markdown` prints that same rendering, and a single-trial row is
marked n = 1."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.experiments import recipes
from dpfl.experiments.recipes import RECIPES, Row, pages
from dpfl.experiments.recipes.pages import BLOCK, LEGEND, markdown, rebuild, rendered, stored

from .test_recipe_golden import GOLDEN, smoke

FOLDER = Path(__file__).parents[2] / "docs" / "reproductions"
REBUILD = "python -m dpfl.experiments.recipes.pages"


def test_every_page_table_is_its_stored_run_rendered() -> None:
    stale = rebuild(FOLDER, check=True)
    assert not stale, f"tables edited by hand or runs re-stored without rebuilding: {REBUILD}"


def test_every_stored_run_is_a_recipe_run_shown_on_a_page() -> None:
    shown = {
        (match["name"], match["scale"])
        for page in FOLDER.glob("*.md")
        for match in BLOCK.finditer(page.read_text(encoding="utf-8"))
    }
    results = sorted((FOLDER / pages.RESULTS).glob("*.json"))
    assert results, "no stored runs"
    for path in results:
        data = json.loads(path.read_text(encoding="utf-8"))
        assert data["recipe"] in RECIPES and data["scale"] in ("default", "full"), path
        assert path.name == f"{data['recipe']}-{data['scale']}.json"
        assert data["title"] == RECIPES[data["recipe"]].title
        stored(path)  # rows as `Row` holds them today, `trials` included
        assert (data["recipe"], data["scale"]) in shown, f"{path.name} is on no page"


def test_a_table_marks_single_trial_rows_and_escapes_bars() -> None:
    rows = [
        Row("a", "0.7", "0.61 ± 0.02", "x", trials=3),
        Row("b", "0.7", "0.52", "y | z", trials=1),
        Row("c", "ε = 1", "ε = 5.0", ""),
    ]
    text = markdown("T", rows, ["skipped x"])
    assert text.splitlines()[4:7] == [
        "| a | 0.7 | 0.61 ± 0.02 | 3 | x |",
        "| b | 0.7 | 0.52 | 1 | y \\| z |",
        "| c | ε = 1 | ε = 5.0 | — |  |",
    ]
    assert LEGEND in text and text.endswith("\nNote: skipped x\n")


def test_a_block_is_rebuilt_from_its_stored_run_and_a_missing_one_is_named(
    tmp_path: Path,
) -> None:
    rows = [Row("a", "p", "0.5", "", trials=1)]
    run = {"recipe": "r", "title": "T", "scale": "default", "notes": [], "runs": []}
    (tmp_path / "r-default.json").write_text(json.dumps({**run, "rows": [asdict(r) for r in rows]}))
    page = "intro\n<!-- table: r default -->\nold | table\n<!-- end table -->\nafter\n"
    new = rendered(page, tmp_path)
    table = markdown("T", rows)
    assert new == f"intro\n<!-- table: r default -->\n{table}<!-- end table -->\nafter\n"
    assert rendered(new, tmp_path) == new
    with pytest.raises(ValueError, match=r"q-full\.json, which does not exist"):
        rendered(page.replace("r default", "q full"), tmp_path)
    old = {**run, "rows": [{"setting": "a", "paper": "p", "ours": "0.5", "note": ""}]}
    (tmp_path / "r-default.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match=r"r-default\.json: not a stored .* keys are"):
        rendered(page, tmp_path)


def test_dpfl_reproduce_markdown_prints_the_golden_rows_rendered(
    shared_data: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the smoke run's finished directory `--markdown` runs nothing again and prints
    the golden rows' table: what is pasted on a page is what the recipe says."""
    name = "kerkouche-fl-sign"
    _, out = smoke(name, shared_data, tmp_path_factory)
    real = recipes.reproduce

    def at_smoke(*args: Any, **kwargs: Any) -> recipes.Reproduction:
        return real(*args, **{**kwargs, "scale": "smoke"})

    monkeypatch.setattr(recipes, "reproduce", at_smoke)
    args = ["reproduce", name, "-o", str(out), "--data-dir", str(shared_data), "--markdown"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))[name]
    rows = [Row(**row) for row in golden["rows"]]
    assert result.stdout == markdown(RECIPES[name].title, rows, golden["notes"])
    assert {row.trials for row in rows} == {1}  # smoke runs one trial: every row says so


def test_dpfl_reproduce_refuses_json_with_markdown(tmp_path: Path) -> None:
    args = ["reproduce", "owkin-idash2020", "-o", str(tmp_path / "o"), "--json", "--markdown"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--json and --markdown: choose one" in result.output
    assert not (tmp_path / "o").exists()
