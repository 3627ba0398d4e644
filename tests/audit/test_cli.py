"""`dpfl audit DIR`: every finished run of a study, rebuilt from the store and audited at
the noise it ran with; the figures kept in the store for the report."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.experiments.results.queries import bound_text
from dpfl.experiments.results.report import write_report
from dpfl.experiments.results.store import ResultsStore
from dpfl.experiments.study.config import Study
from dpfl.experiments.study.runner import run_study
from dpfl.privacy import Ledger
from dpfl.privacy.accounts import account

STUDY: dict[str, Any] = {
    "name": "audited",
    "rounds": 2,
    "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 2}},
    "algorithm": {"name": "fedavg", "expected_batch_size": 32.0},
    "privacy": {"noise_multiplier": 2.0, "delta": 1e-5},
}
runner = CliRunner()


def audit(directory: Path, *options: str) -> list[dict[str, Any]]:
    result = runner.invoke(app, ["audit", str(directory), *options, "--json"])
    assert result.exit_code == 0, result.output
    found: list[dict[str, Any]] = json.loads(result.stdout)
    return found


def test_audits_each_finished_run_and_keeps_the_figures(tmp_path: Path) -> None:
    (run,) = run_study(Study(STUDY), tmp_path)
    assert run.ledger is not None
    ledger = (tmp_path / run.ledger).read_bytes()
    with ResultsStore(tmp_path / "results.sqlite", create=False) as store:
        by_silo = store.epsilon_by_silo(run).by_silo
    # the partition gives hospital-1 the larger ε (its sampling rate): the headline ε
    assert by_silo["hospital-1"] == max(by_silo.values()) > by_silo["hospital-0"]
    (bound,) = audit(tmp_path, "--trials", "40")
    assert (bound["run"], bound["method"], bound["silo"], bound["canary"]) == (
        run.id,
        "two-world",
        "hospital-1",
        "GradientCanary",
    )
    assert (bound["observer"], bound["trials"], bound["positives"]) == ("server", 40, 20)
    with Ledger(tmp_path / run.ledger, create=False) as book:  # the study's own mechanism
        assert bound["epsilon_ledger"] == book.spent(account("hospital-1", 0)).epsilon
    assert bound["epsilon_lower"] <= bound["epsilon_ledger"]

    table = runner.invoke(app, ["audit", str(tmp_path), "--trials", "40", "--canaries", "input"])
    assert table.exit_code == 0, table.output
    assert "InputCanary" in table.stdout and "ledger ε =" in table.stdout
    assert "silo planted: each run's silo of the largest ε" in " ".join(table.stdout.split())
    with ResultsStore(tmp_path / "results.sqlite", create=False) as store:
        kept = store.rows("audit_bounds", run.id)
    assert [(r["canary"], r["trials"]) for r in kept] == [
        ("GradientCanary", 40),
        ("InputCanary", 40),
    ]
    assert kept[0]["epsilon_lower"] == bound["epsilon_lower"]
    assert json.loads(kept[0]["detail"])["statistic"] == bound["statistic"]

    audit(tmp_path, "--trials", "20", "--no-record")
    with ResultsStore(tmp_path / "results.sqlite", create=False) as store:
        assert len(store.rows("audit_bounds")) == 2
    assert (tmp_path / run.ledger).read_bytes() == ledger  # the audit charges its own ledgers

    page = write_report(tmp_path).read_text(encoding="utf-8")
    section = page[page.index("<h2 id='audit'>") : page.index("<h2 id='datasheets'>")]
    datasheet = page[page.index("<h2 id='datasheets'>") :]
    for row in kept:
        figure = bound_text(row["epsilon_ledger"], row["epsilon_lower"], 0.95)
        assert figure in section and figure in datasheet
    assert section.count("<tr>") == 1 + 2 and "EXCEEDS" not in section


def test_one_run_and_membership_audits_of_a_study_calibrated_per_silo(tmp_path: Path) -> None:
    study = STUDY | {
        "privacy": {
            "epsilon": 4.0,
            "delta": 1e-5,
            "calibration": "per-silo",
            "silos": {"hospital-1": {"epsilon": 1.0, "delta": 1e-5}},
        }
    }
    (run,) = run_study(Study(study), tmp_path)
    sigmas = {name: s["noise_multiplier"] for name, s in run.datasheet["silos"].items()}
    assert sigmas["hospital-1"] > sigmas["hospital-0"]  # each silo's own noise
    found = audit(
        tmp_path,
        *("--attack", "one-run", "--attack", "membership", "--silo", "hospital-1"),
        *("--shadows", "2", "--folds", "2"),
    )
    bounds = [f for f in found if "method" in f]
    attacks = [f for f in found if "attack" in f]
    (one_run,) = bounds
    assert (one_run["method"], one_run["silo"], one_run["trials"]) == ("one-run", "hospital-1", 30)
    assert one_run["guesses"] == 14 and one_run["epsilon_lower"] <= 1.0
    assert one_run["epsilon_ledger"] <= 1.0  # hospital-1's own budget, at its own σ
    assert {(a["silo"], a["model"], a["attack"]) for a in attacks} == {
        (silo, "shared", attack) for silo in sigmas for attack in ("loss", "lira")
    }
    with ResultsStore(tmp_path / "results.sqlite", create=False) as store:
        assert len(store.rows("audit_membership", run.id)) == 4


def test_an_empty_study_directory_is_one_error_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["audit", str(tmp_path)])
    assert result.exit_code == 2


def test_an_unknown_attack_is_refused(tmp_path: Path) -> None:
    run_study(Study(STUDY), tmp_path)
    result = runner.invoke(app, ["audit", str(tmp_path), "--attack", "gossip"])
    assert result.exit_code == 2 and "no attack 'gossip'" in result.output


def test_the_default_audit_says_its_plan_time_and_what_its_bound_can_mean(tmp_path: Path) -> None:
    """By default a two-world audit of 100 trials a world (a bound up to 2.57 at δ =
    1e-5, in minutes), its size and expected time said before the bulk of it, and the
    bound explained beside the most these trials could show."""
    from dpfl.audit.bounds import two_world_ceiling, two_world_epsilon

    run_study(Study(STUDY), tmp_path)
    result = runner.invoke(app, ["audit", str(tmp_path), "--no-record"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert "auditing 1 run (two-world): 200 trials, each a training run of the study" in said
    assert re.search(r"expected time: about \d+ (s|min) in all \(10 trials took \d+ s\)", said)
    shown = " ".join(result.stdout.replace("│", " ").split())
    assert " 100 ledger ε = " in shown and " 2.57 " in shown
    assert two_world_ceiling(100, 1e-5) == two_world_epsilon(50, 50, 0, 50, 1e-5)
    assert f"{two_world_ceiling(100, 1e-5):.2f}" == "2.57"
    assert "no mechanism that is (ε, δ)-DP with ε below L could have let the attack" in shown
    assert '"most it could show"' in shown and "raise --trials" in shown
