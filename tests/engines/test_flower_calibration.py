"""A deployment that calibrates σ to the hospitals' budgets, releases DP counts as public
sizes, scores the union of the hospitals' test sets, and says what it does: the server a
line a round, each hospital what it was charged or why it refused (in process, as in
tests/engines/test_flower.py), each against the simulator on the same data."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Context, RecordDict
from typer.testing import CliRunner

from dpfl import secure
from dpfl.cli import app
from dpfl.engines.flower import HospitalConfig, loopback, serve
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import SimulationResult, simulate
from dpfl.experiments.study.build import build_algorithm
from dpfl.experiments.study.datasets import build_silos
from dpfl.experiments.study.deployment import deployment_of, server_app, study_point
from dpfl.privacy import Ledger

from .test_flower import (
    CLEAR,
    DELTA,
    EPSILON,
    STUDY,
    InProcessGrid,
    entries,
    evaluations,
    hospitals,
    study,
)

__all__ = ["study"]  # the fixture, imported so that pytest finds it

CALIBRATED = STUDY.replace("noise_multiplier = 1.0\n", "") + CLEAR
"""σ calibrated to the budgets, the evaluation in the clear (outside ε): the simulator's
plan, which charges no evaluation."""
BUDGETS = {"hospital-0": 2.0, "hospital-1": 4.0, "hospital-2": 8.0}


def simulated(
    study: Path, tmp_path: Path, budgets: dict[str, float], calibrate: Any = None
) -> tuple[SimulationResult, Ledger]:
    """The study in the simulator with each hospital's budget, research noise."""
    config = study_point(study)
    silos = build_silos(config.data, config.seed)
    book = Ledger(tmp_path / "simulated.sqlite", accountant="pld")
    result = simulate(
        build_algorithm(config, silos),
        silos,
        RunPlan(
            rounds=config.rounds,
            seed=config.seed,
            budgets={name: (eps, DELTA) for name, eps in budgets.items()},
            calibrate=calibrate,
            progress=False,
            size_noise=config.data.size_noise,
            secure_sum=secure.by_name(config.summing),
        ),
        ledger=book,
    )
    return result, book


def spent(node: dict[str, Any]) -> float:
    with Ledger(Path(node["ledger"]), create=False) as book:
        return book.spent(f"{node['name']}/trial-0").epsilon


def test_in_process_hospitals_calibrate_and_the_run_uses_the_largest_sigma(
    study: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    study.write_text(CALIBRATED, encoding="utf-8")
    nodes = hospitals(study, tmp_path / "hospitals", BUDGETS)
    with caplog.at_level(logging.INFO, logger="flwr"):
        result = serve(InProcessGrid(nodes.values()), deployment_of(study))
    simulation, book = simulated(study, tmp_path, BUDGETS, calibrate="common")
    assert result.rounds_completed == 3 and not result.refused
    sigma = simulation.noise_multiplier
    assert result.noise == dict.fromkeys(BUDGETS, sigma)  # the simulator's σ: the largest
    for name, value in simulation.params.items():
        assert torch.equal(result.params[name], value[0])
    published = [
        r.getMessage() for r in caplog.records if "publishes the least σ" in r.getMessage()
    ]
    assert len(published) == 3
    assert f"hospital-0 {sigma:.6g}" in caplog.text  # the most constrained one's
    for name, node in nodes.items():
        assert spent(node) <= BUDGETS[name]  # each ledger within its own budget
        mine = entries(Path(node["ledger"]), f"{name}/trial-0")
        assert mine == [e.event.to_json() for e in book.entries(f"{name}/trial-0")]
    assert spent(nodes["hospital-0"]) > 0.99 * BUDGETS["hospital-0"]  # it binds
    book.close()


def test_in_process_per_silo_calibration_gives_each_hospital_its_own_sigma(
    study: Path, tmp_path: Path
) -> None:
    """Each hospital's plan holds its DP evaluation (the study's default): σ is
    calibrated to leave room for it, so each spends nearly its own budget with it, never
    more; the simulator, whose research figures charge nothing, needs less noise."""
    study.write_text(
        STUDY.replace("noise_multiplier = 1.0\n", "").replace(
            "epsilon = 10.0", 'epsilon = 10.0\ncalibration = "per-silo"'
        ),
        encoding="utf-8",
    )
    nodes = hospitals(study, tmp_path / "hospitals", BUDGETS)
    result = serve(InProcessGrid(nodes.values()), deployment_of(study))
    simulation, book = simulated(study, tmp_path, BUDGETS, calibrate="per-silo")
    book.close()
    assert result.rounds_completed == 3
    simulated_noise = simulation.metadata["noise_multipliers"]
    assert all(result.noise[n] > simulated_noise[n] for n in nodes)
    assert result.noise["hospital-0"] > result.noise["hospital-1"] > result.noise["hospital-2"]
    for name, node in nodes.items():  # each spends nearly its own budget, never more
        assert len(evaluations(Path(node["ledger"]), f"{name}/trial-0")) == 1
        assert 0.99 * BUDGETS[name] < spent(node) <= BUDGETS[name]


def dp_count_hospitals(study: Path, root: Path) -> dict[str, dict[str, Any]]:
    """The hospitals of a study that releases DP counts: no public size of their own."""
    config = study_point(study)
    nodes = {}
    for silo in build_silos(config.data, config.seed):
        node = loopback.hospital_node(
            silo.with_public_size(1), study, root / silo.name, epsilon=EPSILON, delta=DELTA
        )
        del node["public-size"]
        nodes[silo.name] = node
    loopback.pin_roster(study, nodes)
    return nodes


def test_in_process_hospitals_release_dp_counts_once_as_the_simulator(
    study: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    study.write_text(
        STUDY.replace(
            'partition = { kind = "iid", silos = 3 }',
            'partition = { kind = "iid", silos = 3 }\npublic_sizes = "dp-count"\nsize_noise = 5.0',
        ),
        encoding="utf-8",
    )
    nodes = dp_count_hospitals(study, tmp_path / "hospitals")
    receipts = tmp_path / "receipts"
    with caplog.at_level(logging.INFO, logger="flwr"):
        result = serve(InProcessGrid(nodes.values()), deployment_of(study), receipts=receipts)
    simulation, book = simulated(study, tmp_path, dict.fromkeys(nodes, EPSILON))
    assert result.rounds_completed == 3
    declared = {s.name: s.size for s in build_silos(study_point(study).data, 3)}
    assert {s.name: s.public_size for s in result.silos} != declared  # counts, with noise
    for name, value in simulation.params.items():
        assert torch.equal(result.params[name], value[0])
    for name, node in nodes.items():
        mine = entries(Path(node["ledger"]), f"{name}/trial-0")
        assert mine == [e.event.to_json() for e in book.entries(f"{name}/trial-0")]
        assert len(mine) == 4 and "Gaussian" in mine[0]  # the count first, then 3 rounds
        assert len(list((receipts / name).glob("*.json"))) == 5  # the count, rounds, evaluation
        verify = ["privacy", "verify", node["ledger"], "--receipts", str(receipts)]
        assert CliRunner().invoke(app, verify).exit_code == 0
    assert caplog.text.count("released its record count") == 3  # once each
    again = serve(InProcessGrid(nodes.values()), deployment_of(study))  # a second run
    assert again.silos == result.silos  # the kept counts, not new ones
    for name, node in nodes.items():
        assert len(entries(Path(node["ledger"]), f"{name}/trial-0")) == 7  # no count again
    book.close()


def test_in_process_the_union_of_the_test_sets_is_the_simulators(
    study: Path, tmp_path: Path
) -> None:
    """In the clear (declared): the simulator's research figures."""
    study.write_text(STUDY + CLEAR, encoding="utf-8")
    nodes = hospitals(study, tmp_path / "hospitals")
    result = serve(InProcessGrid(nodes.values()), deployment_of(study))
    simulation, book = simulated(study, tmp_path, dict.fromkeys(nodes, EPSILON))
    book.close()
    union = simulation.final_metrics()
    assert result.union.keys() == union.keys()
    for metric in ("accuracy", "balanced_accuracy", "precision", "recall"):
        assert result.union[metric] == union[metric]  # counts: exact
    assert result.union["loss"] == pytest.approx(union["loss"], rel=1e-12)
    for metric in ("auroc", "auprc"):  # on scores binned to 1e-4
        assert result.union[metric] == pytest.approx(union[metric], abs=1e-3)


def test_in_process_the_server_and_each_hospital_say_what_they_did(
    study: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    with caplog.at_level(logging.INFO, logger="flwr"):
        result = serve(InProcessGrid(nodes.values()), deployment_of(study))
    lines = [r.getMessage() for r in caplog.records]
    rounds = [line for line in lines if line.startswith("round ")]
    assert len(rounds) == 3
    assert rounds[2].startswith(
        "round 2 of 3: 3 of 3 hospitals replied (hospital-0, hospital-1, hospital-2) in "
    )
    (trained,) = [line for line in lines if line.startswith("hospital-0: round 2 exchange 0")]
    so_far = trained.split("; ε ")[1].split(" of ")[0]  # before its evaluation
    assert rounds[2].endswith(f"largest ε so far {so_far} (hospital-0, reported)")
    largest = max(result.epsilon.values())  # with its DP evaluation's charge
    (summary,) = [line for line in lines if line.startswith("finished after 3 of 3 rounds in ")]
    assert f"largest ε {largest:.4g} (hospital-0, reported)" in summary
    assert float(so_far) < largest
    assert "union of the test sets: accuracy " in summary
    assert any(line.startswith("time: hellos ") for line in lines)  # where the time went
    charged = [line for line in lines if line.startswith("hospital-1: round 1 exchange 0")]
    assert len(charged) == 1 and "charged 10 × Poisson(q=0.105263) Gaussian(σ=1)" in charged[0]
    assert "ε" in charged[0] and "of 10 at δ=1e-05 (PLD)" in charged[0]


def test_a_refusing_hospital_says_why_and_the_server_says_it_in_one_line(
    study: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The ServerApp logs the refusal as one line, no traceback: `dpfl deploy server`
    then reads why from the results store and exits with 1."""
    nodes = hospitals(study, tmp_path / "hospitals", {"hospital-1": 0.5})
    run = {"study": str(study), "out": str(tmp_path / "out"), "wait": 5.0, "timeout": 5.0}
    context = Context(run_id=7, node_id=1, node_config={}, state=RecordDict(), run_config=run)
    with caplog.at_level(logging.INFO, logger="flwr"):
        server_app()(InProcessGrid(nodes.values()), context)  # returns: nothing raised
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    at_hospital = [r.getMessage() for r in refusals if r.getMessage().startswith("hospital-1:")]
    assert len(at_hospital) == 1 and "would exceed ε=0.5" in at_hospital[0]
    (error,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert error.exc_info is None and "\n" not in error.getMessage()
    assert error.getMessage().startswith(
        "the deployment stopped after 0 rounds: hospital-1 refused: hospital-1/trial-0: 3 "
        "more rounds of"
    )


def test_a_hospital_gives_a_public_size_exactly_where_the_study_declares_them(
    study: Path, tmp_path: Path
) -> None:
    node = hospitals(study, tmp_path / "hospitals")["hospital-0"]
    without = {k: v for k, v in node.items() if k != "public-size"}
    with pytest.raises(ValueError, match=r"has declared public sizes .* give this hospital"):
        HospitalConfig.from_node_config(without).deployment(deployment_of)
    text = study.read_text(encoding="utf-8")
    study.write_text(text.replace("[data]\n", '[data]\npublic_sizes = "dp-count"\n'), "utf-8")
    with pytest.raises(ValueError, match=r"releases a DP count .* give no public-size"):
        HospitalConfig.from_node_config(node).deployment(deployment_of)
    assert HospitalConfig.from_node_config(without).deployment(deployment_of).size_noise == 20.0
