"""A study's [analytics] released by a deployment (`dpfl.engines.flower.analytics`), in
process: each hospital reads its own CSV, checks the server's plan against its own copy
of the study and its whole plan against its own ledger, charges it with the simulator's
events and adds its own noise; the server pools the sum (masked: the sum alone) into the
simulator's `dpfl stats` figures, for the same seed."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import typer
from flwr.app import Context, RecordDict
from typer.testing import CliRunner

from dpfl.analytics import Histogram
from dpfl.cli import app
from dpfl.cli.deploy import _released
from dpfl.engines.flower import DeploymentError, masking
from dpfl.engines.flower.analytics import serve_stats
from dpfl.engines.flower.he import EncryptedSum, make_key_files
from dpfl.engines.flower.hospital import Hospital
from dpfl.engines.flower.protocol import Analytics
from dpfl.experiments.study.analytics import STATS_JSON, StatsRun, stats
from dpfl.experiments.study.deployment import (
    STATS_ERROR,
    deployment_of,
    serve_stats_study,
    study_point,
)
from dpfl.federation.messages import Summed
from dpfl.privacy import Ledger

from .test_flower import InProcessGrid, RecordingGrid, approve_node, entries
from .test_flower_table import STUDY, cohort, flower_study, table_hospitals, table_study, write

__all__ = ["flower_study", "table_study"]  # the fixtures, used by name

ANALYTICS = """
[analytics]
noise_multiplier = 6.0
histograms = [{ column = "age", bins = [0, 40, 60, 80, 100] }]
means = [{ column = "medications", range = [0, 80] }]
quantiles = [{ column = "age", bins = [0, 20, 40, 50, 60, 70, 80, 100] }]
[analytics.table_one]
by = "race"
continuous = [{ column = "age", range = [0, 100], bins = [0, 20, 40, 60, 80, 100] }]
"""


def _stats_study(path: Path, summing: str = "none") -> Path:
    text = STUDY.replace("seed = 5\n", f'seed = 5\nsecure_aggregation = "{summing}"\n')
    path.write_text(text + ANALYTICS, encoding="utf-8")
    return path


def _charged(ledger: Path) -> dict[str, list[str]]:
    with Ledger(ledger, create=False) as book:
        return {a.silo: [e.event.to_json() for e in book.entries(a.silo)] for a in book.accounts()}


@pytest.mark.parametrize("summing", ["none", "masking"])
def test_deployed_stats_are_the_simulators_and_charge_each_ledger_once(
    table_study: Path, tmp_path: Path, summing: str
) -> None:
    study = _stats_study(table_study, summing)
    nodes = table_hospitals(study, tmp_path / "hospitals")
    grid = RecordingGrid(nodes.values())
    served = serve_stats(grid, deployment_of(study))
    simulated = stats(study_point(study), tmp_path / "simulated")
    assert served.hospitals == simulated.hospitals == ["east", "north", "south"]
    assert served.released.noise == simulated.noise
    assert served.released.figures == simulated.figures  # the same noise, the same sums
    assert len(simulated.figures) > 10
    book = _charged(tmp_path / "simulated" / "ledger.sqlite")
    for name, node in nodes.items():
        mine = entries(Path(node["ledger"]), f"{name}/trial-0")
        assert len(mine) == 5 and mine == book[f"{name}/trial-0"]
        assert 0 < served.epsilon[name] <= 10.0
    replies = [m.content["dpfl"] for m in grid.seen if m.metadata.message_type == "query.stats"]
    assert len(replies) == 3
    if summing == "masking":  # the server holds masked words only, no hospital's value
        assert all("vector" not in r and "words" in r for r in replies)
        words = np.frombuffer(bytes(replies[0]["words"]), "<i8") / 2.0**16
        assert np.abs(words[:4]).min() > 1e6  # its count is ~150
    else:
        assert all("vector" in r for r in replies)


def test_a_hospital_over_its_budget_refuses_before_anything_is_charged(
    table_study: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    study = _stats_study(table_study)
    nodes = table_hospitals(study, tmp_path / "hospitals")
    nodes["north"]["epsilon"] = 0.2
    why = r"silo 'north/trial-0': 5 × Gaussian\(σ=6\) .* > budget 0\.2"
    with pytest.raises(DeploymentError, match=f"^north refused: {why}"):
        serve_stats(InProcessGrid(nodes.values()), deployment_of(study))
    assert any(  # said in its own log
        r.levelname == "WARNING" and r.getMessage().startswith("north: statistics refused")
        for r in caplog.records
    )
    for name, node in nodes.items():
        assert entries(Path(node["ledger"]), f"{name}/trial-0") == []


def _other_sigma(analytics: Analytics) -> Analytics:
    return dataclasses.replace(analytics, noise_multiplier=0.5)


def _other_bins(analytics: Analytics) -> Analytics:
    """The histogram's bins moved, their count kept: the same lengths, another plan."""
    counts, histogram, *rest = analytics.queries
    assert isinstance(histogram, Histogram)
    moved = Histogram(histogram.column, (0.0, 30.0, 60.0, 80.0, 100.0))
    return dataclasses.replace(analytics, queries=(counts, moved, *rest))


@pytest.mark.parametrize(
    ("other", "said"),
    [(_other_sigma, r"noise multiplier 0\.5"), (_other_bins, r"30\.0, 60\.0")],
)
def test_a_plan_other_than_the_hospitals_study_is_refused(
    table_study: Path, tmp_path: Path, other: Callable[[Analytics], Analytics], said: str
) -> None:
    study = _stats_study(table_study)
    nodes = table_hospitals(study, tmp_path / "hospitals")
    run = deployment_of(study)
    assert run.analytics is not None
    with pytest.raises(DeploymentError, match=f"east refused: the server asks for .*{said}"):
        serve_stats(
            InProcessGrid(nodes.values()),
            dataclasses.replace(run, analytics=other(run.analytics)),
        )
    for name, node in nodes.items():
        assert entries(Path(node["ledger"]), f"{name}/trial-0") == []


def test_a_study_without_analytics_releases_nothing(table_study: Path, tmp_path: Path) -> None:
    nodes = table_hospitals(table_study, tmp_path / "hospitals")
    with pytest.raises(DeploymentError, match=r"declares no \[analytics\]"):
        serve_stats(InProcessGrid(nodes.values()), deployment_of(table_study))


def test_the_server_app_writes_the_simulators_files_or_one_line_why_not(
    table_study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    study = _stats_study(table_study, "masking")
    nodes = table_hospitals(study, tmp_path / "hospitals")
    for node in nodes.values():
        node["epsilon"] = 1.5  # one run costs 1.27
    out = tmp_path / "out"
    run = {"study": str(study), "out": str(out), "wait": 5.0, "timeout": 60.0}
    served = serve_stats_study(InProcessGrid(nodes.values()), run)
    again = StatsRun.read(out / STATS_JSON)
    assert again == served and again.figures == stats(study_point(study), tmp_path / "s").figures
    assert "<img" in (out / "stats.html").read_text(encoding="utf-8")
    started = time.time()
    with pytest.raises(DeploymentError):  # a second run would pass every budget
        serve_stats_study(InProcessGrid(nodes.values()), run)
    why = (out / STATS_ERROR).read_text(encoding="utf-8")
    assert why.startswith("the statistics were not released: east refused: ")
    assert why.count("\n") == 1
    capsys.readouterr()
    with pytest.raises(typer.Exit) as stopped:  # what `dpfl deploy server --stats` then says
        _released(out, started)
    assert stopped.value.exit_code == 1
    said = capsys.readouterr().err
    assert said.startswith("error: the statistics were not released: east refused: ")
    assert said.count("\n") == 1


def test_dpfl_deploy_server_stats_refuses_a_study_without_analytics_in_one_line(
    table_study: Path, tmp_path: Path
) -> None:
    table_hospitals(table_study, tmp_path / "hospitals")
    result = CliRunner().invoke(
        app,
        ["deploy", "server", str(table_study), "--stats", "--superlink", "127.0.0.1:1",
         "--out", str(tmp_path / "out"), "--insecure"],
    )  # fmt: skip
    assert result.exit_code == 2 and "declares no [analytics]" in result.output
    assert "Traceback" not in result.output


def test_encrypted_stats_are_the_simulators_and_the_server_holds_ciphertexts_only(
    table_study: Path, tmp_path: Path
) -> None:
    study = _stats_study(table_study, "he")
    secret, public = make_key_files(tmp_path / "keys")
    nodes = table_hospitals(study, tmp_path / "hospitals")
    for name, node in nodes.items():
        node["he-keys"] = str(secret if name == "east" else public)
    grid = RecordingGrid(nodes.values())
    served = serve_stats(grid, deployment_of(study), he_keys=public)
    simulated = stats(study_point(study), tmp_path / "simulated")
    for mine, theirs in zip(served.released.figures, simulated.figures, strict=True):
        assert (mine.statistic, mine.name) == (theirs.statistic, theirs.name)
        assert mine.value == pytest.approx(theirs.value, rel=1e-4, abs=1e-3)
    replies = [m.content["dpfl"] for m in grid.seen if m.metadata.message_type == "query.stats"]
    assert len(replies) == 3 and all(
        set(r) == {"epsilon", "ciphertext", "receipt"} for r in replies
    )


def test_patient_level_stats_bound_each_patient_and_charge_per_patient(
    table_study: Path, tmp_path: Path
) -> None:
    """Each patient has three records at its hospital; each hospital keeps its first two
    (`bounded`), so Δ doubles and every event is charged per patient, as simulated."""
    rows = cohort()  # 180 records at each site
    for i, row in enumerate(rows):
        row[0] = 900_000 + (i // 9) * 3 + i % 3  # 60 patients a site, 3 records each
    write(table_study.parent / "cohort.csv", rows)
    study = _stats_study(table_study)
    patients = 'site = "hospital"\nunit = "patient"\nmax_records = 2\n'
    text = study.read_text(encoding="utf-8").replace('site = "hospital"\n', patients)
    sites = text.replace(
        "east = 150, north = 150, south = 150", "east = 60, north = 60, south = 60"
    )
    no_evaluation = "\n[evaluation]\nqueries = 0\n"  # a DP one would count patients unbounded
    study.write_text(sites + no_evaluation, encoding="utf-8")
    by_site = {s: [r for r in rows if r[1] == s] for s in ("east", "north", "south")}
    nodes = table_hospitals(study, tmp_path / "hospitals", by_site)
    served = serve_stats(InProcessGrid(nodes.values()), deployment_of(study))
    simulated = stats(study_point(study), tmp_path / "simulated")
    assert served.released.figures == simulated.figures
    pooled = next(f for f in simulated.figures if f.name == "pooled")
    assert abs(pooled.value - 360) < 4 * pooled.std  # two of each patient's three records
    assert served.released.noise["counts"] == pytest.approx(6.0 * np.sqrt(3) * 2 * np.sqrt(3))
    book = _charged(tmp_path / "simulated" / "ledger.sqlite")
    for name, node in nodes.items():
        mine = entries(Path(node["ledger"]), f"{name}/trial-0")
        assert mine == book[f"{name}/trial-0"] and "patient" in mine[0]


def test_the_key_holder_opens_a_statistics_sum_of_every_hospital_only(
    table_study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that names a statistics plan and one hospital in its decrypt request does
    not get that hospital's lone ciphertext opened: the key holder asks a statistics sum
    for every roster hospital, whatever `silos` the server states (else the same request
    would open one hospital's training reply, e.g. Dopamine's share of noise alone)."""
    study = _stats_study(table_study, "he")
    secret, public = make_key_files(tmp_path / "keys")
    nodes = table_hospitals(study, tmp_path / "hospitals")
    for name, node in nodes.items():
        node["he-keys"] = str(secret if name == "east" else public)

    def one_hospital(self: EncryptedSum, vectors: object, *, at_least: int = 1) -> Summed:
        lone = "north"  # a hospital other than the key holder
        self.aggregator.open_round(self.counter)
        self.aggregator.add(lone, self.ciphertexts[lone])
        asked = {  # a fresh run instance: no facts the hospital holds stand in the way
            "sum": self.aggregator.close(),
            "counter": self.counter,
            "silos": [lone],
            "instance": "0123456789abcdef",
        }
        (answer,) = self.ask("query.he_decrypt", {self.holder: asked}).values()
        total = np.frombuffer(bytes(answer["total"]), dtype="<f8").copy()
        return Summed(torch.from_numpy(total), tuple(answer["included"]))

    monkeypatch.setattr(EncryptedSum, "__call__", one_hospital)
    with pytest.raises(DeploymentError, match="fewer than the 3 it must hold"):
        serve_stats(InProcessGrid(nodes.values()), deployment_of(study), he_keys=public)


def test_a_masked_statistics_session_needs_every_hospitals_input(
    table_study: Path, tmp_path: Path
) -> None:
    """A server that names a plan and one silo in its secagg messages does not lower the
    masked inputs a hospital unmasks with below the roster's: its own study's count, as
    for training (else one training reply could be unmasked nearly alone)."""
    study = _stats_study(table_study, "masking")
    nodes = table_hospitals(study, tmp_path / "hospitals")
    approve_node(nodes["east"])
    context = Context(
        run_id=7, node_id=2, node_config=nodes["east"], state=RecordDict(), run_config={}
    )
    fields = {"study": deployment_of(study).key, "instance": "0123456789abcdef"}
    hospital = Hospital.of(context, deployment_of, fields)
    assert hospital.run.analytics is not None
    asked = {**fields, "plan": hospital.run.analytics.plan(1), "silos": ["east"]}
    assert masking.session(hospital, asked).fewest == 3
