"""Every recipe at smoke scale, its table compared with golden rows: each row's setting,
the paper's figure, ours (exactly as printed) and its note, and the reproduction's notes
on what it left out. Written down before the algorithms were split into hospital and
server halves, so any drift in what `dpfl reproduce` prints shows up here.

Rewrite the file only for a change that is meant to move the numbers, and say why:

    DPFL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/experiments/test_recipe_golden.py

Each recipe runs once per test session (`smoke`), even across xdist's workers: the other
recipe test modules read the same runs instead of running the recipe again.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
import pkgutil
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from dpfl.experiments import recipes
from dpfl.experiments.recipes import RECIPES, Recipe, Reproduction, recipe, reproduce

GOLDEN = Path(__file__).parent / "golden" / "recipes.json"
REGENERATE = "DPFL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/experiments/test_recipe_golden.py"
DATA = "<shared data>"
"""Stands for the shared data folder in the golden notes (they name absent folders)."""

Ran = tuple[Reproduction, Path]
_RUNS: dict[tuple[str, Path], Ran] = {}


def smoke(name: str, data_dir: Path, factory: pytest.TempPathFactory) -> Ran:
    """Recipe `name` at smoke scale on `data_dir`, and its study directory: run once per
    test session, whichever test module asks first. Under xdist the directory is shared
    by the session's workers: the first runs the recipe, the others wait for it and
    then only read the finished points (`reproduce` resumes, and every point is done)."""
    key = (name, data_dir)
    if key not in _RUNS:
        root = factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):
            root = root.parent  # the session's directory, above each worker's own
        tag = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]
        out = root / "recipes" / f"{name}-{tag}"
        with recipe_lock(out):
            _RUNS[key] = (reproduce(name, out, data_dir=data_dir, scale="smoke"), out)
    return _RUNS[key]


@contextmanager
def recipe_lock(out: Path) -> Iterator[None]:
    """Hold `out`'s lock among this session's processes (a second `reproduce` in a study
    directory that another process is running is refused, not queued)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _table(reproduction: Reproduction, data_dir: Path) -> dict[str, Any]:
    here = str(data_dir.resolve())
    return {
        "rows": [asdict(row) for row in reproduction.rows],
        "notes": [note.replace(here, DATA) for note in reproduction.notes],
    }


@pytest.mark.parametrize("name", list(RECIPES))
def test_recipe_rows_match_the_golden_rows(
    name: str, shared_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    reproduction, _ = smoke(name, shared_data, tmp_path_factory)
    assert reproduction.runs or reproduction.selected, reproduction.notes
    for run in reproduction.runs:  # never write down a failed run's rows
        assert run.status == "finished", (run.study, run.error)
    table = _table(reproduction, shared_data)
    golden = json.loads(GOLDEN.read_text(encoding="utf-8")) if GOLDEN.exists() else {}
    if os.environ.get("DPFL_UPDATE_GOLDEN") == "1":
        golden = {known: rows for known, rows in golden.items() if known in RECIPES}
        golden[name] = table
        GOLDEN.parent.mkdir(exist_ok=True)
        text = json.dumps(golden, indent=1, sort_keys=True, ensure_ascii=False)
        GOLDEN.write_text(text + "\n", encoding="utf-8")
    assert name in golden, f"no golden rows for {name}: set DPFL_UPDATE_GOLDEN=1 once"
    expected = golden[name]
    moved = f"{name}'s table moved; only if that is meant: {REGENERATE}"
    assert table["notes"] == expected["notes"], moved
    assert len(table["rows"]) == len(expected["rows"]), moved
    for got, want in zip(table["rows"], expected["rows"], strict=True):
        assert got == want, moved


def test_the_golden_file_holds_exactly_the_recipes() -> None:
    assert GOLDEN.exists(), f"{GOLDEN} is missing: {REGENERATE}"
    assert sorted(json.loads(GOLDEN.read_text(encoding="utf-8"))) == sorted(RECIPES)


def test_every_recipe_module_exports_one_registered_recipe() -> None:
    assert list(RECIPES) == [
        "owkin-idash2020",
        "astar-aop",
        "kerkouche-fl-sign",
        "puffle-mrmtl",
        "puffle-pandemic",
        "dopamine",
        "dopamine-retinamnist",
        "flamby-heart-disease",
        "flamby-tcga-brca",
        "gse7390-survival",
        "diabetes-readmission",
    ]
    exported = []
    for info in pkgutil.iter_modules(recipes.__path__):
        module = importlib.import_module(f"{recipes.__name__}.{info.name}")
        if info.name == "base" or info.name.endswith("_common"):
            assert not hasattr(module, "RECIPE"), info.name
            continue
        assert isinstance(module.RECIPE, Recipe), info.name
        assert module.RECIPE.name == module.NAME and module.RECIPE.title == module.TITLE
        exported.append(module.RECIPE)
    assert sorted(exported, key=lambda r: r.name) == sorted(RECIPES.values(), key=lambda r: r.name)
    assert all(RECIPES[r.name] is r for r in exported)


def test_an_unknown_recipe_is_refused_naming_the_known_ones() -> None:
    assert recipe("dopamine") is RECIPES["dopamine"]
    with pytest.raises(ValueError, match="unknown recipe 'owkin'; known: owkin-idash2020, astar"):
        recipe("owkin")


def test_dpfl_reproduce_names_every_recipe_in_its_help() -> None:
    """The command lists the names itself (importing the recipes would slow every `dpfl`
    command's start); this keeps that list and `RECIPES` the same."""
    from dpfl.cli import study

    doc = " ".join((study.reproduce.__doc__ or "").split())
    listed = doc.split("RECIPE: ")[1].split(" (docs/")[0]
    assert re.split(r", | or ", listed) == list(RECIPES)
