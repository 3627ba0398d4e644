"""`make docs`: the API reference of dpfl's public Python surface, rendered by pdoc.

    python docs/api_reference.py [FOLDER]    # default build/api; open FOLDER/index.html

The surface: the names `import dpfl` offers, the privacy layer (events, accountants,
calibration, the ledger, private selection), the algorithms with their settings and
registry, and the DP cohort statistics: `dpfl` and every module of `PACKAGES`.
tests/test_api_reference.py renders the same pages and checks that the dpfl names their
docstrings cite resolve.
"""

from __future__ import annotations

import importlib
import pkgutil
import shutil
import sys
import warnings
from pathlib import Path

import pdoc.doc
import pdoc.render

PACKAGES = ("dpfl.privacy", "dpfl.federation.algorithms", "dpfl.analytics")


def module_names() -> list[str]:
    """`dpfl`, then each package of `PACKAGES` and its modules."""
    names = ["dpfl"]
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        names += [package, *(m.name for m in pkgutil.iter_modules(path, f"{package}."))]
    return names


def modules() -> dict[str, pdoc.doc.Module]:
    """pdoc's view of each module of the reference, by name."""
    dpfl = importlib.import_module("dpfl")
    # `dpfl` imports its names on first use (its module `__getattr__`), which pdoc does not
    # call: look them up once, so that its page documents them.
    vars(dpfl).update({name: getattr(dpfl, name) for name in dpfl.__all__})
    return {name: pdoc.doc.Module.from_name(name) for name in module_names()}


def build(folder: Path) -> dict[str, pdoc.doc.Module]:
    """Write the reference's pages to `folder` (replacing it); the modules rendered."""
    with warnings.catch_warnings():
        # Names imported for type checkers only (under TYPE_CHECKING) cannot be evaluated
        # in a signature; pdoc then shows the annotation as written, which is what we want.
        warnings.filterwarnings("ignore", message="Error parsing type annotation")
        documented = modules()
        shutil.rmtree(folder, ignore_errors=True)
        for module in documented.values():
            page = folder / f"{module.fullname.replace('.', '/')}.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(pdoc.render.html_module(module, documented), encoding="utf-8")
        (folder / "index.html").write_text(pdoc.render.html_index(documented), encoding="utf-8")
        (folder / "search.js").write_text(pdoc.render.search_index(documented), encoding="utf-8")
    return documented


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/api")
    print(f"{len(build(out))} modules documented in {out}/ (open {out / 'index.html'})")
