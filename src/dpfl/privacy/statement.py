"""A hospital's ledger as one statement for whoever oversees it (a data-protection
officer): each capped dataset's cap and what is left of it; each study, by the name it
was approved under, with its accounts, what each spent and has left (the smaller of its
budget's and its dataset cap's rest, and which one binds), its charges by kind and the
rounds it trained; every approval, refusal and statistic released; and whether the
ledger's chain verifies. Pure data, read without writing: `dpfl deploy status` prints
it, as a table, as JSON or as a page.

A charge's kind is read off how the engines record it (`kind_of`): the ledger keeps no
kind of its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import groupby
from typing import Any

from dpfl.privacy import events
from dpfl.privacy.accounting import Accountant
from dpfl.privacy.accounts import EVALUATION_LABEL, RELEASE_LABEL, STATISTIC_LABEL
from dpfl.privacy.governance import Approval, Refusal, Verification
from dpfl.privacy.ledger import Budget, DatasetAccount, Entry, Ledger, SiloAccount, plan_epsilon

TRAINING = "training"
STATISTIC = "statistic"
EVALUATION = "evaluation"
OTHER = "other"
STATISTIC_LABELS = (STATISTIC_LABEL, RELEASE_LABEL)
EVALUATION_LABELS = (EVALUATION_LABEL,)
MOST_POINTS = 24
"""Points on a curve of ε over time: each costs the accountant a composition (PLD:
about 0.2 s), so a long history is shown at this many of its charges, the last one
always among them."""


@dataclass(frozen=True)
class Charge:
    """One recorded event, as a statement lists it."""

    account: str
    study: str | None
    kind: str
    label: str
    round: int | None
    recorded_at: float
    event: str
    """The event, as a person reads it (`PrivacyEvent.describe`)."""


@dataclass(frozen=True)
class Point:
    """ε spent just after the charges recorded at `at` (seconds since the epoch)."""

    at: float
    epsilon: float


@dataclass(frozen=True)
class AccountStatement:
    """One account: what it spent and has left, and what it was charged for."""

    account: str
    """As stored: in a study's book, `STUDY_KEY:name`."""
    study: str | None
    """The study's key, None for an account outside any study's book."""
    name: str | None
    """The study's human name (its key where the ledger knows none)."""
    budget: Budget
    spent: float
    left: float
    """The smaller of what its budget leaves and what its dataset's cap leaves, as ε
    (compositions are not sums: the accountant checks each charge)."""
    left_binding: str | None
    """Which bound `left` is: "budget", "cap", or None (no finite bound)."""
    kinds: dict[str, int]
    """Its charges by kind (`kind_of`)."""
    rounds_trained: int
    """Distinct rounds of its training charges."""
    rounds: int
    """Distinct rounds of any charge (`SiloAccount.rounds`)."""

    @property
    def events(self) -> int:
        return sum(self.kinds.values())

    @property
    def own(self) -> str:
        """Its name in its study's book."""
        return own_name(self.account, self.study)


@dataclass(frozen=True)
class Statement:
    """Everything a hospital's ledger says about what it released, and for whom."""

    path: str
    accounts: list[AccountStatement]
    datasets: list[DatasetAccount]
    approvals: list[Approval]
    refusals: list[Refusal]
    released: list[Charge]
    """Every charge other than training, oldest first."""
    names: dict[str, str]
    """Study key → human name, as the ledger records them."""
    verification: Verification
    spending: dict[str, list[Point]]
    """ε after each charge (at most `MOST_POINTS`), per `account NAME` with a finite
    budget or a cap and per `dataset NAME`; empty unless asked for (`read(over_time=)`)."""

    def name_of(self, study: str | None) -> str:
        """A study's name as shown: its human name (with the start of its key where
        another study has the same name: an amended study is another study), its key
        where none is known, a dash for accounts outside any study's book."""
        if study is None:
            return "—"
        name = self.names.get(study, study)
        same = sum(n == name for n in self.names.values())
        return f"{name} ({study[:12]})" if same > 1 else name


def to_json(statement: Statement) -> dict[str, Any]:
    """The statement as `dpfl deploy status --json` prints it (docs/deployment.md)."""
    verified = statement.verification
    return {
        "ledger": statement.path,
        "accounts": [
            {
                "study": a.study,
                "name": a.name,
                "account": a.account,
                "dataset": a.budget.dataset,
                "rounds": a.rounds,
                "rounds_trained": a.rounds_trained,
                "events": a.events,
                "training_events": a.kinds[TRAINING],
                "statistics": a.kinds[STATISTIC],
                "evaluations": a.kinds[EVALUATION],
                "other_events": a.kinds[OTHER],
                "epsilon": a.spent,
                "budget": a.budget.epsilon,
                "left": a.left,
                "left_binding": a.left_binding,
                "delta": a.budget.delta,
            }
            for a in statement.accounts
        ],
        "datasets": [
            {
                "dataset": d.cap.dataset,
                "cap": d.cap.epsilon,
                "delta": d.cap.delta,
                "epsilon": d.spent.epsilon,
                "left": d.remaining,
                "studies": {study: r.epsilon for study, r in d.studies.items()},
            }
            for d in statement.datasets
        ],
        "names": statement.names,
        "approvals": [
            {k: v for k, v in dataclasses.asdict(a).items() if k != "signature"}
            for a in statement.approvals
        ],
        "refusals": [dataclasses.asdict(r) for r in statement.refusals],
        "released": [dataclasses.asdict(c) for c in statement.released],
        "verification": {"ok": verified.ok, **dataclasses.asdict(verified)},
    }


def when(at: float) -> str:
    """A time a person reads: UTC, to the second."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def epsilon_text(value: float) -> str:
    """An ε as a person reads it: ∞ for a budget that never refuses."""
    return "∞" if value == math.inf else f"{value:.4g}"


def own_name(account: str, study: str | None) -> str:
    """An account's name in its study's book (stored: `STUDY_KEY:name`)."""
    return account if study is None else account.removeprefix(f"{study}:")


def chain_text(verified: Verification) -> str:
    """The chain's verification in one line: verified, or where it breaks."""
    if verified.ok:
        return (
            f"chain verified: {verified.entries} entries, {verified.seals} seals, head "
            f"{verified.head[:16]}…"
        )
    if not verified.chained:
        return "no hash chain: " + "; ".join(verified.problems)
    return f"chain BROKEN ({verified.entries} entries): " + "; ".join(verified.problems)


def kind_of(label: str, round: int | None) -> str:
    """What a charge paid for, as the engines record it: a training exchange carries its
    round; round-less charges are told apart by their labels' prefixes
    (`STATISTIC_LABELS`, `EVALUATION_LABELS`)."""
    if round is not None:
        return TRAINING
    if label.startswith(STATISTIC_LABELS):
        return STATISTIC
    if label.startswith(EVALUATION_LABELS):
        return EVALUATION
    return OTHER


def read(book: Ledger, *, over_time: bool = False) -> Statement:
    """The statement of `book`; with `over_time`, each bound's spending over time too
    (seconds: an accountant's composition per point)."""
    names = book.study_names()
    datasets = book.datasets()
    rest = {d.cap.dataset: d.remaining for d in datasets}
    accounts, charges = [], {}
    for account in book.accounts():
        charges[account.silo] = book.entries(account.silo)
        accounts.append(_account(account, names, rest, charges[account.silo]))
    released = sorted(
        (
            _charge(entry, account.study)
            for account in accounts
            for entry in charges[account.account]
            if kind_of(entry.label, entry.round) != TRAINING
        ),
        key=lambda c: c.recorded_at,
    )
    return Statement(
        str(book.path),
        accounts,
        datasets,
        list(book.approvals()),
        list(book.refusals()),
        released,
        names,
        book.verify(),
        _spending(book.accountant, accounts, datasets, charges) if over_time else {},
    )


def _account(
    account: SiloAccount, names: dict[str, str], rest: dict[str, float], entries: list[Entry]
) -> AccountStatement:
    budget = account.budget
    own = account.remaining
    cap = math.inf if budget.dataset is None else rest[budget.dataset]
    binding = "cap" if cap < own else "budget" if math.isfinite(own) else None
    kinds = dict.fromkeys((TRAINING, STATISTIC, EVALUATION, OTHER), 0)
    for entry in entries:
        kinds[kind_of(entry.label, entry.round)] += 1
    trained = {e.round for e in entries if kind_of(e.label, e.round) == TRAINING}
    return AccountStatement(
        account.silo,
        account.study,
        None if account.study is None else names.get(account.study, account.study),
        budget,
        account.spent.epsilon,
        min(own, cap),
        binding,
        kinds,
        len(trained),
        account.rounds,
    )


def _charge(entry: Entry, study: str | None) -> Charge:
    return Charge(
        entry.silo,
        study,
        kind_of(entry.label, entry.round),
        entry.label,
        entry.round,
        entry.recorded_at,
        entry.event.describe(),
    )


def _spending(
    accountant: Accountant | None,
    accounts: list[AccountStatement],
    datasets: list[DatasetAccount],
    charges: dict[str, list[Entry]],
) -> dict[str, list[Point]]:
    """ε after each charge, composed in the order recorded, by the accountant the ledger
    reports with: per account with a finite budget or a cap, at its δ, and per capped
    dataset over every account spending from it, at the cap's δ. (`Ledger.spent`'s
    `through_round` cannot draw this: it counts every round-less charge, a statistic's,
    from the start.)"""
    out = {}
    for account in accounts:
        if account.left_binding is not None:
            out[f"account {account.account}"] = over_time(
                charges[account.account], account.budget.delta, accountant
            )
    for dataset in datasets:
        cap = dataset.cap
        spending = sorted(
            (e for a in accounts if a.budget.dataset == cap.dataset for e in charges[a.account]),
            key=lambda e: e.id,
        )
        # a cap's accountant, as `Ledger.datasets` composes it: PLD where it can, else RDP
        out[f"dataset {cap.dataset}"] = over_time(spending, cap.delta, None)
    return out


def over_time(
    entries: Iterable[Entry], delta: float, accountant: Accountant | None, most: int = MOST_POINTS
) -> list[Point]:
    """ε at `delta` after each time charges were recorded (entries in the order they
    were), composed as the ledger composes a history; at `most` of those times, spread
    evenly, the last one among them."""
    times = [(at, [e.event for e in group]) for at, group in groupby(entries, _recorded_at)]
    step = max(1, math.ceil(len(times) / most))
    shown = set(range(len(times) - 1, -1, -step))
    points, history = [], []
    for i, (at, charged) in enumerate(times):
        history.extend(charged)
        if i in shown:
            spent = plan_epsilon(events.compose(history), delta, accountant)
            points.append(Point(at, spent.epsilon))
    return points


def _recorded_at(entry: Entry) -> float:
    return entry.recorded_at
