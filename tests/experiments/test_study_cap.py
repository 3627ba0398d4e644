"""A hospital's cap across studies from study files (`[privacy] ledger` and
`[privacy.caps]`): studies run with `dpfl sweep` over the same records share one ledger,
and one whose plan would take the composition of every study's events past the cap is
refused before round 0, naming the studies that spent it."""

from __future__ import annotations

from pathlib import Path

import pytest
from dp_accounting.pld import pld_privacy_accountant
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.experiments.config import load
from dpfl.experiments.store import ResultsStore
from dpfl.privacy import Ledger
from dpfl.privacy.accounting import PLD_DISCRETISATION
from studies import breast_cancer_study

CAP = {"hospital-0": {"epsilon": 4.0, "delta": 1e-5}}


def _sweep(tmp_path: Path, name: str, rounds: int) -> str:
    """Run study `name` (two trials, fixed σ) over the shared ledger; `dpfl sweep`'s output."""
    folder = tmp_path / name
    folder.mkdir()
    study = folder / "study.toml"
    study.write_text(
        breast_cancer_study(
            name,
            rounds=rounds,
            trials=2,
            privacy={"noise_multiplier": 1.5, "ledger": "../hospitals.sqlite", "caps": CAP},
        ),
        encoding="utf-8",
    )
    out = folder / "out"
    result = CliRunner().invoke(app, ["sweep", str(study), "--out", str(out), "-j", "1"])
    with ResultsStore(out / "results.sqlite") as store:
        (run,) = store.runs()
    assert run.id == load(study).points[0][1].key()
    return f"{result.output}\n{run.status} {run.error}"


def test_a_second_study_file_past_a_hospitals_cap_is_refused_naming_the_first(
    tmp_path: Path,
) -> None:
    for first in ("s1", "s2"):
        assert "finished" in _sweep(tmp_path, first, rounds=2)
    refused = _sweep(tmp_path, "s3", rounds=30)
    assert "failed" in refused and "dataset 'hospital-0'" in refused, refused
    assert "s1/" in refused and "s2/" in refused  # the studies that spent it, by name
    with Ledger(tmp_path / "hospitals.sqlite", create=False) as reader:
        (cap,) = reader.datasets()
        assert {s.split("/")[0] for s in cap.studies} == {"s1", "s2"}  # s3 recorded nothing
        independent = pld_privacy_accountant.PLDAccountant(
            value_discretization_interval=PLD_DISCRETISATION
        )
        spenders = [a.silo for a in reader.accounts() if a.budget.dataset == "hospital-0"]
        assert len(spenders) == 3 * 2  # every trial's account of all three studies
        for name in spenders:
            for entry in reader.entries(name):
                independent.compose(entry.event.dp_event)
    assert cap.spent.epsilon == pytest.approx(independent.get_epsilon(1e-5), rel=1e-6)
    assert cap.spent.epsilon <= 4.0


def test_a_run_on_a_shared_ledger_is_re_read_at_another_delta(tmp_path: Path) -> None:
    assert "finished" in _sweep(tmp_path, "s1", rounds=2)
    with ResultsStore(tmp_path / "s1" / "out" / "results.sqlite") as store:
        (run,) = store.runs()
        at_study_delta = store.epsilon_by_silo(run).by_silo
        looser = store.epsilon_by_silo(run, delta=1e-3).by_silo
    assert looser.keys() == at_study_delta.keys()
    assert all(0 < looser[s] < at_study_delta[s] for s in looser)  # a larger δ, a smaller ε
