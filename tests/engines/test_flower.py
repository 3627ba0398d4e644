"""The Flower engine: the simulator's algorithm, split between a ServerApp and hospitals'
ClientApps, each hospital enforcing its own budget from its own ledger.

In process: a grid that hands each message to the ClientApp, no network. The real thing
(a SuperLink and SuperNodes as separate processes on loopback, over TLS with
certificates made on the spot) is in tests/engines/test_flower_loopback.py."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.proto.node_pb2 import NodeInfo
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from dpfl import secure
from dpfl.engines.flower import DeploymentError, DeploymentResult, loopback, serve
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import SimulationResult, simulate
from dpfl.experiments.study.build import build_algorithm
from dpfl.experiments.study.datasets import build_silos
from dpfl.experiments.study.deployment import approve, client_app, deployment_of, study_point
from dpfl.federation.silo import Silo
from dpfl.privacy import Ledger, events

from .conftest import public_fields, server_message

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
CLEAR = '\n[evaluation]\nrelease = "clear"\n'
"""A study's evaluation in the clear, outside ε: the simulator's research figures."""


@pytest.fixture
def study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # the identity Flower gives a ServerApp's process, which its messages are from
    for name, value in [("_run_id", 7), ("_node_id", 1), ("_task_id", 1)]:
        monkeypatch.setattr(TaskIdentity, name, value)
    path = tmp_path / "study.toml"
    path.write_text(STUDY, encoding="utf-8")
    return path


def hospitals(study: Path, root: Path, epsilon: dict[str, float] | None = None) -> dict[str, Any]:
    """Each silo of the study written to its hospital's folder, with its node config and
    a new identity key, which the study's roster then lists."""
    config = study_point(study)
    nodes = {
        silo.name: loopback.hospital_node(
            silo,
            study,
            root / silo.name,
            epsilon=(epsilon or {}).get(silo.name, EPSILON),
            delta=DELTA,
        )
        for silo in build_silos(config.data, config.seed)
    }
    loopback.pin_roster(study, nodes)
    return nodes


class InProcessGrid(Grid):
    """Flower's Grid over the ClientApp in this process: each message goes to the app
    with its node's context (node config and state kept between messages), as a
    SuperNode would deliver it; an exception becomes an error reply, as in Flower."""

    def __init__(self, nodes: Iterable[dict[str, Any]], *, approved: bool = True) -> None:
        nodes = list(nodes)
        if approved:  # each hospital's officer approves the study as it runs it
            for node in nodes:
                approve_node(node)
        self.app = client_app()
        self.replies: dict[str, Message] = {}
        self.apps: dict[int, Callable[[Message, Context], Message]] = {}
        """Nodes that run another ClientApp than dpfl's."""
        self.registered: dict[int, str] = {}
        """Names the nodes' keys were registered with."""
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

    def get_nodes(self) -> Iterable[NodeInfo]:
        return [NodeInfo(node_id=n, name=self.registered.get(n, "")) for n in self.contexts]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            ids.append(f"m{len(self.replies)}")
            message.metadata.__dict__["_message_id"] = ids[-1]  # as Flower's InMemoryGrid
            node = message.metadata.dst_node_id
            try:
                reply = self.apps.get(node, self.app)(message, self.contexts[node])
            except Exception as exc:  # what a SuperNode sends back
                reply = Message(Error(0, f"{type(exc).__name__}: {exc}"), reply_to=message)
            self.replies[ids[-1]] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self.replies.pop(i) for i in message_ids if i in self.replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        raise NotImplementedError


def approve_node(node: dict[str, Any], name: str | None = None) -> None:
    """The hospital's officer approves its study as its node config runs it."""
    budget = node.get("dataset-budget")
    approve(
        Path(node["study"]),
        ledger=Path(node["ledger"]),
        identity=Path(node["identity"]),
        epsilon=float(node["epsilon"]),
        delta=float(node["delta"]),
        dataset_cap=None if budget is None else float(budget),
        name=name,
    )


def untouched(node: dict[str, Any]) -> bool:
    """Whether the hospital's ledger holds its officer's approval only: no account was
    opened, nothing charged."""
    with Ledger(Path(node["ledger"]), create=False) as book:
        return book.silos() == [] and len(book.approvals()) == 1


def simulated(study: Path, tmp_path: Path) -> tuple[SimulationResult, Ledger]:
    """The study in the simulator, summed as the study says (masking, HE: in one process)."""
    config = study_point(study)
    silos = build_silos(config.data, config.seed)
    book = Ledger(tmp_path / "simulated.sqlite")
    result = simulate(
        build_algorithm(config, silos),
        silos,
        RunPlan(
            rounds=config.rounds,
            seed=config.seed,
            epsilon=EPSILON,
            delta=DELTA,
            progress=False,
            secure_sum=secure.by_name(config.summing),
        ),
        ledger=book,
    )
    return result, book


def accuracy(params: dict[str, torch.Tensor], silos: list[Silo]) -> float:
    x = torch.cat([s.x_test for s in silos if s.x_test is not None])
    y = torch.cat([s.y_test for s in silos if s.y_test is not None])
    weight, bias = params["weight"], params["bias"]
    predicted = (x @ weight.T + bias).squeeze(-1) > 0
    return float((predicted == y.bool()).float().mean())


EVALUATION = "evaluation of the final model"
"""The label of a hospital's DP evaluation in its ledger: a deployment's own release,
which the simulator's research figures (outside ε) do not charge."""


def entries(ledger: Path, account: str) -> list[str]:
    """The account's events, but its DP evaluation's (`evaluations`)."""
    with Ledger(ledger, create=False) as book:
        return [e.event.to_json() for e in book.entries(account) if EVALUATION not in e.label]


def evaluations(ledger: Path, account: str) -> list[str]:
    """The account's DP evaluations' events."""
    with Ledger(ledger, create=False) as book:
        return [e.event.to_json() for e in book.entries(account) if EVALUATION in e.label]


def assert_the_simulators(
    result: DeploymentResult,
    nodes: dict[str, dict[str, Any]],
    simulation: SimulationResult,
    book: Ledger,
) -> None:
    """The deployment ended with the simulator's model, bit for bit, and each hospital's
    ledger holds the events the simulator charged it, and its evaluation's where the
    study's is DP (the simulator's research figures are outside ε), in the ε it
    reported."""
    for name, value in simulation.params.items():
        assert torch.equal(result.params[name], value[0])
    plan = deployment_of(Path(nodes[next(iter(nodes))]["study"])).evaluation
    for name, node in nodes.items():
        mine = entries(Path(node["ledger"]), f"{name}/trial-0")
        assert mine == [e.event.to_json() for e in book.entries(f"{name}/trial-0")]
        evaluated = evaluations(Path(node["ledger"]), f"{name}/trial-0")
        if plan.release == "dp":
            assert evaluated == [events.gaussian(plan.noise_multiplier).to_json()]
        else:
            assert evaluated == []
        with Ledger(Path(node["ledger"]), create=False) as own:
            assert result.epsilon[name] == pytest.approx(own.spent(f"{name}/trial-0").epsilon)


class RecordingGrid(InProcessGrid):
    """The in-process grid, keeping every reply the server pulls."""

    def __init__(self, nodes: Iterable[dict[str, Any]]) -> None:
        super().__init__(nodes)
        self.seen: list[Message] = []

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        pulled = list(super().pull_messages(message_ids))
        self.seen += pulled
        return pulled


def test_in_process_the_deployment_ends_with_the_simulators_model(
    study: Path, tmp_path: Path
) -> None:
    """Its clear figures (declared) are the simulator's research figures."""
    study.write_text(STUDY + CLEAR, encoding="utf-8")
    nodes = hospitals(study, tmp_path / "hospitals")
    result = serve(InProcessGrid(nodes.values()), deployment_of(study))
    simulation, book = simulated(study, tmp_path)
    assert result.rounds_completed == 3 and not result.refused
    assert accuracy(result.params, build_silos(study_point(study).data, 3)) > 0.8
    assert result.metrics == simulation.silo_metrics[0]  # each hospital's, on its test set
    for name, value in simulation.params.items():
        assert torch.equal(result.params[name], value[0])  # bit for bit
    for name, node in nodes.items():
        mine = entries(Path(node["ledger"]), f"{name}/trial-0")
        assert mine == [e.event.to_json() for e in book.entries(f"{name}/trial-0")]
        assert len(mine) == 3
        assert result.epsilon[name] == pytest.approx(book.spent(f"{name}/trial-0").epsilon)
    book.close()


@pytest.mark.parametrize(
    "algorithm",
    [
        'name = "mrmtl"\nstrength = 0.5',
        'name = "ditto"\nstrength = 0.5',
        'name = "finetune"\nfederated_rounds = 2',
        'name = "local"',
        'name = "sign"',
        'name = "cyclic"\nsteps_per_visit = 3',
        'name = "fedavg"\nclients_per_round = 2',
        'name = "fedavg"\nnoise = "bandmf"',
        'name = "ditto"\nstrength = 0.5\nnoise = { mechanism = "bandmf", band = 2 }',
        'name = "fedavg"\nserver = { optimizer = "fedadam", learning_rate = 0.05 }',
        'name = "mrmtl"\nstrength = 0.5\nserver = "fedavgm"',
        'name = "sign"\nserver = "fedyogi"',
    ],
)
def test_in_process_every_deployable_algorithm_ends_as_in_the_simulator(
    study: Path, tmp_path: Path, algorithm: str
) -> None:
    """Personal models and momentum stay at the hospitals between rounds (a file beside
    each ledger), hand-offs and sampled cohorts go through the same messages; each
    hospital's DP evaluation of the model it uses is charged once, beside the rounds.
    Correlated noise's secret streams stay there too, and continue round after round. A
    server optimiser's memory stays at the server and moves the model as the simulator's."""
    study.write_text(STUDY.replace('name = "fedavg"', algorithm), encoding="utf-8")
    nodes = hospitals(study, tmp_path / "hospitals")
    result = serve(InProcessGrid(nodes.values()), deployment_of(study))
    simulation, book = simulated(study, tmp_path)
    assert result.rounds_completed == 3 and not result.refused
    assert result.metrics.keys() == simulation.silo_metrics[0].keys()
    assert_the_simulators(result, nodes, simulation, book)
    book.close()


def test_in_process_aop_sets_its_noise_from_the_study_and_deploys_as_simulated(
    study: Path, tmp_path: Path
) -> None:
    study.write_text(
        STUDY.replace('name = "fedavg"', 'name = "aop"').replace("noise_multiplier = 1.0\n", "")
        + CLEAR,
        encoding="utf-8",
    )
    nodes = hospitals(study, tmp_path / "hospitals")
    result = serve(InProcessGrid(nodes.values()), deployment_of(study))
    simulation, book = simulated(study, tmp_path)
    assert result.rounds_completed == 3 and result.metrics == simulation.silo_metrics[0]
    assert_the_simulators(result, nodes, simulation, book)
    book.close()


def test_in_process_a_hospital_whose_budget_is_too_small_refuses_before_round_0(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals", {"hospital-1": 0.5})
    result = serve(InProcessGrid(nodes.values()), deployment_of(study))
    assert result.rounds_completed == 0
    assert list(result.refused) == ["hospital-1"]
    assert "would exceed ε=0.5" in result.refused["hospital-1"]
    for name, node in nodes.items():
        assert entries(Path(node["ledger"]), f"{name}/trial-0") == []


def test_in_process_a_client_that_is_not_dpfls_is_rejected(study: Path, tmp_path: Path) -> None:
    grid = InProcessGrid(hospitals(study, tmp_path / "hospitals").values())
    grid.contexts[9] = grid.contexts[2]
    plain = ClientApp()  # a Flower client with no privacy declaration to give
    plain.train()(lambda message, context: Message(RecordDict(), reply_to=message))
    grid.apps = {9: plain}
    with pytest.raises(DeploymentError, match="No query function registered with name 'hello'"):
        serve(grid, deployment_of(study))


def test_in_process_a_hospital_restarting_after_a_crash_is_asked_again_when_it_joins(
    study: Path, tmp_path: Path
) -> None:
    """The SuperLink holds a crashed hospital's node as connected until it misses its
    heartbeats, then answers for it "node unavailable"; restarted, the hospital joins
    again. The server greets it then, within `wait`, instead of giving up."""
    grid = InProcessGrid(hospitals(study, tmp_path / "hospitals").values())
    asked: list[str] = []
    unavailable = 2  # replies "node unavailable" for, then joins again

    def restarting(message: Message, context: Context) -> Message:
        asked.append(message.metadata.message_type)
        if len(asked) <= unavailable:
            return Message(Error(ErrorCode.NODE_UNAVAILABLE, "Node Unavailable"), reply_to=message)
        return grid.app(message, context)

    grid.apps = {3: restarting}  # hospital-1
    result = serve(grid, deployment_of(study), wait=30)
    assert result.rounds_completed == 3 and asked[:3] == ["query.hello"] * 3
    unavailable, asked[:] = 10**6, []  # it never comes back
    with pytest.raises(DeploymentError, match=r"2 of 3 hospitals answered hello in 0.5s \("):
        serve(grid, deployment_of(study), wait=0.5)


def test_in_process_a_hospital_cannot_claim_another_registered_name(
    study: Path, tmp_path: Path
) -> None:
    grid = InProcessGrid(hospitals(study, tmp_path / "hospitals").values())
    grid.registered = {2: "hospital-0", 3: "hospital-2", 4: "hospital-1"}
    with pytest.raises(
        DeploymentError, match="says it is 'hospital-1', its key is registered as 'hospital-2'"
    ):
        serve(grid, deployment_of(study))


def test_in_process_a_hospital_gone_mid_run_stops_it_with_what_is_done(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    answered, gone = grid.app, ClientApp()
    gone.query("hello")(answered)
    gone.query("plan")(answered)
    gone.evaluate()(answered)

    def crash_in_round_1(message: Message, context: Context) -> Message:
        if message.metadata.message_type == "train" and message.content["dpfl"]["round"] == 1:
            raise ConnectionError("the machine went away")
        return answered(message, context)

    gone.train()(crash_in_round_1)
    grid.apps = {3: gone}  # hospital-1
    result = serve(grid, deployment_of(study), timeout=5)
    assert result.rounds_completed == 1 and not result.refused
    assert result.stopped.startswith("round 1: hospital-1: error 0: ConnectionError")
    for name, node in nodes.items():  # the others paid for round 1, whose sum never came
        assert len(entries(Path(node["ledger"]), f"{name}/trial-0")) == (
            1 if name == "hospital-1" else 2
        )


def test_in_process_a_hospital_refuses_a_round_outside_the_study(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    fields = public_fields(study)
    message = server_message("train", {**fields, "round": 3, "cohort": fields["silos"]})
    (reply,) = grid.pull_messages(grid.push_messages([message]))
    assert reply.content.config_records["dpfl"]["refused"] == (
        "round 3 is not one of the study's 3 rounds"
    )
    assert entries(Path(nodes["hospital-0"]["ledger"]), "hospital-0/trial-0") == []


def test_a_result_survives_its_file(tmp_path: Path) -> None:
    result = DeploymentResult(2, {"w": torch.ones(2)}, [], {"a": 1.5}, {})
    result.save(tmp_path)
    again = DeploymentResult.load(tmp_path)
    assert again.rounds_completed == 2 and again.epsilon == {"a": 1.5}


# -- the real thing: separate processes on loopback ---------------------------------------


@pytest.fixture
def flower_installed() -> None:
    """Flower's commands must be installed: skipped without them, failed under CI=true."""
    missing = loopback.missing_binaries()
    if not missing:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but Flower's {', '.join(missing)} are missing from {loopback.BIN}")
    pytest.skip(f"Flower's {', '.join(missing)} are not installed in {loopback.BIN}")
