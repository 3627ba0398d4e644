"""A ledger's hash chain: every entry tied to the one before it, so that no one edits,
deletes or reorders what a hospital spent without it showing.

SQLite keeps no checksums: a changed byte inside a stored value passes its checks, and an
edited or deleted row leaves no trace. So every write to a ledger (an account opened, a
cap set, a charge, a kept fact, an approval, a refusal) also appends one entry to its
`chain` table, in the same transaction: its kind, its body (canonical JSON), and the
SHA-256 of the entry before it and of itself. `walk` recomputes every hash and says where
the chain breaks; the ledger checks that its tables hold exactly what the chain says
(`Ledger.verify`).

A chain alone can be recomputed whole by whoever edits it. Two things stop that:
* a **seal**: the hospital signs the chain's head with its identity key (Ed25519) at each
  release, as an entry of the chain itself, so a recomputed chain no longer matches the
  signatures in it;
* a **receipt**: the seal and the entries a release charged, sent to the server, which
  keeps them: `verify_receipt` checks one against a hospital's ledger, so a ledger cut
  back or rewritten after a receipt was given disagrees with it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

GENESIS = "0" * 64
"""The `prev` of a chain's first entry."""
KEY_PREFIX = "ed25519:"
SCHEMA = """
CREATE TABLE chain (
    seq INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    prev TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX chain_by_kind ON chain(kind, seq);
"""


@dataclass(frozen=True)
class Link:
    """One entry of the chain."""

    seq: int
    kind: str
    body: str
    """Canonical JSON (`canonical`)."""
    prev: str
    hash: str

    @property
    def data(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.body)
        return value

    def computed(self) -> str:
        """The hash this entry should carry."""
        return digest(self.seq, self.kind, self.body, self.prev)


@dataclass(frozen=True)
class Seal:
    """A hospital's signature on its ledger's head: the chain up to `seq` is as it was."""

    ledger: str
    """The ledger's id (its genesis entry's), so a seal of one ledger is never read as
    another's."""
    seq: int
    head: str
    key: str
    """The signer's public key, `ed25519:<64 hex digits>`."""
    signature: str

    def message(self) -> bytes:
        return sealed_message(self.ledger, self.seq, self.head)

    def valid(self) -> bool:
        return verify_signature(self.key, self.signature, self.message())


@dataclass(frozen=True)
class Receipt:
    """What a hospital gives the server for the charges one release caused: the entries
    that charged them and its seal of the chain's head after them."""

    hospital: str
    study: str | None
    entries: tuple[Link, ...]
    seal: Seal

    def to_json(self) -> str:
        return canonical(
            {
                "hospital": self.hospital,
                "study": self.study,
                "entries": [asdict(link) for link in self.entries],
                "seal": asdict(self.seal),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Receipt:
        try:
            data = json.loads(text)
            return cls(
                str(data["hospital"]),
                None if data["study"] is None else str(data["study"]),
                tuple(Link(**link) for link in data["entries"]),
                Seal(**data["seal"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"not a dpfl receipt: {exc}") from exc

    def problems(self) -> list[str]:
        """What is wrong with the receipt on its own: a signature that does not verify, an
        entry whose hash is not its content's, an entry after the head it seals."""
        found = [] if self.seal.valid() else [f"its seal of entry {self.seal.seq} is forged"]
        for link in self.entries:
            if link.computed() != link.hash:
                found.append(f"entry {link.seq}'s hash is not its content's")
            if link.seq > self.seal.seq:
                found.append(f"entry {link.seq} is after the head it seals ({self.seal.seq})")
        return found


def canonical(value: Any) -> str:
    """JSON with sorted keys and no spaces: one text for one value (floats as Python's
    shortest repr, which reads back to the same double)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def digest(seq: int, kind: str, body: str, prev: str) -> str:
    return hashlib.sha256(f"{prev}\n{seq}\n{kind}\n{body}".encode()).hexdigest()


def sealed_message(ledger: str, seq: int, head: str) -> bytes:
    return f"dpfl ledger seal\n{ledger}\n{seq}\n{head}".encode()


def public_text(key: Ed25519PublicKey) -> str:
    return KEY_PREFIX + key.public_bytes_raw().hex()


def verify_signature(key: str, signature: str, message: bytes) -> bool:
    """Whether `signature` (hex) is `key`'s (`ed25519:<hex>`) on `message`."""
    try:
        if not key.startswith(KEY_PREFIX):
            return False
        public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(key.removeprefix(KEY_PREFIX)))
        public.verify(bytes.fromhex(signature), message)
    except (ValueError, InvalidSignature):
        return False
    return True


def head(db: sqlite3.Connection) -> Link | None:
    """The chain's last entry; None while it is empty."""
    row = db.execute("SELECT seq, kind, body, prev, hash FROM chain ORDER BY seq DESC LIMIT 1")
    found = row.fetchone()
    return None if found is None else Link(*found)


def append(db: sqlite3.Connection, kind: str, body: Mapping[str, Any]) -> Link:
    """Add an entry after the head (inside the caller's write transaction); the first
    entry of a chain is preceded by its genesis, which gives the ledger its id."""
    last = head(db)
    if last is None:
        last = _insert(db, 1, "genesis", {"ledger": uuid.uuid4().hex, "at": time.time()}, GENESIS)
    return _insert(db, last.seq + 1, kind, body, last.hash)


def ledger_id(db: sqlite3.Connection) -> str | None:
    row = db.execute("SELECT body FROM chain WHERE seq = 1 AND kind = 'genesis'").fetchone()
    return None if row is None else str(json.loads(row[0])["ledger"])


def seal(db: sqlite3.Connection, key: Ed25519PrivateKey) -> Seal:
    """Sign the head and append the seal (inside the caller's write transaction)."""
    last = head(db) or append(db, "opened", {})
    ledger = ledger_id(db)
    assert ledger is not None  # every non-empty chain starts with its genesis
    signature = key.sign(sealed_message(ledger, last.seq, last.hash)).hex()
    made = Seal(ledger, last.seq, last.hash, public_text(key.public_key()), signature)
    append(db, "seal", {k: v for k, v in asdict(made).items() if k != "ledger"})
    return made


def links(db: sqlite3.Connection, *, kinds: Sequence[str] = (), after: int = 0) -> list[Link]:
    """The chain's entries after `after`, in order; only `kinds` where given."""
    where = "" if not kinds else f" AND kind IN ({', '.join('?' * len(kinds))})"
    rows = db.execute(
        f"SELECT seq, kind, body, prev, hash FROM chain WHERE seq > ?{where} ORDER BY seq",
        [after, *kinds],
    )
    return [Link(*row) for row in rows]


def walk(chain: Sequence[Link]) -> list[str]:
    """Where the chain breaks, in words (empty: every entry follows the one before it and
    carries its own content's hash, and every seal in it signs the head it names)."""
    problems: list[str] = []
    ledger, previous = None, GENESIS
    hashes: dict[int, str] = {}
    for expected, link in enumerate(chain, start=1):
        if link.seq != expected:
            problems.append(f"entry {expected} is missing (the next is entry {link.seq})")
            return problems
        if link.prev != previous:
            problems.append(f"entry {link.seq} does not follow entry {link.seq - 1}")
        if link.computed() != link.hash:
            problems.append(f"entry {link.seq} ({link.kind}) was changed after it was written")
        if link.seq == 1:
            ledger = link.data.get("ledger") if link.kind == "genesis" else None
        if link.kind == "seal":
            problems.extend(_seal_problems(link, ledger, hashes))
        hashes[link.seq], previous = link.hash, link.hash
    return problems


def _seal_problems(link: Link, ledger: str | None, hashes: Mapping[int, str]) -> list[str]:
    data = link.data
    made = Seal(str(ledger), int(data["seq"]), str(data["head"]), data["key"], data["signature"])
    if hashes.get(made.seq) != made.head:
        return [f"entry {link.seq} seals entry {made.seq} as it no longer is"]
    if not made.valid():
        return [f"entry {link.seq}'s seal does not verify under {made.key}"]
    return []


def _insert(
    db: sqlite3.Connection, seq: int, kind: str, body: Mapping[str, Any], prev: str
) -> Link:
    text = canonical(dict(body))
    link = Link(seq, kind, text, prev, digest(seq, kind, text, prev))
    db.execute("INSERT INTO chain VALUES (?, ?, ?, ?, ?)", (seq, kind, text, prev, link.hash))
    return link
