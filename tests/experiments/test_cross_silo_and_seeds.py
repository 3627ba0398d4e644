"""Cross-silo scores in a study (`cross_silo = true`) and the spread over trials × seeds:
the store's new table (and its schema 1 → 2 upgrade), the query layer, the summaries,
`best` and the report, each figure checked against one computed here from the store's
raw rows."""

from __future__ import annotations

import html
import json
import sqlite3
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.experiments.results import best
from dpfl.experiments.results.queries import (
    open_results,
    pool_seeds,
    read_audits,
    read_cross_silo,
    summarise,
)
from dpfl.experiments.results.report import write_report
from dpfl.experiments.results.store import ResultsStore, RunResults
from dpfl.experiments.results.summary import run_summaries
from dpfl.experiments.study.config import Study
from dpfl.experiments.study.point import STORE
from dpfl.experiments.study.runner import run_study

STUDY = {
    "name": "cross",
    "rounds": 2,
    "trials": 2,
    "seed": [0, 1],  # the split and trial 0's initialisation vary with it
    "cross_silo": True,
    "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 3}},
    "algorithm": {"name": ["mrmtl", "fedavg"], "learning_rate": 1.0, "strength": 0.1},
    "privacy": {"noise_multiplier": 1.0, "delta": 1e-5},
}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("cross")
    runs = run_study(Study(STUDY), directory)
    assert all(r.status == "finished" for r in runs), [r.error for r in runs]
    return directory


@pytest.fixture
def sql(study: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{study / STORE}?mode=ro", uri=True)


def _runs(sql: sqlite3.Connection, algorithm: str) -> list[tuple[str, int, int]]:
    """(id, seed, last round) of the algorithm's runs, by seed."""
    rows = sql.execute(
        "SELECT id, config, rounds_completed - 1 FROM runs WHERE algorithm = ?", (algorithm,)
    ).fetchall()
    return sorted(((i, json.loads(c)["seed"], last) for i, c, last in rows), key=lambda r: r[1])


def test_the_store_holds_every_model_on_every_test_set(
    study: Path, sql: sqlite3.Connection
) -> None:
    for algorithm, models in (
        ("mrmtl", {"hospital-0", "hospital-1", "hospital-2"}),
        ("fedavg", {None}),
    ):
        for run_id, _, last in _runs(sql, algorithm):
            rows = sql.execute(
                "SELECT trial, round, model_silo, test_silo, metric, value FROM cross_silo"
                " WHERE run_id = ?",
                (run_id,),
            ).fetchall()
            assert {r[1] for r in rows} == {last}
            assert {r[2] for r in rows} == models  # the shared model once, not per silo
            assert {(r[0], r[2], r[3]) for r in rows} == {
                (t, m, f"hospital-{k}") for t in range(2) for m in models for k in range(3)
            }
            with open_results(study) as store:
                cross = read_cross_silo(store, store.run(run_id))
            expected: dict[tuple[str | None, str, str], list[float]] = defaultdict(list)
            for _trial, _, model, test, metric, value in sorted(rows):
                expected[model, test, metric].append(value)
            assert {
                (m, t, metric): list(spread.values)
                for m, by_test in cross.items()
                for t, by_metric in by_test.items()
                for metric, spread in by_metric.items()
            } == expected
            # the diagonal of a personalised run is each silo's own final score
            own = dict(
                sql.execute(
                    "SELECT silo || ':' || trial, value FROM metrics WHERE run_id = ? AND"
                    " round = ? AND metric = 'accuracy' AND silo IS NOT NULL",
                    (run_id, last),
                ).fetchall()
            )
            for trial, _, model, test, metric, value in rows:
                if metric == "accuracy" and model in (None, test):
                    assert value == own[f"{test}:{trial}"]


def test_runs_differing_only_in_seed_pool_over_every_trial_of_every_seed(
    study: Path, sql: sqlite3.Connection
) -> None:
    pooled = {s["algorithm"]: s for s in run_summaries(study, pool=True)}
    alone = run_summaries(study)
    assert len(pooled) == 2 and len(alone) == 4
    assert {s["spread"] for s in alone} == {"2 trials × 1 seed"}
    for algorithm, group in pooled.items():
        runs = _runs(sql, algorithm)
        assert group["runs"] == [r for r, _, _ in runs] and group["seeds"] == [0, 1]
        assert group["spread"] == "2 trials × 2 seeds"
        assert "seed" not in group["grid"]
        values = [
            v
            for run_id, _, last in runs
            for (v,) in sql.execute(
                "SELECT value FROM metrics WHERE run_id = ? AND round = ? AND silo IS NULL"
                " AND metric = 'auroc' ORDER BY trial",
                (run_id, last),
            )
        ]
        assert len(values) == 4
        assert group["metrics"]["auroc"]["mean"] == pytest.approx(statistics.fmean(values))
        assert group["metrics"]["auroc"]["std"] == pytest.approx(statistics.stdev(values))
        (worst,) = sql.execute(
            "SELECT MAX(epsilon) FROM privacy JOIN runs ON runs.id = run_id WHERE algorithm = ?"
            " AND view IS NULL AND accountant = 'pld' AND round = rounds_completed - 1",
            (algorithm,),
        ).fetchone()
        assert group["epsilon"]["pld"] == worst
        (up,) = sql.execute(
            "SELECT SUM(bytes_up) FROM communication JOIN runs ON runs.id = run_id"
            " WHERE algorithm = ?",
            (algorithm,),
        ).fetchone()
        assert group["bytes_up_per_client"] == pytest.approx(up / (2 * 2 * 3))
        cross = {(r["model"], r["test"]): r["metrics"] for r in group["cross_silo"]}
        model = "hospital-1" if algorithm == "mrmtl" else None
        by_hand = [
            v
            for run_id, _, _ in runs
            for (v,) in sql.execute(
                "SELECT value FROM cross_silo WHERE run_id = ? AND model_silo IS ? AND"
                " test_silo = 'hospital-2' AND metric = 'accuracy' ORDER BY trial",
                (run_id, model),
            )
        ]
        assert cross[model, "hospital-2"]["accuracy"]["mean"] == pytest.approx(
            statistics.fmean(by_hand)
        )
        assert cross[model, "hospital-2"]["accuracy"]["std"] == pytest.approx(
            statistics.stdev(by_hand)
        )


def test_best_pools_seeds_and_qualifies_only_if_every_seed_does(study: Path) -> None:
    with open_results(study) as store:
        groups = pool_seeds(summarise(store, r) for r in store.runs(status="finished"))
        epsilon = {
            g.run.algorithm: [store.epsilon_by_silo(r, delta=1e-5).max for r in g.runs]
            for g in groups
        }
    found = best.candidates(study, epsilon=100, delta=1e-5, metric="auroc", pool=True)
    assert len(found) == 2
    for c in found:
        assert str(c.replicates) == "2 trials × 2 seeds" and len(c.runs) == 2
        assert c.epsilon == max(epsilon[c.run.algorithm])
    tight = (min(max(e) for e in epsilon.values()) + min(min(e) for e in epsilon.values())) / 2
    for c in best.candidates(study, epsilon=tight, delta=1e-5, pool=True):
        assert c.qualifies == (max(epsilon[c.run.algorithm]) <= tight)
    result = CliRunner().invoke(
        app, ["best", str(study), "-e", "100", "-d", "1e-5", "--pool-seeds", "--json"]
    )
    assert result.exit_code == 0, result.output
    chosen = json.loads(result.output)["best"]
    assert chosen["spread"] == "2 trials × 2 seeds" and len(chosen["runs"]) == 2


def test_the_report_and_the_sweep_table_show_the_matrix_and_the_pooled_rows(
    study: Path, study_text: Callable[[dict[str, Any]], str]
) -> None:
    text = write_report(study, metric="accuracy").read_text(encoding="utf-8")
    assert "<h2 id='cross-silo'>Cross-silo scores</h2>" in text
    assert "<h2 id='pooled'>Pooled over seeds</h2>" in text
    assert html.escape("over 2 trials × 2 seeds") in text
    assert "shared (every silo&#x27;s)" in text  # fedavg's one model
    with open_results(study) as store:
        (group,) = [
            g
            for g in pool_seeds(summarise(store, r) for r in store.runs(status="finished"))
            if g.run.algorithm == "mrmtl"
        ]
    spread = group.cross_silo["hospital-0"]["hospital-1"]["accuracy"]
    assert f"{spread.mean:.3f}\u00a0±\u00a0{spread.std:.3f}" in text
    (study / "study.toml").write_text(study_text(STUDY), encoding="utf-8")
    result = CliRunner().invoke(app, ["sweep", str(study / "study.toml"), "-o", str(study)])
    assert result.exit_code == 0, result.output
    assert "4 of 4 points done" in result.output  # the same points: nothing ran again
    assert result.output.count("2 trials × 1 seed") >= 4
    assert result.output.count("2 trials × 2 seeds") >= 2
    assert "pooled" in result.output and "shared (every silo's)" in result.output
    with open_results(study) as store:
        for run in store.runs():  # a matrix per run
            assert f"run {run.id[:8]}: accuracy of each silo's" in result.output


# -- the store's schema 1 → 2 upgrade ---------------------------------------------------

SCHEMA_1 = """
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
CREATE INDEX metrics_run ON metrics (run_id, metric);
CREATE TABLE privacy (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, trial INTEGER NOT NULL,
    round INTEGER NOT NULL, silo TEXT NOT NULL, view TEXT, accountant TEXT NOT NULL,
    delta REAL NOT NULL, epsilon REAL NOT NULL
);
CREATE INDEX privacy_run ON privacy (run_id);
CREATE TABLE communication (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, trial INTEGER NOT NULL,
    round INTEGER NOT NULL, silo TEXT NOT NULL, bytes_down INTEGER NOT NULL,
    bytes_up INTEGER NOT NULL, messages INTEGER NOT NULL
);
CREATE INDEX communication_run ON communication (run_id);
"""
"""The results store's schema 1, as `git show d2b676d:src/dpfl/experiments/results/store.py` has it
(columns joined on fewer lines)."""


def _version_1(path: Path) -> None:
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_1)
    db.execute("PRAGMA application_id = 1685087858")  # 0x64706672, "dpfr"
    db.execute("PRAGMA user_version = 1")
    db.execute(
        "INSERT INTO runs (id, study, algorithm, config, grid, status, trials, rounds,"
        " rounds_completed, noise_multiplier, stopped_by_budget, seconds, started_at,"
        " finished_at, datasheet) VALUES ('old', 's', 'fedavg', '{\"seed\": 0}', '{}',"
        " 'finished', 2, 1, 1, 1.0, 0, 3.0, 1.0, 2.0, '{}')"
    )
    db.executemany(
        "INSERT INTO metrics VALUES ('old', ?, 0, NULL, 'accuracy', ?)", [(0, 0.5), (1, 0.7)]
    )
    db.execute("INSERT INTO privacy VALUES ('old', 0, 0, 'a', NULL, 'pld', 1e-5, 0.4)")
    db.execute("INSERT INTO communication VALUES ('old', 0, 0, 'a', 10, 20, 2)")
    db.commit()
    db.close()


def test_a_version_1_store_is_read_as_it_is_and_upgraded_keeping_its_runs(tmp_path: Path) -> None:
    _version_1(tmp_path / STORE)
    with open_results(tmp_path) as store:  # read-only: read as it is, never upgraded
        (old,) = store.runs()
        assert store.rows("cross_silo") == [] and read_cross_silo(store, old) == {}
        assert summarise(store, old).metrics.score("accuracy").values == (0.5, 0.7)
    assert sqlite3.connect(tmp_path / STORE).execute("PRAGMA user_version").fetchone() == (1,)

    with ResultsStore(tmp_path / STORE) as store:  # a writer upgrades it in place
        (old,) = store.runs()
        assert (old.id, old.status, old.trials, old.seconds) == ("old", "finished", 2, 3.0)
        assert [r["value"] for r in store.rows("metrics", "old")] == [0.5, 0.7]
        assert len(store.rows("privacy")) == len(store.rows("communication")) == 1
        assert store.start(
            "new", study="s", algorithm="mrmtl", config={}, grid={}, trials=1, rounds=1
        )
        store.finish(
            "new",
            RunResults(1, None, False, 1.0, None, {}, [], [], [], [(0, 0, "a", "b", "auroc", 0.8)]),
        )
        attack = {"silo": "a", "model": "shared", "attack": "loss", "auc": 0.5}
        attack |= {"tpr_at_fpr_0_1": 0.0, "tpr_at_fpr_1": 0.01, "members": 4, "non_members": 2}
        store.record_audit("old", [], [attack | {"trials": 1, "shadows": 2, "folds": 2}])
        assert read_audits(store, old).membership[0]["auc"] == 0.5  # audits: schema 4
    db = sqlite3.connect(tmp_path / STORE)
    assert db.execute("PRAGMA user_version").fetchone() == (5,)  # through 2, 3 and 4 to today's
    assert db.execute("SELECT * FROM cross_silo").fetchall() == [
        ("new", 0, 0, "a", "b", "auroc", 0.8)
    ]
    assert db.execute("SELECT COUNT(*) FROM metrics WHERE run_id = 'old'").fetchone() == (2,)
    db.close()
    (summary,) = [s for s in run_summaries(tmp_path) if s["id"] == "new"]
    assert summary["cross_silo"] == [
        {"model": "a", "test": "b", "metrics": {"auroc": {"mean": 0.8, "std": None}}}
    ]


def test_the_options_leave_the_keys_of_existing_points_alone() -> None:
    """The key dpfl gave this point before `cross_silo` (6a8b805~1) and
    `secure_aggregation` (6a3e6ea) existed, computed by those versions."""
    base = {k: v for k, v in STUDY.items() if k not in ("cross_silo", "seed")}
    base["algorithm"] = {"name": "fedavg"}
    plain = Study(base).points[0][1]
    assert plain.key() == "68d5cc7942904f44"
    for option in ({"cross_silo": True}, {"secure_aggregation": "none"}):
        assert Study({**base, **option}).points[0][1].key() != plain.key()
