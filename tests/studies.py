"""The tests' studies over scikit-learn's breast-cancer table, written from one dict: each
test states only what its study changes, and gets the study file's text (TOML)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


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


def halves_pneumonia(folder: Path, sizes: Mapping[str, int]) -> Path:
    """A PneumoniaMNIST-shaped file in a new `folder`, `sizes` images a split, whose class
    shows as which half is brighter (not as brightness alone, which a normalisation per
    image divides away)."""
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in sizes.items():
        labels = rng.integers(0, 2, n)
        pixels = rng.integers(0, 128, (n, 28, 28))
        pixels[labels == 1, :, :14] += 100
        pixels[labels == 0, :, 14:] += 100
        arrays[f"{split}_images"] = pixels.astype(np.uint8)
        arrays[f"{split}_labels"] = labels
    folder.mkdir()
    np.savez(folder / "pneumoniamnist.npz", **arrays)
    return folder
