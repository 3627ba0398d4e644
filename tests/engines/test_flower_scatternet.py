"""A ScatterNet study deployed (in process, over Flower's messages): the server and each
hospital build the same model from the study file, only the head's parameters travel,
and the deployment ends with the simulator's model, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from flwr.supercore.task_identity import TaskIdentity

from dpfl.engines.flower import serve
from dpfl.experiments.study.deployment import deployment_of
from studies import halves_pneumonia

from .test_flower import CLEAR, InProcessGrid, assert_the_simulators, hospitals, simulated


def test_in_process_a_scatternet_deployment_ends_with_the_simulators_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in [("_run_id", 7), ("_node_id", 1), ("_task_id", 1)]:
        monkeypatch.setattr(TaskIdentity, name, value)
    study = tmp_path / "study.toml"
    study.write_text(
        f'''name = "scattered"
seed = 3
rounds = 2
[data]
dataset = "pneumoniamnist"
path = "{halves_pneumonia(tmp_path / "data", {"train": 40, "val": 8, "test": 20})}"
partition = {{ kind = "iid", silos = 2 }}
split = "official"
[model]
kind = "scatternet_linear"
[algorithm]
name = "fedavg"
learning_rate = 0.5
expected_batch_size = 8
local_epochs = 1.0
[privacy]
noise_multiplier = 1.0
epsilon = 10.0
'''
        + CLEAR,
        encoding="utf-8",
    )
    nodes = hospitals(study, tmp_path / "hospitals")
    result = serve(InProcessGrid(nodes.values()), deployment_of(study))
    simulation, book = simulated(study, tmp_path)
    assert result.rounds_completed == 2 and not result.refused
    assert sorted(result.params) == ["3.bias", "3.weight"]  # the head only: no filters
    assert result.params["3.weight"].shape == (1, 81 * 7 * 7)
    assert_the_simulators(result, nodes, simulation, book)
    assert all(torch.isfinite(v).all() for v in result.params.values())
    book.close()
