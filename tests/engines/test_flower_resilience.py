"""A deployment that loses a hospital or its server: with `missing="continue"` a round
goes on without a hospital that failed or refused (which is asked again the next round);
a server restarted from its checkpoint continues the same run instance, and hospitals
answer a round they already answered with the reply they sent (nothing new released,
nothing charged twice), except a masked reply, which is trained and paid for anew. In
process."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from dpfl.engines.flower import DeploymentError, serve
from dpfl.engines.flower.protocol import LOG
from dpfl.experiments.study import deployment
from dpfl.experiments.study.deployment import deployment_of, study_point
from dpfl.federation.silo import SiloInfo
from dpfl.local.mechanisms import STREAMS

from .test_flower import (
    STUDY,
    InProcessGrid,
    assert_the_simulators,
    entries,
    hospitals,
    simulated,
    study,
)
from .test_flower_secure import DOPAMINE

__all__ = ["study"]  # the fixture, used by name


def crashing_in(grid: InProcessGrid, name: str, round_: int) -> None:
    """`name`'s ClientApp fails every train message of `round_` (its machine is away)."""
    node = next(n for n, c in grid.contexts.items() if c.node_config["name"] == name)
    answered, gone = grid.app, ClientApp()
    for kind in ("hello", "plan", "secagg_keys", "secagg_shares", "secagg_unmask"):
        gone.query(kind)(answered)
    gone.evaluate()(answered)

    def train(message: Message, context: Context) -> Message:
        if message.content["dpfl"]["round"] == round_:
            raise ConnectionError("the machine went away")
        return answered(message, context)

    gone.train()(train)
    grid.apps = {node: gone}


class ServerKilled(InProcessGrid):
    """The grid of a server killed once the hospitals answered `round_`'s train."""

    def __init__(self, nodes: Iterable[dict[str, Any]], round_: int) -> None:
        super().__init__(nodes)
        self.round, self.trained = round_, False

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        self.trained = any(
            m.metadata.message_type == "train" and m.content["dpfl"]["round"] == self.round
            for m in messages
        )
        return super().push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        if self.trained:
            raise KeyboardInterrupt  # the server's process dies with the replies unread
        return super().pull_messages(message_ids)


def rounds_charged(node: dict[str, Any]) -> int:
    return len(entries(Path(node["ledger"]), f"{node['name']}/trial-0"))


def test_a_round_goes_on_without_a_hospital_that_failed_and_asks_it_again(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    crashing_in(grid, "hospital-1", 1)
    result = serve(grid, deployment_of(study), timeout=5, missing="continue")
    assert result.rounds_completed == 3 and not result.stopped and not result.refused
    assert [(r, n) for r, n, _ in result.absent] == [(1, "hospital-1")]
    assert "ConnectionError: the machine went away" in result.absent[0][2]
    # it had paid for nothing in round 1 (it failed before training), and came back in 2
    assert [rounds_charged(nodes[n]) for n in nodes] == [3, 2, 3]
    assert set(result.metrics) == set(nodes)


def test_a_hospital_over_budget_refuses_and_the_run_goes_on_without_it(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals", {"hospital-2": 0.5})
    result = serve(InProcessGrid(nodes.values()), deployment_of(study), missing="continue")
    assert result.rounds_completed == 3 and not result.refused
    assert [(r, n) for r, n, _ in result.absent] == [(r, "hospital-2") for r in range(3)]
    assert all("would exceed ε=0.5" in why for _, _, why in result.absent)
    assert [rounds_charged(nodes[n]) for n in nodes] == [3, 3, 0]


@pytest.mark.parametrize("server", ["", 'server = { optimizer = "fedadam", learning_rate = 0.05 }'])
def test_a_server_restarted_from_its_checkpoint_ends_as_an_uninterrupted_run(
    study: Path, tmp_path: Path, server: str
) -> None:
    """Killed with round 1's replies unread: the restarted server (a new Flower run, new
    node contexts) asks round 1 again and the hospitals send the same replies, uncharged.
    Their budgets afford exactly the study's 3 rounds and its DP evaluation: round 1 is
    not planned twice. A server optimiser's memory is in the checkpoint."""
    study.write_text(STUDY.replace('name = "fedavg"', f'name = "fedavg"\n{server}'))
    simulation, book = simulated(study, tmp_path)
    evaluation = deployment.evaluation(study_point(study)).event(SiloInfo("any", 1))
    exact = {
        n: book.projected(f"{n}/trial-0", evaluation).epsilon * 1.001
        for n in simulation.silo_metrics[0]
    }
    nodes = hospitals(study, tmp_path / "hospitals", exact)
    checkpoint = tmp_path / "server" / "checkpoint.pt"
    checkpoint.parent.mkdir()
    with pytest.raises(KeyboardInterrupt):
        serve(
            ServerKilled(nodes.values(), 1),
            deployment_of(study),
            checkpoint=checkpoint,
        )
    assert [rounds_charged(node) for node in nodes.values()] == [2, 2, 2]
    result = serve(InProcessGrid(nodes.values()), deployment_of(study), checkpoint=checkpoint)
    assert result.rounds_completed == 3 and not result.stopped and not result.refused
    assert_the_simulators(result, nodes, simulation, book)
    book.close()


def test_a_masked_round_asked_again_is_trained_and_paid_for_again(
    study: Path, tmp_path: Path
) -> None:
    study.write_text(DOPAMINE, encoding="utf-8")
    nodes = hospitals(study, tmp_path / "hospitals")
    checkpoint = tmp_path / "checkpoint.pt"
    with pytest.raises(KeyboardInterrupt):
        serve(
            ServerKilled(nodes.values(), 1),
            deployment_of(study),
            checkpoint=checkpoint,
        )
    result = serve(InProcessGrid(nodes.values()), deployment_of(study), checkpoint=checkpoint)
    assert result.rounds_completed == 3 and not result.stopped
    for node in nodes.values():  # rounds 0, 1 (lost with the server), 1 again, 2
        charged = rounds_charged(node)
        assert charged == 4
        with_view = entries(Path(node["ledger"]), f"{node['name']}/trial-0/hospitals")
        assert len(with_view) == charged


def test_a_checkpoint_of_another_study_is_refused(study: Path, tmp_path: Path) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    checkpoint = tmp_path / "checkpoint.pt"
    serve(InProcessGrid(nodes.values()), deployment_of(study), checkpoint=checkpoint)
    study.write_text(STUDY.replace("rounds = 3", "rounds = 4"), encoding="utf-8")
    with pytest.raises(DeploymentError, match="is of another study or other hospitals"):
        serve(
            InProcessGrid(hospitals(study, tmp_path / "others").values()),
            deployment_of(study),
            checkpoint=checkpoint,
        )


def test_a_masked_round_trained_again_starts_a_new_noise_stream(
    study: Path, tmp_path: Path
) -> None:
    """Correlated noise: the exchange lost with the server is trained again from the
    hospital's state before it, on a new stream (continuing the one whose noise went
    out in the lost masked reply would let its memory take that noise back out): after
    rounds 1 (again) and 2 the stream has taken two rounds' steps, not three."""
    masked = STUDY.replace("seed = 3\n", 'seed = 3\nsecure_aggregation = "masking"\n')
    banded = masked.replace('name = "fedavg"', 'name = "fedavg"\nnoise = "bandmf"')
    study.write_text(banded.replace("noise_multiplier = 1.0", "noise_multiplier = 2.0"))

    def steps_taken(nodes: dict[str, Any]) -> list[int]:
        files = [next(Path(n["ledger"]).parent.glob("*.state.pt")) for n in nodes.values()]
        kept = [torch.load(f, weights_only=True)["local"] for f in files]
        return [local[STREAMS]["model"]["step"] for local in kept]

    whole = hospitals(study, tmp_path / "whole")
    serve(InProcessGrid(whole.values()), deployment_of(study))
    nodes = hospitals(study, tmp_path / "hospitals")
    checkpoint = tmp_path / "checkpoint.pt"
    with pytest.raises(KeyboardInterrupt):
        serve(ServerKilled(nodes.values(), 1), deployment_of(study), checkpoint=checkpoint)
    result = serve(InProcessGrid(nodes.values()), deployment_of(study), checkpoint=checkpoint)
    assert result.rounds_completed == 3 and not result.stopped
    assert [rounds_charged(node) for node in nodes.values()] == [4, 4, 4]
    assert [3 * s for s in steps_taken(nodes)] == [2 * s for s in steps_taken(whole)]


class Restarting(InProcessGrid):
    """hospital-1's SuperNode goes away just after it answered round 1's train (charged,
    its reply kept; the SuperLink answers "node unavailable" for it) and comes back as a
    new node with an empty context, as a restarted SuperNode, after the server looked for
    nodes `looks` times (never with `looks=None`), its node config changed by `changed`.
    `silent`: no reply at all, as from a SuperNode that died before the SuperLink missed
    its heartbeats."""

    def __init__(
        self,
        nodes: Iterable[dict[str, Any]],
        looks: int | None,
        *,
        silent: bool = False,
        **changed: Any,
    ) -> None:
        super().__init__(nodes)
        self.looks, self.away, self.changed = looks, dict[int, Context](), changed
        self.silent = silent

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        ids = list(super().push_messages(messages))
        for id_, message in zip(ids, messages, strict=True):
            dpfl, node = message.content["dpfl"], message.metadata.dst_node_id
            if message.metadata.message_type == "train" and dpfl["round"] == 1 and node == 3:
                error = Error(ErrorCode.NODE_UNAVAILABLE, "Node Unavailable")
                if self.silent:  # its reply, kept by the hospital, never reaches the server
                    del self.replies[id_]
                else:
                    self.replies[id_] = Message(error, reply_to=message)
                self.away[5] = self.contexts.pop(3)
        return ids

    def get_node_ids(self) -> Iterable[int]:
        if self.away and self.looks is not None:
            self.looks -= 1
            if self.looks < 0:
                old = self.away.pop(5)
                config = {**old.node_config, **self.changed}
                self.contexts[5] = Context(7, 5, config, RecordDict(), {})
        return super().get_node_ids()


@pytest.mark.parametrize("silent", [False, True])
def test_a_hospital_restarted_mid_round_is_waited_for_and_asked_again(
    study: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, silent: bool
) -> None:
    """Within the grace period the run goes on by itself: the hospital answers round 1
    again with the reply it kept, charged once, and the run ends as the simulator's;
    so too where the SuperLink had not yet said it was gone when the reply was due."""
    simulation, book = simulated(study, tmp_path)
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = Restarting(nodes.values(), 3, silent=silent)
    with caplog.at_level(logging.INFO, logger=LOG.name):
        result = serve(grid, deployment_of(study), grace=30, timeout=2 if silent else 600)
    assert result.rounds_completed == 3 and not result.stopped and not result.refused
    assert_the_simulators(result, nodes, simulation, book)
    book.close()
    assert "hospital-1 gone: waiting up to 30s for it to come back" in caplog.text
    assert "hospital-1 is back (node 5): asking it again" in caplog.text


@pytest.mark.parametrize(("grace", "looks"), [(0.0, 3), (0.5, None)])
def test_without_grace_or_past_it_a_hospital_gone_stops_the_run(
    study: Path, tmp_path: Path, grace: float, looks: int | None
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    result = serve(Restarting(nodes.values(), looks), deployment_of(study), grace=grace)
    assert result.rounds_completed == 1
    assert result.stopped.startswith("round 1: hospital-1: error 5: Node Unavailable")
    assert [rounds_charged(node) for node in nodes.values()] == [2, 2, 2]


def test_a_hospital_that_comes_back_with_another_hello_stops_the_run(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = Restarting(nodes.values(), 3, **{"public-size": 100})
    result = serve(grid, deployment_of(study), grace=30)
    assert result.rounds_completed == 1
    assert result.stopped.startswith("round 1: hospital-1 came back with another hello: ")
