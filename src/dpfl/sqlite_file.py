"""Opening dpfl's own SQLite files (privacy ledgers, results stores) safely.

Each kind of file is marked with its own SQLite `application_id` and a schema version,
so that a ledger is never mistaken for a results store, a foreign database is refused
without being touched, and an empty file is initialised exactly once even when several
processes open it at the same moment (the schema is written inside `BEGIN IMMEDIATE`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def open_database(
    path: Path,
    *,
    kind: str,
    application_id: int,
    schema: str,
    schema_version: int,
    error: type[Exception],
) -> sqlite3.Connection:
    """Open or create a `kind` file at `path` in WAL mode with `synchronous=FULL`;
    anything else at that path raises `error` and is left as it was."""
    if path.is_dir():
        raise error(f"{path} is a directory, not a {kind} file")
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    try:
        app_id, version = _identity(db)
        if app_id == 0 and _is_empty(db):
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("BEGIN IMMEDIATE")
            if _is_empty(db):  # another process may have created it meanwhile
                for statement in schema.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA application_id = {application_id}")
                db.execute(f"PRAGMA user_version = {schema_version}")
            db.execute("COMMIT")
            app_id, version = _identity(db)
        if app_id != application_id:
            raise error(f"{path} is an SQLite file but not a dpfl {kind}")
        if version != schema_version:
            raise error(
                f"{path} is a dpfl {kind} of schema {version}; this dpfl reads schema "
                f"{schema_version}"
            )
        db.execute("PRAGMA synchronous = FULL")
        db.execute("PRAGMA foreign_keys = ON")
    except sqlite3.DatabaseError as exc:
        db.close()
        raise error(f"{path} is not a readable dpfl {kind}: {exc}") from exc
    except error:
        db.close()
        raise
    return db


@contextmanager
def write_transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One `BEGIN IMMEDIATE` transaction (the write lock is taken up front, so checks made
    inside it still hold at commit), rolled back on any error or interrupt."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _is_empty(db: sqlite3.Connection) -> bool:
    return int(db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]) == 0


def _identity(db: sqlite3.Connection) -> tuple[int, int]:
    app_id = db.execute("PRAGMA application_id").fetchone()[0]
    version = db.execute("PRAGMA user_version").fetchone()[0]
    return int(app_id), int(version)
