"""The per-silo privacy ledger: what each hospital has spent, on disk, crash-safe.

Each silo has its own budget (ε_k, δ_k) and neighbouring relation. Only a silo's own
events are composed in its account: what other silos do with data it never sees is
post-processing for it and costs nothing. The ledger is a SQLite file, one per study or
one per hospital shared by its studies (`Ledger(path, study=...)`: each study's accounts
under its own name):

* A dataset may be capped (`cap_dataset`): the accounts that spend from it (every study's
  over the same records) are then also held, together, to the cap, by the accountant's
  composition of the union of their events (never a sum of ε's): PLD where it can
  analyse every study's events, else RDP (`_CAP_ACCOUNTANT`), whichever accountant each
  study chose, so that one study's events (a selection's, which RDP alone analyses) never
  make the cap unreadable to another.
* `record` computes ε outside the write lock, then, in one write transaction
  (`BEGIN IMMEDIATE`), checks that the ledger is still what it computed from (or that
  what changed is still within what was shown affordable) before it inserts; otherwise
  it computes again. Two processes cannot both spend the last of a budget, and none
  holds the lock while it computes. It returns only after the commit is durable (WAL,
  `synchronous=FULL`). Callers release the model update an event paid for only after
  `record` returns, so a crash or `kill -9` can lose an update but never spent budget.
* An event that would take an account or a dataset past its budget is refused and
  nothing is written.
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from dp_accounting import dp_event as dpe

from dpfl.privacy import calibration, chain, events, governance, mirror
from dpfl.privacy.accounting import Accountant, EpsilonReport, check_delta, epsilon
from dpfl.privacy.accounts import RELEASE_LABEL
from dpfl.privacy.errors import BudgetExceededError, LedgerError, PrivacyParameterError
from dpfl.privacy.events import Neighbouring, PrivacyEvent
from dpfl.sqlite_file import (
    Consent,
    DamagedFileError,
    Migration,
    database_errors,
    open_database,
    schema_of,
    write_transaction,
)

_APPLICATION_ID = 0x6470666C  # "dpfl": marks the SQLite file as a dpfl ledger
_SCHEMA_VERSION = 4
_FACTS = """
CREATE TABLE facts (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    recorded_at REAL NOT NULL
);
"""
_DATASETS = """
CREATE TABLE IF NOT EXISTS datasets (
    dataset TEXT PRIMARY KEY,
    epsilon REAL NOT NULL CHECK (epsilon > 0),
    delta REAL NOT NULL CHECK (delta > 0 AND delta < 1),
    neighbouring TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS memberships (
    silo TEXT PRIMARY KEY REFERENCES silos(silo),
    study TEXT,
    dataset TEXT REFERENCES datasets(dataset)
);
CREATE INDEX IF NOT EXISTS memberships_by_dataset ON memberships(dataset);
"""


def _chained(db: sqlite3.Connection) -> None:
    """Schema 3 to 4: the hash chain, holding every row the ledger had (`mirror`)."""
    for statement in chain.SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    mirror.chain_rows(db)


# schema 1 had no facts (no owner, no released values); schema 2 no dataset caps, no
# studies; schema 3 no hash chain (an upgrade to 4 only with the user's consent)
_MIGRATIONS: dict[int, Migration] = {1: _FACTS, 2: _DATASETS, 3: _chained}
UPGRADE_COMMAND = "dpfl privacy upgrade"
_CAP_ACCOUNTANT: Accountant | None = None
"""A cap's accountant: PLD where it can analyse all its events, else RDP."""
_PATIENCE = 600.0
"""Seconds `record` keeps trying to take the write lock (each try waits up to 30 s):
writers hold it only to insert, so only a stuck process holds it that long."""
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
    + _DATASETS
    + chain.SCHEMA
)


class DamagedLedgerError(LedgerError, DamagedFileError):
    """The ledger file is damaged; nothing was written to it."""

    remedy = "restore it from a backup: the budget it records as spent cannot be recomputed"


@dataclass(frozen=True)
class Budget:
    """A silo's target: no more than ε at δ, for neighbouring datasets as stated; with
    `dataset`, its events also count against that dataset's cap (`Ledger.cap_dataset`)."""

    epsilon: float
    delta: float
    neighbouring: Neighbouring
    size: int | None
    dataset: str | None = None


@dataclass(frozen=True)
class Cap:
    """A dataset's cap: every account over it (all studies) together within ε at δ."""

    dataset: str
    epsilon: float
    delta: float
    neighbouring: Neighbouring


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
    study: str | None = None
    rounds: int = 0
    """How many distinct rounds it was charged for."""

    @property
    def remaining(self) -> float:
        return max(self.budget.epsilon - self.spent.epsilon, 0.0)


@dataclass(frozen=True)
class DatasetAccount:
    """What every study together has spent of a dataset's cap, and per study."""

    cap: Cap
    spent: EpsilonReport
    studies: dict[str, EpsilonReport]
    """Per study (an account without one: its own name), its events' ε at the cap's δ."""

    @property
    def remaining(self) -> float:
        return max(self.cap.epsilon - self.spent.epsilon, 0.0)


@dataclass(frozen=True)
class _Limit:
    """One bound a charge is held to: an account's budget or a dataset's cap, with the
    histories before and after the charges (multisets of leaf events)."""

    key: str
    """`silo NAME` or `dataset NAME`: what the limit is, and its key in the caches."""
    epsilon: float
    delta: float
    neighbouring: Neighbouring
    before: Counter[str]
    after: Counter[str]
    charged: list[PrivacyEvent]
    accountant: Accountant | None
    """An account's: the ledger's; a cap's: `_CAP_ACCOUNTANT`."""

    def epsilon_of(self, history: Counter[str]) -> EpsilonReport:
        return _composed_epsilon(_key(history), self.neighbouring, self.delta, self.accountant)


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
    `record` also checks a little ahead (the same charge again, an eighth as many times
    as the history holds it), so that many writers charging one budget compute ε once
    every few charges, not at every one.

    `study` names this book's accounts within a ledger that several studies share (a
    hospital's): every name it is given or shows is the study's own; stored, each is
    `study:name`, with the study beside it. `create=False` opens an existing ledger
    read-only, for readers: nothing is ever written to it (not even an empty or older
    file is initialised or upgraded). A ledger written before the hash chain (schema 3 or
    older) is opened for writing only with `upgrade=True`, the user's consent, which adds
    the chain over everything it holds (`dpfl privacy upgrade`); readers read it as it is.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        accountant: Accountant | str | None = None,
        create: bool = True,
        study: str | None = None,
        upgrade: bool = False,
    ) -> None:
        if study is not None and (not study or ":" in study):
            raise PrivacyParameterError(f"a study's name must be non-empty, without ':': {study!r}")
        self.path = Path(path)
        self.accountant = None if accountant is None else Accountant(accountant)
        self.study = study
        self._db = _open(self.path, read_only=not create, upgrade=upgrade)
        self._caps = schema_of(self._db) >= 3  # a reader of an older file: no caps
        self._chain = schema_of(self._db) >= 4  # nor a chain
        self._within_budget: dict[str, list[Counter[str]]] = {}
        self._over_budget: dict[str, list[Counter[str]]] = {}
        self._budgets: dict[str, Budget] = {}

    # -- datasets -------------------------------------------------------------------

    @_guarded
    def cap_dataset(
        self,
        dataset: str,
        *,
        epsilon: float,
        delta: float,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
    ) -> Cap:
        """Cap what every account over `dataset` may spend together (a data steward's
        limit across studies). The same cap again is a no-op; another is refused: caps,
        like budgets, are fixed."""
        wanted = _checked_cap(Cap(dataset, epsilon, delta, neighbouring))
        with write_transaction(self._db) as db:
            existing = _cap_or_none(db, dataset)
            if existing is None:
                row = (
                    dataset,
                    wanted.epsilon,
                    wanted.delta,
                    wanted.neighbouring.value,
                    time.time(),
                )
                mirror.write(db, "datasets", [row])
            elif existing != wanted:
                raise LedgerError(
                    f"dataset {dataset!r} is already capped at {_show_limit(existing)}; "
                    f"refusing to change it to {_show_limit(wanted)}"
                )
        return wanted

    @_guarded
    def cap(self, dataset: str) -> Cap | None:
        """`dataset`'s cap, if it has one."""
        return _cap_or_none(self._db, dataset) if self._caps else None

    @_guarded
    def datasets(self, *, accountant: Accountant | str | None = None) -> list[DatasetAccount]:
        """Every capped dataset: ε spent over all its accounts, and per study."""
        if not self._caps:
            return []
        out = []
        for (name,) in self._db.execute("SELECT dataset FROM datasets ORDER BY rowid").fetchall():
            cap = _cap_or_none(self._db, name)
            assert cap is not None
            chosen = accountant or _CAP_ACCOUNTANT
            by_study = {
                study: _composed_epsilon(_key(history), cap.neighbouring, cap.delta, chosen)
                for study, history in _dataset_histories(self._db, name).items()
            }
            spent = _composed_epsilon(
                _key(_dataset_history(self._db, name)), cap.neighbouring, cap.delta, chosen
            )
            out.append(DatasetAccount(cap, spent, by_study))
        return out

    # -- silos ----------------------------------------------------------------------

    def register_silo(
        self,
        silo: str,
        *,
        epsilon: float,
        delta: float,
        size: int | None = None,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
        dataset: str | None = None,
    ) -> Budget:
        """Open an account for `silo`. Registering it again with the same budget is a
        no-op (a restarted run); a different budget is refused: budgets are fixed. An ε of
        `math.inf` opens an account that records and reports but never refuses (a
        research run at a fixed σ, whose ε is read off afterwards). With `dataset` (capped
        first), its events also count against that dataset's cap."""
        budget = Budget(epsilon, delta, neighbouring, size, dataset)
        return self.register_silos({silo: budget})[silo]

    @_guarded
    def register_silos(self, budgets: Mapping[str, Budget]) -> dict[str, Budget]:
        """Open several accounts, each as `register_silo` would, in ONE durable transaction:
        all are opened or, if any is refused, none is (a run's accounts: one commit, not
        one each). Returns the budgets as stored."""
        wanted = {silo: _checked_budget(silo, budget) for silo, budget in budgets.items()}
        with write_transaction(self._db) as db:
            new = []
            for silo, budget in wanted.items():
                existing = _budget_or_none(db, self._stored(silo))
                if existing is None:
                    new.append(silo)
                    self._check_dataset(db, silo, budget)
                elif existing != budget:
                    raise LedgerError(
                        f"silo {silo!r} is already registered with {_show_budget(existing)}; "
                        f"refusing to change it to {_show_budget(budget)}"
                    )
            created = time.time()
            mirror.write(
                db,
                "silos",
                [
                    (
                        self._stored(silo),
                        wanted[silo].epsilon,
                        wanted[silo].delta,
                        wanted[silo].size,
                        wanted[silo].neighbouring.value,
                        created,
                    )
                    for silo in new
                ],
            )
            mirror.write(
                db,
                "memberships",
                [
                    (self._stored(silo), self.study, wanted[silo].dataset)
                    for silo in new
                    if self.study is not None or wanted[silo].dataset is not None
                ],
            )
        self._budgets.update({self._stored(s): b for s, b in wanted.items()})  # never change
        return wanted

    @_guarded
    def silos(self) -> list[str]:
        """The accounts' names (a study's book: its own)."""
        names = [row[0] for row in self._db.execute("SELECT silo FROM silos ORDER BY rowid")]
        if self.study is None:
            return names
        return [name[len(self.study) + 1 :] for name in names if self._mine(name)]

    @_guarded
    def budget(self, silo: str) -> Budget:
        stored = self._stored(silo)
        if stored in self._budgets:  # budgets never change once registered
            return self._budgets[stored]
        found = _budget_or_none(self._db, stored)
        if found is None:
            known = ", ".join(self.silos()) or "none"
            raise LedgerError(f"no silo {silo!r} in ledger {self.path} (silos: {known})")
        self._budgets[stored] = found
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
            _key(_history(self._db, self._stored(silo), through_round)),
            budget.neighbouring,
            budget.delta if delta is None else delta,
            accountant or self.accountant,
        )

    @_guarded
    def projected(self, silo: str, event: PrivacyEvent) -> EpsilonReport:
        """ε the silo would have spent, at its δ, if `event` were recorded now."""
        budget = self._budget_for(silo, event)
        stored = self._stored(silo)
        after = _history(self._db, stored) + _leaves(event)
        report = self._epsilon(after, budget.neighbouring, budget.delta)
        if report.epsilon <= budget.epsilon:
            self._remember(self._within_budget, f"silo {stored}", after)
        return report

    def can_afford(self, silo: str, event: PrivacyEvent) -> bool:
        """Whether `event` (e.g. every round still planned) fits in what is left, of the
        silo's budget and of its dataset's cap."""
        return self.refusal([(silo, event)]) is None

    @_guarded
    def refusal(self, charges: Sequence[tuple[str, PrivacyEvent]]) -> str | None:
        """Why recording `charges` together (e.g. every account's plan) would be refused,
        or None if they fit."""
        try:
            self._check(self._limits(self._db, charges), ahead=False)
        except BudgetExceededError as exc:
            return str(exc).removesuffix("; nothing was recorded")
        return None

    @_guarded
    def affordable_repeats(self, silo: str, event: PrivacyEvent) -> int:
        """How many more times `event` fits in the silo's budget and its dataset's cap
        (e.g. DP-SGD steps left)."""
        budget = self._budget_for(silo, event)
        limits: list[tuple[float, float, Counter[str], Accountant | None]] = [
            (budget.epsilon, budget.delta, _history(self._db, self._stored(silo)), self.accountant)
        ]
        cap = None if budget.dataset is None else _cap_or_none(self._db, budget.dataset)
        if cap is not None:
            history = _dataset_history(self._db, cap.dataset)
            limits.append((cap.epsilon, cap.delta, history, _CAP_ACCOUNTANT))
        return min(
            calibration.max_steps(
                eps,
                delta,
                lambda count, history=history: events.compose(  # type: ignore[misc]
                    [
                        *(
                            events.repeat(PrivacyEvent.from_json(leaf), n)
                            for leaf, n in history.items()
                        ),
                        events.repeat(event, count),
                    ]
                ),
                accountant=accountant,
            )
            for eps, delta, history, accountant in limits
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
        or, if any would pass a silo's budget or a dataset's cap, none is. One commit for a
        round's silos instead of one each; release their outputs only after this returns.

        ε is computed outside the write lock, from one read of the ledger; inside it, the
        charges are inserted only if no event was recorded since that read, or if every
        history they touch is still within what was shown affordable. Otherwise the lock
        is let go and all is computed again from a new read."""
        deadline = time.monotonic() + _PATIENCE
        while True:
            with _read_transaction(self._db) as db:
                seen = _version(db)
                limits = self._limits(db, charges)
            self._check(limits, ahead=True)  # the lock is not held meanwhile
            try:
                with write_transaction(self._db) as db:
                    if _version(db) == seen or self._covered(self._limits(db, charges)):
                        return self._insert(db, charges, label, round)
            except sqlite3.OperationalError as exc:  # waited 30 s: nothing was written
                if exc.sqlite_errorname != "SQLITE_BUSY" or time.monotonic() > deadline:
                    raise

    # -- facts ----------------------------------------------------------------------

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
        label = f"{RELEASE_LABEL}{name}"
        with write_transaction(self._db) as db:
            kept = _fact(db, label)
            accounts = sorted({self._stored(silo) for silo, _ in charges})
            paid = {
                silo
                for (silo,) in db.execute(  # per account: the (silo, id) index answers
                    f"SELECT DISTINCT silo FROM events WHERE silo IN "
                    f"({', '.join('?' * len(accounts))}) AND label = ?",
                    [*accounts, label],
                )
            }
            due = [(silo, event) for silo, event in charges if self._stored(silo) not in paid]
            self._check(self._limits(db, due), ahead=False)  # a rare write: in the lock
            self._insert(db, due, label, None)
            if kept is not None:
                return float(json.loads(kept))
            value = float(draw())
            mirror.write(db, "facts", [(label, json.dumps(value), time.time())])
            return value

    @_guarded
    def released(self, name: str) -> float | None:
        """The value `release(name, ...)` stored, if any."""
        if schema_of(self._db) < 2:
            return None
        kept = _fact(self._db, f"{RELEASE_LABEL}{name}")
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
            mirror.write(db, "facts", [(key, "", time.time())])
            return False

    @_guarded
    def claim(self, owner: str) -> None:
        """Mark the ledger as the account book of `owner` (e.g. a study's run id); a ledger
        already claimed by another owner is refused, so that one run's spending can never
        be read as another's."""
        with write_transaction(self._db) as db:
            claimed = _fact(db, "owner")
            if claimed is None:
                mirror.write(db, "facts", [("owner", owner, time.time())])
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

    # -- governance: the chain, its seals, approvals and refusals ---------------------

    @property
    def chained(self) -> bool:
        """Whether the ledger has its hash chain (one written before it has not, until
        upgraded)."""
        return self._chain

    @_guarded
    def head(self) -> chain.Link | None:
        """The chain's last entry (None: empty, or a ledger from before the chain)."""
        return chain.head(self._db) if self._chain else None

    @_guarded
    def verify(self) -> governance.Verification:
        """The hash chain walked and the tables compared with it: where it breaks, if it
        does (`dpfl privacy verify`)."""
        if not self._chain:
            return governance.Verification(
                0,
                chain.GENESIS,
                0,
                [
                    f"{self.path} was written before the hash chain (schema "
                    f"{schema_of(self._db)}): nothing can be verified until it is upgraded "
                    f"(`{UPGRADE_COMMAND} {self.path}`)"
                ],
                chained=False,
            )
        with _read_transaction(self._db) as db:
            return governance.verify(db)

    @_guarded
    def checked(self, receipts: Sequence[chain.Receipt]) -> tuple[list[str], int]:
        """Where this ledger disagrees with the receipts of it among `receipts` (a
        server's, `dpfl privacy verify --receipts`), and how many were of it."""
        if not self._chain:
            return self.verify().problems, 0
        with _read_transaction(self._db) as db:
            mine = [r for r in receipts if r.seal.ledger == chain.ledger_id(db)]
            held = {link.seq: link for link in chain.links(db)} if mine else {}
        problems = [p for r in mine for p in governance.receipt_problems(held, r)]
        return problems, len(mine)

    @_guarded
    def receipt(self, key: Ed25519PrivateKey, *, hospital: str, after: int) -> chain.Receipt:
        """Seal the chain's head with `key` and return the receipt of this book's charges
        recorded after entry `after` (a release's: what the server is given)."""
        with write_transaction(self._db) as db:
            mine = [
                link
                for link in chain.links(db, kinds=("events",), after=after)
                if all(self._mine(row[1]) for row in link.data["rows"])
            ]
            return chain.Receipt(hospital, self.study, tuple(mine), chain.seal(db, key))

    @_guarded
    def approve(self, approval: governance.Approval, key: Ed25519PrivateKey) -> governance.Approval:
        """Keep the officer's approval, signed with the hospital's identity `key`; one
        under the same name supersedes it."""
        with write_transaction(self._db) as db:
            return governance.approve(db, approval, key)

    @_guarded
    def revoke(self, name: str, key: Ed25519PrivateKey) -> governance.Approval:
        with write_transaction(self._db) as db:
            return governance.revoke(db, name, key)

    @_guarded
    def approvals(self) -> list[governance.Approval]:
        return governance.approvals(self._db) if self._chain else []

    @_guarded
    def refuse(self, silo: str, reason: str, *, round: int | None = None) -> None:
        """Keep the refusal of a release charged to `silo` (this book's), and why."""
        with write_transaction(self._db) as db:
            governance.refuse(db, self.study, self._stored(silo), round, reason)

    @_guarded
    def refusals(self) -> list[governance.Refusal]:
        return governance.refusals(self._db) if self._chain else []

    @_guarded
    def name_study(self, key: str, name: str) -> None:
        """Keep a study's name beside its key (what a statement shows), once."""
        if name and key not in self.study_names():
            with write_transaction(self._db) as db:
                governance.study_name(db, key, name)

    @_guarded
    def study_names(self) -> dict[str, str]:
        """Each study's name, by its key, where it was kept."""
        return governance.study_names(self._db) if schema_of(self._db) >= 2 else {}

    # -- reading --------------------------------------------------------------------

    @_guarded
    def entries(self, silo: str) -> list[Entry]:
        self.budget(silo)
        rows = self._db.execute(
            "SELECT id, event, label, round, recorded_at FROM events WHERE silo = ? ORDER BY id",
            (self._stored(silo),),
        )
        return [
            Entry(row[0], silo, _parse_event(row[1], row[0]), row[2], row[3], row[4])
            for row in rows
        ]

    @_guarded
    def accounts(self, *, accountant: Accountant | str | None = None) -> list[SiloAccount]:
        """Every silo's budget, number of recorded events and of rounds charged, and ε
        spent at its own δ."""
        counts = {
            silo: (n, rounds)
            for silo, n, rounds in self._db.execute(
                "SELECT silo, COUNT(*), COUNT(DISTINCT round) FROM events GROUP BY silo"
            )
        }
        studies = (
            dict(self._db.execute("SELECT silo, study FROM memberships")) if self._caps else {}
        )
        return [
            SiloAccount(
                silo,
                self.budget(silo),
                counts.get(self._stored(silo), (0, 0))[0],
                self.spent(silo, accountant=accountant),
                studies.get(self._stored(silo)),
                counts.get(self._stored(silo), (0, 0))[1],
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

    def _stored(self, silo: str) -> str:
        """An account's name as stored: in a study's book, prefixed with the study."""
        return silo if self.study is None else f"{self.study}:{silo}"

    def _mine(self, stored: str) -> bool:
        return self.study is None or stored.startswith(f"{self.study}:")

    def _check_dataset(self, db: sqlite3.Connection, silo: str, budget: Budget) -> None:
        """A new account may spend only from a capped dataset, under the cap's relation."""
        if budget.dataset is None:
            return
        cap = _cap_or_none(db, budget.dataset)
        if cap is None:
            raise LedgerError(
                f"silo {silo!r}: dataset {budget.dataset!r} has no cap in ledger {self.path}"
            )
        if cap.neighbouring is not budget.neighbouring:
            raise PrivacyParameterError(
                f"silo {silo!r} is accounted under {budget.neighbouring.description} "
                f"neighbouring, but dataset {cap.dataset!r} under "
                f"{cap.neighbouring.description}"
            )

    def _budget_for(self, silo: str, event: PrivacyEvent) -> Budget:
        budget = self.budget(silo)
        if event.neighbouring is not budget.neighbouring:
            raise PrivacyParameterError(
                f"silo {silo!r} is accounted under {budget.neighbouring.description} "
                f"neighbouring, but the event was analysed under "
                f"{event.neighbouring.description}: {event.describe()}"
            )
        return budget

    def _limits(
        self, db: sqlite3.Connection, charges: Sequence[tuple[str, PrivacyEvent]]
    ) -> list[_Limit]:
        """Every bound `charges` are held to (their accounts' budgets, their datasets'
        caps), with the histories before and after them, read from `db`."""
        budgets = {silo: self._budget_for(silo, event) for silo, event in charges}
        bound = [self._stored(s) for s, b in budgets.items() if b.epsilon != math.inf]
        befores = _histories(db, bound) if bound else {}  # unbounded accounts never refuse
        caps = {b.dataset: _cap_or_none(db, b.dataset) for b in budgets.values() if b.dataset}
        limits = {
            f"silo {stored}": _Limit(
                f"silo {stored}",
                budget.epsilon,
                budget.delta,
                budget.neighbouring,
                befores[stored],
                Counter(befores[stored]),
                [],
                self.accountant,
            )
            for stored, budget in ((self._stored(s), b) for s, b in budgets.items())
            if budget.epsilon != math.inf
        }
        for name, cap in caps.items():
            if cap is not None:
                history = _dataset_history(db, name)
                limits[f"dataset {name}"] = _Limit(
                    f"dataset {name}",
                    cap.epsilon,
                    cap.delta,
                    cap.neighbouring,
                    history,
                    Counter(history),
                    [],
                    _CAP_ACCOUNTANT,
                )
        for silo, event in charges:
            budget, leaves = budgets[silo], _leaves(event)
            for key in (f"silo {self._stored(silo)}", f"dataset {budget.dataset}"):
                if key in limits:
                    limits[key].after.update(leaves)
                    limits[key].charged.append(event)
        return list(limits.values())

    def _check(self, limits: Sequence[_Limit], *, ahead: bool) -> None:
        """Refuse (`BudgetExceededError`) if any limit's history after the charges is past
        it. With `ahead`, try first the charges' events as many more times as an eighth of
        the history (at least once): if that fits, recording the next ones needs no new
        accounting, in this process."""
        for limit in limits:
            if self._known(self._within_budget, limit.key, limit.after, within=True):
                continue
            added = limit.after - limit.before
            if ahead and added:
                times = max(1, min(limit.before[leaf] // n for leaf, n in added.items()) // 8)
                further = limit.after + Counter({leaf: n * times for leaf, n in added.items()})
                if not self._known(self._over_budget, limit.key, further, within=False):
                    if limit.epsilon_of(further).epsilon <= limit.epsilon:
                        self._remember(self._within_budget, limit.key, further)
                        continue
                    self._remember(self._over_budget, limit.key, further)
            report = limit.epsilon_of(limit.after)
            if report.epsilon > limit.epsilon:
                raise BudgetExceededError(self._refused(limit, report))
            self._remember(self._within_budget, limit.key, limit.after)

    def _refused(self, limit: _Limit, report: EpsilonReport) -> str:
        """Why `limit` refuses the charges: for a dataset's cap, with the studies that
        spent it."""
        spent = limit.epsilon_of(limit.before).epsilon
        kind, name = limit.key.split(" ", 1)
        what = " and ".join(event.describe() for event in limit.charged)
        if kind == "silo":
            shown = name if self.study is None else name[len(self.study) + 1 :]
            return (
                f"silo {shown!r}: {what} would bring ε to {report.epsilon:.4g} > budget "
                f"{limit.epsilon:g} at δ={limit.delta:g} (spent so far {spent:.4g}); nothing "
                "was recorded"
            )
        named = self.study_names()
        studies = ", ".join(
            f"{named.get(study, study)} (ε={limit.epsilon_of(history).epsilon:.4g})"
            for study, history in _dataset_histories(self._db, name).items()
        )
        return (
            f"dataset {name!r}: {what} would bring ε over all its studies to "
            f"{report.epsilon:.4g} > its cap {limit.epsilon:g} at δ={limit.delta:g} (spent "
            f"so far {spent:.4g}, by {studies or 'none'}); nothing was recorded"
        )

    def _covered(self, limits: Sequence[_Limit]) -> bool:
        """Whether every limit's history after the charges is known to be within it."""
        return all(
            self._known(self._within_budget, limit.key, limit.after, within=True)
            for limit in limits
        )

    def _insert(
        self,
        db: sqlite3.Connection,
        charges: Sequence[tuple[str, PrivacyEvent]],
        label: str,
        round: int | None,
    ) -> list[Entry]:
        """Insert checked charges (inside the caller's write transaction)."""
        if not charges:
            return []
        recorded_at = time.time()
        (used,) = db.execute(  # the ids AUTOINCREMENT gave, deleted ones included
            "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0)"
        ).fetchone()
        first = int(used) + 1
        rows = [
            (first + i, self._stored(silo), round, label, event.to_json(), recorded_at)
            for i, (silo, event) in enumerate(charges)
        ]
        mirror.write(db, "events", rows)
        return [
            Entry(first + i, silo, event, label, round, recorded_at)
            for i, (silo, event) in enumerate(charges)
        ]

    @staticmethod
    def _remember(known: dict[str, list[Counter[str]]], key: str, history: Counter[str]) -> None:
        """Keep only maximal multisets within a limit (minimal ones past it): one that
        another contains adds nothing."""
        kept = [c for c in known.get(key, []) if not (c <= history or history <= c)]
        known[key] = [*kept, history]

    @staticmethod
    def _known(
        known: dict[str, list[Counter[str]]], key: str, history: Counter[str], *, within: bool
    ) -> bool:
        """Whether `history` is inside a multiset known within the limit (`within`), or
        contains one known past it."""
        return any((history <= c) if within else (c <= history) for c in known.get(key, []))

    def _epsilon(
        self, history: Counter[str], neighbouring: Neighbouring, delta: float
    ) -> EpsilonReport:
        return _composed_epsilon(_key(history), neighbouring, delta, self.accountant)


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
    marks = ", ".join("?" * len(wanted))
    cutoff = "" if through_round is None else " AND (round IS NULL OR round <= ?)"
    arguments = [*wanted] if through_round is None else [*wanted, through_round]
    return _grouped(
        db,
        f"SELECT silo, MIN(id), event, COUNT(*) FROM events WHERE silo IN ({marks}){cutoff} "
        "GROUP BY silo, event",
        arguments,
        {silo: Counter() for silo in wanted},
    )


def _dataset_history(db: sqlite3.Connection, dataset: str) -> Counter[str]:
    """The union of every account's history over `dataset`."""
    return _grouped(
        db,
        "SELECT '', MIN(e.id), e.event, COUNT(*) FROM events e JOIN memberships m "
        "ON m.silo = e.silo WHERE m.dataset = ? GROUP BY e.event",
        [dataset],
        {"": Counter()},
    )[""]


def _dataset_histories(db: sqlite3.Connection, dataset: str) -> dict[str, Counter[str]]:
    """Per study (an account without one: its own name), its history over `dataset`."""
    return _grouped(
        db,
        "SELECT COALESCE(m.study, e.silo), MIN(e.id), e.event, COUNT(*) FROM events e "
        "JOIN memberships m ON m.silo = e.silo WHERE m.dataset = ? GROUP BY 1, e.event "
        "ORDER BY MIN(e.id)",
        [dataset],
        {},
    )


def _grouped(
    db: sqlite3.Connection,
    query: str,
    arguments: Sequence[object],
    totals: dict[str, Counter[str]],
) -> dict[str, Counter[str]]:
    """Histories from `query`'s rows (group, first id, event, count), added to `totals`."""
    for group, row_id, text, count in db.execute(query, arguments):
        try:
            leaves = _leaf_counts(text)
        except PrivacyParameterError as exc:
            raise LedgerError(f"ledger event #{row_id} is corrupt: {exc}") from exc
        history = totals.setdefault(group, Counter())
        for leaf, times in leaves:
            history[leaf] += times * count
    return totals


def _version(db: sqlite3.Connection) -> int:
    """The last event's id: events are only ever added, with growing ids, so an equal
    version means that no history changed."""
    (last,) = db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()
    return int(last)


@contextmanager
def _read_transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One snapshot for several reads (WAL: it waits for no writer, and none for it)."""
    db.execute("BEGIN")
    try:
        yield db
    finally:
        db.execute("COMMIT")


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
    if budget.dataset is not None and not (isinstance(budget.dataset, str) and budget.dataset):
        raise PrivacyParameterError(f"silo {silo!r}: a dataset needs a non-empty name")
    return Budget(
        float(epsilon), float(delta), Neighbouring(budget.neighbouring), size, budget.dataset
    )


def _checked_cap(cap: Cap) -> Cap:
    """The cap as stored, or an error saying what is wrong."""
    if not cap.dataset or not isinstance(cap.dataset, str):
        raise PrivacyParameterError("a dataset needs a non-empty name")
    if not (isinstance(cap.epsilon, int | float) and 0 < cap.epsilon < math.inf):
        raise PrivacyParameterError(
            f"dataset {cap.dataset!r}: its cap's ε must be > 0 and finite, got {cap.epsilon!r}"
        )
    check_delta(cap.delta)
    return Cap(cap.dataset, float(cap.epsilon), float(cap.delta), Neighbouring(cap.neighbouring))


def _cap_or_none(db: sqlite3.Connection, dataset: str) -> Cap | None:
    row = db.execute(
        "SELECT epsilon, delta, neighbouring FROM datasets WHERE dataset = ?", (dataset,)
    ).fetchone()
    return None if row is None else Cap(dataset, row[0], row[1], Neighbouring(row[2]))


def _fact(db: sqlite3.Connection, key: str) -> str | None:
    row = db.execute("SELECT value FROM facts WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def _budget_or_none(db: sqlite3.Connection, silo: str) -> Budget | None:
    row = db.execute(
        "SELECT epsilon, delta, neighbouring, size FROM silos WHERE silo = ?", (silo,)
    ).fetchone()
    if row is None:
        return None
    member = (
        db.execute("SELECT dataset FROM memberships WHERE silo = ?", (silo,)).fetchone()
        if schema_of(db) >= 3
        else None
    )
    dataset = None if member is None else member[0]
    return Budget(row[0], row[1], Neighbouring(row[2]), row[3], dataset)


def _parse_event(text: str, row_id: int) -> PrivacyEvent:
    try:
        return PrivacyEvent.from_json(text)
    except PrivacyParameterError as exc:
        raise LedgerError(f"ledger event #{row_id} is corrupt: {exc}") from exc


def _show_budget(budget: Budget) -> str:
    over = "" if budget.dataset is None else f", over dataset {budget.dataset!r}"
    return f"(ε={budget.epsilon:g}, δ={budget.delta:g}, {budget.neighbouring.description}{over})"


def _show_limit(cap: Cap) -> str:
    return f"(ε={cap.epsilon:g}, δ={cap.delta:g}, {cap.neighbouring.description})"


def _open(path: Path, *, read_only: bool, upgrade: bool) -> sqlite3.Connection:
    """Open or create a ledger file; refuse, without touching it, anything that is not one,
    and, unless `upgrade`, one written before the hash chain (schema 3 or older)."""
    how = f"back it up, then run `{UPGRADE_COMMAND} {path}`"
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
        consent=Consent(3, upgrade, how, LedgerError),
    )
