"""No function in dpfl runs to 100 lines: a longer one is split into named steps."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "dpfl"
LIMIT = 100


def test_every_function_in_src_is_under_100_lines() -> None:
    long = [
        f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({length} lines)"
        for path in sorted(SRC.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (length := node.end_lineno - node.lineno + 1) >= LIMIT  # type: ignore[operator]
    ]
    assert not long, "split these into named steps: " + "; ".join(long)
