"""`dpfl audit DIR`: every finished run of a study, rebuilt from the store and audited at
the σ it ran with."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.engines.accounts import account
from dpfl.experiments.config import Study
from dpfl.experiments.runner import run_study
from dpfl.privacy import Ledger

STUDY = {
    "name": "audited",
    "rounds": 2,
    "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 2}},
    "algorithm": {"name": "fedavg", "expected_batch_size": 32.0},
    "privacy": {"noise_multiplier": 2.0, "delta": 1e-5},
}


def test_audits_each_finished_run(tmp_path: Path) -> None:
    (run,) = run_study(Study(STUDY), tmp_path)
    before = {f: f.read_bytes() for f in tmp_path.rglob("*.sqlite")}
    runner = CliRunner()
    result = runner.invoke(app, ["audit", str(tmp_path), "--trials", "40", "--json"])
    assert result.exit_code == 0, result.output
    (audit,) = json.loads(result.stdout)
    assert audit["run"] == run.id
    assert (audit["algorithm"], audit["silo"], audit["canary"]) == (
        "fedavg",
        "hospital-0",
        "GradientCanary",
    )
    assert (audit["observer"], audit["trials"], audit["positives"]) == ("server", 40, 20)
    assert run.ledger is not None
    with Ledger(tmp_path / run.ledger, create=False) as book:  # the study's own mechanism
        assert audit["epsilon_ledger"] == book.spent(account("hospital-0", 0)).epsilon
    assert audit["epsilon_lower"] <= audit["epsilon_ledger"]

    table = runner.invoke(app, ["audit", str(tmp_path), "--trials", "40", "--canaries", "input"])
    assert table.exit_code == 0, table.output
    assert "InputCanary" in table.stdout and "ledger ε" in table.stdout
    assert {f: f.read_bytes() for f in tmp_path.rglob("*.sqlite")} == before  # read only


def test_an_empty_study_directory_is_one_error_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["audit", str(tmp_path)])
    assert result.exit_code == 2
