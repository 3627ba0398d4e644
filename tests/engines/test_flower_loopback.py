"""On loopback (beyond tests/engines/test_flower.py), a SuperLink and three SuperNodes as
separate processes (`dpfl.engines.flower.loopback`), TLS and registered keys, bounded in time:
a hospital over its budget and an unregistered node, Dopamine's replies masked between
them, a hospital and the server killed mid-round, then restarted, a hospital restarted
within the server's grace period, hospitals calibrating to their own budgets, and a
second study past the hospitals' dataset cap. Every such test lives in this file, marked
`loopback`: `make test-loopback` runs them one at a time (CI after `make test`, which
leaves them out: they are twelve minutes mostly waiting on Flower,
and on two cores beside the parallel suite each takes half as long again)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
import torch

from dpfl.engines.flower import DeploymentResult, loopback, serve
from dpfl.engines.flower.loopback import Cluster, LoopbackError
from dpfl.experiments.study.deployment import deployment_of
from dpfl.privacy import Ledger
from dpfl.privacy.errors import LedgerError

from .test_flower import (
    InProcessGrid,
    assert_the_simulators,
    entries,
    evaluations,
    flower_installed,
    hospitals,
    simulated,
    study,
)
from .test_flower_dataset_budget import capped_hospitals, second_study_refused
from .test_flower_secure import DOPAMINE
from .test_flower_table import STUDY as TABLE_STUDY
from .test_flower_table import flower_study, table_hospitals, table_study

__all__ = ["flower_installed", "flower_study", "study", "table_study"]  # fixtures, by name
pytestmark = pytest.mark.loopback
DEADLINE = 600.0
REJOIN = 150.0
"""Seconds to wait for a reply from a hospital that restarts after a crash: the SuperLink
lets its dead node go after two missed heartbeats (60 s), then it joins again."""


def same_as_simulated(
    out: Path, nodes: dict[str, dict[str, Any]], simulation: Any, book: Any, output: str
) -> None:
    """The deployment's model and every hospital's ledger are the simulator's, with its
    DP evaluation (the study's default), whose metrics the server read off its counts."""
    result = DeploymentResult.load(out)
    assert not result.refused and not result.stopped, output
    assert result.rounds_completed == simulation.rounds_completed, output
    assert result.metrics.keys() == simulation.silo_metrics[0].keys()
    assert_the_simulators(result, nodes, simulation, book)
    book.close()


@pytest.mark.slow
@pytest.mark.usefixtures("flower_installed")
def test_on_loopback_a_hospital_over_budget_refuses_and_an_unregistered_node_is_kept_out(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals", {"hospital-2": 0.5})
    # 60 s for each reply, as the other deployments here: the first message cold-starts a
    # ClientApp process per hospital (about 5 s of imports each, four SuperNodes on two
    # cores); at 30 s the hellos once came back just too late under CI's load
    output, out, logs = loopback.deploy(study, nodes, tmp_path, cli=True, intruder=True, timeout=60)
    result = DeploymentResult.load(out)
    assert result.rounds_completed == 0 and list(result.refused) == ["hospital-2"], output
    assert "hospital-2 refused: hospital-2/trial-0: 3 more rounds" in output
    for name, node in nodes.items():
        assert entries(Path(node["ledger"]), f"{name}/trial-0") == []
    assert "Failed to activate SuperNode" in (logs / "intruder.log").read_text()


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


def until(done: Callable[[], bool], seconds: float, running: Cluster) -> None:
    """Wait until `done()`, polling every 20 ms; LoopbackError with the logs after
    `seconds`."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            raise LoopbackError(f"not done in {seconds:g}s\n{running.tails()}")
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.usefixtures("flower_installed")
def test_a_hospital_and_the_server_killed_mid_round_then_restarted_end_as_simulated(
    study: Path, tmp_path: Path
) -> None:
    """Three rounds of DP-FedAvg between separate processes, with a crash. hospital-1's
    machine and the server's lose power in round 1, just after hospital-1's ledger
    committed the round's charge: no ledger loses a committed event. Restarted, the
    server resumes from its checkpoint as the same run instance and asks round 1 again:
    the others re-send their replies, uncharged; hospital-1 re-sends its own if it had
    kept it, else trains round 1 again (the same streams, with research noise) and pays
    again. The model ends as the simulator's, bit for bit, and every ledger with the
    simulator's events, hospital-1's perhaps with round 1 twice."""
    nodes = hospitals(study, tmp_path / "hospitals")
    ledgers = {name: Path(node["ledger"]) for name, node in nodes.items()}

    def charged(name: str) -> list[str]:
        return entries(ledgers[name], f"{name}/trial-0")

    def charged_twice(name: str) -> bool:
        with suppress(LedgerError):  # not made yet, or being made
            return len(charged(name)) == 2
        return False

    out = tmp_path / "server-out"
    with loopback.cluster(nodes, tmp_path) as running:
        command = running.server(study, out, "--wait", "60", "--timeout", "60")
        with open(running.logs / "first-server.log", "wb") as log:
            first = subprocess.Popen(command, env=running.env, stdout=log, stderr=log)
        try:
            until(lambda: charged_twice("hospital-1"), DEADLINE, running)
            running.kill("superlink", "flwr-serverapp")
            running.kill("hospital-1")
        finally:
            loopback.stop([first])
        committed = {name: charged(name) for name in nodes}
        (checkpoint,) = out.glob("checkpoint-*.pt")
        instance = torch.load(checkpoint, weights_only=True)["instance"]
        again = running.server(study, out, "--wait", str(REJOIN), "--timeout", str(REJOIN))
        with open(running.logs / "second-server.log", "wb") as log:
            second = subprocess.Popen(again, env=running.env, stdout=log, stderr=log)
        try:
            rejoin(running, "hospital-1", second)
            second.wait(timeout=DEADLINE)
        finally:
            loopback.stop([second])
        output = (running.logs / "second-server.log").read_text()
    assert second.returncode == 0, output
    simulation, book = simulated(study, tmp_path)
    result = DeploymentResult.load(out)
    assert result.rounds_completed == 3 and not result.stopped and not result.refused, output
    assert result.instance == instance  # resumed, not started anew
    for name, value in simulation.params.items():
        assert torch.equal(result.params[name], value[0]), output
    assert result.metrics.keys() == simulation.silo_metrics[0].keys()  # DP, of the counts
    for name in nodes:
        assert len(evaluations(ledgers[name], f"{name}/trial-0")) == 1  # charged once
        final = charged(name)
        assert final[: len(committed[name])] == committed[name], name  # none lost
        simulated_events = [e.event.to_json() for e in book.entries(f"{name}/trial-0")]
        paid_twice = [*simulated_events[:2], *simulated_events[1:]]
        assert final == simulated_events or (name == "hospital-1" and final == paid_twice)
        with Ledger(ledgers[name], create=False) as ledger:
            assert result.epsilon[name] == pytest.approx(ledger.spent(f"{name}/trial-0").epsilon)
    book.close()


@pytest.mark.slow
@pytest.mark.usefixtures("flower_installed")
def test_a_hospital_restarted_mid_run_is_waited_for_and_the_server_finishes_by_itself(
    study: Path, tmp_path: Path
) -> None:
    """hospital-1 is killed (SIGKILL, with its SuperNode and ClientApp) once it kept its
    round 0 reply, and started again at once; its `dpfl deploy hospital` retries until
    the SuperLink lets the dead SuperNode go. The one server run finishes, and each
    ledger holds the simulator's events, one a round: none twice. (`dpfl deploy
    hospital` draws its noise from the OS, so the model is not the simulator's: the
    in-process test, tests/engines/test_flower_resilience.py, checks that bit for bit.)"""
    nodes = hospitals(study, tmp_path / "hospitals")
    ledger = Path(nodes["hospital-1"]["ledger"])

    def kept_round_0() -> bool:
        with suppress(LedgerError, OSError, RuntimeError, StopIteration, EOFError):
            kept = torch.load(next(ledger.parent.glob("*.state.pt")), weights_only=True)
            charged = entries(ledger, "hospital-1/trial-0")
            return kept["at"] == [0, 0] and "reply" in kept and len(charged) == 1
        return False

    out = tmp_path / "server-out"
    with loopback.cluster(nodes, tmp_path, cli=True) as running:
        timing = ["--wait", "60", "--timeout", "60", "--grace", "200"]
        with open(running.logs / "server.log", "wb") as log:
            server = subprocess.Popen(
                running.server(study, out, *timing), env=running.env, stdout=log, stderr=log
            )
        try:
            until(kept_round_0, DEADLINE, running)
            running.kill("hospital-1")
            running.start("hospital-1")
            server.wait(timeout=DEADLINE)
        finally:
            loopback.stop([server])
        output = (running.logs / "server.log").read_text()
    assert server.returncode == 0, output
    assert "hospital-1 gone: waiting up to 200s" in output, output
    assert "hospital-1 is back" in output, output
    _, book = simulated(study, tmp_path)
    result = DeploymentResult.load(out)
    assert result.rounds_completed == 3 and not result.stopped and not result.refused, output
    for name, node in nodes.items():
        simulated_events = [e.event.to_json() for e in book.entries(f"{name}/trial-0")]
        assert entries(Path(node["ledger"]), f"{name}/trial-0") == simulated_events, name
    book.close()


def rejoin(running: Cluster, name: str, server: subprocess.Popen[bytes]) -> None:
    """Start the hospital's SuperNode again, and again every 2 s while it stops (the
    SuperLink refuses it while it holds its dead one as connected), as `dpfl deploy
    hospital` does, until the server ends or REJOIN seconds have passed."""
    deadline = time.monotonic() + REJOIN
    running.start(name)
    while server.poll() is None and time.monotonic() < deadline:
        if running.processes[name][-1].poll() is not None:
            time.sleep(2)
            running.start(name)
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.usefixtures("flower_installed")
def test_on_loopback_hospitals_read_their_own_csv_and_calibrate_to_their_own_budgets(
    table_study: Path, tmp_path: Path
) -> None:
    """`dpfl deploy hospital --data own.csv` for each of three hospitals with budgets 2, 4
    and 8, a study that leaves σ to calibration: each reads only its own rows through the
    study's schema, the run takes the largest σ the hospitals publish, and every ledger
    ends within its own budget, the tightest nearly spent."""
    table_study.write_text(TABLE_STUDY.replace("noise_multiplier = 1.0\n", ""), encoding="utf-8")
    nodes = table_hospitals(table_study, tmp_path / "hospitals")
    budgets = {"east": 2.0, "north": 4.0, "south": 8.0}
    for name, node in nodes.items():
        node["epsilon"] = budgets[name]
    output, out, _ = loopback.deploy(
        table_study, nodes, tmp_path, cli=True, deadline=DEADLINE, timeout=60
    )
    result = DeploymentResult.load(out)
    assert result.rounds_completed == 2 and not result.refused and not result.stopped, output
    spent = {}
    for name, node in nodes.items():
        with Ledger(Path(node["ledger"]), create=False) as book:
            spent[name] = book.spent(f"{name}/trial-0").epsilon
    assert all(0 < spent[name] <= budgets[name] for name in nodes), spent
    assert spent["east"] > 0.99 * budgets["east"], spent


@pytest.mark.slow
@pytest.mark.usefixtures("flower_installed")
def test_on_loopback_a_second_study_past_a_hospitals_dataset_cap_is_refused(
    study: Path, tmp_path: Path
) -> None:
    """`dpfl deploy hospital --dataset-budget 3.5` for each hospital, whose ledgers hold a
    first one-round study (run in process: it is not what is tested): the second study's
    hospitals refuse it before round 0, each in one line of its own log naming the
    first, and charge nothing; `dpfl deploy server` ends with one line and status 1."""
    nodes, second = capped_hospitals(study, tmp_path / "hospitals")
    assert serve(InProcessGrid(nodes.values()), deployment_of(study)).rounds_completed == 1
    first = deployment_of(study).key
    for node in nodes.values():
        node["study"] = str(second)
    output, out, logs = loopback.deploy(second, nodes, tmp_path, cli=True, timeout=60)
    assert "Traceback" not in output, output
    assert "the deployment stopped after 0 rounds: hospital-0 refused: " in output, output
    assert DeploymentResult.load(out).rounds_completed == 0
    for name in nodes:
        log = (logs / f"{name}.log").read_text()
        refused = [line for line in log.splitlines() if f"{name}: round 0: refused" in line]
        assert len(refused) == 1 and "by deployed (ε=" in refused[0], log[-3000:]  # by name
    second_study_refused(nodes, first, deployment_of(second).key)
