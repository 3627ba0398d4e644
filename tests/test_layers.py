"""The dependency order of docs/architecture.md, checked on every module's imports: a
package imports only packages below it (the deployment engine, for one, must not read
study files: `dpfl.experiments.study.deployment` does that and hands it a `Deployment`)."""

from __future__ import annotations

import ast
from pathlib import Path

import dpfl

ROOT = Path(dpfl.__file__).parent
LAYER = {
    "cli": 7,
    "experiments": 6,
    "audit": 5.5,  # drives the simulator; experiments and the CLI may use it
    "analytics": 4.5,  # statistics over the secure sums; experiments and the CLI use it
    "engines": 5,
    "secure": 4,
    "federation": 3,
    "local": 2,
    "models": 1,
    "data": 1,
    "privacy": 0,
    "errors": -1,
    "sqlite_file": -1,
    "files": -1,
    "allocator": -1,
    "__init__": -1,
}


def imported(path: Path, root: Path = ROOT) -> set[str]:
    """The dpfl packages a module under `root` (dpfl's folder) imports, absolutely or
    relatively."""
    parts = list(path.relative_to(root).parent.parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts[: len(parts) - node.level + 1]
                names = [".".join(["dpfl", *base, *([node.module] if node.module else [])])]
                if not base and node.module is None:  # from .. import x: x is the package
                    names = [f"dpfl.{alias.name}" for alias in node.names]
            else:
                names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {name.split(".")[1] for name in names if name.startswith("dpfl.")}
    return found


def test_every_package_has_a_layer() -> None:
    packages = {p.name.removesuffix(".py") for p in ROOT.iterdir() if p.name != "py.typed"}
    assert packages - {"__pycache__"} == set(LAYER)


def test_no_module_imports_a_package_above_its_own() -> None:
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        own = path.relative_to(ROOT).parts[0].removesuffix(".py")
        for other in imported(path) - {own}:
            if LAYER[other] >= LAYER[own]:
                upward.append(f"{path.relative_to(ROOT)} imports dpfl.{other}")
    assert upward == []


def test_the_check_reads_absolute_and_relative_imports(tmp_path: Path) -> None:
    module = tmp_path / "engines" / "sub" / "m.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "import dpfl.privacy.ledger\nfrom dpfl.experiments.study.config import load\n"
        "from ...federation import silo\nfrom ... import secure\nfrom . import sibling\n"
        "import torch\n",
        encoding="utf-8",
    )
    assert imported(module, tmp_path) == {
        "privacy",
        "experiments",
        "federation",
        "secure",
        "engines",
    }
