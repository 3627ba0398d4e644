"""A hospital's cap on its records across studies in a deployment (`dpfl deploy hospital
--dataset-budget`): a second study that would take the composition over both past the
cap is refused by the hospital, in one line of its own log naming the study that spent
it, before anything is charged; the server ends with one line. In process here, between
processes (a real SuperNode) in tests/engines/test_flower_loopback.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, RecordDict

from dpfl.engines.flower import loopback, serve
from dpfl.experiments.study.deployment import deployment_of, server_app
from dpfl.privacy import Ledger, Neighbouring

from .test_flower import STUDY, InProcessGrid, hospitals, study
from .test_flower_table import STUDY as TABLE
from .test_flower_table import flower_study, table_hospitals, table_study

__all__ = ["flower_study", "study", "table_study"]  # the fixtures, imported for pytest

FIRST = STUDY.replace("rounds = 3", "rounds = 1")
"""One round of the breast-cancer study: ε ≈ 2.97 at each hospital."""
CAP = 3.5
"""Each hospital's dataset budget: room for one such study, not two."""
PATIENTS = (
    TABLE.replace('site = "hospital"\n', 'site = "hospital"\nunit = "patient"\n')
    + "\n[evaluation]\nqueries = 0\n"
)
"""The table study with the patient as its unit of privacy (and no deployed evaluation:
a DP one bounds no patient's test records, so a patient-level study declares none)."""


def capped_hospitals(study: Path, root: Path) -> tuple[dict[str, dict[str, Any]], Path]:
    """The hospitals of the one-round study, each capping its records at CAP, and a
    second study file (another name: another key) over the same hospitals."""
    study.write_text(FIRST, encoding="utf-8")
    nodes = hospitals(study, root)
    for node in nodes.values():
        node["dataset-budget"] = CAP
    second = study.with_name("second.toml")
    second.write_text(FIRST.replace('name = "deployed"', 'name = "second"'), encoding="utf-8")
    loopback.pin_roster(second, nodes)
    return nodes, second


def second_study_refused(nodes: dict[str, dict[str, Any]], first: str, second: str) -> None:
    """Every ledger holds the first study's round and nothing of the second's."""
    for name, node in nodes.items():
        with Ledger(Path(node["ledger"]), create=False) as book:
            (capped,) = book.datasets()
            assert list(capped.studies) == [first], name
            assert 0 < capped.spent.epsilon <= CAP
        with Ledger(Path(node["ledger"]), create=False, study=second) as book:
            assert book.entries(f"{name}/trial-0") == [], name


def test_in_process_a_second_study_past_a_hospitals_dataset_cap_is_refused(
    study: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nodes, second = capped_hospitals(study, tmp_path / "hospitals")
    assert serve(InProcessGrid(nodes.values()), deployment_of(study)).rounds_completed == 1
    for node in nodes.values():
        node["study"] = str(second)
    run = {"study": str(second), "out": str(tmp_path / "out"), "wait": 5.0, "timeout": 5.0}
    context = Context(run_id=7, node_id=1, node_config={}, state=RecordDict(), run_config=run)
    with caplog.at_level(logging.INFO, logger="flwr"):
        server_app()(InProcessGrid(nodes.values()), context)  # returns: nothing raised
    lines = [r.getMessage() for r in caplog.records]
    mine = [line for line in lines if line.startswith("hospital-0: round 0: refused")]
    assert len(mine) == 1 and "\n" not in mine[0]
    assert "dataset 'hospital-0'" in mine[0] and "by deployed (ε=" in mine[0]  # its name
    (error,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert error.exc_info is None and "\n" not in error.getMessage()
    assert error.getMessage().startswith("the deployment stopped after 0 rounds: hospital-0 ")
    second_study_refused(nodes, deployment_of(study).key, deployment_of(second).key)


def test_a_patient_level_study_is_capped_under_its_own_relation(
    table_study: Path, tmp_path: Path
) -> None:
    """A study whose unit is the patient spends from a cap under add/remove one patient
    (a cap under add/remove one record could not hold its events, and refused it)."""
    table_study.write_text(PATIENTS, encoding="utf-8")
    nodes = table_hospitals(table_study, tmp_path / "hospitals")
    for node in nodes.values():
        node["dataset-budget"] = 20.0
    result = serve(InProcessGrid(nodes.values()), deployment_of(table_study))
    assert result.rounds_completed == 2 and not result.refused and not result.stopped
    for name, node in nodes.items():
        with Ledger(Path(node["ledger"]), create=False) as book:
            (capped,) = book.datasets()
            assert capped.cap.neighbouring is Neighbouring.ADD_REMOVE_PATIENT
            assert 0 < capped.spent.epsilon <= 20.0, name
