"""Dopamine on loopback (beyond tests/engines/test_flower.py): its replies masked between
separate processes, a SuperLink and three SuperNodes (`dpfl.engines.loopback`), TLS and
registered keys, bounded in time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dpfl.engines import loopback
from dpfl.engines.flower import DeploymentResult

from .test_flower import entries, flower_installed, hospitals, simulated, study
from .test_flower_secure import DOPAMINE

__all__ = ["flower_installed", "study"]  # fixtures, used by name
DEADLINE = 300.0


def same_as_simulated(
    out: Path, nodes: dict[str, dict[str, Any]], simulation: Any, book: Any, output: str
) -> None:
    """The deployment's model, metrics and every hospital's ledger are the simulator's."""
    result = DeploymentResult.load(out)
    assert not result.refused and not result.stopped, output
    assert result.rounds_completed == simulation.rounds_completed, output
    for name, value in simulation.params.items():
        assert torch.equal(result.params[name], value[0]), output
    assert result.metrics == simulation.silo_metrics[0]
    for name, node in nodes.items():
        mine = entries(Path(node["ledger"]), f"{name}/trial-0")
        assert mine == [e.event.to_json() for e in book.entries(f"{name}/trial-0")], name
        assert result.epsilon[name] == pytest.approx(book.spent(f"{name}/trial-0").epsilon)
    book.close()


@pytest.mark.slow
@pytest.mark.usefixtures("flower_installed")
def test_dopamine_masked_between_processes_ends_as_simulated(study: Path, tmp_path: Path) -> None:
    """Each hospital's masking client lives in its SuperNode's context state between the
    protocol's messages, each handled by a new ClientApp process. Two rounds (four
    message round trips each, about 8 s apiece with Flower 1.41's SuperNode): the three
    rounds of the in-process test would take the suite's time for no new path."""
    study.write_text(DOPAMINE.replace("rounds = 3", "rounds = 2"), encoding="utf-8")
    nodes = hospitals(study, tmp_path / "hospitals")
    output, out, _ = loopback.deploy(study, nodes, tmp_path, deadline=DEADLINE, timeout=60)
    simulation, book = simulated(study, tmp_path)
    same_as_simulated(out, nodes, simulation, book, output)
