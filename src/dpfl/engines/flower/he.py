"""Homomorphic encryption across machines: `dpfl.secure.he` (BFV, TenSEAL) with its
parties on their own machines. Each hospital encrypts its reply under the run's public
key; the server only adds ciphertexts; one hospital, the key holder, decrypts one sum per
round and returns it to the server.

Keys are made once per run, before it, by `make_key_files` (`dpfl deploy he-keys`): the
key holder's file (the secret key, the MAC key, the session: it never leaves that
hospital) and the public file for the other hospitals and the server. A hospital's node
config names its file (`he-keys`); the server's run config names the public one; the
key holder announces itself at hello, and a run needs exactly one.

The key holder decrypts a sum only of at least the replies its own algorithm's charged
events assume (`Algorithm.fewest_replies`), and one sum per round: the last round it
decrypted, and that sum, are kept durably beside its key file before the sum leaves.
Asked again for that round with the same ciphertexts (a server restarted from its
checkpoint, whose hospitals re-send their replies) it returns the same sum, which
releases nothing new; any other sum of a round it decrypted is refused, and so is a sum
that claims a reply from outside the study's roster (`dpfl.engines.flower.roster`). Trust model:
`dpfl.secure.he` (honest-but-curious server, a key holder that does not collude with it):
the server holds the MAC key, so a server that lies about which roster hospitals' replies
a sum holds is outside it; masking is the choice against such a server.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from dpfl.engines.flower.protocol import Ask, DeploymentError, Exchange
from dpfl.engines.flower.roster import Roster
from dpfl.engines.flower.sums import DeployedSum
from dpfl.federation.algorithms.base import Reply
from dpfl.federation.messages import Summed
from dpfl.files import replacing
from dpfl.secure.he import MODE, Aggregator, HomomorphicError, KeyFile, KeyHolder

if TYPE_CHECKING:
    from dpfl.engines.flower.hospital import Hospital

_TRAILER = 12 + 16
"""A sealed message's nonce and tag: what differs between two sealings of one sum."""


def make_key_files(folder: Path) -> tuple[Path, Path]:
    """A new run's key files in `folder`: the key holder's (`key-holder.he`, secret) and
    everyone else's (`public.he`)."""
    folder.mkdir(parents=True, exist_ok=True)
    secret, public = KeyHolder(mac_key=os.urandom(32), session=os.urandom(16)).key_files()
    paths = folder / "key-holder.he", folder / "public.he"
    for path, data in zip(paths, (secret, public), strict=True):
        path.write_bytes(data)
    paths[0].chmod(0o600)
    return paths


def key_file(hospital: Hospital) -> KeyFile:
    """The hospital's HE key file (the key holder's holds the secret key)."""
    if hospital.me.he_keys is None:
        raise DeploymentError(
            f"study {hospital.run.key} encrypts replies: give this hospital its he-keys file"
        )
    return read_key_file(hospital.me.he_keys)


def read_key_file(path: Path) -> KeyFile:
    try:
        return KeyFile.read(path.read_bytes())
    except OSError as exc:
        raise HomomorphicError(f"cannot read the HE key file {path}: {exc}") from None


# -- the hospitals' half ----------------------------------------------------------------


@dataclass(frozen=True)
class KeyHolderSide:
    """The key holder's decryption, its one-sum-per-round memory in a file beside its key."""

    keys: Path
    roster: Roster
    """The federation: a sum that claims a reply from anyone else is not decrypted."""

    @property
    def _memory(self) -> Path:
        return self.keys.with_name(self.keys.name + ".decrypted")

    def decrypt(self, fields: Mapping[str, Any], fewest: int) -> dict[str, Any]:
        message, round_ = bytes(fields["sum"]), int(fields["counter"])
        digest = hashlib.sha256(message[:-_TRAILER]).digest()
        memory: dict[str, Any] = (
            torch.load(self._memory, weights_only=True) if self._memory.exists() else {}
        )
        if memory.get("round") == round_ and memory.get("digest") == digest:
            return {"total": memory["total"], "included": memory["included"]}
        holder = read_key_file(self.keys).key_holder(last_round=memory.get("round", -1))
        total, included = holder.decrypt_sum(
            message, round_, at_least=fewest, among=self.roster.names
        )
        answer = {"total": total.numpy().astype("<f8").tobytes(), "included": list(included)}
        with replacing(self._memory) as partial:  # durable before the sum leaves
            torch.save({"round": round_, "digest": digest, **answer}, partial)
        return answer


# -- the server half --------------------------------------------------------------------


@dataclass
class EncryptedSum:
    """One exchange's sum at the server, the `SecureSum` its algorithm's `aggregate`
    calls: it adds the ciphertexts and asks the key holder for the plaintext sum."""

    carried: ClassVar[str] = "ciphertext"
    """The reply field that carries a hospital's protected reply."""

    ask: Ask
    holder: str
    aggregator: Aggregator
    counter: int
    ciphertexts: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def opener(
        cls, hellos: Mapping[str, Mapping[str, Any]], keys: Path | None
    ) -> Callable[[Exchange], EncryptedSum]:
        """How the server opens each exchange's sum: with the public key file `keys` and
        the one key holder among the hospitals' `hellos` (by name)."""
        holders = [name for name, hello in hellos.items() if hello["key-holder"]]
        if len(holders) != 1 or keys is None:
            raise DeploymentError(
                f"an encrypted study needs the server's public key file and one key holder "
                f"among the hospitals, not {holders}"
            )
        return partial(cls.open, holder=holders[0], aggregator=read_key_file(keys).aggregator())

    @classmethod
    def open(cls, exchange: Exchange, *, holder: str, aggregator: Aggregator) -> EncryptedSum:
        return cls(exchange.ask_all, holder, aggregator, exchange.counter)

    @property
    def reveals_inputs(self) -> bool:
        return False

    def instructed(self, names: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Every hospital instructed; a train message adds nothing."""
        return {name: {} for name in names}

    def received(self, name: str, fields: Mapping[str, Any]) -> Reply:
        """Keep `name`'s encrypted reply; its bytes, all the server has of it."""
        self.ciphertexts[name] = bytes(fields["ciphertext"])
        return Reply(torch.frombuffer(bytearray(self.ciphertexts[name]), dtype=torch.uint8))

    def __call__(self, vectors: Mapping[str, Tensor], *, at_least: int = 1) -> Summed:
        self.aggregator.open_round(self.counter)
        for name in vectors:
            self.aggregator.add(name, self.ciphertexts[name])
        summed = self.aggregator.close()
        asked = {self.holder: {"sum": summed, "counter": self.counter}}
        (answer,) = self.ask("query.he_decrypt", asked).values()
        included = tuple(str(n) for n in answer["included"])
        if included != self.aggregator.included or len(included) < at_least:
            raise HomomorphicError(
                f"the key holder decrypted a sum of {included}, not of "
                f"{self.aggregator.included} (at least {at_least})"
            )
        total = np.frombuffer(bytes(answer["total"]), dtype="<f8").astype(np.float64)
        return Summed(torch.from_numpy(total).to(torch.float32), included)


# -- the mode's halves ------------------------------------------------------------------


class Encrypted:
    """The reply encrypted under the run's public key; the key holder announces itself
    at hello."""

    resent: ClassVar[bool] = True

    def announced(self, hospital: Hospital) -> dict[str, Any]:
        return {"key-holder": key_file(hospital).secret}

    def refusal(self, hospital: Hospital, fields: Mapping[str, Any]) -> str | None:
        return None

    def protected(
        self, hospital: Hospital, fields: Mapping[str, Any], reply: Reply, at: int
    ) -> dict[str, Any]:
        encrypted = key_file(hospital).hospital(hospital.me.name).encrypt(reply.vector, at)
        return {"ciphertext": encrypted}

    def released(
        self, hospital: Hospital, fields: Mapping[str, Any], vector: Tensor
    ) -> dict[str, Any]:
        return self.protected(hospital, fields, Reply(vector), 0)


def _decrypt(hospital: Hospital, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The key holder decrypts one sum of at least what its own algorithm assumes."""
    if not isinstance(hospital.protection, Encrypted) or hospital.me.he_keys is None:
        raise DeploymentError("this hospital holds no key to decrypt with")
    side = KeyHolderSide(hospital.me.he_keys, hospital.run.roster)
    if "plan" in fields:  # the statistics' sum (`flower.analytics`): every roster hospital's,
        # never the server's `silos`' count (it could open one training reply alone)
        return side.decrypt(fields, len(hospital.run.roster.names))
    algorithm, silos = hospital.algorithm(fields)
    return side.decrypt(fields, algorithm.fewest_replies(len(silos)))


HALVES = DeployedSum(
    MODE, Encrypted(), EncryptedSum.opener, EncryptedSum.opener, {"he_decrypt": _decrypt}
)
