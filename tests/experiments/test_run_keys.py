"""Run ids pinned: `StudyConfig.key()` of every recipe's points (at each scale, with and
without the real data) and of hand-written points with optional settings set, written
down before the study schema moved to per-algorithm settings. A run's id names its
results and its ledger, so no refactoring may move one.

`DPFL_UPDATE_GOLDEN=1 pytest tests/experiments/test_run_keys.py` rewrites the file; only
ever for a change that is meant to give existing runs new ids, and say why."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dpfl.experiments.recipes import RECIPES
from dpfl.experiments.study.config import Study

GOLDEN = Path(__file__).parent / "golden" / "run_keys.json"
SCALES = ("smoke", "default", "full")

BASE: dict[str, Any] = {
    "rounds": 3,
    "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 3}},
    "privacy": {"epsilon": 2.0},
}
HAND_WRITTEN: dict[str, dict[str, Any]] = {
    "defaults": {"algorithm": {"name": ["fedavg", "cyclic", "mrmtl", "ditto", "finetune"]}},
    "references": {
        "algorithm": {"name": ["local", "centralized"]},
        "privacy": {"private": False},
    },
    "aop": {"algorithm": {"name": "aop", "regularization": 0.1}, "rounds": 1},
    "fedavg-options": {
        "algorithm": {
            "name": "fedavg",
            "optimizer": "adam",
            "sampling": "balanced",
            "client_rate": 0.5,
            "weighting": "uniform",
            "loss": ["focal", "weighted_bce"],
            "positive_weight": 3.0,
        },
        "cross_silo": True,
        "secure_aggregation": "masking",
        "threshold": {"choose": "balanced", "bins": 8},
        "data": {
            "dataset": "breast_cancer",
            "partition": {"kind": "dirichlet", "silos": 3, "alpha": 0.3},
            "public_sizes": "dp-count",
        },
        "tune": {"validation": "held-out"},
        "roster": {"a": "key-a"},
        "model": {"kind": "mlp", "hidden": [[8], [16, 8]], "init": "shared"},
        "eval_every": "end",
        "metrics": ["auprc"],
    },
    "sign": {
        "algorithm": {
            "name": "sign",
            "votes": ["binary", "ternary"],
            "server_learning_rate": 0.01,
            "clients_per_round": 2,
        },
        "privacy": {
            "epsilon": 2.0,
            "accountant": "rdp",
            "silos": {"silo-0": {"epsilon": 1.0, "delta": 1e-6}},
        },
    },
    "fedsgd_secure": {
        "algorithm": {"name": "fedsgd_secure", "tolerated_dropouts": [0, 1]},
        "secure_aggregation": ["he", None],
        "research_noise": False,
    },
    "personal": {
        "algorithm": {"name": ["mrmtl", "ditto"], "strength": 0.3, "local_epochs": 2.0},
        "privacy": {"noise_multiplier": 1.5, "epsilon": 8.0},
    },
    "cyclic-calibrated": {
        "algorithm": {"name": "cyclic", "steps_per_visit": 4, "momentum": 0.5},
        "privacy": {"epsilon": [1.0, 4.0], "calibration": "per-silo"},
        "seed": 7,
        "trials": 2,
    },
    "finetune": {"algorithm": {"name": "finetune", "federated_rounds": 2}},
    "centralized": {
        "algorithm": {"name": "centralized", "epochs_per_round": 0.5},
        "data": {
            "dataset": "breast_cancer",
            "partition": {"kind": "iid", "silos": 3},
            "test_fraction": 0.3,
        },
    },
}


def _studies(shared_data: Path | None) -> Iterator[tuple[str, Study]]:
    for name, recipe in RECIPES.items():
        for scale in SCALES:
            for study in recipe.studies(None, scale).studies:
                yield f"{name}/{scale}/{study.name}", study
            if shared_data is not None:
                for study in recipe.studies(shared_data, scale).studies:
                    yield f"{name}/{scale}/real/{study.name}", study
    for label, changes in HAND_WRITTEN.items():
        yield f"hand-written/{label}", Study({**BASE, "name": label, **changes})


def _keys(shared_data: Path | None) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for label, study in _studies(shared_data):
        keys.setdefault(label, []).extend(config.key() for _, config in study.points)
    return keys


def test_every_run_id_is_the_one_it_had(shared_data: Path) -> None:
    keys = _keys(shared_data)
    if os.environ.get("DPFL_UPDATE_GOLDEN"):
        pinned = {"shared_data": str(shared_data.resolve()), "keys": keys}
        GOLDEN.write_text(json.dumps(pinned, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    pinned = json.loads(GOLDEN.read_text(encoding="utf-8"))
    if pinned["shared_data"] != str(shared_data.resolve()):  # real data's keys hold its path
        keys = {label: k for label, k in keys.items() if "/real/" not in label}
        pinned["keys"] = {label: k for label, k in pinned["keys"].items() if "/real/" not in label}
    assert keys == pinned["keys"]
