"""A damaged `results.sqlite`, or a damaged ledger inside a study, is refused in one line
naming the file by every command that opens it (`best`, `report`, `audit`, a `sweep`
resuming into the directory), exit status 1, and is never modified; read commands
create nothing in a healthy study either. Faults as in tests/privacy/test_ledger_files.py."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.experiments.results.store import DamagedStoreError, ResultsStore, StoreError
from dpfl.experiments.study.config import load
from dpfl.experiments.study.point import STORE
from dpfl.experiments.study.runner import run_study
from dpfl.privacy import LedgerError
from dpfl.privacy.accounts import account
from privacy.test_ledger_files import BESIDE, FAULTS, damage, one_line_naming
from studies import breast_cancer_study

TINY = breast_cancer_study(
    "tiny",
    rounds=2,
    trials=1,
    algorithm={"learning_rate": 1.0},
    privacy={"noise_multiplier": [1.0, 3.0], "delta": 1e-5, "accountant": "rdp"},
)
SOME = ["truncated to half", "page size overwritten", "a page overwritten", "a page appended"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-point study and its config (`study.toml`, beside it)."""
    place = tmp_path_factory.mktemp("finished")
    (place / "study.toml").write_text(TINY, encoding="utf-8")
    runs = run_study(load(place / "study.toml"), place / "study")
    assert [r.status for r in runs] == ["finished", "finished"]
    return place


def _copy(finished: Path, tmp_path: Path) -> Path:
    shutil.copytree(finished, tmp_path, dirs_exist_ok=True)
    return tmp_path / "study"


def _commands(place: Path) -> dict[str, list[str]]:
    out = str(place / "study")
    return {
        "best": ["best", out, "-e", "100", "-d", "1e-5"],
        "report": ["report", out, "--out", str(place / "elsewhere")],
        "audit": ["audit", out, "--trials", "8", "--no-record"],
        "sweep": ["sweep", str(place / "study.toml"), "--out", out],
    }


def _sqlite_files(study: Path) -> dict[str, bytes]:
    """Every SQLite file of the study and what beside it: no -wal, -shm or -journal."""
    found = {str(p.relative_to(study)): p.read_bytes() for p in study.rglob("*.sqlite*")}
    assert not [name for name in found if name.endswith(BESIDE)], found
    return found


@pytest.mark.parametrize("target", ["results.sqlite", "a ledger"])
@pytest.mark.parametrize("fault", SOME)
def test_every_command_refuses_a_damaged_file_in_one_line(
    finished: Path, tmp_path: Path, fault: str, target: str
) -> None:
    study = _copy(finished, tmp_path)
    path = study / STORE if target == "results.sqlite" else sorted(study.glob("ledgers/*"))[0]
    damage(path, fault)
    before = _sqlite_files(study)
    for name, command in _commands(tmp_path).items():
        shown = CliRunner().invoke(app, command)
        assert shown.exit_code == 1, (name, shown.output)
        assert one_line_naming(path, shown.stderr), (name, shown.stderr)
        assert "is damaged" in shown.stderr and "Traceback" not in shown.output, name
        assert _sqlite_files(study) == before, name  # not a byte, nothing beside


@pytest.mark.parametrize("fault", FAULTS)
def test_a_damaged_store_is_refused_by_name_and_left_as_it_was(
    finished: Path, tmp_path: Path, fault: str
) -> None:
    path = _copy(finished, tmp_path) / STORE
    data = damage(path, fault)
    for create in (False, True):
        with pytest.raises(DamagedStoreError, match="nothing was written") as refused:
            ResultsStore(path, create=create)
        assert isinstance(refused.value, StoreError) and refused.value.path == path
        assert f"results store {path} is damaged (" in str(refused.value)
        assert path.read_bytes() == data and sorted(path.parent.glob("results.sqlite*")) == [path]


def test_a_sweep_resuming_a_point_with_a_damaged_ledger_stops_in_one_line(
    finished: Path, tmp_path: Path
) -> None:
    """The point is left `running`, to resume once its ledger is restored."""
    study = _copy(finished, tmp_path)
    ledger = sorted(study.glob("ledgers/*"))[0]
    with sqlite3.connect(study / STORE) as db:  # as a sweep killed during this point left it
        db.execute("UPDATE runs SET status = 'running' WHERE id = ?", (ledger.stem,))
    db.close()
    data = damage(ledger, "truncated to half")
    for jobs in ("1", "2"):
        shown = CliRunner().invoke(app, [*_commands(tmp_path)["sweep"], "-j", jobs])
        assert shown.exit_code == 1, shown.output
        assert one_line_naming(ledger, shown.stderr) and "Traceback" not in shown.output
        assert ledger.read_bytes() == data
        with ResultsStore(study / STORE, create=False) as store:
            assert store.status(ledger.stem) == "running"


def test_read_commands_create_nothing_in_a_healthy_study(finished: Path, tmp_path: Path) -> None:
    study = _copy(finished, tmp_path)
    before = _sqlite_files(study)
    stamps = {p: p.stat().st_mtime_ns for p in study.rglob("*.sqlite")}
    commands = _commands(tmp_path)
    for name in ("best", "report", "audit"):
        shown = CliRunner().invoke(app, commands[name])
        assert shown.exit_code == 0, (name, shown.output)
        assert _sqlite_files(study) == before, name
    for ledger in study.glob("ledgers/*"):
        assert CliRunner().invoke(app, ["privacy", "ledger", str(ledger)]).exit_code == 0
    assert _sqlite_files(study) == before
    assert {p: p.stat().st_mtime_ns for p in study.rglob("*.sqlite")} == stamps


def _privacy_rows(store: Path) -> list[tuple[str, int, str | None, str]]:
    with sqlite3.connect(store) as db:
        return db.execute("SELECT silo, trial, view, account FROM privacy").fetchall()


def test_each_runs_ledger_accounts_are_stored_and_read_back_by_name(
    finished: Path, tmp_path: Path
) -> None:
    """A stored run names the ledger account of each of its ε figures, and a reader
    re-reads ε at another δ from that account, not from a name it makes up again."""
    study = _copy(finished, tmp_path)
    rows = _privacy_rows(study / STORE)
    assert rows and all(name == account(silo, trial, view) for silo, trial, view, name in rows)
    with ResultsStore(study / STORE, create=False) as store:
        run = store.runs()[0]
        again = store.epsilon_by_silo(run, delta=1e-6).by_silo
    assert again and all(e > 0 for e in again.values())
    with sqlite3.connect(study / STORE) as db:
        db.execute("UPDATE privacy SET account = 'nobody/trial-0' WHERE run_id = ?", (run.id,))
    with (
        ResultsStore(study / STORE, create=False) as store,
        pytest.raises(LedgerError, match="no silo 'nobody/trial-0'"),
    ):
        store.epsilon_by_silo(store.run(run.id), delta=1e-6)


def test_a_store_from_before_account_names_is_read_as_before(
    finished: Path, tmp_path: Path
) -> None:
    """Schema 4 kept no account names: a reader opening it read-only names them itself."""
    study = _copy(finished, tmp_path)
    with ResultsStore(study / STORE, create=False) as store:
        run = store.runs()[0]
        today = store.epsilon_by_silo(run, delta=1e-6).by_silo
    with sqlite3.connect(study / STORE) as db:
        db.execute("ALTER TABLE privacy DROP COLUMN account")
        db.execute("PRAGMA user_version = 4")
    with ResultsStore(study / STORE, create=False) as store:
        assert store.epsilon_by_silo(store.run(run.id), delta=1e-6).by_silo == today
