"""Opening dpfl's own SQLite files (privacy ledgers, results stores) safely.

Each kind of file is marked with its own SQLite `application_id` and a schema version,
so that a ledger is never mistaken for a results store, a foreign database is refused
without being touched, and an empty file is initialised exactly once even when several
processes open it at the same moment (the schema is written inside `BEGIN IMMEDIATE`).

Readers open files read-only (`read_only=True`): a command that only reads never
creates, upgrades or rewrites a file, creates nothing beside it (no `-wal`, `-shm` or
`-journal`), and still works in a read-only directory.

Every open runs `PRAGMA quick_check` and checks the file's size against its pages, so a
truncated or overwritten file, or one with bytes appended, is refused by name
(`DamagedFileError`) before anything is read from it or written to it, and is left as it
was. SQLite keeps no checksums: a changed byte inside a stored value is not detected.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_DAMAGED = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}
_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite file
# A read-only connection to a WAL file needs its -shm index, which it cannot create in a
# read-only directory: SQLite then says one of these.
_NO_INDEX = {"SQLITE_READONLY_DIRECTORY", "SQLITE_CANTOPEN"}


Migration = str | Callable[[sqlite3.Connection], None]
"""How schema v becomes v + 1: SQL statements, or a function run on the connection."""


@dataclass(frozen=True)
class Consent:
    """An upgrade that is never made silently: files of schema `since` or older are
    upgraded only where `given`; otherwise opening one for writing raises `error` with
    `how` (what the user runs to give it). Read-only opens read them as they are."""

    since: int
    given: bool
    how: str
    error: type[Exception]

    def check(self, path: Path, version: int) -> None:
        if version <= self.since and not self.given:
            raise self.error(
                f"{path} was written by an older dpfl (schema {version}); it is read as it "
                f"is, but not written to until you upgrade it: {self.how}"
            )


class DamagedFileError(Exception):
    """A dpfl SQLite file that is not as SQLite wrote it (truncated, overwritten, bytes
    appended): refused by name and never modified. Each kind of file has a subclass that
    is also its kind's error (`LedgerError`, `StoreError`); the `dpfl` command prints it
    as one line and exits with status 1."""

    path: Path
    remedy = "restore it from a backup"

    @classmethod
    def of(cls, path: Path, kind: str, reason: str) -> DamagedFileError:
        """The error for the `kind` file at `path`, in one line whatever SQLite said."""
        error = cls(
            f"{kind} {path} is damaged ({' '.join(reason.split())}); nothing was written; "
            f"{cls.remedy}"
        )
        error.path = path
        return error


def open_database(
    path: Path,
    *,
    kind: str,
    application_id: int,
    schema: str,
    schema_version: int,
    error: type[Exception],
    damaged: type[DamagedFileError],
    migrations: Mapping[int, Migration] | None = None,
    read_only: bool = False,
    consent: Consent | None = None,
) -> sqlite3.Connection:
    """Open or create a `kind` file at `path` in WAL mode with `synchronous=FULL`;
    anything else at that path raises `error` (`damaged` for a damaged file) and is left
    as it was. `migrations[v]` holds the statements that bring schema v to v + 1 (applied
    in one transaction each, so an older file is upgraded in place and never left
    half-way): SQL statements, or a function that makes the change on the connection.
    With `consent`, an upgrade from its version on is made only where it was given; a
    file of that version or older is otherwise refused, saying how to give it.

    `read_only` opens an existing file without ever writing to it (no schema, no
    upgrade: an older schema that `migrations` can upgrade is read as it is, so callers
    check `schema_of`), and the connection refuses writes."""
    if path.is_dir():
        raise error(f"{path} is a directory, not a {kind} file")
    if path.is_file() and path.stat().st_size > 0:
        with path.open("rb") as head:
            if head.read(len(_MAGIC)) != _MAGIC:
                raise error(
                    f"{path} is not a readable dpfl {kind} (not an SQLite file); "
                    "nothing was written"
                )
    if read_only:
        db = _connect_read_only(path, kind, error, damaged)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    try:
        _check_intact(db, path, kind, damaged)
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
        if not read_only and consent is not None and version < schema_version:
            consent.check(path, version)
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
        if getattr(exc, "sqlite_errorname", "") in _DAMAGED:
            raise damaged.of(path, kind, str(exc)) from exc
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
def database_errors(
    path: Path, kind: str, error: type[Exception], damaged: type[DamagedFileError]
) -> Iterator[None]:
    """Turn SQLite's errors while using the `kind` file at `path` into `error` (`damaged`
    for a damaged page), naming the file: a message for a person, not a traceback. Writes
    happen in transactions that such an error rolls back, so nothing was written."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", "") in _DAMAGED:
            raise damaged.of(path, kind, str(exc)) from exc
        raise error(f"{kind} {path}: {exc}; nothing was written") from exc


def _connect_read_only(
    path: Path, kind: str, error: type[Exception], damaged: type[DamagedFileError]
) -> sqlite3.Connection:
    """Without a write-ahead log beside the file, no connection has it open and all it
    holds is in the file: `immutable=1`, which reads it exactly and creates nothing
    (`mode=ro` would create the `-wal` and `-shm` files of a WAL database). With one (a
    writer at work, or one that was killed), `mode=ro`, which sees what it committed
    through the writer's own `-shm` index; in a read-only directory, where a missing
    index cannot be created, `immutable=1` again if the log holds nothing."""
    if not path.is_file():
        raise error(f"no {kind} at {path}")
    uri = path.resolve().as_uri()
    wal = path.with_name(path.name + "-wal")
    if not wal.exists():
        return sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None)
    db = sqlite3.connect(f"{uri}?mode=ro", uri=True, isolation_level=None, timeout=30.0)
    try:
        _identity(db)  # opens the WAL index
        return db
    except sqlite3.DatabaseError as exc:
        db.close()
        name = getattr(exc, "sqlite_errorname", "")
        if name in _DAMAGED:
            raise damaged.of(path, kind, str(exc)) from exc
        if name not in _NO_INDEX:
            raise error(
                f"{path} is not a readable dpfl {kind} ({exc}); nothing was written"
            ) from exc
        if wal.exists() and wal.stat().st_size > 0:
            raise error(
                f"{path} cannot be read in a read-only directory: its latest changes are "
                f"still in {wal.name}, which needs an index SQLite cannot create here; copy "
                "the directory somewhere writable to read it"
            ) from exc
    return sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None)


def _migrate(db: sqlite3.Connection, migration: Migration, version: int) -> None:
    with write_transaction(db):
        if _identity(db)[1] == version:  # another process upgraded it meanwhile
            return
        if callable(migration):
            migration(db)
        else:
            for statement in migration.split(";"):
                if statement.strip():
                    db.execute(statement)
        db.execute(f"PRAGMA user_version = {version}")


def _check_intact(
    db: sqlite3.Connection, path: Path, kind: str, damaged: type[DamagedFileError]
) -> None:
    """Refuse a damaged file before anything reads or writes it: SQLite's quick check of
    its pages, and its size, which is a whole number of pages and no more than the
    database's (dpfl never shrinks a file, so a longer one had bytes appended)."""
    problems = [row[0] for row in db.execute("PRAGMA quick_check(3)")]
    if problems != ["ok"]:
        raise damaged.of(path, kind, "; ".join(problems))
    size = path.stat().st_size  # before the page count, which a concurrent writer only raises
    page_size = int(db.execute("PRAGMA page_size").fetchone()[0])
    pages = int(db.execute("PRAGMA page_count").fetchone()[0])
    if size % page_size:
        raise damaged.of(
            path, kind, f"{size} bytes is not a whole number of {page_size}-byte pages"
        )
    if size > pages * page_size:
        raise damaged.of(path, kind, f"{size - pages * page_size} bytes follow its last page")


def _is_empty(db: sqlite3.Connection) -> bool:
    return int(db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]) == 0


def _identity(db: sqlite3.Connection) -> tuple[int, int]:
    app_id = db.execute("PRAGMA application_id").fetchone()[0]
    version = db.execute("PRAGMA user_version").fetchone()[0]
    return int(app_id), int(version)
