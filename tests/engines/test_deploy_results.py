"""A deployed study's results store: the server records its run where `dpfl run` would,
with ε per hospital as each reported it from its own ledger (the server has none), so
that `dpfl report` reads a deployment as it reads a simulation."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.engines.flower import DeploymentError, DeploymentResult
from dpfl.engines.flower.protocol import PROTOCOL
from dpfl.experiments.results.queries import open_results, read_metrics, summarise
from dpfl.experiments.results.report import write_report
from dpfl.experiments.results.store import ResultsStore, RunResults, StoreError
from dpfl.experiments.study.deployment import serve_study, stop_reason, unfinished
from dpfl.experiments.study.point import STORE
from dpfl.experiments.study.runner import owning
from dpfl.privacy import Ledger

from .test_flower import InProcessGrid, hospitals, study
from .test_flower_resilience import ServerKilled

__all__ = ["study"]  # the fixture, imported so that pytest finds it


def run_config(study: Path, out: Path) -> dict[str, Any]:
    """The server's run config, as `dpfl deploy server` gives it."""
    return {"study": str(study), "out": str(out), "wait": 5.0, "timeout": 5.0}


def spent(node: dict[str, Any], **options: Any) -> float:
    """What the hospital's own ledger says it spent (its server-view account, trial 0)."""
    with Ledger(Path(node["ledger"]), create=False) as book:
        return book.spent(f"{node['name']}/trial-0", **options).epsilon


def test_a_deployed_run_is_stored_with_each_hospitals_reported_epsilon_and_metrics(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    out = tmp_path / "results"
    result = serve_study(InProcessGrid(nodes.values()), run_config(study, out))
    assert result.rounds_completed == 3 and stop_reason(result) is None
    ledgers = {name: spent(node) for name, node in nodes.items()}
    assert min(ledgers.values()) < max(ledgers.values())  # the max is not every figure
    with open_results(out) as store:
        (run,) = store.runs()
        assert (run.status, run.rounds_completed, run.reported, run.ledger) == (
            "finished",
            3,
            True,
            None,
        )
        epsilon = store.epsilon_by_silo(run)
        assert epsilon.reported and epsilon.accountant == "pld" and epsilon.delta == {}
        assert epsilon.by_silo == ledgers  # exactly: the figures each ledger gave
        assert epsilon.max == max(ledgers.values())
        assert summarise(store, run).own_epsilon == max(ledgers.values())
        assert store.epsilon_by_silo(run, accountant="rdp").by_silo == {}  # not reported
        assert store.epsilon_by_silo(run, "hospitals").by_silo == {}  # nor other views
        with pytest.raises(StoreError, match="reported ε at their own δ"):
            store.epsilon_by_silo(run, delta=1e-6)
        with pytest.raises(StoreError, match="the server has none"):
            store.ledger_of(run)
        metrics = read_metrics(store, run)
        union = {m: (v,) for m, v in result.union.items()}  # of the hospitals' test sets
        assert {m: s.values for m, s in metrics.final[None].items()} == union
        assert {silo: {m: s.values for m, s in metrics.final[silo].items()} for silo in nodes} == {
            silo: {m: (v,) for m, v in scores.items()} for silo, scores in result.metrics.items()
        }
    assert DeploymentResult.load(out).epsilon == result.epsilon  # result.pt as before


def test_dpfl_report_renders_a_deployed_study_labelling_the_reported_epsilon(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    out = tmp_path / "results"
    serve_study(InProcessGrid(nodes.values()), run_config(study, out))
    worst = max(spent(node) for node in nodes.values())
    listed = CliRunner().invoke(app, ["report", str(out), "--json"])
    assert listed.exit_code == 0, listed.output
    assert '"runs": 1' in listed.output
    page = (out / "report" / "index.html").read_text(encoding="utf-8")
    assert f"{worst:.3g} (PLD, reported)" in page  # the results table's max ε
    assert "ε (PLD, reported by the hospital)" in page  # the per-hospital table
    assert "none reported" not in page  # every hospital trained
    assert not (out / "ledgers").exists()  # nothing looked for a ledger there
    best = CliRunner().invoke(app, ["best", str(out), "--epsilon", "10", "--delta", "1e-5"])
    assert best.exit_code == 2  # ε at the hospitals' own δ is never re-read as another δ's
    assert "reported ε at their own δ" in best.output


def test_a_refused_deployment_is_stored_failed_with_its_reason_and_no_epsilon(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals", {"hospital-1": 0.5})
    out = tmp_path / "results"
    result = serve_study(InProcessGrid(nodes.values()), run_config(study, out))
    assert result.rounds_completed == 0 and list(result.refused) == ["hospital-1"]
    with open_results(out) as store:
        (run,) = store.runs()
        assert run.status == "failed" and run.error == stop_reason(result)
        assert "hospital-1 refused" in (run.error or "")
        assert "would exceed ε=0.5" in (run.error or "")
        assert store.epsilon_by_silo(run).by_silo == {}  # nobody trained: nothing charged
    assert unfinished(study, out) == f"the deployment failed: {stop_reason(result)}"
    page = write_report(out).read_text(encoding="utf-8")
    assert "hospital-1 refused" in page and "none reported" in page


def test_the_server_says_whether_its_run_finished(study: Path, tmp_path: Path) -> None:
    """`flwr run` ends with status 0 whether the ServerApp succeeded or not: `dpfl deploy
    server` reads the run's end from the results store (`unfinished`)."""
    out = tmp_path / "results"
    assert "the server recorded nothing" in (unfinished(study, out) or "")
    nodes = hospitals(study, tmp_path / "hospitals")
    with pytest.raises(KeyboardInterrupt):  # the server's process dies in round 1
        serve_study(ServerKilled(nodes.values(), 1), run_config(study, out))
    assert "did not end (running)" in (unfinished(study, out) or "")
    serve_study(InProcessGrid(nodes.values()), run_config(study, out))  # resumed
    assert unfinished(study, out) is None


def test_a_second_server_on_a_held_out_folder_is_refused_naming_the_first(
    study: Path, tmp_path: Path
) -> None:
    hospitals(study, tmp_path / "hospitals")  # the study's roster
    out = tmp_path / "results"
    with owning(out):  # the first server's ServerApp holds OUT
        command = ["deploy", "server", str(study), "--out", str(out)]
        result = CliRunner().invoke(app, [*command, "--superlink", "127.0.0.1:1", "--insecure"])
    assert result.exit_code == 2 and "is in use by" in result.output, result.output
    assert not (out / STORE).exists()  # Flower was never asked to run anything


def test_a_deployment_stopped_mid_run_keeps_the_epsilon_reported_until_then(
    study: Path, tmp_path: Path
) -> None:
    """The others paid for round 1 after their last report (its sum never came): what
    is stored is what they reported, their ε after round 0, and says so."""
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    answered, gone = grid.app, ClientApp()
    gone.query("hello")(answered)
    gone.query("plan")(answered)

    def crash_in_round_1(message: Message, context: Context) -> Message:
        if message.content["dpfl"]["round"] == 1:
            raise ConnectionError("the machine went away")
        return answered(message, context)

    gone.train()(crash_in_round_1)
    grid.apps = {3: gone}  # hospital-1
    out = tmp_path / "results"
    result = serve_study(grid, run_config(study, out))
    assert result.rounds_completed == 1 and "ConnectionError" in result.stopped
    after_round_0 = {name: spent(node, through_round=0) for name, node in nodes.items()}
    assert spent(nodes["hospital-0"]) > after_round_0["hospital-0"]
    with open_results(out) as store:
        (run,) = store.runs()
        assert run.status == "failed" and "the machine went away" in (run.error or "")
        assert store.epsilon_by_silo(run).by_silo == after_round_0
    page = write_report(out).read_text(encoding="utf-8")
    assert f"{max(after_round_0.values()):.3g} (PLD, reported)" in page
    assert "may have been charged for the round it stopped in" in page


def test_a_study_finished_in_the_folder_is_refused_before_any_hospital_is_asked(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    out = tmp_path / "results"
    serve_study(InProcessGrid(nodes.values()), run_config(study, out))
    before = {name: spent(node) for name, node in nodes.items()}
    with pytest.raises(DeploymentError, match="already holds the finished run"):
        serve_study(InProcessGrid(nodes.values()), run_config(study, out))
    assert {name: spent(node) for name, node in nodes.items()} == before


def test_a_failure_before_the_rounds_is_stored_failed(study: Path, tmp_path: Path) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    other = tmp_path / "other.toml"  # the server's study is not the hospitals'
    other.write_text(study.read_text(encoding="utf-8").replace("seed = 3", "seed = 4"))
    out = tmp_path / "results"
    with pytest.raises(DeploymentError, match=f"runs protocol {PROTOCOL} of study"):
        serve_study(InProcessGrid(nodes.values()), run_config(other, out))
    with open_results(out) as store:
        (run,) = store.runs()
        assert run.status == "failed" and "DeploymentError" in (run.error or "")


# -- an older store ---------------------------------------------------------------------

SCHEMA_2_TABLES = """
CREATE TABLE runs (
    id TEXT PRIMARY KEY, study TEXT NOT NULL, algorithm TEXT NOT NULL, config TEXT NOT NULL,
    grid TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('running', 'finished', 'failed')),
    error TEXT, trials INTEGER NOT NULL, rounds INTEGER NOT NULL, rounds_completed INTEGER,
    noise_multiplier REAL, stopped_by_budget INTEGER, seconds REAL, started_at REAL NOT NULL,
    finished_at REAL, ledger TEXT, datasheet TEXT
);
CREATE TABLE metrics (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, trial INTEGER NOT NULL,
    round INTEGER NOT NULL, silo TEXT, metric TEXT NOT NULL, value REAL
);
CREATE TABLE privacy (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, trial INTEGER NOT NULL,
    round INTEGER NOT NULL, silo TEXT NOT NULL, view TEXT, accountant TEXT NOT NULL,
    delta REAL NOT NULL, epsilon REAL NOT NULL
);
CREATE TABLE communication (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, trial INTEGER NOT NULL,
    round INTEGER NOT NULL, silo TEXT NOT NULL, bytes_down INTEGER NOT NULL,
    bytes_up INTEGER NOT NULL, messages INTEGER NOT NULL
);
CREATE TABLE cross_silo (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, trial INTEGER NOT NULL,
    round INTEGER NOT NULL, model_silo TEXT, test_silo TEXT NOT NULL, metric TEXT NOT NULL,
    value REAL
);
"""
"""The results store's tables at schema 2 (before deployments; indexes left out)."""


def _version_2(path: Path) -> None:
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_2_TABLES)
    db.execute("PRAGMA application_id = 1685087858")  # 0x64706672, "dpfr"
    db.execute("PRAGMA user_version = 2")
    db.execute(
        "INSERT INTO runs (id, study, algorithm, config, grid, status, trials, rounds,"
        " rounds_completed, noise_multiplier, stopped_by_budget, seconds, started_at,"
        " finished_at, datasheet) VALUES ('old', 's', 'fedavg', '{\"seed\": 0}', '{}',"
        " 'finished', 1, 1, 1, 1.0, 0, 3.0, 1.0, 2.0, '{}')"
    )
    db.execute("INSERT INTO metrics VALUES ('old', 0, 0, NULL, 'accuracy', 0.5)")
    db.execute("INSERT INTO privacy VALUES ('old', 0, 0, 'a', NULL, 'pld', 1e-5, 0.4)")
    db.commit()
    db.close()


def test_a_schema_2_store_is_read_as_it_is_and_upgraded_with_its_runs_from_their_ledgers(
    tmp_path: Path,
) -> None:
    _version_2(tmp_path / STORE)
    with open_results(tmp_path) as store:  # read-only: read as it is, never upgraded
        (old,) = store.runs()
        assert not old.reported and store.rows("reported_privacy") == []
        spent = store.epsilon_by_silo(old)
        assert (spent.by_silo, spent.delta, spent.reported) == ({"a": 0.4}, {"a": 1e-5}, False)
    assert sqlite3.connect(tmp_path / STORE).execute("PRAGMA user_version").fetchone() == (2,)

    with ResultsStore(tmp_path / STORE) as store:  # a writer upgrades it in place
        (old,) = store.runs()
        assert not old.reported and store.epsilon_by_silo(old).by_silo == {"a": 0.4}
        assert store.start(
            "new",
            study="s",
            algorithm="fedavg",
            config={},
            grid={},
            trials=1,
            rounds=1,
            epsilon_source="hospitals",
        )
        store.finish(
            "new",
            RunResults(
                1, None, False, 1.0, None, {}, [], [], [], reported_privacy=[("b", "pld", 0.7)]
            ),
        )
        assert store.epsilon_by_silo(store.run("new")).by_silo == {"b": 0.7}
    db = sqlite3.connect(tmp_path / STORE)
    assert db.execute("PRAGMA user_version").fetchone() == (5,)  # through 3 and 4 to today's
    assert db.execute("SELECT id, epsilon_source FROM runs ORDER BY rowid").fetchall() == [
        ("old", "ledger"),
        ("new", "hospitals"),
    ]
    db.close()
