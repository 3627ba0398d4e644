"""Opening dpfl's own SQLite files (privacy ledgers, results stores) safely.

Each kind of file is marked with its own SQLite `application_id` and a schema version,
so that a ledger is never mistaken for a results store, a foreign database is refused
without being touched, and an empty file is initialised exactly once even when several
processes open it at the same moment (the schema is written inside `BEGIN IMMEDIATE`).

Readers open files read-only (`read_only=True`): a command that only reads never
creates, upgrades or rewrites a file, and it still works in a read-only directory.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_DAMAGED = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}
# A read-only connection to a WAL file needs its -shm index, which it cannot create in a
# read-only directory: SQLite then says one of these.
_NO_INDEX = {"SQLITE_READONLY_DIRECTORY", "SQLITE_CANTOPEN"}


def open_database(
    path: Path,
    *,
    kind: str,
    application_id: int,
    schema: str,
    schema_version: int,
    error: type[Exception],
    migrations: dict[int, str] | None = None,
    read_only: bool = False,
) -> sqlite3.Connection:
    """Open or create a `kind` file at `path` in WAL mode with `synchronous=FULL`;
    anything else at that path raises `error` and is left as it was. `migrations[v]`
    holds the statements that bring schema v to v + 1 (applied in one transaction each,
    so an older file is upgraded in place and never left half-way).

    `read_only` opens an existing file without ever writing to it (no schema, no
    upgrade: an older schema that `migrations` can upgrade is read as it is, so callers
    check `schema_of`), and the connection refuses writes."""
    if path.is_dir():
        raise error(f"{path} is a directory, not a {kind} file")
    if read_only:
        db = _connect_read_only(path, kind, error)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    try:
        app_id, version = _identity(db)
        if app_id == 0 and _is_empty(db):
            if read_only:
                raise error(
                    f"{path} is empty ({path.stat().st_size} bytes), not a dpfl {kind}; "
                    "nothing was written"
                )
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
        upgradable = migrations or {}
        while not read_only and version < schema_version and version in upgradable:
            _migrate(db, upgradable[version], version + 1)
            app_id, version = _identity(db)
        if version != schema_version and not (read_only and version in upgradable):
            raise error(
                f"{path} is a dpfl {kind} of schema {version}; this dpfl reads schema "
                f"{schema_version}"
            )
        db.execute("PRAGMA query_only = ON" if read_only else "PRAGMA synchronous = FULL")
        db.execute("PRAGMA foreign_keys = ON")
    except sqlite3.DatabaseError as exc:
        db.close()
        raise error(f"{path} is not a readable dpfl {kind} ({exc}); nothing was written") from exc
    except error:
        db.close()
        raise
    return db


def schema_of(db: sqlite3.Connection) -> int:
    """The schema version of an open file (older than the current one only if it was
    opened read-only)."""
    return _identity(db)[1]


@contextmanager
def write_transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One `BEGIN IMMEDIATE` transaction (the write lock is taken up front, so checks made
    inside it still hold at commit), rolled back on any error or interrupt."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        if db.in_transaction:  # SQLite may have rolled back already (a damaged file)
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


@contextmanager
def database_errors(path: Path, kind: str, error: type[Exception]) -> Iterator[None]:
    """Turn SQLite's errors while using the `kind` file at `path` into `error`, naming the
    file: a damaged page is a message for a person, not a traceback. Writes happen in
    transactions that such an error rolls back, so nothing was written."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", "") in _DAMAGED:
            raise error(
                f"{kind} {path} is damaged ({exc}); nothing was written. Restore the file "
                "from a backup: what it recorded cannot be recomputed"
            ) from exc
        raise error(f"{kind} {path}: {exc}; nothing was written") from exc


def _connect_read_only(path: Path, kind: str, error: type[Exception]) -> sqlite3.Connection:
    """`mode=ro`, which sees what concurrent writers commit; in a read-only directory,
    where the WAL index cannot be created, `immutable=1`, which is exact there as long
    as no write-ahead log holds changes not yet merged into the file."""
    if not path.is_file():
        raise error(f"no {kind} at {path}")
    uri = path.resolve().as_uri()
    db = sqlite3.connect(f"{uri}?mode=ro", uri=True, isolation_level=None, timeout=30.0)
    try:
        _identity(db)  # opens the WAL index, if the file has one
        return db
    except sqlite3.OperationalError as exc:
        db.close()
        if getattr(exc, "sqlite_errorname", "") not in _NO_INDEX:
            raise error(
                f"{path} is not a readable dpfl {kind} ({exc}); nothing was written"
            ) from exc
        wal = path.with_name(path.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise error(
                f"{path} cannot be read in a read-only directory: its latest changes are "
                f"still in {wal.name}, which needs an index SQLite cannot create here; copy "
                "the directory somewhere writable to read it"
            ) from exc
    return sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None)


def _migrate(db: sqlite3.Connection, statements: str, version: int) -> None:
    with write_transaction(db):
        if _identity(db)[1] == version:  # another process upgraded it meanwhile
            return
        for statement in statements.split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute(f"PRAGMA user_version = {version}")


def _is_empty(db: sqlite3.Connection) -> bool:
    return int(db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]) == 0


def _identity(db: sqlite3.Connection) -> tuple[int, int]:
    app_id = db.execute("PRAGMA application_id").fetchone()[0]
    version = db.execute("PRAGMA user_version").fetchone()[0]
    return int(app_id), int(version)
