"""A study with a model dpfl has never seen (`model.factory`): it sweeps and is chosen
from like a built-in kind, is refused before training where DP-SGD cannot bound a record's
influence, and a run's key follows the model file's content."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.experiments.study.config import load
from dpfl.experiments.study.point import STORE
from dpfl.experiments.study.runner import run_study
from dpfl.local import clipping
from per_example import ghost_calls
from studies import breast_cancer_study

runner = CliRunner()

GROUPNORM = """
from torch import nn


def build(n_features, n_outputs):
    return nn.Sequential(
        nn.Linear(n_features, 8), nn.GroupNorm(2, 8), nn.ReLU(), nn.Linear(8, n_outputs)
    )
"""
RESIDUAL = """
from torch import nn


class Residual(nn.Module):
    def __init__(self, n_features, n_outputs):
        super().__init__()
        self.inner = nn.Linear(n_features, 8)
        self.norm = nn.GroupNorm(2, 8)
        self.skip = nn.Linear(n_features, 8)
        self.head = nn.Linear(8, n_outputs)

    def forward(self, x):
        return self.head(self.norm(self.inner(x)).relu() + self.skip(x))


def build(n_features, n_outputs):
    return Residual(n_features, n_outputs)
"""
"""A model of its own that is no nn.Sequential: a skip connection."""
BATCHNORM = GROUPNORM.replace("nn.GroupNorm(2, 8)", "nn.BatchNorm1d(8)")
STUDY = breast_cancer_study(
    "own-model",
    rounds=2,
    silos=2,
    model={"factory": "my_model.py:build"},
    algorithm={"learning_rate": [0.5, 1.0]},
    privacy={"noise_multiplier": 1.0},
)


def _study(tmp_path: Path, model: str, text: str = STUDY) -> Path:
    """A study file with `model` as my_model.py beside it."""
    (tmp_path / "my_model.py").write_text(model, encoding="utf-8")
    path = tmp_path / "study.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_a_groupnorm_mlp_of_its_own_sweeps_and_is_chosen_by_best(tmp_path: Path) -> None:
    study = _study(tmp_path, GROUPNORM)
    out = tmp_path / "out"
    swept = runner.invoke(app, ["sweep", str(study), "-o", str(out)])
    assert swept.exit_code == 0, swept.output
    db = sqlite3.connect(out / STORE)
    assert db.execute("SELECT status FROM runs").fetchall() == [("finished",)] * 2
    chosen = runner.invoke(app, ["best", str(out), "-e", "100", "-d", "1e-5"])
    assert chosen.exit_code == 0, chosen.output
    assert (out / "ledgers").is_dir()  # (what the refusal below must not leave)
    assert "learning_rate" in _flat(chosen.stdout)


def test_batchnorm_is_refused_before_training_with_the_groupnorm_hint(tmp_path: Path) -> None:
    study = _study(tmp_path, BATCHNORM)
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", str(study), "-o", str(out)])
    assert result.exit_code != 0
    said = _flat(result.output)
    assert f"{tmp_path / 'my_model.py'}:build: module '1' (BatchNorm1d) mixes the examples" in said
    assert "nn.GroupNorm" in said and "Traceback" not in result.output
    assert not (out / "ledgers").exists()  # no ledger: nothing was trained or charged


def test_editing_the_model_file_changes_the_runs_key(tmp_path: Path) -> None:
    study = _study(tmp_path, GROUPNORM)
    before = [config.key() for _, config in load(study).points]
    again = [config.key() for _, config in load(study).points]
    (tmp_path / "my_model.py").write_text(GROUPNORM.replace("8", "16"), encoding="utf-8")
    after = [config.key() for _, config in load(study).points]
    assert before == again and len(set(before)) == 2
    assert not set(before) & set(after)


def test_a_large_model_of_its_own_without_convolutions_is_clipped_by_ghost_clipping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`model.factory` takes the fast path where its layers allow it: a model that is no
    nn.Sequential, whose per-example gradients for a batch would pass `VMAP_BYTES` (here
    lowered to 0), trains its silos one by one with per-example norms from the layers'
    hooks (`dpfl.local.ghost`); below it, its silos stack under `vmap`, the small
    models' fast path."""
    calls = ghost_calls(monkeypatch)
    study = load(_study(tmp_path, RESIDUAL, STUDY.replace("[0.5, 1.0]", "0.5")))
    (small,) = run_study(study, tmp_path / "small")
    assert small.status == "finished", small.error
    assert not calls
    monkeypatch.setattr(clipping, "VMAP_BYTES", 0)
    (large,) = run_study(study, tmp_path / "large")
    assert large.status == "finished", large.error
    assert calls
