"""Pairwise masking across machines: `dpfl.secure.masking`'s SecAgg rounds as Flower
messages, so that a deployed study whose ε assumes the server sees only the sum of the
replies (Dopamine) keeps that promise on the wire.

One exchange, over its cohort (the server half in `MaskedSum`, the hospital half in the
functions below, called by `dpfl.engines.flower`):

1. "query.secagg_keys": the session id, the cohort's names and the server's X25519 key.
   Each hospital builds the session's `Setup` itself: the cohort's identity keys from
   the study's roster (a name outside it is refused: `dpfl.engines.flower.roster`), the
   threshold from the cohort's size, the fixed point, its own model's length and, as
   the fewest masked inputs it helps to unmask, what its own algorithm's charged events
   assume (`Algorithm.fewest_replies`), never the server's word. It answers its signed
   public keys; its client's secrets stay in its node's context state, on its machine.
2. "query.secagg_shares": the roster; each answers its encrypted Shamir shares.
3. "train": the model and the hospital's inbox of shares. It trains, charging its ledger
   first, and sends its reply masked: the server receives masked words only.
4. "query.secagg_unmask": when the algorithm's `aggregate` asks for the sum
   (`MaskedSum.__call__`), the survivors and the dropped; each survivor checks the
   announcement and answers the shares that remove the masks.

Why not Flower's SecAgg+ workflow and mod: its masks are numpy's `RandomState` seeded
with 32 bits folded out of the agreed seed (`pseudo_rand_gen` in
flwr/common/secure_aggregation/secaggplus_utils.py), so every mask is one of 2^32
streams, not a cryptographic PRG's; its shares are encrypted with Fernet, bound to no
sender or recipient. Here Flower carries the messages and dpfl's protocol (ChaCha20
masks under 256-bit seeds, AES-GCM shares bound to sender and recipient, GMAC'd
messages, commitments) does the rest. The identity keys that sign each party's keys are
pinned in the roster every hospital holds, so the server cannot stand in for a hospital
or add parties of its own to a session.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from flwr.app import ConfigRecord, RecordDict
from torch import Tensor

from dpfl.engines.flower.protocol import Ask, DeploymentError, Exchange
from dpfl.engines.flower.roster import Roster, RosterError, read_identity
from dpfl.engines.flower.sums import DeployedSum, Work
from dpfl.federation.algorithms.base import Reply, flat
from dpfl.federation.messages import Summed
from dpfl.local.dpsgd import parameters_of
from dpfl.secure.masking import (
    MODE,
    STATS_MASKING,
    AdvertiseKeys,
    Client,
    EncryptedShare,
    MaskedInput,
    PairwiseMasking,
    SecureAggregationError,
    Server,
    Setup,
    ShareKeys,
    UnmaskReply,
    UnmaskRequest,
    roster_fields,
    roster_of,
)

if TYPE_CHECKING:
    from dpfl.engines.flower.hospital import Hospital

MASKING = PairwiseMasking()
"""The protocol's public parameters (threshold rule, fixed point): the simulator's."""
STATE = "dpfl.secagg"
"""The hospital's context-state record holding its client between messages."""


def session_setup(
    fields: Mapping[str, Any],
    roster: Roster,
    length: int,
    fewest: int,
    masking: PairwiseMasking = MASKING,
) -> Setup:
    """The session's setup from the server's announcement (its id, the cohort's names, the
    server's key) and what each party knows itself: the cohort's identity keys from the
    roster, the vector's length, the fewest inputs its algorithm's events assume, the
    protocol's parameters (a stats exchange's: `dpfl.secure.masking.STATS_MASKING`)."""
    names = tuple(str(n) for n in fields["names"])
    try:
        roster.check(names, "the masking session")
    except RosterError as exc:
        raise SecureAggregationError(str(exc)) from None
    return Setup(
        session=bytes(fields["session"]),
        names=names,
        identities={name: roster.identities[name] for name in names},
        threshold=masking.threshold_for(len(names)),
        codec=masking.codec,
        length=length,
        server_public=bytes(fields["server-public"]),
        min_inputs=fewest,
    )


# -- the hospital half ------------------------------------------------------------------


@dataclass
class HospitalSide:
    """One hospital's client of the session, resumed from its context state."""

    state: RecordDict
    name: str
    length: int
    fewest: int
    identity: Ed25519PrivateKey
    """The key the roster lists for this hospital: it signs its advertised keys."""
    roster: Roster
    masking: PairwiseMasking = MASKING

    def _keep(self, announced: Mapping[str, Any], client: Client) -> None:
        self.state.config_records[STATE] = ConfigRecord(
            {**{f"setup.{k}": v for k, v in announced.items()}, **client.saved()}
        )

    def _resume(self) -> tuple[dict[str, Any], Client]:
        if STATE not in self.state.config_records:
            raise SecureAggregationError(
                f"{self.name}: no secure-aggregation session under way; this study's "
                "replies leave this hospital masked only"
            )
        kept = dict(self.state.config_records[STATE])
        announced = {k.removeprefix("setup."): v for k, v in kept.items() if k.startswith("setup.")}
        setup = session_setup(announced, self.roster, self.length, self.fewest, self.masking)
        client = Client(setup, self.name, self.identity, os.urandom, saved=kept)
        return announced, client

    def keys(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """Round 0: a new session's client; its signed public keys."""
        announced = {k: fields[k] for k in ("session", "names", "server-public")}
        setup = session_setup(announced, self.roster, self.length, self.fewest, self.masking)
        if self.name not in setup.names:
            raise SecureAggregationError(f"{self.name}: a masking session without me")
        client = Client(setup, self.name, self.identity, os.urandom)
        self._keep(announced, client)
        advert = client.advertise()
        return {
            "c-public": advert.c_public,
            "s-public": advert.s_public,
            "signature": advert.signature,
        }

    def shares(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """Round 1: the roster's signatures checked, b and s shared among it."""
        announced, client = self._resume()
        message = client.share_keys(roster_of(client.setup.session, fields))
        self._keep(announced, client)
        return {
            "commitment": message.commitment,
            "recipients": [s.recipient for s in message.shares],
            "nonces": [s.nonce for s in message.shares],
            "ciphertexts": [s.ciphertext for s in message.shares],
            "tag": message.tag,
        }

    def check_cohort(self, fields: Mapping[str, Any]) -> None:
        """A train message's session and cohort are the session's: else no masked reply
        (refused before training, so nothing is charged)."""
        announced, _ = self._resume()
        if bytes(fields.get("session", b"")) != bytes(announced["session"]) or list(
            fields["cohort"]
        ) != list(announced["names"]):
            raise SecureAggregationError(
                f"{self.name}: the train message's session or cohort is not the session's"
            )

    def masked(self, fields: Mapping[str, Any], vector: Tensor) -> dict[str, Any]:
        """Round 2: the shares received decrypted; the reply masked."""
        announced, client = self._resume()
        session = client.setup.session
        inbox = [
            EncryptedShare(session, str(sender), client.name, bytes(nonce), bytes(ciphertext))
            for sender, nonce, ciphertext in zip(
                fields["senders"], fields["nonces"], fields["ciphertexts"], strict=True
            )
        ]
        message = client.masked_input(inbox, vector.detach().cpu().numpy())
        self._keep(announced, client)
        return {"words": message.words.tobytes(), "tag": message.tag}

    def unmask(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """Round 3: the shares that remove the survivors' and the dropped's masks, once."""
        announced, client = self._resume()
        request = UnmaskRequest(
            client.setup.session,
            tuple(str(v) for v in fields["survivors"]),
            tuple(str(v) for v in fields["dropped"]),
        )
        reply = client.unmask(request)
        self._keep(announced, client)
        return {
            "b-names": [v for v, _ in reply.self_mask_shares],
            "b-shares": [s for _, s in reply.self_mask_shares],
            "s-names": [v for v, _ in reply.key_shares],
            "s-shares": [s for _, s in reply.key_shares],
            "tag": reply.tag,
        }


# -- the server half --------------------------------------------------------------------


@dataclass
class MaskedSum:
    """One exchange's session at the server, and the `SecureSum` its algorithm's
    `aggregate` calls: it only ever holds masked words and shares."""

    carried: ClassVar[str] = "words"
    """The reply field that carries a hospital's protected reply."""

    ask: Ask
    setup: Setup
    server: Server
    inboxes: dict[str, list[EncryptedShare]] = field(default_factory=dict)
    masked_inputs: dict[str, MaskedInput] = field(default_factory=dict)

    @property
    def reveals_inputs(self) -> bool:
        return False

    @classmethod
    def opener(
        cls, hellos: Mapping[str, Mapping[str, Any]], keys: Path | None
    ) -> Callable[[Exchange], MaskedSum]:
        """How the server opens each exchange's session: no key of its own."""
        return cls.open

    @classmethod
    def open(cls, exchange: Exchange, masking: PairwiseMasking = MASKING) -> MaskedSum:
        """Rounds 0 and 1 with the exchange's cohort (in order), keys from the roster."""
        ask, key = exchange.ask, X25519PrivateKey.generate()
        announced = {
            "session": os.urandom(16),
            "names": list(exchange.names),
            "server-public": key.public_key().public_bytes_raw(),
        }
        setup = session_setup(announced, exchange.roster, exchange.length, exchange.fewest, masking)
        server = Server(setup, key)
        adverts = ask("query.secagg_keys", {n: announced for n in setup.names})
        keyed = server.collect_keys(
            [
                AdvertiseKeys(
                    setup.session,
                    n,
                    bytes(a["c-public"]),
                    bytes(a["s-public"]),
                    bytes(a["signature"]),
                )
                for n, a in adverts.items()
            ]
        )
        listed = roster_fields(keyed)
        shared = ask("query.secagg_shares", {m.sender: listed for m in keyed})
        session = cls(ask, setup, server)
        session.inboxes = server.collect_shares(
            [
                ShareKeys(
                    setup.session,
                    n,
                    bytes(s["commitment"]),
                    tuple(
                        EncryptedShare(setup.session, n, str(r), bytes(nonce), bytes(c))
                        for r, nonce, c in zip(
                            s["recipients"], s["nonces"], s["ciphertexts"], strict=True
                        )
                    ),
                    bytes(s["tag"]),
                )
                for n, s in shared.items()
            ]
        )
        return session

    def instructed(self, names: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The hospitals that took part in the key rounds, each with what its train
        message adds: the session and its inbox of shares."""
        return {
            name: {
                "session": self.setup.session,
                "senders": [s.sender for s in inbox],
                "nonces": [s.nonce for s in inbox],
                "ciphertexts": [s.ciphertext for s in inbox],
            }
            for name, inbox in self.inboxes.items()
        }

    def received(self, name: str, fields: Mapping[str, Any]) -> Reply:
        """Keep `name`'s masked input (checked when the sum is asked for); its words, which
        are all the server has of its reply."""
        dtype = self.setup.codec.dtype
        words = np.frombuffer(bytes(fields["words"]), dtype=dtype.newbyteorder("<")).astype(dtype)
        self.masked_inputs[name] = MaskedInput(
            self.setup.session, name, words, bytes(fields["tag"])
        )
        return Reply(torch.from_numpy(words.view(np.int32 if dtype.itemsize == 4 else np.int64)))

    def __call__(self, vectors: Mapping[str, Tensor], *, at_least: int = 1) -> Summed:
        """Round 3: the survivors' sum, if at least `at_least` masked inputs are in it (the
        hospitals themselves refuse a sum of fewer than their own algorithm assumes)."""
        if at_least > self.setup.quorum:
            raise SecureAggregationError(
                f"a sum of at least {at_least} was asked for; the session's hospitals agreed "
                f"to unmask sums of {self.setup.quorum}"
            )
        unknown = set(vectors) - set(self.masked_inputs)
        if unknown:
            raise SecureAggregationError(f"no masked input from {sorted(unknown)}")
        request = self.server.collect_masked([self.masked_inputs[v] for v in vectors])
        announced = {"survivors": list(request.survivors), "dropped": list(request.dropped)}
        answers = self.ask("query.secagg_unmask", {v: announced for v in request.survivors})
        return self.server.aggregate(
            [
                UnmaskReply(
                    self.setup.session,
                    v,
                    tuple(zip(map(str, a["b-names"]), map(bytes, a["b-shares"]), strict=True)),
                    tuple(zip(map(str, a["s-names"]), map(bytes, a["s-shares"]), strict=True)),
                    bytes(a["tag"]),
                )
                for v, a in answers.items()
            ]
        )


# -- the mode's halves ------------------------------------------------------------------


class Masked:
    """The reply masked in the exchange's session. It is never sent again: in a new
    session beside other inputs it could be told apart, so an exchange asked again is
    trained again, and paid for."""

    resent: ClassVar[bool] = False

    def announced(self, hospital: Hospital) -> dict[str, Any]:
        return {}

    def refusal(self, hospital: Hospital, fields: Mapping[str, Any]) -> str | None:
        try:
            session(hospital, fields).check_cohort(fields)
        except SecureAggregationError as exc:
            return str(exc)
        return None

    def protected(
        self, hospital: Hospital, fields: Mapping[str, Any], reply: Reply, at: int
    ) -> dict[str, Any]:
        return session(hospital, fields).masked(fields, reply.vector)

    def released(
        self, hospital: Hospital, fields: Mapping[str, Any], vector: Tensor
    ) -> dict[str, Any]:
        return self.protected(hospital, fields, Reply(vector), 0)


def session(hospital: Hospital, fields: Mapping[str, Any]) -> HospitalSide:
    """The hospital's side of the exchange's masking session; where the server states a
    plan, a stats exchange's (`flower.analytics`: its plan's vector, in the statistics'
    ring, unmasked only as the sum of every roster hospital's, not of as many as the
    server's `silos`, which could then unmask a training reply nearly alone)."""
    scheme = MASKING
    if "plan" in fields and hospital.run.analytics is not None:
        fewest = len(hospital.run.roster.names)
        length, scheme = hospital.run.analytics.length(fewest), STATS_MASKING
    else:
        algorithm, silos = hospital.algorithm(fields)
        length = flat(parameters_of(algorithm.model)).numel()
        fewest = algorithm.fewest_replies(len(silos))
    return HospitalSide(
        hospital.state,
        hospital.me.name,
        length,
        fewest,
        read_identity(hospital.me.identity),
        hospital.run.roster,
        scheme,
    )


def _step(step: Callable[[HospitalSide, Mapping[str, Any]], dict[str, Any]]) -> Work:
    """A hospital's answer to one of the session's messages, in a masked study only."""

    def work(hospital: Hospital, fields: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(hospital.protection, Masked):
            raise DeploymentError("this study's replies are not masked")
        return step(session(hospital, fields), fields)

    return work


def _stats_opener(
    hellos: Mapping[str, Mapping[str, Any]], keys: Path | None
) -> Callable[[Exchange], MaskedSum]:
    """The statistics' sessions: in their own, wider ring."""
    return partial(MaskedSum.open, masking=STATS_MASKING)


HALVES = DeployedSum(
    MODE,
    Masked(),
    MaskedSum.opener,
    _stats_opener,
    {f"secagg_{s}": _step(getattr(HospitalSide, s)) for s in ("keys", "shares", "unmask")},
)
