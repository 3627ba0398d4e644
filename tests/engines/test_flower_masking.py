"""Secure aggregation across machines: a deployed study whose replies are masked
(`dpfl.engines.flower_masking`) ends as the simulator's run with `PairwiseMasking`, and
the server never holds a reply in the clear. In process (the grid hands each message to
the ClientApp, keeping each node's context state between messages as a SuperNode does)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import ConfigRecord, Message, RecordDict

from dpfl import secure
from dpfl.engines.flower import serve
from dpfl.engines.simulation import SimulationResult, simulate
from dpfl.experiments.datasets import build_silos
from dpfl.experiments.deploy import deployment_of, study_point
from dpfl.experiments.runner import build_algorithm
from dpfl.privacy import Ledger

from .test_flower import DELTA, EPSILON, STUDY, InProcessGrid, entries, hospitals, study

__all__ = ["study"]  # the fixture, used by name

DOPAMINE = (
    STUDY.replace('name = "fedavg"', 'name = "fedsgd_secure"')
    .replace("local_epochs = 1.0\n", "")
    .replace("learning_rate = 2.0", "learning_rate = 0.5\nmomentum = 0.5")
    .replace("seed = 3\n", 'seed = 3\nsecure_aggregation = "masking"\n')
)


class RecordingGrid(InProcessGrid):
    """The in-process grid, keeping every reply the server pulls."""

    def __init__(self, nodes: Iterable[dict[str, Any]]) -> None:
        super().__init__(nodes)
        self.seen: list[Message] = []

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        pulled = list(super().pull_messages(message_ids))
        self.seen += pulled
        return pulled


def simulated(study: Path, tmp_path: Path) -> tuple[SimulationResult, Ledger]:
    """The study in the simulator, summed by the same pairwise masking in one process."""
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
        secure_sum=secure.by_name(config.summing),
    )
    return result, book


@pytest.mark.parametrize(
    "text",
    [DOPAMINE, STUDY.replace("seed = 3\n", 'seed = 3\nsecure_aggregation = "masking"\n')],
    ids=["dopamine", "fedavg"],
)
def test_a_masked_deployment_ends_as_the_simulators_masked_run(
    study: Path, tmp_path: Path, text: str
) -> None:
    study.write_text(text, encoding="utf-8")
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = RecordingGrid(nodes.values())
    result = serve(grid, deployment_of(study), hospitals=3)
    simulation, book = simulated(study, tmp_path)
    assert result.rounds_completed == 3 and not result.refused and not result.stopped
    for name, value in simulation.params.items():
        assert torch.equal(result.params[name], value[0])  # the masks cancel exactly
    assert result.metrics == simulation.silo_metrics[0]
    for name, node in nodes.items():
        mine = entries(Path(node["ledger"]), f"{name}/trial-0")
        assert mine == [e.event.to_json() for e in book.entries(f"{name}/trial-0")]
        assert result.epsilon[name] == pytest.approx(book.spent(f"{name}/trial-0").epsilon)
    book.close()
    kinds = [m.metadata.message_type for m in grid.seen]
    assert kinds.count("query.secagg_keys") == kinds.count("query.secagg_unmask") == 9
    trained = [m.content["dpfl"] for m in grid.seen if m.metadata.message_type == "train"]
    assert len(trained) == 9 and all("vector" not in r and "words" in r for r in trained)


def test_a_hospital_never_sends_a_masked_studys_reply_without_a_session(
    study: Path, tmp_path: Path
) -> None:
    study.write_text(DOPAMINE, encoding="utf-8")
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    config = study_point(study)
    silos = build_silos(config.data, config.seed)
    public = {
        "protocol": 1,
        "study": config.key(),
        "silos": [s.name for s in silos],
        "sizes": [s.declared_size for s in silos],
        "shape": [silos[0].x.shape[1]],
        "classes": 2,
        "instance": "0123456789abcdef",
        "round": 0,
        "exchange": 0,
        "cohort": [s.name for s in silos],
        "params": b"",
    }
    message = Message(
        RecordDict({"dpfl": ConfigRecord(public)}), dst_node_id=2, message_type="train"
    )
    (reply,) = grid.pull_messages(grid.push_messages([message]))
    refused = reply.content.config_records["dpfl"]["refused"]
    assert "no secure-aggregation session under way" in str(refused)
    assert entries(Path(nodes["hospital-0"]["ledger"]), "hospital-0/trial-0") == []


@pytest.mark.parametrize("kind", ["ideal", "he"])
def test_a_secure_sum_that_cannot_run_across_machines_is_refused(study: Path, kind: str) -> None:
    study.write_text(DOPAMINE.replace('"masking"', f'"{kind}"'), encoding="utf-8")
    with pytest.raises(ValueError, match=f"secure_aggregation '{kind}': across machines"):
        study_point(study)
