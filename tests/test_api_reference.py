"""The API reference (`make docs`, docs/api_reference.py) renders, and every dpfl name its
docstrings cite resolves, so a renamed or moved name cannot leave a dead reference.

The rule: in the docstring of every object the reference documents (each module, class,
function and documented attribute of its pages, each once), a backticked span whose text,
less a trailing `()`, is a dotted name `a.b…` cites a dpfl object when its first part `a`
is `dpfl`, a name the object's own module binds to a dpfl module, class or function, or a
dpfl module beside that module or beside one of its packages (`events` in
`dpfl.privacy.accounting` is `dpfl.privacy.events`; `engines` is `dpfl.engines`). Such a
name must resolve: each further part an attribute, a submodule or a declared field
(dataclass, pydantic or annotated) of what precedes it. Any other span (`np.inf`,
`nn.Linear`, `[data] path`, code with arguments) is not a reference.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pdoc.doc
import pytest

ROOT = Path(__file__).resolve().parent.parent
SPAN = re.compile(r"``?([^`\n]+?)``?")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


def _api_reference() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("api_reference", ROOT / "docs/api_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def documented(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("api")
    return folder, _api_reference().build(folder)


def test_every_module_has_its_page(documented: tuple[Path, dict[str, Any]]) -> None:
    folder, modules = documented
    assert {
        "dpfl",
        "dpfl.privacy",
        "dpfl.privacy.ledger",
        "dpfl.privacy.selection",
        "dpfl.federation.algorithms",
        "dpfl.federation.algorithms.fedavg",
        "dpfl.analytics.mechanisms",
    } <= set(modules)
    for name in modules:
        assert (folder / f"{name.replace('.', '/')}.html").is_file(), name
    assert (folder / "index.html").is_file()
    # the names `import dpfl` offers on first use are on its page
    page = (folder / "dpfl.html").read_text(encoding="utf-8")
    for name in ("simulate", "Ledger", "DPSGDConfig", "silos_from_dataset"):
        assert f'id="{name}"' in page, name


def _docs(doc: pdoc.doc.Doc[Any]) -> Iterator[pdoc.doc.Doc[Any]]:
    yield doc
    if isinstance(doc, pdoc.doc.Module):
        for member in doc.members.values():
            yield from _docs(member)
    elif isinstance(doc, pdoc.doc.Class):
        for member in doc.own_members:
            yield from _docs(member)


def _is_dpfl(value: object) -> bool:
    name = value.__name__ if isinstance(value, types.ModuleType) else None
    name = name or getattr(value, "__module__", None)
    return isinstance(name, str) and (name == "dpfl" or name.startswith("dpfl."))


def _first(name: str, module: types.ModuleType) -> object | None:
    """What `name`, the first part of a cited dotted name, is in `module`'s docstrings:
    None where it does not name a dpfl object (the span is then no reference)."""
    if name == "dpfl":
        return importlib.import_module("dpfl")
    bound = vars(module).get(name)
    if bound is not None and _is_dpfl(bound):
        return bound
    package = module.__name__ if hasattr(module, "__path__") else module.__package__ or ""
    while package:
        if importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
        package = package.rpartition(".")[0]
    return None


def _declares(cls: type, name: str) -> bool:
    return any(
        name in vars(k).get("__annotations__", {}) or name in vars(k).get("model_fields", {})
        for k in cls.__mro__
    )


def _resolves(value: object, parts: list[str]) -> bool:
    for part in parts:
        if hasattr(value, part):
            value = getattr(value, part)
        elif hasattr(value, "__path__") and importlib.util.find_spec(f"{value.__name__}.{part}"):
            value = importlib.import_module(f"{value.__name__}.{part}")
        else:
            # a declared field (no class attribute) ends what can be followed
            return isinstance(value, type) and _declares(value, part)
    return True


def _broken(documented: dict[str, pdoc.doc.Module]) -> list[str]:
    seen: set[tuple[str, str]] = set()
    broken = []
    for module_doc in documented.values():
        for doc in _docs(module_doc):
            source = doc.taken_from[0]
            if (source, doc.docstring) in seen:
                continue
            seen.add((source, doc.docstring))
            for span in SPAN.findall(doc.docstring):
                cited = span.removesuffix("()")
                if not DOTTED.fullmatch(cited):
                    continue
                first, *rest = cited.split(".")
                value = _first(first, importlib.import_module(source))
                if value is not None and not _resolves(value, rest):
                    broken.append(f"{doc.fullname}: `{span}`")
    return broken


def test_cited_dpfl_names_resolve(documented: tuple[Path, dict[str, Any]]) -> None:
    broken = _broken(documented[1])
    assert not broken, "dpfl names cited that do not resolve:\n" + "\n".join(broken)


def test_a_dead_reference_is_caught() -> None:
    """The check can fail: a misspelt attribute, a name that is gone and modules that
    moved are caught; a call, foreign names and unbound ones are not references."""
    dead = "`Ledger.recrod`, `events.gone`, `dpfl.experiments.runner`, `engines.flower_hospital`"
    alive = "`Ledger.record()`, `events.repeat`, `np.inf`, `Deployment.anything`, `f(x.y)`"
    probe = pdoc.doc.Module(importlib.import_module("dpfl.privacy.ledger"))
    probe.docstring = f"{dead}; {alive}"  # cached properties: set on this object only
    probe.members = {}
    assert _broken({"probe": probe}) == [f"dpfl.privacy.ledger: {s}" for s in dead.split(", ")]
