"""dpfl's own bytes on the wire: the run's public facts (study, instance, silos, sizes,
shape, classes, σ) go to a hospital in full until it holds them, then by their digest
(`flower_protocol.by_reference`, `held`); a hospital checks what it holds as it checked
what it was sent, refuses facts changed mid-run, and gets them in full again when it
lost them (a restarted SuperNode)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, Message, RecordDict

from dpfl.engines.flower import serve
from dpfl.engines.flower.protocol import FACTS, UNHELD, DeploymentError, digest, fields_of
from dpfl.experiments.study.deployment import client_app, deployment_of

from .conftest import public_fields, server_message
from .test_flower import (
    InProcessGrid,
    approve_node,
    assert_the_simulators,
    hospitals,
    simulated,
    study,
    untouched,
)

__all__ = ["study"]  # the fixture, imported so that pytest finds it


class RecordingGrid(InProcessGrid):
    """The in-process grid, keeping each message's kind and fields; `forget` empties a
    node's context state before its next `train` (its SuperNode restarted)."""

    def __init__(self, nodes: Iterable[dict[str, Any]], forget: int | None = None) -> None:
        super().__init__(nodes)
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.forget = forget

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        for message in messages:
            kind, node = message.metadata.message_type, message.metadata.dst_node_id
            if kind == "train" and node == self.forget:
                self.contexts[node].state = RecordDict()
                self.forget = None
            self.sent.append((kind, fields_of(message)))
        return super().push_messages(messages)


def test_after_the_plan_a_hospital_is_sent_the_facts_by_their_digest(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = RecordingGrid(nodes.values())
    result = serve(grid, deployment_of(study))
    assert result.rounds_completed == 3
    plans = [fields for kind, fields in grid.sent if kind == "query.plan"]
    assert len(plans) == 3 and all("silos" in fields for fields in plans)
    later = [fields for kind, fields in grid.sent if kind in ("train", "evaluate")]
    assert len(later) == 12
    facts = {k: plans[0][k] for k in FACTS if k in plans[0]}
    assert all(f["facts"] == digest(facts) and not FACTS & f.keys() for f in later)


def test_a_hospital_that_lost_the_facts_is_sent_them_again_and_the_run_is_the_simulators(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = RecordingGrid(nodes.values(), forget=3)  # hospital-1, before round 0's train
    result = serve(grid, deployment_of(study))
    simulation, book = simulated(study, tmp_path)
    assert_the_simulators(result, nodes, simulation, book)
    book.close()
    trains = [fields for kind, fields in grid.sent if kind == "train"]
    assert sum("silos" in fields for fields in trains) == 1  # hospital-1's, again in full


def test_a_hospital_answers_unheld_facts_and_refuses_facts_changed_mid_run(
    study: Path, tmp_path: Path
) -> None:
    node = hospitals(study, tmp_path / "hospitals")["hospital-0"]
    approve_node(node)
    app, state = client_app(), RecordDict()
    context = Context(run_id=7, node_id=2, node_config=node, state=state, run_config={})
    fields = public_fields(study)
    facts = digest({k: fields[k] for k in FACTS if k in fields})
    train = {"round": 0, "exchange": 0, "cohort": fields["silos"], "facts": facts}
    assert fields_of(app(server_message("train", train), context)) == {UNHELD: True}
    assert untouched(node)  # nothing done, nothing charged
    assert fields_of(app(server_message("query.plan", fields), context))["accepted"]
    changed = {**fields, "sizes": [s + 1 for s in fields["sizes"]]}
    with pytest.raises(DeploymentError, match="the server changed the run's sizes mid-run"):
        app(server_message("query.plan", changed), context)


def test_facts_sent_beside_their_digest_are_refused(study: Path, tmp_path: Path) -> None:
    """A message that refers to the held facts by digest stands on those facts: one that
    also states some of them (another silo's size here) is refused, not merged."""
    node = hospitals(study, tmp_path / "hospitals")["hospital-0"]
    approve_node(node)
    app = client_app()
    context = Context(run_id=7, node_id=2, node_config=node, state=RecordDict(), run_config={})
    fields = public_fields(study)
    assert fields_of(app(server_message("query.plan", fields), context))["accepted"]
    facts = digest({k: fields[k] for k in FACTS if k in fields})
    sizes = [fields["sizes"][0], *(s + 1 for s in fields["sizes"][1:])]
    plan = {k: v for k, v in fields.items() if k not in FACTS}
    with pytest.raises(DeploymentError, match="the run's sizes beside their digest"):
        app(server_message("query.plan", {**plan, "facts": facts, "sizes": sizes}), context)
