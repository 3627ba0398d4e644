"""A ledger's tables written with their chain entries, and read back against them.

Every row a ledger writes to its tables (`silos`, `memberships`, `datasets`, `events`,
`facts`) goes in through `write`, which appends the same row to the hash chain in the same
transaction (`dpfl.privacy.chain`). The tables answer queries fast; the chain is what they
must hold: `differences` rebuilds every table from the chain and names each row that
differs, is missing or was never written by dpfl. `chain_rows` turns an older ledger's
tables into chain entries when the user upgrades it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dpfl.privacy import chain

TABLES: Mapping[str, tuple[str, ...]] = {
    "datasets": ("dataset", "epsilon", "delta", "neighbouring", "created_at"),
    "silos": ("silo", "epsilon", "delta", "size", "neighbouring", "created_at"),
    "memberships": ("silo", "study", "dataset"),
    "events": ("id", "silo", "round", "label", "event", "recorded_at"),
    "facts": ("key", "value", "recorded_at"),
}
"""Each mirrored table's columns, its key first."""
_KIND = {table: table for table in TABLES}
_BATCH = 1000
"""Rows an upgrade puts in one chain entry."""


def write(db: sqlite3.Connection, table: str, rows: Sequence[Sequence[Any]]) -> None:
    """Insert `rows` (every column of `table`, in order) and append them to the chain, in
    the caller's write transaction."""
    if not rows:
        return
    columns = TABLES[table]
    marks = ", ".join("?" * len(columns))
    db.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)
    chain.append(db, table, {"rows": [list(row) for row in rows]})


def chain_rows(db: sqlite3.Connection) -> None:
    """Append every row an older ledger holds to its new chain (an upgrade's one
    transaction), after a genesis that says so."""
    chain.append(db, "upgraded", {"from_schema": 3})
    for table, columns in TABLES.items():
        rows = db.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY rowid").fetchall()
        for start in range(0, len(rows), _BATCH):
            chain.append(db, table, {"rows": [list(row) for row in rows[start : start + _BATCH]]})


def differences(db: sqlite3.Connection, links: Iterable[chain.Link]) -> list[str]:
    """Every row of the tables that is not as the chain recorded it, in words."""
    expected: dict[str, dict[Any, tuple[Any, ...]]] = {table: {} for table in TABLES}
    where: dict[tuple[str, Any], int] = {}
    for link in links:
        if link.kind in TABLES:
            for row in link.data["rows"]:
                expected[link.kind][row[0]] = tuple(row)
                where[link.kind, row[0]] = link.seq
    problems = []
    for table, columns in TABLES.items():
        found = {
            row[0]: tuple(row)
            for row in db.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY rowid")
        }
        for key, row in found.items():
            if key not in expected[table]:
                problems.append(f"{table} row {_show(key)} was not written by dpfl: {_show(row)}")
            elif expected[table][key] != row:
                changed = _changed(columns, expected[table][key], row)
                problems.append(
                    f"{table} row {_show(key)} was changed: {changed} "
                    f"(chain entry {where[table, key]})"
                )
        for key in expected[table].keys() - found.keys():
            problems.append(
                f"{table} row {_show(key)} was deleted (chain entry {where[table, key]})"
            )
    return problems


def _changed(columns: Sequence[str], was: Sequence[Any], now: Sequence[Any]) -> str:
    return ", ".join(
        f"{column} {_show(a)} → {_show(b)}"
        for column, a, b in zip(columns, was, now, strict=True)
        if a != b
    )


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else f"{text[:117]}..."
