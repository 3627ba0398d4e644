"""The ledger: per-silo accounts, refusal past budget, durability across crashes."""

from __future__ import annotations

import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.privacy import (
    Budget,
    BudgetExceededError,
    DeltaTooLargeWarning,
    Ledger,
    LedgerError,
    Neighbouring,
    PrivacyParameterError,
    epsilon,
    events,
)
from dpfl.privacy.ledger import plan_epsilon

STEP = events.poisson_gaussian(0.01, 1.0, steps=10)  # one round of local DP-SGD


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger(tmp_path / "study.sqlite")
    ledger.register_silo("a", epsilon=1.0, delta=1e-5, size=5000)
    ledger.register_silo("b", epsilon=3.0, delta=1e-6, size=20000)
    return ledger


def test_each_silo_composes_only_its_own_events(ledger: Ledger) -> None:
    for _ in range(5):
        ledger.record("a", STEP, label="round")
    ledger.record("b", events.gaussian(10.0), label="dp mean")
    expected_a = epsilon(events.repeat(STEP, 5), 1e-5)
    assert ledger.spent("a") == expected_a
    assert ledger.spent("b") == epsilon(events.gaussian(10.0), 1e-6)
    assert [e.label for e in ledger.entries("a")] == ["round"] * 5
    assert ledger.spent("a", accountant="rdp").epsilon > expected_a.epsilon


def test_spent_through_a_round_composes_only_that_prefix(ledger: Ledger) -> None:
    ledger.record("a", events.gaussian(50.0), label="public-free setup")  # no round: counts
    for r in range(4):
        ledger.record("a", STEP, round=r)
    for r in range(4):
        expected = epsilon(
            events.compose([events.gaussian(50.0), events.repeat(STEP, r + 1)]), 1e-5
        )
        assert ledger.spent("a", through_round=r).epsilon == pytest.approx(expected.epsilon)
    assert ledger.spent("a", through_round=3) == ledger.spent("a")


def test_refuses_past_budget_and_writes_nothing(ledger: Ledger) -> None:
    recorded = 0
    while ledger.can_afford("a", STEP):
        ledger.record("a", STEP, round=recorded)
        recorded += 1
    assert recorded > 0
    with pytest.raises(BudgetExceededError, match=r"silo 'a'.*> budget 1 at δ=1e-05"):
        ledger.record("a", STEP)
    assert len(ledger.entries("a")) == recorded
    assert ledger.spent("a").epsilon <= 1.0
    assert epsilon(events.repeat(STEP, recorded + 1), 1e-5).epsilon > 1.0


def test_a_plan_checked_up_front_is_recorded_round_by_round(ledger: Ledger) -> None:
    rounds = ledger.affordable_repeats("a", STEP)
    assert ledger.can_afford("a", events.repeat(STEP, rounds))
    assert not ledger.can_afford("a", events.repeat(STEP, rounds + 1))
    for r in range(rounds):
        ledger.record("a", STEP, round=r)
    assert ledger.spent("a").epsilon <= 1.0
    with pytest.raises(BudgetExceededError):  # the plan's end is still enforced
        ledger.record("a", STEP)


def test_a_plan_costs_what_a_ledger_charges_for_it(ledger: Ledger) -> None:
    """`plan_epsilon` (calibration's check of a silo's whole plan) is the ε a ledger
    computes for an account whose history is that plan, from the same cache."""
    plan = events.compose([events.gaussian(20.0), events.repeat(STEP, 3)])
    expected = plan_epsilon(plan, 1e-5, None)
    assert ledger.projected("a", plan) == expected
    for event in (events.gaussian(20.0), STEP, STEP, STEP):
        ledger.record("a", event)
    assert ledger.spent("a") == expected
    assert expected.epsilon == pytest.approx(epsilon(plan, 1e-5).epsilon, rel=1e-9)


def test_history_is_composed_as_a_multiset_of_leaf_events(ledger: Ledger) -> None:
    """Ten rounds of 10 steps cost exactly what 100 steps do, in any grouping."""
    single = events.poisson_gaussian(0.01, 1.0)
    for _ in range(10):
        ledger.record("a", STEP)
    ledger.record("b", events.repeat(single, 100))
    assert ledger.spent("a").epsilon == pytest.approx(
        epsilon(events.poisson_gaussian(0.01, 1.0, steps=100), 1e-5).epsilon, rel=1e-12
    )
    assert ledger.spent("b").epsilon == pytest.approx(
        epsilon(events.poisson_gaussian(0.01, 1.0, steps=100), 1e-6).epsilon, rel=1e-12
    )


def test_reopening_continues_from_what_was_spent(tmp_path: Path) -> None:
    path = tmp_path / "study.sqlite"
    with Ledger(path) as first:
        first.register_silo("a", epsilon=1.0, delta=1e-5)
        first.record("a", STEP)
        spent = first.spent("a")
    with Ledger(path) as again:
        again.register_silo("a", epsilon=1.0, delta=1e-5)  # a restarted run: no-op
        assert again.spent("a") == spent
        again.record("a", STEP)
        assert len(again.entries("a")) == 2
        with pytest.raises(LedgerError, match="refusing to change"):
            again.register_silo("a", epsilon=2.0, delta=1e-5)


def test_events_must_match_the_silos_neighbouring_relation(ledger: Ledger) -> None:
    with pytest.raises(PrivacyParameterError, match="add/remove one record neighbouring"):
        ledger.record("a", events.fixed_size_gaussian(5000, 50, 1.0))
    ledger.register_silo("c", epsilon=2.0, delta=1e-5, neighbouring=Neighbouring.REPLACE_ONE)
    ledger.record("c", events.fixed_size_gaussian(5000, 50, 2.0, steps=10))
    assert ledger.spent("c").accountant.value == "rdp"
    assert ledger.spent("c").neighbouring is Neighbouring.REPLACE_ONE


def test_bad_budgets_and_unknown_silos(ledger: Ledger) -> None:
    with pytest.raises(PrivacyParameterError, match="ε budget"):
        ledger.register_silo("x", epsilon=0.0, delta=1e-5)
    with pytest.raises(PrivacyParameterError, match="δ must lie"):
        ledger.register_silo("x", epsilon=1.0, delta=1.0)
    with pytest.warns(DeltaTooLargeWarning, match="silo of 100 records"):
        ledger.register_silo("small", epsilon=1.0, delta=0.05, size=100)
    with pytest.raises(LedgerError, match=r"no silo 'nowhere'.*silos: a, b, small"):
        ledger.record("nowhere", STEP)


def test_files_that_are_not_ledgers_are_refused_untouched(tmp_path: Path) -> None:
    text = tmp_path / "notes.sqlite"
    text.write_text("patient records, not a ledger")
    with pytest.raises(LedgerError, match="not a readable dpfl ledger"):
        Ledger(text)
    assert text.read_text() == "patient records, not a ledger"

    foreign = tmp_path / "other.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE patients (id INTEGER)")
    before = foreign.read_bytes()
    with pytest.raises(LedgerError, match="not a dpfl ledger"):
        Ledger(foreign)
    assert foreign.read_bytes() == before

    with pytest.raises(LedgerError, match="is a directory"):
        Ledger(tmp_path)
    with pytest.raises(LedgerError, match="no ledger at"):
        Ledger(tmp_path / "missing.sqlite", create=False)
    assert not (tmp_path / "missing.sqlite").exists()


def test_a_corrupted_event_row_is_reported(ledger: Ledger) -> None:
    ledger.record("a", STEP)
    with sqlite3.connect(ledger.path) as db:
        db.execute("UPDATE events SET event = '{\"broken\": 1}'")
    with pytest.raises(LedgerError, match="event #1 is corrupt"):
        ledger.entries("a")


_RECORDER = textwrap.dedent(
    """
    import sys
    from dpfl.privacy import Ledger, events
    ledger = Ledger(sys.argv[1], accountant="rdp")
    ledger.register_silo("a", epsilon=1e6, delta=1e-5)
    step = events.poisson_gaussian(0.01, 1.0)
    while True:
        entry = ledger.record("a", step, label="step")
        print(entry.id, flush=True)  # only now may the update it paid for be released
    """
)


def test_sigkill_while_recording_loses_no_committed_event(tmp_path: Path) -> None:
    path = tmp_path / "study.sqlite"
    process = subprocess.Popen(
        [sys.executable, "-c", _RECORDER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    released = [int(process.stdout.readline()) for _ in range(40)]
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL

    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with Ledger(path) as reopened:
        recorded = {entry.id for entry in reopened.entries("a")}
        assert set(released) <= recorded
        count = len(recorded)
        reopened.record("a", events.poisson_gaussian(0.01, 1.0))
        assert reopened.spent("a").epsilon == pytest.approx(
            epsilon(events.poisson_gaussian(0.01, 1.0, steps=count + 1), 1e-5).epsilon
        )


_SPENDER = textwrap.dedent(
    """
    import sys
    from dpfl.privacy import BudgetExceededError, Ledger, events
    ledger = Ledger(sys.argv[1], accountant="rdp")
    step = events.gaussian(4.0)
    spent = 0
    try:
        while True:
            ledger.record("a", step)
            spent += 1
    except BudgetExceededError:
        print(spent)
    """
)


def test_two_processes_cannot_overspend_one_budget(tmp_path: Path) -> None:
    path = tmp_path / "study.sqlite"
    with Ledger(path, accountant="rdp") as ledger:
        ledger.register_silo("a", epsilon=3.0, delta=1e-5)
        affordable = ledger.affordable_repeats("a", events.gaussian(4.0))
    workers = [
        subprocess.Popen([sys.executable, "-c", _SPENDER, str(path)], stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    counts = [int(w.communicate(timeout=120)[0]) for w in workers]
    assert sum(counts) == affordable
    with Ledger(path, accountant="rdp") as ledger:
        assert ledger.spent("a").epsilon <= 3.0


def test_an_account_without_budget_records_and_reports_but_never_refuses(tmp_path: Path) -> None:
    with Ledger(tmp_path / "study.sqlite") as ledger:
        ledger.register_silo("research", epsilon=math.inf, delta=1e-5)
        big = events.poisson_gaussian(0.5, 0.5, steps=50)
        assert ledger.can_afford("research", big)
        ledger.record("research", big)
        assert ledger.spent("research") == epsilon(big, 1e-5)
    with Ledger(tmp_path / "study.sqlite") as reopened:
        assert reopened.budget("research").epsilon == math.inf


def test_record_many_commits_all_or_nothing(ledger: Ledger) -> None:
    ledger.register_silo("tight", epsilon=0.05, delta=1e-5)
    ledger.record("b", STEP)  # ids go on from earlier entries
    entries = ledger.record_many([("a", STEP), ("b", STEP), ("a", STEP)], round=0)
    assert [e.silo for e in entries] == ["a", "b", "a"]
    stored = {e.id: e for e in [*ledger.entries("a"), *ledger.entries("b")]}
    assert [(stored[e.id].silo, stored[e.id].round) for e in entries] == [
        ("a", 0),
        ("b", 0),
        ("a", 0),
    ]
    assert ledger.spent("a") == epsilon(events.repeat(STEP, 2), 1e-5)
    with pytest.raises(BudgetExceededError, match="silo 'tight'"):
        ledger.record_many([("a", STEP), ("tight", STEP)], round=1)
    assert len(ledger.entries("a")) == 2  # the batch was refused whole
    assert ledger.entries("tight") == []


def test_register_silos_opens_all_accounts_or_none(ledger: Ledger) -> None:
    """A run's accounts in one commit: each as `register_silo` would open it, and a
    refused one (a changed budget, a bad δ) leaves every other unopened."""
    plain = Budget(1.0, 1e-5, Neighbouring.ADD_REMOVE, None)
    stored = ledger.register_silos(
        {"a": Budget(1, 1e-5, Neighbouring.ADD_REMOVE, 5000), "c": plain}
    )
    assert stored["a"] == ledger.budget("a") and stored["c"] == ledger.budget("c") == plain
    for refused, error in [
        (Budget(2.0, 1e-5, Neighbouring.ADD_REMOVE, 5000), "refusing to change"),
        (Budget(1.0, 1.0, Neighbouring.ADD_REMOVE, None), "δ must lie"),
    ]:
        with pytest.raises((LedgerError, PrivacyParameterError), match=error):
            ledger.register_silos({"d": plain, "a": refused})
        assert ledger.silos() == ["a", "b", "c"]
    with Ledger(ledger.path, create=False) as reader:  # committed: another connection sees it
        assert reader.budget("c") == plain


def _stamp(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


def test_readers_open_read_only_and_change_nothing(ledger: Ledger) -> None:
    ledger.record("a", STEP, round=0)
    ledger.close()
    before = _stamp(ledger.path)
    with Ledger(ledger.path, create=False) as reader:
        assert reader.spent("a") == epsilon(STEP, 1e-5)
        with pytest.raises(LedgerError, match=f"ledger {ledger.path}: .*readonly"):
            reader.record("a", STEP)
    assert _stamp(ledger.path) == before


def test_a_reader_reads_an_older_schema_without_upgrading_it(ledger: Ledger) -> None:
    ledger.record("a", STEP)
    ledger.close()
    db = sqlite3.connect(ledger.path)  # as dpfl wrote it before owners and released values
    db.execute("DROP TABLE facts")
    db.execute("DROP TABLE chain")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    before = _stamp(ledger.path)
    with Ledger(ledger.path, create=False) as reader:
        assert reader.owner is None and reader.released("count") is None
        assert reader.spent("a") == epsilon(STEP, 1e-5)
    assert _stamp(ledger.path) == before
    db = sqlite3.connect(ledger.path)
    assert db.execute("PRAGMA user_version").fetchone() == (1,)  # not upgraded
    db.close()
    with pytest.raises(LedgerError, match="not written to until you upgrade it"):
        Ledger(ledger.path)  # never upgraded silently
    assert _stamp(ledger.path) == before
    with Ledger(ledger.path, upgrade=True) as writer:  # with consent, upgraded in place
        writer.claim("run-1")
        assert writer.owner == "run-1"
        assert writer.verify().ok


def test_an_empty_file_is_not_a_ledger_and_stays_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    with pytest.raises(LedgerError, match=r"is empty \(0 bytes\), not a dpfl ledger"):
        Ledger(empty, create=False)
    shown = CliRunner().invoke(app, ["privacy", "ledger", str(empty)])
    assert shown.exit_code == 2
    said = " ".join(shown.stderr.split())
    assert f"{empty} is empty (0 bytes), not a dpfl ledger; nothing was written" in said
    assert empty.stat().st_size == 0


def test_a_damaged_page_names_the_file_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "study.sqlite"
    with Ledger(path, accountant="rdp") as book:
        book.register_silo("a", epsilon=math.inf, delta=1e-5)
        for r in range(300):  # enough events for many pages
            book.record("a", events.poisson_gaussian(0.01, 1.0 + r / 1000), round=r)
    data = bytearray(path.read_bytes())
    page = 4096 * (len(data) // 4096 // 2)  # a b-tree page in the middle of the file
    assert data[page] in (0x02, 0x05, 0x0A, 0x0D)
    data[page : page + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))
    before = _stamp(path)
    with pytest.raises(LedgerError, match="is damaged"):  # when opened, before any read
        Ledger(path, create=False)
    shown = CliRunner().invoke(app, ["privacy", "ledger", str(path)])
    said = " ".join(shown.stderr.split())
    assert shown.exit_code == 1, shown.output
    assert f"ledger {path} is damaged" in said and "nothing was written" in said
    assert "Traceback" not in shown.output
    assert _stamp(path) == before
