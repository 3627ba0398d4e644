"""What a ledger keeps besides events: its owner, and values released once through it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dpfl.privacy import Ledger, events
from dpfl.privacy.errors import BudgetExceededError, LedgerError

COUNT = events.gaussian(20.0)


def _book(path: Path) -> Ledger:
    book = Ledger(path)
    for name in ("a/trial-0", "a/trial-1", "a/trial-2"):
        book.register_silo(name, epsilon=1.0, delta=1e-5)
    return book


def test_a_value_is_drawn_once_charged_first_and_kept(tmp_path: Path) -> None:
    draws: list[float] = []

    def draw() -> float:
        draws.append(101.7)
        return 101.7

    with _book(tmp_path / "l.sqlite") as book:
        charges = [("a/trial-0", COUNT), ("a/trial-1", COUNT)]
        assert book.release("count of a", charges, draw) == 101.7
        assert book.release("count of a", charges, draw) == 101.7
        assert draws == [101.7]
        assert [len(book.entries(f"a/trial-{t}")) for t in range(3)] == [1, 1, 0]
        # a later user of the value (a new trial) pays for it, once
        book.release("count of a", [("a/trial-2", COUNT)], draw)
        book.release("count of a", [("a/trial-2", COUNT)], draw)
        assert [len(book.entries(f"a/trial-{t}")) for t in range(3)] == [1, 1, 1]
    with Ledger(tmp_path / "l.sqlite") as reopened:
        assert reopened.released("count of a") == 101.7
        assert reopened.released("count of b") is None


def test_a_release_over_budget_draws_and_records_nothing(tmp_path: Path) -> None:
    def draw() -> float:
        raise AssertionError("must not be drawn")

    with _book(tmp_path / "l.sqlite") as book:
        with pytest.raises(BudgetExceededError):
            book.release("count of a", [("a/trial-0", events.gaussian(0.1))], draw)
        assert book.entries("a/trial-0") == []
        assert book.released("count of a") is None


def test_a_ledger_belongs_to_one_owner(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.sqlite") as book:
        assert book.owner is None
        book.claim("run 1")
        book.claim("run 1")
        with pytest.raises(LedgerError, match="belongs to 'run 1'"):
            book.claim("run 2")
    with Ledger(tmp_path / "l.sqlite") as book:
        assert book.owner == "run 1"


def test_a_schema_1_ledger_is_upgraded_in_place_with_its_events(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with _book(path) as book:
        book.record("a/trial-0", COUNT, round=0)
        spent = book.spent("a/trial-0").epsilon
    db = sqlite3.connect(path)
    db.execute("DROP TABLE facts")
    db.execute("DROP TABLE chain")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    with Ledger(path, upgrade=True) as book:
        assert book.spent("a/trial-0").epsilon == spent
        book.claim("run 1")
        assert book.owner == "run 1"
