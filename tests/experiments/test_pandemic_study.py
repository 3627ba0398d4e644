"""The pandemic dataset as a study: regions become silos, each charged node-level steps
under replace-one person, read by RDP; a setting that cannot be accounted is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpfl.experiments.results.store import ResultsStore
from dpfl.experiments.study.config import Study
from dpfl.experiments.study.point import STORE
from dpfl.experiments.study.runner import run_study
from dpfl.privacy import Ledger, Neighbouring
from dpfl.privacy.accounts import account

STUDY: dict[str, Any] = {
    "name": "pandemic",
    "rounds": 2,
    "eval_every": "end",
    "metrics": ["auprc"],
    "data": {
        "dataset": "pandemic",
        "split": "official",
        "partition": {"kind": "natural"},
        "options": {"people": 4000, "regions": 3, "max_appearances": 4, "contacts": "summary"},
    },
    "algorithm": {"name": "mrmtl", "expected_batch_size": 64, "strength": 0.1},
    "privacy": {"epsilon": 8.0, "delta": 1e-5, "accountant": "rdp"},
}


def test_regions_are_silos_charged_node_level_steps(tmp_path: Path) -> None:
    (run,) = run_study(Study(STUDY), tmp_path)
    assert run.status == "finished", run.error
    sheet = run.datasheet
    assert sheet["unit"].startswith("one person with all their contacts (node-level)")
    assert set(sheet["silos"]) == {"region0", "region1", "region2"}
    assert all(
        "node-level(≤4 rows a person, 7 per replacement)" in e
        for e in sheet["silos"]["region2"]["events"]
    )
    with ResultsStore(tmp_path / STORE) as store:
        with Ledger(store.ledger_of(run), create=False) as book:
            budget = book.budget(account("region0", 0))
            assert budget.neighbouring is Neighbouring.REPLACE_ONE
            assert budget.size == sheet["silos"]["region0"]["public_size"]
        spent = store.epsilon_by_silo(run).by_silo
    assert set(spent) == {"region0", "region1", "region2"}
    assert all(0 < eps <= 8.0 for eps in spent.values())


def test_pld_is_refused_for_node_level_silos_with_the_fix_named(tmp_path: Path) -> None:
    study = {**STUDY, "privacy": {**STUDY["privacy"], "accountant": "pld"}}
    (run,) = run_study(Study(study), tmp_path)
    assert run.status == "failed"
    assert "privacy.accountant = 'rdp'" in (run.error or "")


def test_a_random_split_is_refused(tmp_path: Path) -> None:
    study = {**STUDY, "data": {**STUDY["data"], "split": "stratified"}}
    (run,) = run_study(Study(study), tmp_path)
    assert run.status == "failed"
    assert "official" in (run.error or "")
