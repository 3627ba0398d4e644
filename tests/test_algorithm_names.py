"""An algorithm is its module plus one line in the registry: no other code of dpfl picks
an algorithm by its name. Checked on every module outside the algorithms' package: no
string equal to an algorithm's name is compared with anything, nor do two or more key
one dict (a table by algorithm; one such key is taken for the ordinary word it may also
be: a hospital's "local" state, the `dpfl.local` package). Recipes
(`dpfl.experiments.recipes`) are study files written in Python: they name the
algorithms they run, and may read them back from their runs, so they are exempt."""

from __future__ import annotations

import ast
from pathlib import Path

import dpfl
from dpfl.federation.algorithms import SETTINGS

ROOT = Path(dpfl.__file__).parent
EXEMPT = (ROOT / "federation" / "algorithms", ROOT / "experiments" / "recipes")


def by_name(source: str) -> list[tuple[int, str]]:
    """(line, name) of each algorithm name compared with something, or keying a dict with
    another."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if isinstance(k, ast.Constant) and k.value in SETTINGS]
            operands = keys if len(keys) > 1 else []
        else:
            continue
        for operand in operands:
            for leaf in ast.walk(operand):
                if isinstance(leaf, ast.Constant) and leaf.value in SETTINGS:
                    found.append((leaf.lineno, leaf.value))
    return found


def test_no_module_outside_the_algorithms_picks_one_by_name() -> None:
    named = [
        f"{path.relative_to(ROOT)}:{line} {name!r}"
        for path in sorted(ROOT.rglob("*.py"))
        if not any(path.is_relative_to(folder) for folder in EXEMPT)
        for line, name in by_name(path.read_text(encoding="utf-8"))
    ]
    assert named == []


def test_the_check_finds_comparisons_and_dict_keys() -> None:
    source = (
        'if spec.name == "sign": pass\n'
        'makers = {"aop": 1, "cyclic": 2}\n'
        'study = {"name": "fedavg", "local": 3}\n'
    )
    assert by_name(source) == [(1, "sign"), (2, "aop"), (2, "cyclic")]
