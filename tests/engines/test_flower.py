"""The Flower engine: the simulator's algorithm, split between a ServerApp and hospitals'
ClientApps, each hospital enforcing its own budget from its own ledger.

In process first (a grid that hands each message to the ClientApp, no network), then
the real thing: a SuperLink and three SuperNodes as separate processes on loopback."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from dpfl.engines.flower import (
    DeploymentResult,
    client_app,
    serve,
    study_point,
)
from dpfl.engines.simulation import simulate
from dpfl.experiments.datasets import build_silos
from dpfl.experiments.runner import build_algorithm
from dpfl.federation.silo import Silo
from dpfl.privacy import Ledger

STUDY = """
name = "deployed"
seed = 3
rounds = 3
[data]
dataset = "breast_cancer"
partition = { kind = "iid", silos = 3 }
[algorithm]
name = "fedavg"
learning_rate = 2.0
expected_batch_size = 16
local_epochs = 1.0
[privacy]
noise_multiplier = 1.0
epsilon = 10.0
"""
EPSILON, DELTA = 10.0, 1e-5


@pytest.fixture
def study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # the identity Flower gives a ServerApp's process, which its messages are from
    for name, value in [("_run_id", 7), ("_node_id", 1), ("_task_id", 1)]:
        monkeypatch.setattr(TaskIdentity, name, value)
    path = tmp_path / "study.toml"
    path.write_text(STUDY, encoding="utf-8")
    return path


def hospitals(study: Path, root: Path, epsilon: dict[str, float] | None = None) -> dict[str, Any]:
    """Each silo of the study written to its hospital's folder, with its node config."""
    config = study_point(study)
    nodes = {}
    for silo in build_silos(config.data, config.seed):
        folder = root / silo.name
        folder.mkdir(parents=True)
        np.savez(folder / "train.npz", x=silo.x.numpy(), y=silo.y.numpy())
        nodes[silo.name] = {
            "name": silo.name,
            "study": str(study),
            "data": str(folder),
            "public-size": silo.declared_size,
            "epsilon": (epsilon or {}).get(silo.name, EPSILON),
            "delta": DELTA,
            "ledger": str(folder / "ledger.sqlite"),
            "research-noise": True,
        }
    return nodes


class InProcessGrid(Grid):
    """Flower's Grid over the ClientApp in this process: each message goes to the app
    with its node's context (node config and state kept between messages), as a
    SuperNode would deliver it; an exception becomes an error reply, as in Flower."""

    def __init__(self, nodes: Iterable[dict[str, Any]]) -> None:
        self.app = client_app()
        self.contexts = {
            k + 2: Context(
                run_id=7, node_id=k + 2, node_config=n, state=RecordDict(), run_config={}
            )
            for k, n in enumerate(nodes)
        }

    def set_run(self, run: Any) -> None:
        raise NotImplementedError

    @property
    def run(self) -> Any:
        raise NotImplementedError

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterator[Message]:
        for message in messages:
            node = message.metadata.dst_node_id
            try:
                reply = self.app(message, self.contexts[node])
            except Exception as exc:  # what a SuperNode sends back
                reply = Message(Error(0, f"{type(exc).__name__}: {exc}"), reply_to=message)
            yield reply


def simulated(study: Path, tmp_path: Path) -> tuple[dict[str, torch.Tensor], Ledger]:
    config = study_point(study)
    silos = build_silos(config.data, config.seed)
    book = Ledger(tmp_path / "simulated.sqlite")
    result = simulate(
        build_algorithm(config, silos),
        silos,
        rounds=config.rounds,
        seed=config.seed,
        epsilon_budget=EPSILON,
        delta=DELTA,
        ledger=book,
        progress=False,
    )
    return {k: v[0] for k, v in result.params.items()}, book


def accuracy(params: dict[str, torch.Tensor], silos: list[Silo]) -> float:
    x = torch.cat([s.x_test for s in silos if s.x_test is not None])
    y = torch.cat([s.y_test for s in silos if s.y_test is not None])
    weight, bias = params["weight"], params["bias"]
    predicted = (x @ weight.T + bias).squeeze(-1) > 0
    return float((predicted == y.bool()).float().mean())


def entries(ledger: Path, account: str) -> list[str]:
    with Ledger(ledger, create=False) as book:
        return [e.event.to_json() for e in book.entries(account)]


def test_in_process_the_deployment_ends_with_the_simulators_model(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    result = serve(InProcessGrid(nodes.values()), study_point(study), hospitals=3)
    expected, book = simulated(study, tmp_path)
    assert result.rounds_completed == 3 and not result.refused
    assert accuracy(result.params, build_silos(study_point(study).data, 3)) > 0.8
    for name, value in expected.items():
        assert torch.equal(result.params[name], value)  # bit for bit
    for name, node in nodes.items():
        mine = entries(Path(node["ledger"]), f"{name}/trial-0")
        assert mine == [e.event.to_json() for e in book.entries(f"{name}/trial-0")]
        assert len(mine) == 3
        assert result.epsilon[name] == pytest.approx(book.spent(f"{name}/trial-0").epsilon)
    book.close()


def test_in_process_a_hospital_whose_budget_is_too_small_refuses_before_round_0(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals", {"hospital-1": 0.5})
    result = serve(InProcessGrid(nodes.values()), study_point(study), hospitals=3)
    assert result.rounds_completed == 0
    assert list(result.refused) == ["hospital-1"]
    assert "would exceed ε=0.5" in result.refused["hospital-1"]
    for name, node in nodes.items():
        assert entries(Path(node["ledger"]), f"{name}/trial-0") == []


def test_a_result_survives_its_file(tmp_path: Path) -> None:
    result = DeploymentResult(2, {"w": torch.ones(2)}, [], {"a": 1.5}, {})
    result.save(tmp_path)
    again = DeploymentResult.load(tmp_path)
    assert again.rounds_completed == 2 and again.epsilon == {"a": 1.5}
