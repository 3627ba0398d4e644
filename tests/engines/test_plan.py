"""The plan part every engine shares (the schedule, the released count's noise) lives
outside the simulator: a deployed hospital, the Flower server and `tune` import none of it."""

from __future__ import annotations

import ast
from pathlib import Path

import dpfl

SRC = Path(dpfl.__file__).parent
SIMULATOR = "dpfl.engines.simulation"


def _importers(files: list[Path]) -> list[str]:
    """The files among `files` that import the simulator (or anything from it)."""
    found = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
        }
        if SIMULATOR in names:
            found.append(str(path.relative_to(SRC)))
    return found


def test_the_flower_engine_and_the_bookkeeping_never_import_the_simulator() -> None:
    engines = SRC / "engines"
    others = [p for p in engines.glob("*.py") if p.name != "simulation.py"]
    assert _importers([*(engines / "flower").glob("*.py"), *others]) == []
    assert _importers([SRC / "experiments/results/store.py", SRC / "privacy/accounts.py"]) == []
