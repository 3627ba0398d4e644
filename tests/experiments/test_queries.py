"""The query layer (`dpfl.experiments.results.queries`) that the report, the summaries and `best`
read: each figure is checked against one computed here in SQL from the store's raw rows,
on a real (tiny) study and on a hand-built store with the awkward cases."""

from __future__ import annotations

import math
import sqlite3
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpfl.experiments.results import best, queries
from dpfl.experiments.results.queries import Spread, epsilon_over_rounds, open_results, summarise
from dpfl.experiments.results.store import ResultsStore, RunResults, RunRow
from dpfl.experiments.results.summary import run_summaries, silo_summaries
from dpfl.experiments.study.config import Study
from dpfl.experiments.study.point import STORE
from dpfl.experiments.study.runner import run_study
from dpfl.privacy.accounts import account

STUDY = {
    "name": "tiny",
    "rounds": 3,
    "trials": 2,
    "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 3}},
    # client sampling: trials spend differently, and a silo may sit a trial out
    "algorithm": {"name": "fedavg", "learning_rate": 1.0, "client_rate": 0.5},
    "privacy": {"noise_multiplier": 1.0, "delta": 1e-5},
}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("study")
    (private,) = run_study(Study(STUDY), directory)
    (public,) = run_study(Study({**STUDY, "privacy": {"private": False}}), directory, add=True)
    assert private.status == public.status == "finished", (private.error, public.error)
    return directory


@pytest.fixture
def sql(study: Path) -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(f"file:{study / STORE}?mode=ro", uri=True)
    yield db
    db.close()


def finished(study: Path) -> list[RunRow]:
    with open_results(study) as store:
        return store.runs(status="finished")


def private_run(study: Path) -> RunRow:
    (run,) = [r for r in finished(study) if r.noise_multiplier is not None]
    return run


def test_the_store_file_is_the_runners(study: Path) -> None:
    assert queries.RESULTS_FILE == STORE


def test_final_metrics_are_each_trials_value_after_the_last_round(
    study: Path, sql: sqlite3.Connection
) -> None:
    for run in finished(study):
        with open_results(study) as store:
            metrics = summarise(store, run).metrics
        last = sql.execute("SELECT rounds_completed - 1 FROM runs WHERE id = ?", (run.id,))
        (last_round,) = last.fetchone()
        names = [m for (m,) in sql.execute("SELECT DISTINCT metric FROM metrics")]
        assert {"accuracy", "auroc", "loss"} <= set(names)
        for silo in [None, "hospital-0", "hospital-2"]:
            for metric in names:
                values = [
                    v
                    for (v,) in sql.execute(
                        "SELECT value FROM metrics WHERE run_id = ? AND metric = ? AND round = ?"
                        " AND silo IS ? AND value IS NOT NULL ORDER BY trial",
                        (run.id, metric, last_round, silo),
                    )
                ]
                spread = metrics.score(metric, silo)
                assert list(spread.values) == values
                assert spread.mean == statistics.fmean(values)
                assert spread.std == statistics.stdev(values)
        assert metrics.silos == {"hospital-0", "hospital-1", "hospital-2"}
        assert metrics.score("no-such-metric").values == ()


def test_learning_curves_are_means_over_trials_at_every_evaluated_round(
    study: Path, sql: sqlite3.Connection
) -> None:
    run = private_run(study)
    with open_results(study) as store:
        curve = summarise(store, run).metrics.curves["auroc"]
    expected = sql.execute(
        "SELECT round, AVG(value), COUNT(value) FROM metrics WHERE run_id = ? AND silo IS NULL"
        " AND metric = 'auroc' GROUP BY round ORDER BY round",
        (run.id,),
    ).fetchall()
    assert [(r, s.mean, len(s.values)) for r, s in curve.items()] == [
        (r, pytest.approx(mean, rel=1e-12), n) for r, mean, n in expected
    ]
    assert list(curve) == [0, 1, 2]


def test_epsilon_is_each_silos_worst_trial_by_the_enforcing_accountant(
    study: Path, sql: sqlite3.Connection
) -> None:
    run = private_run(study)
    with open_results(study) as store:
        summary = summarise(store, run)
        over_rounds = epsilon_over_rounds(store, run)
    assert summary.private and summary.accountant == "pld" and summary.views == {}

    def worst(accountant: str, round_: int) -> dict[str, float]:
        return dict(
            sql.execute(
                "SELECT silo, MAX(epsilon) FROM privacy WHERE run_id = ? AND view IS NULL"
                " AND accountant = ? AND round = ? GROUP BY silo",
                (run.id, accountant, round_),
            ).fetchall()
        )

    for accountant in ("pld", "rdp"):
        assert summary.epsilon[accountant].by_silo == worst(accountant, 2)
        assert summary.epsilon[accountant].accountant == accountant
    assert summary.own_epsilon == max(worst("pld", 2).values())
    assert worst("rdp", 2) != worst("pld", 2)  # the two accountants are told apart
    assert over_rounds == {
        silo: [(r, worst("pld", r)[silo]) for r in range(3)] for silo in worst("pld", 2)
    }
    (delta,) = {d for (d,) in sql.execute("SELECT delta FROM privacy WHERE run_id = ?", (run.id,))}
    assert set(summary.epsilon["pld"].delta.values()) == {delta}


def test_traffic_counts_a_trial_a_silo_sat_out_as_zero_bytes(
    study: Path, sql: sqlite3.Connection
) -> None:
    for run in finished(study):
        with open_results(study) as store:
            traffic = summarise(store, run).traffic
        silos = [s for (s,) in sql.execute("SELECT DISTINCT silo FROM communication")]
        for direction, column in (("up", "bytes_up"), ("down", "bytes_down")):
            by_silo = dict(
                sql.execute(
                    f"SELECT silo, SUM({column}) FROM communication WHERE run_id = ? GROUP BY silo",
                    (run.id,),
                ).fetchall()
            )
            for silo in silos:
                expected = by_silo.get(silo, 0) / run.trials
                assert traffic.per_client(direction, silo) == pytest.approx(expected, rel=1e-12)
            overall = sum(by_silo.values()) / (run.trials * len(by_silo))
            assert traffic.per_client(direction) == pytest.approx(overall, rel=1e-12)
            assert overall > 0


def test_a_non_private_run_has_no_epsilon(study: Path) -> None:
    (run,) = [r for r in finished(study) if r.noise_multiplier is None]
    with open_results(study) as store:
        summary = summarise(store, run)
        assert epsilon_over_rounds(store, run) == {}
    assert not summary.private and summary.own_epsilon is None
    assert all(not e.by_silo and e.max == math.inf for e in summary.epsilon.values())


def test_summaries_and_best_show_the_query_layers_figures(study: Path) -> None:
    run = private_run(study)
    with open_results(study) as store:
        summary = summarise(store, run)
    accuracy = summary.metrics.score("accuracy")
    (shown,) = [s for s in run_summaries(study) if s["id"] == run.id]
    assert shown["metrics"]["accuracy"] == {"mean": accuracy.mean, "std": accuracy.std}
    assert shown["epsilon"] == {a: e.max for a, e in summary.epsilon.items()}
    assert shown["bytes_up_per_client"] == summary.traffic.per_client("up")
    for silo in silo_summaries(study, run.id):
        name = silo["silo"]
        assert silo["epsilon"] == {a: e.by_silo[name] for a, e in summary.epsilon.items()}
        assert silo["metrics"]["auroc"]["mean"] == summary.metrics.score("auroc", name).mean
        assert silo["bytes_down"] == summary.traffic.per_client("down", name)
    (chosen,) = [c for c in best.candidates(study, epsilon=100, delta=1e-5) if c.run.id == run.id]
    assert (chosen.mean, chosen.std) == (accuracy.mean, accuracy.std)
    assert chosen.epsilon == pytest.approx(summary.own_epsilon, rel=1e-9)  # re-read at δ


# -- the awkward cases, on a hand-built store -----------------------------------------------


def hand_built(directory: Path) -> RunRow:
    """Two trials over three planned rounds, stopped after two: NULL values, a silo that
    sent nothing in trial 1, and trials that spend differently."""
    with ResultsStore(directory / STORE) as store:
        store.start("r", study="s", algorithm="fedavg", config={}, grid={}, trials=2, rounds=3)
        store.finish(
            "r",
            RunResults(
                rounds_completed=2,
                noise_multiplier=1.0,
                stopped_by_budget=True,
                seconds=1.0,
                ledger=None,
                datasheet={"accountant": "rdp"},
                metrics=[
                    (0, 0, None, "accuracy", 0.5),
                    (1, 0, None, "accuracy", 0.7),
                    (0, 1, None, "accuracy", 0.6),
                    (1, 1, None, "accuracy", 0.9),
                    (0, 1, None, "auroc", math.nan),  # undefined in trial 0 only
                    (1, 1, None, "auroc", 0.8),
                    (0, 1, "a", "auroc", None),  # undefined in every trial
                    (1, 1, "a", "auroc", None),
                ],
                privacy=[
                    (t, r, silo, None, "rdp", 1e-5, eps, account(silo, t))
                    for t, r, silo, eps in [
                        (0, 0, "a", 0.5),
                        (1, 0, "a", 0.2),
                        (0, 1, "a", 1.0),
                        (1, 1, "a", 2.0),
                        (0, 1, "b", 3.0),
                        (1, 1, "b", 1.5),
                    ]
                ]
                + [
                    (0, 1, "a", "hospitals", "rdp", 1e-5, 9.0, account("a", 0, "hospitals")),
                    (0, 1, "a", None, "pld", 1e-5, 0.9, account("a", 0)),
                ],
                communication=[
                    (0, 0, "a", 10, 100, 2),
                    (0, 1, "a", 10, 100, 2),
                    (1, 0, "b", 4, 40, 2),
                ],
            ),
        )
        return store.run("r")


def test_the_conventions_on_a_hand_built_store(tmp_path: Path) -> None:
    run = hand_built(tmp_path)
    with open_results(tmp_path) as store:
        summary = summarise(store, run)
        over_rounds = epsilon_over_rounds(store, run)
    final = summary.metrics
    assert final.score("accuracy") == Spread((0.6, 0.9))  # after round 1, not planned round 2
    assert final.score("accuracy").std == pytest.approx(statistics.stdev([0.6, 0.9]))
    auroc = final.score("auroc")
    assert auroc.values == (0.8,) and auroc.mean == 0.8 and math.isnan(auroc.std)
    undefined = final.score("auroc", "a")
    assert not undefined.defined and math.isnan(undefined.mean)
    assert final.names == {"accuracy", "auroc"} and final.silos == {"a"}
    assert [s.mean for s in final.curves["accuracy"].values()] == pytest.approx([0.6, 0.75])

    assert summary.accountant == "rdp" and summary.other_accountant == "pld"
    assert summary.epsilon["rdp"].by_silo == {"a": 2.0, "b": 3.0}  # worst trial each
    assert summary.epsilon["pld"].by_silo == {"a": 0.9}
    assert summary.own_epsilon == 3.0
    assert summary.views["hospitals"].by_silo == {"a": 9.0}
    assert over_rounds == {"a": [(0, 0.5), (1, 2.0)], "b": [(1, 3.0)]}

    assert summary.traffic.up == {"a": (200, 0), "b": (0, 40)}
    assert summary.traffic.down == {"a": (20, 0), "b": (0, 4)}
    assert summary.traffic.per_client("up", "a") == 100.0
    assert summary.traffic.per_client("up") == 60.0  # (200 + 0 + 0 + 40) / 4
    assert summary.traffic.per_client("down", "nobody") == 0.0

    (shown,) = run_summaries(tmp_path)
    assert shown["metrics"] == {
        "accuracy": {"mean": 0.75, "std": pytest.approx(statistics.stdev([0.6, 0.9]))},
        "auroc": {"mean": 0.8, "std": None},  # one value: its spread is unknown, not 0
    }
    assert shown["epsilon"] == {"rdp": 3.0, "pld": 0.9} and shown["accountant"] == "rdp"


def test_one_value_is_shown_as_n_1_never_as_a_spread_of_zero(tmp_path: Path) -> None:
    """Every table prints a single trial's figure as `n = 1`: its spread is unknown."""
    from dpfl.cli.common import mean_std
    from dpfl.experiments.results.report.page import _spread_text

    assert queries.mean_std_text(0.8378, None, 4) == "0.8378 (n = 1)"
    assert queries.mean_std_text(0.8378, math.nan, 4) == "0.8378 (n = 1)"
    assert queries.mean_std_text(0.8, 0.0) == "0.800 ± 0.000"  # a spread of 0 measured
    hand_built(tmp_path)
    (shown,) = run_summaries(tmp_path)
    assert mean_std(shown["metrics"]["auroc"]) == "0.800 (n = 1)"
    assert mean_std(shown["metrics"]["accuracy"]) == "0.750 ± 0.212"
    assert _spread_text(Spread((0.8,))) == "0.800\u00a0(n\u00a0=\u00a01)"
