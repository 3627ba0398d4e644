"""Each extension axis that a study names by a string is one registry, and only the
registry picks by that name: an algorithm is its module plus one line in
`dpfl.federation.algorithms` (`SETTINGS`); a secure-sum mode its module plus its entry in
`dpfl.secure.MODES` (deployed, its halves in `dpfl.engines.flower`), and the rest of dpfl
reads a mode's facts (`SecureMode`) instead. Checked on every module outside a registry's
own package: no string equal to one of its names is compared with anything, nor do two or
more key one dict (a table by name; one such key is taken for the ordinary word it may
also be: a hospital's "local" state, the `dpfl.local` package). Recipes
(`dpfl.experiments.recipes`) are study files written in Python: they name the algorithms
they run, and may read them back from their runs, so they are exempt for algorithms."""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

import pytest

import dpfl
from dpfl.federation.algorithms import SETTINGS
from dpfl.secure import MODES

ROOT = Path(dpfl.__file__).parent
REGISTRIES: dict[str, tuple[Collection[str], tuple[Path, ...]]] = {
    "algorithm": (SETTINGS, (ROOT / "federation" / "algorithms", ROOT / "experiments" / "recipes")),
    "secure-sum mode": (MODES, (ROOT / "secure",)),
}


def by_name(source: str, names: Collection[str]) -> list[tuple[int, str]]:
    """(line, name) of each of `names` compared with something, or keying a dict with
    another."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if isinstance(k, ast.Constant) and k.value in names]
            operands = keys if len(keys) > 1 else []
        else:
            continue
        for operand in operands:
            for leaf in ast.walk(operand):
                if isinstance(leaf, ast.Constant) and leaf.value in names:
                    found.append((leaf.lineno, leaf.value))
    return found


@pytest.mark.parametrize("registry", REGISTRIES)
def test_no_module_outside_a_registry_picks_by_its_names(registry: str) -> None:
    names, exempt = REGISTRIES[registry]
    named = [
        f"{path.relative_to(ROOT)}:{line} {name!r}"
        for path in sorted(ROOT.rglob("*.py"))
        if not any(path.is_relative_to(folder) for folder in exempt)
        for line, name in by_name(path.read_text(encoding="utf-8"), names)
    ]
    assert named == []


def test_the_check_finds_comparisons_and_dict_keys() -> None:
    algorithms = (
        'if spec.name == "sign": pass\n'
        'makers = {"aop": 1, "cyclic": 2}\n'
        'study = {"name": "fedavg", "local": 3}\n'
    )
    assert by_name(algorithms, SETTINGS) == [(1, "sign"), (2, "aop"), (2, "cyclic")]
    modes = (
        'if run.summing == "none": pass\n'
        'sums = {"masking": 1, "he": 2}\n'
        'ok = {"ideal": 1, "other": 2} if kind not in ("ideal",) else None\n'
    )
    assert by_name(modes, MODES) == [(1, "none"), (2, "masking"), (2, "he"), (3, "ideal")]
