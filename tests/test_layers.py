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


def _private_uses(path: Path) -> list[str]:
    """The names with one leading underscore that a module takes from another dpfl module:
    imported by name, or read as an attribute of a dpfl module it imported."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
            node.level or (node.module or "").startswith("dpfl")
        ):
            base = "." * node.level + (node.module or "")
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{base}.{alias.name}")
                elif _is_module(node, path, alias.name):
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.asname and a.name.startswith("dpfl.")}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def _is_module(node: ast.ImportFrom, path: Path, name: str) -> bool:
    parts = list(path.relative_to(ROOT).parent.parts)
    base = parts[: len(parts) - node.level + 1] if node.level else []
    package = ROOT.joinpath(*base, *((node.module or "").removeprefix("dpfl").split(".")))
    return (package / f"{name}.py").exists() or (package / name / "__init__.py").exists()


def test_no_module_uses_another_modules_private_names() -> None:
    """A leading underscore means "this module's own": what another module needs is made
    public where it lives (or moved to where both can reach it)."""
    borrowed = {
        str(path.relative_to(ROOT)): uses
        for path in sorted(ROOT.rglob("*.py"))
        if (uses := _private_uses(path))
    }
    assert borrowed == {}


def _dpfl_modules(path: Path) -> set[str]:
    """The dpfl modules (dotted, absolute) a module imports from."""
    parts = list(path.relative_to(ROOT).parent.parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level + 1] if node.level else []
            own = [node.module] if node.module else []
            module = ".".join(["dpfl", *base, *own] if node.level else own)
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return {m for m in found if m.startswith("dpfl.")}


def test_the_results_side_reads_the_study_file_and_runs_nothing() -> None:
    """experiments/ is three rooms: `study` (a study file and the commands that run it),
    `results` (what runs left, and reading it) and `recipes` (the seed papers' studies).
    The results side reads a study's config and where its charges went (`spending`), and
    imports nothing that runs; neither side imports the recipes."""
    reached = []
    for path in sorted((ROOT / "experiments").rglob("*.py")):
        room = path.relative_to(ROOT / "experiments").parts[0]
        for module in _dpfl_modules(path):
            if room in ("study", "results") and module.startswith("dpfl.experiments.recipes"):
                reached.append(f"{path.relative_to(ROOT)} imports {module}")
            study = module.removeprefix("dpfl.experiments.study.").split(".")[0]
            if (
                room == "results"
                and module.startswith("dpfl.experiments.study.")
                and study not in ("config", "spending")
            ):
                reached.append(f"{path.relative_to(ROOT)} imports {module}")
    assert reached == []


def test_the_package_map_names_every_folder() -> None:
    """docs/architecture.md's package map names every folder of dpfl, so that it reads
    true after a move."""
    text = (ROOT.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = " ".join(line for line in text.splitlines() if line.startswith("| "))
    folders = {p.parent for p in ROOT.rglob("__init__.py")} - {ROOT}
    unnamed = [
        str(f.relative_to(ROOT))
        for f in sorted(folders)
        if f"`{f.name}/`" not in rows and f"`dpfl.{f.name}`" not in rows
    ]
    assert unnamed == []
