"""The federation's roster: every hospital's name and identity key, pinned before round 0.

A deployed hospital must not take the server's word for who else is in the federation:
Dopamine's noise share is σ/√K and the masking threshold a majority of K, so a server
that padded the cohort with parties of its own would get replies carrying a fraction of
the noise each hospital was charged for, and could unmask them with those parties'
shares. So the study file every hospital holds names the federation (`[roster]`: each
hospital's name and its Ed25519 identity public key). Being part of the study, the
roster is compared at hello with the server's through the study's key; each hospital
checks that its own entry is its own key, refuses a run whose silos are not exactly the
roster, a cohort or a sum that names anyone outside it, and builds every session's
identity keys from the roster, never from what the server relays.

Each hospital makes its identity key once (`dpfl deploy identity`), keeps the private
half, and sends the line it prints to the coordinator, who lists every hospital's line
under `[roster]` in the study file it distributes."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

PREFIX = "ed25519:"
_PUBLIC = re.compile(r"ed25519:[0-9a-f]{64}")


class RosterError(ValueError):
    """A roster, an identity key, or a party the roster does not name."""


@dataclass(frozen=True)
class Roster:
    """The hospitals of a federation by name, with their identity public keys (raw
    Ed25519, 32 bytes)."""

    identities: Mapping[str, bytes]

    @classmethod
    def parse(cls, table: Mapping[str, str], source: str = "the study's [roster]") -> Roster:
        """From the study file's table: `NAME = "ed25519:<64 hex digits>"`."""
        if not table:
            raise RosterError(
                f"{source} is empty: a deployment lists every hospital's name and identity "
                "key (`dpfl deploy identity`) under [roster] in the study file"
            )
        identities = {}
        for name, text in table.items():
            if not name or not isinstance(text, str) or not _PUBLIC.fullmatch(text):
                raise RosterError(
                    f"{source}: {name!r} = {text!r} is not an identity key "
                    f"({PREFIX} and 64 hex digits, as `dpfl deploy identity` prints it)"
                )
            identities[name] = bytes.fromhex(text.removeprefix(PREFIX))
        if len(set(identities.values())) != len(identities):
            raise RosterError(f"{source}: two hospitals share one identity key")
        return cls(identities)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.identities)

    def __len__(self) -> int:
        return len(self.identities)

    def outsiders(self, names: Iterable[str]) -> list[str]:
        """The names that are not the roster's, or that appear twice."""
        seen: set[str] = set()
        odd = []
        for name in names:
            if name not in self.identities or name in seen:
                odd.append(name)
            seen.add(name)
        return odd

    def check(self, names: Iterable[str], what: str) -> None:
        """Refuse `what` (a cohort, a sum's parties) if it names anyone outside the
        roster, or anyone twice."""
        odd = self.outsiders(names)
        if odd:
            raise RosterError(
                f"{what} names {sorted(set(odd))}, not (once each) among the roster's "
                f"hospitals {sorted(self.names)}"
            )

    def check_all(self, names: Iterable[str], what: str) -> None:
        """Refuse `what` unless it names exactly the roster's hospitals, each once."""
        listed = list(names)
        self.check(listed, what)
        missing = self.names - set(listed)
        if missing:
            raise RosterError(f"{what} leaves out the roster's {sorted(missing)}")


def public_text(key: Ed25519PrivateKey) -> str:
    """The roster's form of `key`'s public half."""
    return PREFIX + key.public_key().public_bytes_raw().hex()


def make_identity(path: Path) -> str:
    """A new identity key written to `path` (PEM, readable by its owner only; an
    existing file is never overwritten); the roster's text of its public half."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise RosterError(f"{path} exists: an identity key is never overwritten") from None
    with os.fdopen(descriptor, "wb") as file:
        file.write(pem)
        file.flush()
        os.fsync(file.fileno())
    return public_text(key)


def read_identity(path: Path) -> Ed25519PrivateKey:
    """The identity key in `path`, as `make_identity` wrote it."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise RosterError(f"{path}: not an identity key file ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise RosterError(f"{path}: not an Ed25519 identity key")
    return key


def roster_table(lines: Mapping[str, str]) -> str:
    """The study file's `[roster]` section for hospitals' printed identity lines."""
    return "[roster]\n" + "".join(f'"{name}" = "{text}"\n' for name, text in lines.items())
