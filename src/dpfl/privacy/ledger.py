"""The per-silo privacy ledger: what each hospital has spent, on disk, crash-safe.

Each silo has its own budget (ε_k, δ_k) and neighbouring relation. Only a silo's own
events are composed in its account: what other silos do with data it never sees is
post-processing for it and costs nothing. The ledger is a SQLite file (one per study):

* `record` checks the budget and inserts the event in one write transaction
  (`BEGIN IMMEDIATE`, so two processes cannot both spend the last of a budget) and
  returns only after the commit is durable (WAL, `synchronous=FULL`). Callers release
  the model update an event paid for only after `record` returns, so a crash or
  `kill -9` can lose an update but never spent budget.
* An event that would take the silo past its budget is refused and nothing is written.
* Reopening the file continues from what was spent.
* Readers open it read-only (`create=False`) and create nothing beside it. A damaged
  file is refused by name when opened (`DamagedLedgerError`), before any budget is read
  or charged, never as a traceback, and is never modified.
"""

from __future__ import annotations

import functools
import json
import math
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from dp_accounting import dp_event as dpe

from dpfl.privacy import calibration, events
from dpfl.privacy.accounting import Accountant, EpsilonReport, check_delta, epsilon
from dpfl.privacy.errors import BudgetExceededError, LedgerError, PrivacyParameterError
from dpfl.privacy.events import Neighbouring, PrivacyEvent
from dpfl.sqlite_file import (
    DamagedFileError,
    database_errors,
    open_database,
    schema_of,
    write_transaction,
)

_APPLICATION_ID = 0x6470666C  # "dpfl": marks the SQLite file as a dpfl ledger
_SCHEMA_VERSION = 2
_FACTS = """
CREATE TABLE facts (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    recorded_at REAL NOT NULL
);
"""
_MIGRATIONS = {1: _FACTS}  # schema 1 had no facts: no owner, no released values
_P = ParamSpec("_P")
_R = TypeVar("_R")
_SCHEMA = (
    _FACTS
    + """
CREATE TABLE silos (
    silo TEXT PRIMARY KEY,
    epsilon REAL NOT NULL CHECK (epsilon > 0),
    delta REAL NOT NULL CHECK (delta > 0 AND delta < 1),
    size INTEGER CHECK (size IS NULL OR size > 0),
    neighbouring TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    silo TEXT NOT NULL REFERENCES silos(silo),
    round INTEGER,
    label TEXT NOT NULL,
    event TEXT NOT NULL,
    recorded_at REAL NOT NULL
);
CREATE INDEX events_by_silo ON events(silo, id);
"""
)


class DamagedLedgerError(LedgerError, DamagedFileError):
    """The ledger file is damaged; nothing was written to it."""

    remedy = "restore it from a backup: the budget it records as spent cannot be recomputed"


@dataclass(frozen=True)
class Budget:
    """A silo's target: no more than ε at δ, for neighbouring datasets as stated."""

    epsilon: float
    delta: float
    neighbouring: Neighbouring
    size: int | None


@dataclass(frozen=True)
class Entry:
    """One recorded event."""

    id: int
    silo: str
    event: PrivacyEvent
    label: str
    round: int | None
    recorded_at: float


@dataclass(frozen=True)
class SiloAccount:
    """What a silo has spent and has left, as shown by `dpfl privacy ledger`."""

    silo: str
    budget: Budget
    events: int
    spent: EpsilonReport

    @property
    def remaining(self) -> float:
        return max(self.budget.epsilon - self.spent.epsilon, 0.0)


def _guarded(
    method: Callable[Concatenate[Ledger, _P], _R],
) -> Callable[Concatenate[Ledger, _P], _R]:
    """SQLite's errors inside `method` become a `LedgerError` that names the file."""

    @functools.wraps(method)
    def guarded(self: Ledger, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with database_errors(self.path, "ledger", LedgerError, DamagedLedgerError):
            return method(self, *args, **kwargs)

    return guarded


class Ledger:
    """Per-silo (ε, δ) accounts persisted in one SQLite file.

    `accountant` is the one budgets are enforced with: None means PLD wherever it can
    analyse a silo's events and RDP otherwise. Any accountant can be asked for a report.

    A silo's history is composed as a multiset of leaf events (composition bounds do
    not depend on order), so a thousand recorded rounds of one step type cost one
    self-composition. Multisets already shown to be within budget are remembered: ε
    never falls when events are added, so recording anything still inside such a
    multiset (a round of a plan checked with `can_afford`) needs no new accounting.

    `create=False` opens an existing ledger read-only, for readers: nothing is ever
    written to it (not even an empty or older file is initialised or upgraded).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        accountant: Accountant | str | None = None,
        create: bool = True,
    ) -> None:
        self.path = Path(path)
        self.accountant = None if accountant is None else Accountant(accountant)
        self._db = _open(self.path, read_only=not create)
        self._within_budget: dict[str, list[Counter[str]]] = {}
        self._budgets: dict[str, Budget] = {}

    # -- silos ----------------------------------------------------------------------

    def register_silo(
        self,
        silo: str,
        *,
        epsilon: float,
        delta: float,
        size: int | None = None,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
    ) -> Budget:
        """Open an account for `silo`. Registering it again with the same budget is a
        no-op (a restarted run); a different budget is refused: budgets are fixed. An ε of
        `math.inf` opens an account that records and reports but never refuses (a
        research run at a fixed σ, whose ε is read off afterwards)."""
        return self.register_silos({silo: Budget(epsilon, delta, neighbouring, size)})[silo]

    @_guarded
    def register_silos(self, budgets: Mapping[str, Budget]) -> dict[str, Budget]:
        """Open several accounts, each as `register_silo` would, in ONE durable transaction:
        all are opened or, if any is refused, none is (a run's accounts: one commit, not
        one each). Returns the budgets as stored."""
        wanted = {silo: _checked_budget(silo, budget) for silo, budget in budgets.items()}
        with write_transaction(self._db) as db:
            new = []
            for silo, budget in wanted.items():
                existing = _budget_or_none(db, silo)
                if existing is None:
                    new.append(silo)
                elif existing != budget:
                    raise LedgerError(
                        f"silo {silo!r} is already registered with {_show_budget(existing)}; "
                        f"refusing to change it to {_show_budget(budget)}"
                    )
            created = time.time()
            db.executemany(
                "INSERT INTO silos VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (
                        silo,
                        wanted[silo].epsilon,
                        wanted[silo].delta,
                        wanted[silo].size,
                        wanted[silo].neighbouring.value,
                        created,
                    )
                    for silo in new
                ],
            )
        self._budgets.update(wanted)  # committed, and budgets never change
        return wanted

    @_guarded
    def silos(self) -> list[str]:
        return [row[0] for row in self._db.execute("SELECT silo FROM silos ORDER BY rowid")]

    @_guarded
    def budget(self, silo: str) -> Budget:
        if silo in self._budgets:  # budgets never change once registered
            return self._budgets[silo]
        found = _budget_or_none(self._db, silo)
        if found is None:
            known = ", ".join(self.silos()) or "none"
            raise LedgerError(f"no silo {silo!r} in ledger {self.path} (silos: {known})")
        self._budgets[silo] = found
        return found

    # -- spending -------------------------------------------------------------------

    @_guarded
    def spent(
        self,
        silo: str,
        *,
        delta: float | None = None,
        accountant: Accountant | str | None = None,
        through_round: int | None = None,
    ) -> EpsilonReport:
        """ε the silo has spent at `delta` (default: its budget's δ); with `through_round`,
        only what events labelled with rounds up to that one cost (ε over a run)."""
        budget = self.budget(silo)
        return _composed_epsilon(
            _key(_history(self._db, silo, through_round)),
            budget.neighbouring,
            budget.delta if delta is None else delta,
            accountant or self.accountant,
        )

    @_guarded
    def projected(self, silo: str, event: PrivacyEvent) -> EpsilonReport:
        """ε the silo would have spent, at its δ, if `event` were recorded now."""
        budget = self._budget_for(silo, event)
        after = _history(self._db, silo) + _leaves(event)
        report = self._epsilon(after, budget)
        if report.epsilon <= budget.epsilon:
            self._remember_within(silo, after)
        return report

    @_guarded
    def can_afford(self, silo: str, event: PrivacyEvent) -> bool:
        """Whether `event` (e.g. every round still planned) fits in what is left."""
        budget = self._budget_for(silo, event)
        if budget.epsilon == math.inf:  # never refuses: no history to read
            return True
        after = _history(self._db, silo) + _leaves(event)
        return self._known_within(silo, after) or (
            self.projected(silo, event).epsilon <= budget.epsilon
        )

    @_guarded
    def affordable_repeats(self, silo: str, event: PrivacyEvent) -> int:
        """How many more times `event` fits in the silo's budget (e.g. DP-SGD steps left)."""
        budget = self._budget_for(silo, event)
        spent = [
            events.repeat(PrivacyEvent.from_json(leaf), n)
            for leaf, n in _history(self._db, silo).items()
        ]
        return calibration.max_steps(
            budget.epsilon,
            budget.delta,
            lambda count: events.compose([*spent, events.repeat(event, count)]),
            accountant=self.accountant,
        )

    def record(
        self, silo: str, event: PrivacyEvent, *, label: str = "", round: int | None = None
    ) -> Entry:
        """Charge `event` to `silo` and commit it durably; refuse if over budget.

        Release the output the event paid for only after this returns.
        """
        return self.record_many([(silo, event)], label=label, round=round)[0]

    @_guarded
    def record_many(
        self,
        charges: Sequence[tuple[str, PrivacyEvent]],
        *,
        label: str = "",
        round: int | None = None,
    ) -> list[Entry]:
        """Charge several (silo, event) pairs in ONE durable transaction: all are recorded
        or, if any silo would pass its budget, none is. One commit for a round's silos
        instead of one each; release their outputs only after this returns."""
        with write_transaction(self._db) as db:  # the checks and inserts: one transaction
            return self._insert(db, charges, label, round)

    def _insert(
        self,
        db: sqlite3.Connection,
        charges: Sequence[tuple[str, PrivacyEvent]],
        label: str,
        round: int | None,
    ) -> list[Entry]:
        """Check every charge against its silo's budget, then insert them all (inside
        the caller's write transaction)."""
        budgets = [self._budget_for(silo, event) for silo, event in charges]
        bound = [
            silo for (silo, _), b in zip(charges, budgets, strict=True) if b.epsilon != math.inf
        ]
        pending = _histories(db, bound) if bound else {}  # unbounded accounts never refuse
        for (silo, event), budget in zip(charges, budgets, strict=True):
            if budget.epsilon != math.inf:
                before = pending[silo]
                after = pending[silo] = before + _leaves(event)
                self._check_within(silo, event, before, after, budget)
        if not charges:
            return []
        recorded_at = time.time()
        db.executemany(
            "INSERT INTO events (silo, round, label, event, recorded_at) VALUES (?, ?, ?, ?, ?)",
            [(silo, round, label, event.to_json(), recorded_at) for silo, event in charges],
        )
        # one writer holds the transaction: the rows got consecutive ids ending at the last
        (last,) = db.execute("SELECT last_insert_rowid()").fetchone()
        first = int(last) - len(charges) + 1
        return [
            Entry(first + i, silo, event, label, round, recorded_at)
            for i, (silo, event) in enumerate(charges)
        ]

    def _check_within(
        self,
        silo: str,
        event: PrivacyEvent,
        before: Counter[str],
        after: Counter[str],
        budget: Budget,
    ) -> None:
        if self._known_within(silo, after):
            return
        report = self._epsilon(after, budget)
        if report.epsilon > budget.epsilon:
            raise BudgetExceededError(
                f"silo {silo!r}: {event.describe()} would bring ε to {report.epsilon:.4g} > "
                f"budget {budget.epsilon:g} at δ={budget.delta:g} (spent so far "
                f"{self._epsilon(before, budget).epsilon:.4g}); nothing was recorded"
            )
        self._remember_within(silo, after)

    @_guarded
    def release(
        self,
        name: str,
        charges: Sequence[tuple[str, PrivacyEvent]],
        draw: Callable[[], float],
    ) -> float:
        """A value released once and kept for good (e.g. a silo's DP record count): the
        first call charges `charges`, calls `draw` and stores its result in one
        transaction; later calls return the stored value, charging only accounts that
        have not paid for it yet (a new trial using it). Re-using a released value is
        post-processing, and a value that was paid for is never drawn again."""
        label = f"release {name}"
        with write_transaction(self._db) as db:
            kept = _fact(db, label)
            accounts = sorted({silo for silo, _ in charges})
            paid = {
                silo
                for (silo,) in db.execute(  # per account: the (silo, id) index answers
                    f"SELECT DISTINCT silo FROM events WHERE silo IN "
                    f"({', '.join('?' * len(accounts))}) AND label = ?",
                    [*accounts, label],
                )
            }
            due = [(silo, event) for silo, event in charges if silo not in paid]
            self._insert(db, due, label, None)
            if kept is not None:
                return float(json.loads(kept))
            value = float(draw())
            db.execute(
                "INSERT INTO facts VALUES (?, ?, ?)", (label, json.dumps(value), time.time())
            )
            return value

    @_guarded
    def released(self, name: str) -> float | None:
        """The value `release(name, ...)` stored, if any."""
        if schema_of(self._db) < 2:
            return None
        kept = _fact(self._db, f"release {name}")
        return None if kept is None else float(json.loads(kept))

    @_guarded
    def noted(self, key: str, *, note: bool = False) -> bool:
        """Whether the fact `key` is kept (e.g. that a run released a round); with `note`,
        keep it now if not, in one transaction: of processes noting one key, exactly one
        is told it was not kept before."""
        if not note:
            return schema_of(self._db) >= 2 and _fact(self._db, key) is not None
        with write_transaction(self._db) as db:
            if _fact(db, key) is not None:
                return True
            db.execute("INSERT INTO facts VALUES (?, ?, ?)", (key, "", time.time()))
            return False

    @_guarded
    def claim(self, owner: str) -> None:
        """Mark the ledger as the account book of `owner` (e.g. a study's run id); a ledger
        already claimed by another owner is refused, so that one run's spending can never
        be read as another's."""
        with write_transaction(self._db) as db:
            claimed = _fact(db, "owner")
            if claimed is None:
                db.execute("INSERT INTO facts VALUES ('owner', ?, ?)", (owner, time.time()))
            elif claimed != owner:
                raise LedgerError(
                    f"ledger {self.path} belongs to {claimed!r}, not to {owner!r}; refusing "
                    "to mix two runs' accounts"
                )

    @property
    @_guarded
    def owner(self) -> str | None:
        """Who claimed this ledger (`claim`), if anyone (no one, in a schema-1 ledger)."""
        return None if schema_of(self._db) < 2 else _fact(self._db, "owner")

    # -- reading --------------------------------------------------------------------

    @_guarded
    def entries(self, silo: str) -> list[Entry]:
        self.budget(silo)
        rows = self._db.execute(
            "SELECT id, silo, event, label, round, recorded_at FROM events WHERE silo = ? "
            "ORDER BY id",
            (silo,),
        )
        return [
            Entry(row[0], row[1], _parse_event(row[2], row[0]), row[3], row[4], row[5])
            for row in rows
        ]

    @_guarded
    def accounts(self, *, accountant: Accountant | str | None = None) -> list[SiloAccount]:
        """Every silo's budget, number of recorded events and ε spent at its own δ."""
        counts = dict(self._db.execute("SELECT silo, COUNT(*) FROM events GROUP BY silo"))
        return [
            SiloAccount(
                silo,
                self.budget(silo),
                counts.get(silo, 0),
                self.spent(silo, accountant=accountant),
            )
            for silo in self.silos()
        ]

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------

    def _budget_for(self, silo: str, event: PrivacyEvent) -> Budget:
        budget = self.budget(silo)
        if event.neighbouring is not budget.neighbouring:
            raise PrivacyParameterError(
                f"silo {silo!r} is accounted under {budget.neighbouring.description} "
                f"neighbouring, but the event was analysed under "
                f"{event.neighbouring.description}: {event.describe()}"
            )
        return budget

    def _remember_within(self, silo: str, history: Counter[str]) -> None:
        """Keep only maximal multisets: one that a newer one contains adds nothing."""
        kept = [c for c in self._within_budget.get(silo, []) if not c <= history]
        self._within_budget[silo] = [*kept, history]

    def _known_within(self, silo: str, history: Counter[str]) -> bool:
        return any(history <= checked for checked in self._within_budget.get(silo, []))

    def _epsilon(self, history: Counter[str], budget: Budget) -> EpsilonReport:
        return _composed_epsilon(_key(history), budget.neighbouring, budget.delta, self.accountant)


def plan_epsilon(
    event: PrivacyEvent, delta: float, accountant: Accountant | str | None
) -> EpsilonReport:
    """ε of `event` as a ledger computes it for an account whose history is `event`, and
    from the same cache: a plan checked during calibration costs nothing when a ledger
    checks it again before round 0 (for each of Kerkouche's 314 hospitals)."""
    return _composed_epsilon(_key(_leaves(event)), event.neighbouring, delta, accountant)


@functools.lru_cache(maxsize=1024)
def _composed_epsilon(
    history: tuple[tuple[str, int], ...],
    neighbouring: Neighbouring,
    delta: float,
    accountant: Accountant | str | None,
) -> EpsilonReport:
    """ε of a multiset of leaf events. Cached: silos with equal histories (IID silos in
    a simulation) and a `can_afford` followed by a `record` compute it once."""
    parts = [events.repeat(PrivacyEvent.from_json(leaf), count) for leaf, count in history]
    if not parts:
        return EpsilonReport(0.0, delta, Accountant(accountant or Accountant.PLD), neighbouring)
    return epsilon(events.compose(parts), delta, accountant)


def _leaves(event: PrivacyEvent) -> Counter[str]:
    """The event as a multiset of leaf events (serialised), top-level repeats multiplied out."""
    return Counter(dict(_leaf_counts(event.to_json())))


@functools.lru_cache(maxsize=4096)
def _leaf_counts(text: str) -> tuple[tuple[str, int], ...]:
    """Cached by the serialised event: a round charges many silos the same few events."""
    event = PrivacyEvent.from_json(text)
    counts: Counter[str] = Counter()

    def walk(node: dpe.DpEvent, times: int) -> None:
        if isinstance(node, dpe.NoOpDpEvent):
            return
        if isinstance(node, dpe.SelfComposedDpEvent):
            walk(node.event, times * node.count)
        elif isinstance(node, dpe.ComposedDpEvent):
            for inner in node.events:
                walk(inner, times)
        else:
            counts[PrivacyEvent(node, event.neighbouring).to_json()] += times

    walk(event.dp_event, 1)
    return tuple(counts.items())


def _key(history: Counter[str]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(history.items()))


def _history(db: sqlite3.Connection, silo: str, through_round: int | None = None) -> Counter[str]:
    """A silo's recorded events as a multiset of leaf events."""
    return _histories(db, [silo], through_round)[silo]


def _histories(
    db: sqlite3.Connection, silos: Sequence[str], through_round: int | None = None
) -> dict[str, Counter[str]]:
    """Several silos' histories in one query (a round charges many silos at once);
    with `through_round`, only events of rounds ≤ it (events without a round count)."""
    wanted = sorted(set(silos))
    totals: dict[str, Counter[str]] = {silo: Counter() for silo in wanted}
    marks = ", ".join("?" * len(wanted))
    cutoff = "" if through_round is None else " AND (round IS NULL OR round <= ?)"
    arguments = [*wanted] if through_round is None else [*wanted, through_round]
    for silo, row_id, text, count in db.execute(
        f"SELECT silo, MIN(id), event, COUNT(*) FROM events WHERE silo IN ({marks}){cutoff} "
        "GROUP BY silo, event",
        arguments,
    ):
        try:
            leaves = _leaf_counts(text)
        except PrivacyParameterError as exc:
            raise LedgerError(f"ledger event #{row_id} is corrupt: {exc}") from exc
        for leaf, times in leaves:
            totals[silo][leaf] += times * count
    return totals


def _checked_budget(silo: str, budget: Budget) -> Budget:
    """The budget as stored (floats, a `Neighbouring`), or an error saying what is wrong."""
    if not silo or not isinstance(silo, str):
        raise PrivacyParameterError("a silo needs a non-empty name")
    epsilon, delta, size = budget.epsilon, budget.delta, budget.size
    if not (isinstance(epsilon, int | float) and 0 < epsilon <= math.inf):
        raise PrivacyParameterError(
            f"silo {silo!r}: ε budget must be > 0 (math.inf: no budget, record only), "
            f"got {epsilon!r}"
        )
    if size is not None and not (isinstance(size, int) and size > 0):
        raise PrivacyParameterError(f"silo {silo!r}: size must be a positive integer")
    check_delta(delta, dataset_size=size)
    return Budget(float(epsilon), float(delta), Neighbouring(budget.neighbouring), size)


def _fact(db: sqlite3.Connection, key: str) -> str | None:
    row = db.execute("SELECT value FROM facts WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def _budget_or_none(db: sqlite3.Connection, silo: str) -> Budget | None:
    row = db.execute(
        "SELECT epsilon, delta, neighbouring, size FROM silos WHERE silo = ?", (silo,)
    ).fetchone()
    return None if row is None else Budget(row[0], row[1], Neighbouring(row[2]), row[3])


def _parse_event(text: str, row_id: int) -> PrivacyEvent:
    try:
        return PrivacyEvent.from_json(text)
    except PrivacyParameterError as exc:
        raise LedgerError(f"ledger event #{row_id} is corrupt: {exc}") from exc


def _show_budget(budget: Budget) -> str:
    return f"(ε={budget.epsilon:g}, δ={budget.delta:g}, {budget.neighbouring.description})"


def _open(path: Path, *, read_only: bool) -> sqlite3.Connection:
    """Open or create a ledger file; refuse, without touching it, anything that is not one."""
    return open_database(
        path,
        kind="ledger",
        application_id=_APPLICATION_ID,
        schema=_SCHEMA,
        schema_version=_SCHEMA_VERSION,
        error=LedgerError,
        damaged=DamagedLedgerError,
        migrations=_MIGRATIONS,
        read_only=read_only,
    )
