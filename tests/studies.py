"""The tests' studies over scikit-learn's breast-cancer table, written from one dict: each
test states only what its study changes, and gets the study file's text (TOML)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def breast_cancer_study(name: str, *, rounds: int, silos: int = 3, **rest: Any) -> str:
    """A study of `rounds` rounds over the breast-cancer table in `silos` IID hospitals,
    fedavg unless `algorithm` names another; `rest`: the other keys and sections."""
    scalars = {k: v for k, v in rest.items() if not isinstance(v, Mapping)}
    sections = {k: v for k, v in rest.items() if isinstance(v, Mapping) and k != "algorithm"}
    return toml_text(
        {
            "name": name,
            "rounds": rounds,
            **scalars,
            "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": silos}},
            "algorithm": {"name": "fedavg", **rest.get("algorithm", {})},
            **sections,
        }
    )


def toml_text(study: Mapping[str, Any]) -> str:
    """A study file's text (TOML) for a study given as the dict `Study` takes."""
    keys = [f"{k} = {_toml(v)}" for k, v in study.items() if not isinstance(v, Mapping)]
    tables = [
        "\n".join([f"[{name}]", *(f"{k} = {_toml(v)}" for k, v in table.items())])
        for name, table in study.items()
        if isinstance(table, Mapping)
    ]
    return "\n".join([*keys, *tables]) + "\n"


def _toml(value: Any) -> str:
    """A TOML value: dicts within a table are written inline."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)
