"""What a hospital's officer decides and what its ledger can prove: approvals of studies,
refusals, and the verification of the ledger's hash chain.

An approval is the officer's signed statement that a study may run over the hospital's
records: the digests of the study file, of the model file it names, of its data schema and
of the dpfl that runs it, with the budget and cap approved. It is kept in the ledger's
chain (`dpfl.privacy.chain`), signed with the hospital's identity key, and checked before
anything runs (`dpfl.engines.flower.approval`). A later approval under the same name
supersedes it; a revocation ends it. A refusal (a study or round the hospital would not
run, and why) is kept in the chain too, so the statement a data-protection officer reads
lists every one.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dpfl.privacy import chain, mirror
from dpfl.privacy.errors import LedgerError


@dataclass(frozen=True)
class Approval:
    """An officer's approval of a study (`name`: the approval's, its study's by default)."""

    name: str
    study: str
    """The study's name."""
    study_key: str
    study_digest: str
    """SHA-256 of the study file's bytes."""
    model_digest: str | None
    """SHA-256 of the model file the study names (`[model] factory`); None: a built-in."""
    schema_digest: str
    """SHA-256 of the study's data schema (its `[data]` section, canonical)."""
    dpfl_version: str
    """dpfl's version and the SHA-256 of its source: what runs the study."""
    epsilon: float
    delta: float
    dataset_cap: float | None
    approved_at: float = 0.0
    key: str = ""
    """The approver's identity public key, `ed25519:<hex>`."""
    signature: str = ""
    revoked_at: float | None = None
    superseded_by: int | None = None
    """The chain entry of the approval under the same name that replaced it."""
    seq: int = 0
    """Its chain entry."""

    @property
    def active(self) -> bool:
        return self.revoked_at is None and self.superseded_by is None

    def signed(self) -> dict[str, Any]:
        """What the signature covers: every field but itself and what later entries say."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("signature", "revoked_at", "superseded_by", "seq")
        }

    def valid(self) -> bool:
        message = chain.canonical(self.signed()).encode()
        return chain.verify_signature(self.key, self.signature, message)


@dataclass(frozen=True)
class Refusal:
    """A release the hospital refused, and why."""

    study: str | None
    account: str
    round: int | None
    reason: str
    recorded_at: float


@dataclass(frozen=True)
class Verification:
    """What `Ledger.verify` found: `ok` when the chain is whole, every seal in it signs the
    head it names, and the tables hold exactly what the chain recorded."""

    entries: int
    head: str
    seals: int
    problems: list[str]
    chained: bool = True
    """False: a ledger written before the chain, which nothing verifies until upgraded."""

    @property
    def ok(self) -> bool:
        return not self.problems


def approve(db: sqlite3.Connection, approval: Approval, key: Ed25519PrivateKey) -> Approval:
    """Sign and keep `approval` (inside the caller's write transaction)."""
    made = Approval(
        **{
            **asdict(approval),
            "approved_at": time.time(),
            "key": chain.public_text(key.public_key()),
            "signature": "",
        }
    )
    signature = key.sign(chain.canonical(made.signed()).encode()).hex()
    link = chain.append(db, "approval", {**made.signed(), "signature": signature})
    return Approval(**{**asdict(made), "signature": signature, "seq": link.seq})


def revoke(db: sqlite3.Connection, name: str, key: Ed25519PrivateKey) -> Approval:
    """End the active approval `name` (inside the caller's write transaction)."""
    active = [a for a in approvals(db) if a.name == name and a.active]
    if not active:
        known = ", ".join(sorted({a.name for a in approvals(db) if a.active})) or "none"
        raise LedgerError(f"no active approval {name!r} to revoke (active: {known})")
    public = chain.public_text(key.public_key())
    if active[0].key != public:
        raise LedgerError(f"approval {name!r} was signed by {active[0].key}, not by {public}")
    at = time.time()
    body = {"name": name, "revoked_at": at, "key": public}
    signature = key.sign(chain.canonical(body).encode()).hex()
    chain.append(db, "revocation", {**body, "signature": signature})
    return Approval(**{**asdict(active[0]), "revoked_at": at})


def approvals(db: sqlite3.Connection) -> list[Approval]:
    """Every approval in the order given, with what later entries did to it."""
    found: list[Approval] = []
    latest: dict[str, int] = {}
    for link in chain.links(db, kinds=("approval", "revocation")):
        data = link.data
        if link.kind == "approval":
            if data["name"] in latest:
                i = latest[data["name"]]
                found[i] = Approval(**{**asdict(found[i]), "superseded_by": link.seq})
            latest[data["name"]] = len(found)
            found.append(Approval(**data, seq=link.seq))
        elif data["name"] in latest and found[latest[data["name"]]].revoked_at is None:
            i = latest[data["name"]]
            found[i] = Approval(**{**asdict(found[i]), "revoked_at": data["revoked_at"]})
    return found


def refuse(
    db: sqlite3.Connection, study: str | None, account: str, round_: int | None, reason: str
) -> None:
    """Keep a refusal (inside the caller's write transaction)."""
    body = {"study": study, "account": account, "round": round_, "reason": reason}
    chain.append(db, "refusal", {**body, "recorded_at": time.time()})


def refusals(db: sqlite3.Connection) -> list[Refusal]:
    return [Refusal(**link.data) for link in chain.links(db, kinds=("refusal",))]


def verify(db: sqlite3.Connection) -> Verification:
    """The whole chain walked, its approvals' and revocations' signatures checked, and the
    tables compared with it."""
    links = chain.links(db)
    problems = chain.walk(links)
    problems += _signature_problems(links)
    problems += mirror.differences(db, links)
    seals = sum(link.kind == "seal" for link in links)
    return Verification(len(links), links[-1].hash if links else chain.GENESIS, seals, problems)


def receipt_problems(held: Mapping[int, chain.Link], receipt: chain.Receipt) -> list[str]:
    """Where the ledger whose chain is `held` (entries by number) disagrees with a receipt
    the hospital gave (empty: it holds the entries the receipt names, as they were, and
    the seal). A receipt of another ledger is not this one's to judge: the caller sorts
    them by `receipt.seal.ledger`."""
    seal = receipt.seal
    name = f"{receipt.hospital}'s receipt of entry {seal.seq}"
    found = [f"{name}: {problem}" for problem in receipt.problems()]
    ends = max(held, default=0)
    if ends < seal.seq + 1:
        return [*found, f"{name}: the ledger ends at entry {ends}: entries were removed"]
    for link in receipt.entries:
        if link.seq not in held or held[link.seq].hash != link.hash:
            found.append(f"{name}: entry {link.seq} ({link.kind}) is no longer what was charged")
    if seal.seq not in held or held[seal.seq].hash != seal.head:
        found.append(f"{name}: the ledger's entry {seal.seq} is not the one it sealed")
    kept = held.get(seal.seq + 1)
    if kept is None or kept.kind != "seal" or kept.data.get("signature") != seal.signature:
        found.append(f"{name}: its seal is not in the ledger after entry {seal.seq}")
    return found


def _signature_problems(links: Sequence[chain.Link]) -> list[str]:
    found = []
    for link in links:
        data: Mapping[str, Any] = link.data
        if link.kind == "approval":
            good = Approval(**data).valid()
        elif link.kind == "revocation":
            body = {k: v for k, v in data.items() if k != "signature"}
            good = chain.verify_signature(
                data["key"], data["signature"], chain.canonical(body).encode()
            )
        else:
            continue
        if not good:
            found.append(f"entry {link.seq}: the {link.kind} of {data['name']!r} is not signed")
    return found


def study_name(db: sqlite3.Connection, key: str, name: str) -> None:
    """Keep the name of the study whose key is `key` (once; inside a write transaction)."""
    fact = f"study {key}"
    if db.execute("SELECT 1 FROM facts WHERE key = ?", (fact,)).fetchone() is None:
        mirror.write(db, "facts", [(fact, json.dumps(name), time.time())])


def study_names(db: sqlite3.Connection) -> dict[str, str]:
    rows = db.execute("SELECT key, value FROM facts WHERE key LIKE 'study %'")
    return {key.removeprefix("study "): json.loads(value) for key, value in rows}
