"""A study point's run plan is built from its file in one place (`study.plan.plan_of`),
which decides σ: the study's, or calibrated to its budgets; and a point's run
(`study.point`) is what the sweep and the Ray cluster share, importing neither."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from dpfl.engines.plan import RunPlan
from dpfl.experiments.study import cluster, point, runner
from dpfl.experiments.study.build import build_algorithm
from dpfl.experiments.study.config import Study
from dpfl.experiments.study.datasets import build_silos
from dpfl.experiments.study.plan import plan_of

BASE: dict[str, Any] = {
    "name": "plan",
    "rounds": 3,
    "trials": 2,
    "seed": 4,
    "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 3}},
    "algorithm": {"name": "fedavg"},
}


def _plan(privacy: dict[str, Any], checkpoint: Path | None = None) -> RunPlan:
    config = Study({**BASE, "privacy": privacy}).points[0][1]
    silos = build_silos(config.data, config.seed)
    return plan_of(config, build_algorithm(config, silos), checkpoint)


def test_a_study_with_a_noise_multiplier_runs_at_it_and_one_without_is_calibrated(
    tmp_path: Path,
) -> None:
    fixed = _plan({"epsilon": 2.0, "noise_multiplier": 1.5}, tmp_path / "run.pt")
    assert fixed.calibrate is None and fixed.epsilon == 2.0
    assert (fixed.rounds, fixed.trials, fixed.seed) == (3, 2, 4)
    assert fixed.checkpoint_file == tmp_path / "run.pt" and not fixed.progress
    assert _plan({"epsilon": 2.0}).calibrate == "common"
    assert _plan({"epsilon": 2.0, "calibration": "per-silo"}).calibrate == "per-silo"
    reference = _plan({"private": False})
    assert reference.calibrate is None and reference.epsilon is None


def test_a_plan_is_frozen_and_refuses_what_no_run_can_be() -> None:
    plan = RunPlan(rounds=2)
    with pytest.raises(AttributeError):
        plan.rounds = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="≥ 1"):
        RunPlan(rounds=0)
    with pytest.raises(ValueError, match="'common' or 'per-silo'"):
        RunPlan(rounds=1, calibrate=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="consortium budget calibrates one σ"):
        RunPlan(rounds=1, calibrate="per-silo", consortium=(2, 1.0))


def _imports(module: Any) -> set[str]:
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    return {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }


def test_the_sweep_and_the_cluster_share_a_points_run_without_importing_each_other() -> None:
    assert "dpfl.experiments.study.runner" not in _imports(cluster)
    assert "dpfl.experiments.study.runner" not in _imports(point)
    assert "dpfl.experiments.study.cluster" in _imports(runner)
