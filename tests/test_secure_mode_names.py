"""A secure-sum mode is its module plus its entry in the registry (`dpfl.secure.MODES`;
deployed, its halves in `dpfl.engines.flower.sums`): no other code of dpfl picks a mode
by its name. Checked on every module outside `dpfl.secure`: no string equal to a mode's
name is compared with anything, nor do two or more key one dict (a table by mode); the
rest of dpfl reads a mode's facts (`SecureMode`) instead."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dpfl
from dpfl.engines.flower.protocol import DeploymentError
from dpfl.engines.flower.sums import deployed, every_deployed
from dpfl.secure import MODES

ROOT = Path(dpfl.__file__).parent
EXEMPT = (ROOT / "secure",)


def by_name(source: str) -> list[tuple[int, str]]:
    """(line, name) of each mode's name compared with something, or keying a dict with
    another."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if isinstance(k, ast.Constant) and k.value in MODES]
            operands = keys if len(keys) > 1 else []
        else:
            continue
        for operand in operands:
            for leaf in ast.walk(operand):
                if isinstance(leaf, ast.Constant) and leaf.value in MODES:
                    found.append((leaf.lineno, leaf.value))
    return found


def test_no_module_outside_the_registry_picks_a_mode_by_name() -> None:
    named = [
        f"{path.relative_to(ROOT)}:{line} {name!r}"
        for path in sorted(ROOT.rglob("*.py"))
        if not any(path.is_relative_to(folder) for folder in EXEMPT)
        for line, name in by_name(path.read_text(encoding="utf-8"))
    ]
    assert named == []


def test_the_check_finds_comparisons_and_dict_keys() -> None:
    source = (
        'if run.summing == "none": pass\n'
        'sums = {"masking": 1, "he": 2}\n'
        'ok = {"ideal": 1, "other": 2} if kind not in ("ideal",) else None\n'
    )
    assert by_name(source) == [(1, "none"), (2, "masking"), (2, "he"), (3, "ideal")]


def test_every_deployable_mode_has_its_deployed_halves_and_no_other_has() -> None:
    halves = every_deployed()
    assert [h.mode.name for h in halves] == [n for n, m in MODES.items() if m.deployable]
    assert all(h.mode is MODES[h.mode.name] for h in halves)
    for name in (n for n, m in MODES.items() if not m.deployable):
        with pytest.raises(DeploymentError, match="not deployable"):
            deployed(name)


def test_a_modes_facts_agree_with_its_sums() -> None:
    """What a mode says of the server agrees with what its sums show it."""
    for mode in MODES.values():
        assert mode.sum().reveals_inputs is not mode.hides_replies, mode.name
        assert mode.stats_sum().reveals_inputs is not mode.hides_replies, mode.name
