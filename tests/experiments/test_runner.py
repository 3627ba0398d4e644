"""dpfl.experiments.study.runner: sweeps end to end. Results land in SQLite, a killed sweep
resumes without loss or double charges, `best` honours both ε and δ, the commands print
JSON."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.experiments.results import best
from dpfl.experiments.results.report import write_report
from dpfl.experiments.results.store import ResultsStore
from dpfl.experiments.results.summary import run_summaries, silo_summaries
from dpfl.experiments.study.config import Study
from dpfl.experiments.study.point import STORE
from dpfl.experiments.study.runner import run_study
from dpfl.privacy import Ledger, epsilon, events
from dpfl.privacy.accounts import account
from studies import breast_cancer_study

STUDY = {
    "name": "tiny",
    "rounds": 3,
    "trials": 2,
    "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 3}},
    "algorithm": {"name": "fedavg", "learning_rate": 1.0},
    "privacy": {"noise_multiplier": 1.0, "delta": 1e-5},
}


def _study(**privacy: object) -> Study:
    return Study({**STUDY, "privacy": {**STUDY["privacy"], **privacy}})


def test_a_tiny_sweep_lands_in_sqlite_with_epsilon_from_each_ledger(tmp_path: Path) -> None:
    study = Study({**STUDY, "algorithm": {"name": ["fedavg", "cyclic"], "learning_rate": 1.0}})
    runs = run_study(study, tmp_path)
    assert [r.status for r in runs] == ["finished", "finished"]
    db = sqlite3.connect(tmp_path / STORE)  # plain SQLite: any reader will do
    assert db.execute("SELECT COUNT(*) FROM runs").fetchone() == (2,)
    (union_rows,) = db.execute(
        "SELECT COUNT(*) FROM metrics WHERE silo IS NULL AND metric = 'accuracy'"
    ).fetchone()
    assert union_rows == 2 * 2 * 3  # runs × trials × rounds
    with ResultsStore(tmp_path / STORE) as store:
        for run in runs:
            with Ledger(store.ledger_of(run), create=False) as book:
                for row in store.rows("privacy", run.id):
                    name = account(row["silo"], row["trial"])
                    spent = book.spent(
                        name, accountant=row["accountant"], through_round=row["round"]
                    )
                    assert row["epsilon"] == spent.epsilon
            fedavg_step = run.datasheet["silos"]["hospital-0"]
            assert fedavg_step["participations"] == [3, 3]  # per trial
            assert store.epsilon_by_silo(run).by_silo["hospital-0"] > 0
            bytes_up = sum(r["bytes_up"] for r in store.rows("communication", run.id))
            assert bytes_up > 0
    again = run_study(study, tmp_path)  # everything finished: nothing reruns
    assert [r.seconds for r in again] == [r.seconds for r in runs]


def test_the_ledger_epsilon_matches_an_independent_composition(tmp_path: Path) -> None:
    (run,) = run_study(_study(), tmp_path)
    (q,) = run.datasheet["silos"]["hospital-0"]["sample_rates"]
    steps = round(1 / q)
    independent = epsilon(events.repeat(events.poisson_gaussian(q, 1.0, steps=steps), 3), 1e-5)
    with ResultsStore(tmp_path / STORE) as store:
        shown = store.epsilon_by_silo(run).by_silo["hospital-0"]
    assert shown == pytest.approx(independent.epsilon, rel=1e-9)


CLIENT_SAMPLED = {
    **STUDY,
    "rounds": 4,
    "trials": 3,
    "algorithm": {"name": "fedavg", "learning_rate": 1.0, "client_rate": 0.5},
}


def test_every_epsilon_shown_is_the_worst_trial_under_client_sampling(tmp_path: Path) -> None:
    (run,) = run_study(Study(CLIENT_SAMPLED), tmp_path)
    silos = ["hospital-0", "hospital-1", "hospital-2"]
    with Ledger(tmp_path / "ledgers" / f"{run.id}.sqlite", create=False) as book:
        spent = {
            silo: [book.spent(account(silo, t), accountant="pld").epsilon for t in range(3)]
            for silo in silos
        }
    assert any(len(set(trials)) > 1 for trials in spent.values())  # the trials differ
    worst = {silo: max(trials) for silo, trials in spent.items()}
    overall = max(worst.values())
    assert overall > max(trials[0] for trials in spent.values())  # trial 0 is not the worst
    with ResultsStore(tmp_path / STORE) as store:
        shown = store.epsilon_by_silo(run)
        assert shown.accountant == "pld" and shown.by_silo == worst and shown.max == overall
        at_delta = store.epsilon_by_silo(run, delta=1e-5)
        assert at_delta.by_silo == pytest.approx(worst, rel=1e-9)
    participations = run.datasheet["silos"]["hospital-0"]["participations"]
    assert len(participations) == 3  # one count per trial, not trial 0's
    assert run.datasheet["research_noise"] is True
    assert "outside ε" in run.datasheet["evaluation"]

    (summary,) = run_summaries(tmp_path)
    assert summary["epsilon"]["pld"] == overall and summary["research_noise"]
    by_silo = {s["silo"]: s["epsilon"]["pld"] for s in silo_summaries(tmp_path, run.id)}
    assert by_silo == worst

    page = write_report(tmp_path).read_text(encoding="utf-8")
    assert f"<td>{overall:.3g} (PLD) †</td>" in page  # the results table
    for silo, spent_by_silo in worst.items():  # the datasheet
        assert f"<td>{silo}</td>" in page and f"<td>{spent_by_silo:.3g}</td>" in page

    just_above = best.candidates(tmp_path, epsilon=overall * 1.001, delta=1e-5)
    assert [c.qualifies for c in just_above] == [True]
    assert just_above[0].epsilon == pytest.approx(overall, rel=1e-9)
    below = best.candidates(tmp_path, epsilon=overall * 0.999, delta=1e-5)
    assert [c.qualifies for c in below] == [False]

    table = CliRunner().invoke(app, ["best", str(tmp_path), "-e", "100", "-d", "1e-5"])
    assert table.exit_code == 0, table.output
    assert f"{overall:.4g} (PLD) †" in table.output and "research noise" in table.output


# RDP: twice as fast as PLD, and the resume is not about ε
SWEEP = breast_cancer_study(
    "killable",
    rounds=8,
    trials=2,
    algorithm={"learning_rate": [0.5, 1.0, 2.0]},
    privacy={"noise_multiplier": 1.0, "epsilon": 50, "accountant": "rdp"},
)


def _finished(store: Path) -> int:
    if not store.exists():
        return 0
    with ResultsStore(store) as results:
        return len(results.runs(status="finished"))


def test_a_killed_sweep_resumes_and_loses_nothing(tmp_path: Path) -> None:
    config, out = tmp_path / "sweep.toml", tmp_path / "out"
    config.write_text(SWEEP, encoding="utf-8")
    command = [sys.executable, "-m", "dpfl.cli", "sweep", str(config), "--out", str(out), "-j", "1"]
    sweep = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while _finished(out / STORE) < 1 and time.monotonic() < deadline and sweep.poll() is None:
        time.sleep(0.05)
    time.sleep(0.3)  # into the second point's rounds
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.wait()
    with ResultsStore(out / STORE) as store:
        before = {r.id: r for r in store.runs()}
    assert 1 <= sum(r.status == "finished" for r in before.values()) < 3
    assert any(r.status == "running" for r in before.values())  # killed mid-run
    done = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert len(summary["runs"]) == 3 and summary["failed"] == 0
    with ResultsStore(out / STORE) as store:
        after = {r.id: r for r in store.runs()}
        for run_id, run in after.items():
            assert run.status == "finished" and run.rounds_completed == 8
            if run_id in before and before[run_id].status == "finished":  # skipped, not rerun
                assert run.seconds == before[run_id].seconds
            with Ledger(store.ledger_of(run), create=False) as book:
                for trial in range(2):
                    rounds = [e.round for e in book.entries(f"hospital-1/trial-{trial}")]
                    assert rounds == list(range(8))  # each round paid exactly once
            metric_rounds = {r["round"] for r in store.rows("metrics", run_id)}
            assert metric_rounds == set(range(8))
    assert not list((out / "checkpoints").glob("*.pt"))


def test_best_respects_both_epsilon_and_delta(tmp_path: Path) -> None:
    run_study(
        Study({**STUDY, "privacy": {"noise_multiplier": [0.8, 3.0], "delta": 1e-5}}), tmp_path
    )
    run_study(Study({**STUDY, "privacy": {"private": False}}), tmp_path, add=True)
    found = best.candidates(tmp_path, epsilon=100.0, delta=1e-5)
    by_sigma = {c.run.noise_multiplier: c for c in found}
    assert by_sigma[None].epsilon == math.inf and not by_sigma[None].qualifies  # non-private
    low, high = by_sigma[0.8], by_sigma[3.0]
    assert low.epsilon > high.epsilon
    target = (low.epsilon + high.epsilon) / 2
    within = best.candidates(tmp_path, epsilon=target, delta=1e-5)
    assert [c.run.noise_multiplier for c in within if c.qualifies] == [3.0]
    # the same ε at a smaller δ is a stronger claim: the σ = 3 run no longer meets it
    strict = best.candidates(tmp_path, epsilon=high.epsilon * 1.0001, delta=1e-9)
    assert not any(c.qualifies for c in strict)
    looser = best.candidates(tmp_path, epsilon=high.epsilon * 1.0001, delta=1e-5)
    assert [c.run.noise_multiplier for c in looser if c.qualifies] == [3.0]
    result = CliRunner().invoke(
        app, ["best", str(tmp_path), "-e", f"{target}", "-d", "1e-5", "--json"]
    )
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["best"]["config"]["privacy"]["noise_multiplier"] == 3.0
    assert answer["qualifying"] == 1 and "privacy cost" in answer["caveat"]
    assert answer["best"]["selection_in_epsilon"] is False
    shown = CliRunner().invoke(app, ["best", str(tmp_path), "-e", f"{target}", "-d", "1e-5"])
    assert "choosing it among 3 finished configurations is not in it" in shown.output
    nothing = CliRunner().invoke(app, ["best", str(tmp_path), "-e", "0.01", "-d", "1e-5"])
    assert nothing.exit_code == 1 and "no finished run is within" in nothing.output


def test_run_refuses_a_grid_and_reports_a_bad_config_cleanly(tmp_path: Path) -> None:
    config = tmp_path / "grid.toml"
    config.write_text(SWEEP, encoding="utf-8")
    grid = CliRunner().invoke(app, ["run", str(config), "--out", str(tmp_path / "o")])
    assert grid.exit_code == 2 and "use `dpfl sweep`" in grid.output
    config.write_text(SWEEP.replace("rounds = 8", "rounds = 'eight'"), encoding="utf-8")
    bad = CliRunner().invoke(app, ["run", str(config), "--out", str(tmp_path / "o")])
    assert bad.exit_code == 2 and "rounds: Input should be a valid integer" in bad.output


def test_evaluating_only_at_the_end_releases_one_round_of_metrics(tmp_path: Path) -> None:
    (run,) = run_study(Study({**STUDY, "trials": 1, "eval_every": "end"}), tmp_path)
    with ResultsStore(tmp_path / STORE) as store:
        assert {row["round"] for row in store.rows("metrics", run.id)} == {2}
    assert "released after 1 of the 3 rounds" in run.datasheet["evaluation"]
    every = run_study(Study({**STUDY, "trials": 1}), tmp_path / "every")[0]
    assert "released after 3 of the 3 rounds" in every.datasheet["evaluation"]


def test_a_study_can_release_dp_counts_instead_of_declaring_sizes(tmp_path: Path) -> None:
    data = {**STUDY["data"], "public_sizes": "dp-count", "size_noise": 5.0}  # type: ignore[dict-item]
    (run,) = run_study(Study({**STUDY, "data": data}), tmp_path)
    assert run.status == "finished", run.error
    with ResultsStore(tmp_path / STORE) as store:
        sheet = store.run(run.id).datasheet
        with Ledger(store.ledger_of(run), create=False) as book:
            for silo, facts in sheet["silos"].items():
                assert facts["public_size_source"].startswith("DP count")
                released = book.released(f"record count of {silo}")
                assert released is not None and facts["public_size"] == max(1, round(released))
                for trial in range(2):
                    first = book.entries(account(silo, trial))[0]
                    assert first.event == events.gaussian(5.0) and first.round is None
                assert facts["participations"] == [3, 3]  # the release is not a round


def test_a_study_chooses_its_secure_aggregation_and_the_datasheet_says_which(
    tmp_path: Path,
) -> None:
    """FedAvg's models summed by masking or HE equal the sum in the clear within the
    fixed point; the datasheet names the protocol (and the ideal one for Dopamine)."""
    runs = {}
    for summing in ("none", "masking", "he"):
        (runs[summing],) = run_study(
            Study({**STUDY, "secure_aggregation": summing}), tmp_path / summing
        )
        assert runs[summing].status == "finished", runs[summing].error
    assert runs["none"].datasheet["secure_aggregation"].startswith("none")
    assert runs["masking"].datasheet["secure_aggregation"].startswith("pairwise masking")
    assert runs["he"].datasheet["secure_aggregation"].startswith("BFV")

    def accuracies(summing: str) -> list[float]:
        with ResultsStore(tmp_path / summing / STORE) as store:
            return [
                row["value"]
                for row in store.rows("metrics", runs[summing].id)
                if row["silo"] is None and row["metric"] == "accuracy"
            ]

    assert accuracies("masking") == accuracies("none") == accuracies("he")
    dopamine = {
        **STUDY,
        "algorithm": {"name": "fedsgd_secure"},
        "privacy": {"epsilon": 8.0, "noise_multiplier": 1.0},
    }
    (secure,) = run_study(Study(dopamine), tmp_path / "dopamine")
    assert secure.datasheet["secure_aggregation"].startswith("simulated by its ideal")
