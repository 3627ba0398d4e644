"""The results store: one SQLite file per study, readable by pandas, DuckDB or `sqlite3`.

Tables (long format, one number a row, so that any grouping is one SQL query):

* `runs`: one row per grid point (id = hash of its resolved config), its config and grid
  coordinates as JSON, status (`running`, `finished`, `failed`), the noise multiplier it
  ran with, timings, the path of its privacy ledger and its privacy datasheet (JSON).
* `metrics`: (run, trial, round, silo, metric, value); `silo` NULL is the union of the
  silos' test sets.
* `privacy`: (run, trial, round, silo, view, accountant, delta, epsilon, account), read
  off the run's ledger; `view` NULL is the server's view (the one budgets bind);
  `account` (schema 5) the ledger account the figure was read from, which a reader
  re-reads it from (NULL in older stores: named by `dpfl.privacy.accounts.account`).
* `communication`: (run, trial, round, silo, bytes_down, bytes_up, messages).
* `cross_silo` (schema 2): (run, trial, round, model_silo, test_silo, metric, value), for
  runs asked to score every silo's final model on every silo's test set (`cross_silo =
  true`); `model_silo` NULL is the one model every silo shared (a non-personalised
  algorithm).
* `reported_privacy` (schema 3): (run, silo, accountant, epsilon), for a deployed run
  (`dpfl.experiments.study.deployment`): the ε each hospital last reported from its own ledger, at
  its own δ (which the server is not told). The server keeps no ledger, so such a run's
  `runs.epsilon_source` is `hospitals` and it has no `privacy` rows; a simulated run's
  is `ledger`.
* `audit_bounds` (schema 4): (run, audited_at, method, silo, observer, canary, trials,
  confidence, delta, epsilon_lower, epsilon_ledger, detail), one row per ε lower bound
  that `dpfl audit` measured for a finished run (`dpfl.audit`: `two-world` or `one-run`;
  `trials` is trials a world, or the canaries of the one run; `detail` the attack's
  counts as JSON). Every audit is kept: the report shows each kind's latest.
* `audit_membership` (schema 4): (run, audited_at, silo, model, attack, auc,
  tpr_at_fpr_0_1, tpr_at_fpr_1, members, non_members, trials, shadows, folds), one row
  per membership-inference attack (`loss`, `lira`) on a silo's `shared` or `personal`
  final models. Audit figures are measurements on the training records, not DP releases.

A store of an older schema is upgraded in place when opened for writing (it keeps all
its rows, gains the empty tables, and its runs are marked `ledger`, which they were);
read-only, it is read as it is.

A run's rows and its `finished` status are written in one transaction: a run killed
half-way leaves no partial results, and a restarted sweep simply runs it again. Nothing
ever deletes a finished run's rows: starting it again, or failing it, is refused. A run's
ledger must have been claimed by that run (`Ledger.claim(run id)`); one copied in from
another run is refused wherever runs are read.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpfl.experiments.study import spending
from dpfl.privacy import Ledger
from dpfl.privacy.accounts import account
from dpfl.sqlite_file import DamagedFileError, open_database, schema_of, write_transaction

_APPLICATION_ID = 0x64706672  # "dpfr": a dpfl results store
_SCHEMA_VERSION = 5
FROM_LEDGER = "ledger"
"""A run's ε read off its own ledger (a simulated run)."""
REPORTED_BY_HOSPITALS = "hospitals"
"""A run's ε as each hospital reported it from its own ledger (a deployed run)."""
_EPSILON_SOURCE = (
    f"epsilon_source TEXT NOT NULL DEFAULT '{FROM_LEDGER}'"
    f" CHECK (epsilon_source IN ('{FROM_LEDGER}', '{REPORTED_BY_HOSPITALS}'))"
)
_CROSS_SILO = """
CREATE TABLE cross_silo (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    trial INTEGER NOT NULL,
    round INTEGER NOT NULL,
    model_silo TEXT,
    test_silo TEXT NOT NULL,
    metric TEXT NOT NULL,
    value REAL
);
CREATE INDEX cross_silo_run ON cross_silo (run_id)
"""
_REPORTED_PRIVACY = """
CREATE TABLE reported_privacy (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    silo TEXT NOT NULL,
    accountant TEXT NOT NULL,
    epsilon REAL NOT NULL
);
CREATE INDEX reported_privacy_run ON reported_privacy (run_id)
"""
_AUDITS = """
CREATE TABLE audit_bounds (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    audited_at REAL NOT NULL,
    method TEXT NOT NULL CHECK (method IN ('two-world', 'one-run')),
    silo TEXT NOT NULL,
    observer TEXT NOT NULL,
    canary TEXT NOT NULL,
    trials INTEGER NOT NULL,
    confidence REAL NOT NULL,
    delta REAL NOT NULL,
    epsilon_lower REAL NOT NULL,
    epsilon_ledger REAL NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX audit_bounds_run ON audit_bounds (run_id);
CREATE TABLE audit_membership (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    audited_at REAL NOT NULL,
    silo TEXT NOT NULL,
    model TEXT NOT NULL CHECK (model IN ('shared', 'personal')),
    attack TEXT NOT NULL,
    auc REAL NOT NULL,
    tpr_at_fpr_0_1 REAL NOT NULL,
    tpr_at_fpr_1 REAL NOT NULL,
    members INTEGER NOT NULL,
    non_members INTEGER NOT NULL,
    trials INTEGER NOT NULL,
    shadows INTEGER NOT NULL,
    folds INTEGER NOT NULL
);
CREATE INDEX audit_membership_run ON audit_membership (run_id)
"""
_MIGRATIONS = {
    1: _CROSS_SILO,  # schema 1 had no cross-silo scores
    2: f"ALTER TABLE runs ADD COLUMN {_EPSILON_SOURCE};{_REPORTED_PRIVACY}",  # nor deployments
    3: _AUDITS,  # nor audits
    4: "ALTER TABLE privacy ADD COLUMN account TEXT",  # nor the accounts' names
}
_TABLES = (
    "metrics",
    "privacy",
    "communication",
    "cross_silo",
    "reported_privacy",
    "audit_bounds",
    "audit_membership",
)
_SINCE = {"cross_silo": 2, "reported_privacy": 3, "audit_bounds": 4, "audit_membership": 4}
"""The schema that added each table (an older store opened read-only has none)."""
_SCHEMA = (
    """
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    study TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    config TEXT NOT NULL,
    grid TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('running', 'finished', 'failed')),
    error TEXT,
    trials INTEGER NOT NULL,
    rounds INTEGER NOT NULL,
    rounds_completed INTEGER,
    noise_multiplier REAL,
    stopped_by_budget INTEGER,
    seconds REAL,
    started_at REAL NOT NULL,
    finished_at REAL,
    ledger TEXT,
    datasheet TEXT,
    """
    + _EPSILON_SOURCE
    + """
);
CREATE TABLE metrics (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    trial INTEGER NOT NULL,
    round INTEGER NOT NULL,
    silo TEXT,
    metric TEXT NOT NULL,
    value REAL
);
CREATE INDEX metrics_run ON metrics (run_id, metric);
CREATE TABLE privacy (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    trial INTEGER NOT NULL,
    round INTEGER NOT NULL,
    silo TEXT NOT NULL,
    view TEXT,
    accountant TEXT NOT NULL,
    delta REAL NOT NULL,
    epsilon REAL NOT NULL,
    account TEXT
);
CREATE INDEX privacy_run ON privacy (run_id);
CREATE TABLE communication (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    trial INTEGER NOT NULL,
    round INTEGER NOT NULL,
    silo TEXT NOT NULL,
    bytes_down INTEGER NOT NULL,
    bytes_up INTEGER NOT NULL,
    messages INTEGER NOT NULL
);
CREATE INDEX communication_run ON communication (run_id);
"""
    + _CROSS_SILO
    + ";"
    + _REPORTED_PRIVACY
    + ";"
    + _AUDITS
)


class StoreError(ValueError):
    """The file is not a results store, or a run is not in it."""


class DamagedStoreError(StoreError, DamagedFileError):
    """The results store is damaged; nothing was written to it."""

    remedy = "restore it from a backup, or run the study again in a new directory"


@dataclass(frozen=True)
class RunRow:
    """One run as stored: its config and grid point are parsed back from JSON."""

    id: str
    study: str
    algorithm: str
    config: dict[str, Any]
    grid: dict[str, Any]
    status: str
    error: str | None
    trials: int
    rounds: int
    rounds_completed: int | None
    noise_multiplier: float | None
    stopped_by_budget: bool
    seconds: float | None
    ledger: Path | None
    datasheet: dict[str, Any]
    epsilon_source: str = FROM_LEDGER
    """`FROM_LEDGER` or `REPORTED_BY_HOSPITALS` (see the module docstring)"""

    @property
    def last_round(self) -> int:
        """The run's final round (earlier than planned if it stopped at its budget)."""
        return (self.rounds_completed or self.rounds) - 1

    @property
    def reported(self) -> bool:
        """Whether the run's ε is the hospitals' own report (a deployment), not its ledger's."""
        return self.epsilon_source == REPORTED_BY_HOSPITALS


@dataclass(frozen=True)
class RunResults:
    """What a finished run adds to the store: rows of the three result tables."""

    rounds_completed: int
    noise_multiplier: float | None
    stopped_by_budget: bool
    seconds: float
    ledger: Path | None
    datasheet: Mapping[str, Any]
    metrics: Sequence[tuple[int, int, str | None, str, float | None]]
    """(trial, round, silo or None for the union, metric, value; NaN or None if undefined)"""
    privacy: Sequence[tuple[int, int, str, str | None, str, float, float, str]]
    """(trial, round, silo, view or None, accountant, delta, epsilon, ledger account)"""
    communication: Sequence[tuple[int, int, str, int, int, int]]
    """(trial, round, silo, bytes_down, bytes_up, messages)"""
    cross_silo: Sequence[tuple[int, int, str | None, str, str, float | None]] = ()
    """(trial, round, model silo or None for the shared model, test silo, metric, value)"""
    reported_privacy: Sequence[tuple[str, str, float]] = ()
    """(silo, accountant, ε) as each hospital of a deployment last reported it"""


def enforcing_accountant(run: RunRow) -> str:
    """The accountant that held the run's silos to their budgets: PLD unless the run's
    ledger enforced with RDP."""
    return str(run.datasheet.get("accountant") or "pld")


@dataclass(frozen=True)
class SiloEpsilons:
    """ε per silo of one run, each the largest over its trials (see
    `ResultsStore.epsilon_by_silo`); no silos for a run that accounted none."""

    accountant: str
    by_silo: dict[str, float]
    delta: dict[str, float]
    """each silo's δ (or the δ asked for); none for ε the hospitals reported, each at
    its own δ, which the server is not told"""
    reported: bool = False
    """ε as each hospital reported it from its own ledger (a deployment), not read off
    the run's ledger"""

    @property
    def max(self) -> float:
        """The largest ε over silos and trials; ∞ if none was accounted (non-private)."""
        return max(self.by_silo.values(), default=math.inf)


class ResultsStore:
    """A study's results (see the module docstring); safe to share between processes."""

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        """`create=False` opens an existing store read-only (readers never write)."""
        self.path = Path(path)
        self._db = open_database(
            self.path,
            kind="results store",
            application_id=_APPLICATION_ID,
            schema=_SCHEMA,
            schema_version=_SCHEMA_VERSION,
            error=StoreError,
            damaged=DamagedStoreError,
            migrations=_MIGRATIONS,
            read_only=not create,
        )

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ----------------------------------------------------------------------

    def start(
        self,
        run_id: str,
        *,
        study: str,
        algorithm: str,
        config: Mapping[str, Any],
        grid: Mapping[str, Any],
        trials: int,
        rounds: int,
        epsilon_source: str = FROM_LEDGER,
    ) -> bool:
        """Mark a run as running (again, after an unfinished or failed attempt); False,
        changing nothing, if it has finished. `epsilon_source` says where its ε will come
        from (see the module docstring)."""
        with write_transaction(self._db) as db:
            if self.status(run_id) == "finished":
                return False
            db.execute(
                "INSERT INTO runs (id, study, algorithm, config, grid, status, trials, rounds,"
                " started_at, epsilon_source) VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET study = excluded.study,"
                " algorithm = excluded.algorithm, config = excluded.config,"
                " grid = excluded.grid, status = 'running', error = NULL,"
                " trials = excluded.trials, rounds = excluded.rounds,"
                " started_at = excluded.started_at, finished_at = NULL,"
                " epsilon_source = excluded.epsilon_source",
                (
                    run_id,
                    study,
                    algorithm,
                    json.dumps(config, sort_keys=True),
                    json.dumps(grid, sort_keys=True),
                    trials,
                    rounds,
                    time.time(),
                    epsilon_source,
                ),
            )
            return True

    def finish(self, run_id: str, results: RunResults) -> None:
        """Write a run's results and mark it finished, all in one transaction."""
        self._end(run_id, "finished", None, results)

    def fail(self, run_id: str, error: str, results: RunResults | None = None) -> None:
        """Mark a running run failed with `error`, in one transaction with what it did
        before it stopped, if given (a deployment stopped after some rounds keeps the ε
        its hospitals reported); with nothing given it has no result rows."""
        self._end(run_id, "failed", error, results)

    def _end(self, run_id: str, status: str, error: str | None, results: RunResults | None) -> None:
        with write_transaction(self._db) as db:
            self._require_running(run_id)
            for table in _TABLES:
                db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            db.execute(
                "UPDATE runs SET status = ?, error = ?, finished_at = ? WHERE id = ?",
                (status, error, time.time(), run_id),
            )
            if results is None:
                return
            for table, rows in [
                ("metrics", results.metrics),
                ("privacy", results.privacy),
                ("communication", results.communication),
                ("cross_silo", results.cross_silo),
                ("reported_privacy", results.reported_privacy),
            ]:
                if rows:
                    marks = ", ".join("?" * (1 + len(rows[0])))
                    db.executemany(
                        f"INSERT INTO {table} VALUES ({marks})", ((run_id, *row) for row in rows)
                    )
            db.execute(
                "UPDATE runs SET rounds_completed = ?, noise_multiplier = ?,"
                " stopped_by_budget = ?, seconds = ?, ledger = ?, datasheet = ? WHERE id = ?",
                (
                    results.rounds_completed,
                    results.noise_multiplier,
                    int(results.stopped_by_budget),
                    results.seconds,
                    None if results.ledger is None else str(results.ledger),
                    json.dumps(results.datasheet, sort_keys=True),
                    run_id,
                ),
            )

    def record_audit(
        self,
        run_id: str,
        bounds: Sequence[Mapping[str, Any]],
        membership: Sequence[Mapping[str, Any]],
    ) -> None:
        """Keep one audit of a finished run: rows of `audit_bounds` and `audit_membership`
        as column -> value (all but `run_id` and `audited_at`, which this sets), in one
        transaction; earlier audits stay."""
        at = time.time()
        with write_transaction(self._db) as db:
            if self.status(run_id) != "finished":
                raise StoreError(f"run {run_id} is not finished: only finished runs are audited")
            for table, rows in (("audit_bounds", bounds), ("audit_membership", membership)):
                for row in rows:
                    columns = ", ".join(("run_id", "audited_at", *row))
                    marks = ", ".join("?" * (2 + len(row)))
                    db.execute(
                        f"INSERT INTO {table} ({columns}) VALUES ({marks})",
                        (run_id, at, *row.values()),
                    )

    # -- reading ----------------------------------------------------------------------

    def runs(self, *, status: str | None = None) -> list[RunRow]:
        return self._select("WHERE status = ?" if status else "", (status,) if status else ())

    def run(self, run_id: str) -> RunRow:
        matches = self._select("WHERE id = ?", (run_id,))
        if not matches:
            raise StoreError(f"no run {run_id!r} in {self.path}")
        return matches[0]

    def ledger_of(self, run: RunRow) -> Path:
        """The run's privacy ledger (stored relative to the store's folder), refused if
        another run claimed it."""
        if run.reported:
            raise StoreError(
                f"run {run.id} was deployed: its ε was reported by the hospitals, each from "
                "its own ledger (`dpfl privacy ledger` at each hospital); the server has none"
            )
        if run.ledger is None:
            raise StoreError(f"run {run.id} has no ledger (it did not finish)")
        owned_ledger(self.path.parent / run.ledger, run.id).close()
        return self.path.parent / run.ledger

    def status(self, run_id: str) -> str | None:
        row = self._db.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else str(row[0])

    def rows(self, table: str, run_id: str | None = None) -> list[dict[str, Any]]:
        """Every row of one of the tables (of one run) as dicts, in the order written; none
        of a table newer than a store opened read-only."""
        if table not in _TABLES:
            raise StoreError(f"no table {table!r}: {', '.join(_TABLES)}")
        if schema_of(self._db) < _SINCE.get(table, 1):
            return []
        where = "" if run_id is None else " WHERE run_id = ?"
        cursor = self._db.execute(
            f"SELECT * FROM {table}{where} ORDER BY rowid", () if run_id is None else (run_id,)
        )
        names = [c[0] for c in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]

    def final_metric(self, run: RunRow, metric: str, silo: str | None = None) -> list[float]:
        """The metric after the run's last round, one value per trial, on the union of the
        test sets or on `silo`'s; undefined values (NULL, NaN) are left out."""
        return [
            row["value"]
            for row in self.rows("metrics", run.id)
            if row["metric"] == metric
            and row["round"] == run.last_round
            and row["silo"] == silo
            and row["value"] is not None
            and not math.isnan(row["value"])
        ]

    def epsilon_by_silo(
        self,
        run: RunRow,
        view: str | None = None,
        accountant: str | None = None,
        *,
        delta: float | None = None,
        through_round: int | None = None,
    ) -> SiloEpsilons:
        """What each silo is promised: the largest ε over the run's trials (each trial is
        a separate account, and trials spend differently under client sampling), after
        `through_round` (default: the run's last), by `accountant` (default: the one that
        enforced the budgets), against `view` (None: the server, whom budgets bind), at
        each silo's δ, or re-read from the run's ledger at `delta` if given. The one
        place every ε shown for a run comes from.

        A deployed run's ε is what each hospital last reported, by its own accountant, in
        the server's view, at its own δ (`SiloEpsilons.reported`): none by another
        accountant, view or earlier round, and it cannot be re-read at another δ (refused
        with `StoreError`), since the ledgers are at the hospitals. A hospital that never
        reported has no ε here: in a finished run it never trained (it was charged nothing);
        in a stopped one it may have been charged for the round it stopped in."""
        accountant = accountant or enforcing_accountant(run)
        last = run.last_round if through_round is None else through_round
        if run.reported:
            if delta is not None:
                raise StoreError(
                    f"run {run.id} was deployed: its hospitals reported ε at their own δ, "
                    f"which cannot be re-read at δ = {delta:g} without their ledgers"
                )
            reported = (
                self.rows("reported_privacy", run.id)
                if view is None and last == run.last_round
                else []
            )
            by_silo = {r["silo"]: r["epsilon"] for r in reported if r["accountant"] == accountant}
            return SiloEpsilons(accountant, by_silo, {}, reported=True)
        named = "account" if schema_of(self._db) >= 5 else "NULL"  # older: no names kept
        rows = self._db.execute(
            f"SELECT silo, trial, delta, epsilon, {named} FROM privacy WHERE run_id = ?"
            " AND view IS ? AND accountant = ? AND round = ? ORDER BY silo, trial",
            (run.id, view, accountant, last),
        ).fetchall()
        if delta is not None and rows:
            shared = run.config.get("privacy", {}).get("ledger")
            book_of = spending.book(run.study, run.id, shared)
            with Ledger(self.ledger_of(run), create=False, study=book_of) as book:
                rows = [
                    (
                        silo,
                        trial,
                        delta,
                        book.spent(
                            name or account(silo, trial, view),
                            delta=delta,
                            accountant=accountant,
                            through_round=last,
                        ).epsilon,
                        name,
                    )
                    for silo, trial, _, _, name in rows
                ]
        epsilon: dict[str, float] = {}
        deltas: dict[str, float] = {}
        for silo, _, silo_delta, spent, _ in rows:
            epsilon[silo] = max(epsilon.get(silo, -math.inf), spent)
            deltas[silo] = silo_delta
        return SiloEpsilons(accountant, epsilon, deltas)

    # -- internals --------------------------------------------------------------------

    def _select(self, where: str, arguments: tuple[str, ...]) -> list[RunRow]:
        """The runs matching `where`, each with its ledger checked to be its own (every
        reader of a study sees a swapped ledger refused)."""
        cursor = self._db.execute(f"SELECT * FROM runs {where} ORDER BY rowid", arguments)
        names = [c[0] for c in cursor.description]
        runs = [_run_row(dict(zip(names, row, strict=True))) for row in cursor]
        for run in runs:
            if run.ledger is not None and (self.path.parent / run.ledger).exists():
                owned_ledger(self.path.parent / run.ledger, run.id).close()
        return runs

    def _require_running(self, run_id: str) -> None:
        status = self.status(run_id)
        if status is None:
            raise StoreError(f"no run {run_id!r}: call start() first")
        if status != "running":
            raise StoreError(f"run {run_id} is {status}, not running; left as it is")


def owned_ledger(path: Path, run_id: str) -> Ledger:
    """The ledger at `path`, opened read-only, if run `run_id` claimed it (or nobody did:
    a ledger older than claims); one that another run claimed is refused, since its ε
    would be read as this run's."""
    book = Ledger(path, create=False)
    owner = book.owner
    if owner is not None and owner != run_id:
        book.close()
        raise StoreError(
            f"{path} is the ledger of run {owner}, not of run {run_id}: it was copied or "
            "moved here from another run, and its ε would be read as this run's. Put back "
            "this run's own ledger, or run the study again in a new directory"
        )
    return book


def _run_row(row: dict[str, Any]) -> RunRow:
    return RunRow(
        id=row["id"],
        study=row["study"],
        algorithm=row["algorithm"],
        config=json.loads(row["config"]),
        grid=json.loads(row["grid"]),
        status=row["status"],
        error=row["error"],
        trials=row["trials"],
        rounds=row["rounds"],
        rounds_completed=row["rounds_completed"],
        noise_multiplier=row["noise_multiplier"],
        stopped_by_budget=bool(row["stopped_by_budget"]),
        seconds=row["seconds"],
        ledger=None if row["ledger"] is None else Path(row["ledger"]),
        datasheet=json.loads(row["datasheet"]) if row["datasheet"] else {},
        epsilon_source=row.get("epsilon_source", FROM_LEDGER),  # schema 2 read-only
    )
