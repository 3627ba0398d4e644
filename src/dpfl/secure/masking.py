"""Pairwise masking tolerant to dropouts: SecAgg (Bonawitz et al. 2017), run in one process.

`PairwiseMasking` satisfies `dpfl.federation.messages.SecureSum`. It runs the real
protocol between explicit `Client` and `Server` objects; every message is a value (the
`Transcript` of `PairwiseMasking.run` holds all that the server received), so a test can
check that the server only ever sees masked words. The rounds (the paper's names):

0. AdvertiseKeys. Client u draws two X25519 key pairs, (c_u) to encrypt shares and (s_u)
   to agree mask seeds, and sends both public keys signed with its Ed25519 identity key
   (the PKI: `Setup.identities`; a substituted key is refused). The server broadcasts the
   roster U1 (|U1| ≥ t).
1. ShareKeys. u draws its self-mask seed b_u (32 bytes), splits b_u and the private key
   of s_u into Shamir shares (threshold t of |U1|) and sends share j to client j,
   encrypted with AES-GCM under HKDF(X25519(c_u, c_j)) with the session, sender and
   recipient as associated data: the server relays ciphertexts only, and a tampered,
   misrouted or replayed share fails authentication. u also sends a commitment
   SHA-256(session, u, b_u), so that a wrong reconstruction of b_u is caught. U2 = the
   senders (|U2| ≥ t).
2. MaskedInputCollection. u sends y_u = x̄_u + PRG(b_u) + Σ_{v∈U2, v>u} PRG(s_uv)
   − Σ_{v∈U2, v<u} PRG(s_uv) in Z_{2^k}, with x̄_u the fixed-point encoding of its
   vector and s_uv = HKDF(X25519(s_u, s_v)) (the pair's masks cancel in the sum). U3 = the
   senders; fewer than t and the protocol aborts.
3. Unmasking. The server announces U3 and the dropped D = U2 \\ U3; each client in U3
   that is still there (U5, |U5| ≥ t) checks the announcement (U3 ⊆ U2, D = U2 \\ U3,
   |U3| ≥ t, one announcement per session: it never reveals both b_v and s_v of one v;
   others may be told otherwise: see Threshold, below) and
   returns its shares of b_v for v ∈ U3 and of s_v for v ∈ D. The server reconstructs
   them from t shares, checks b_v against its commitment and s_v against its advertised
   public key, removes the self masks of U3 and the pairwise masks between U3 and D, and
   decodes Σ_{u∈U3} x̄_u.

Client→server messages after round 0 carry a GMAC tag under a channel key
HKDF(X25519(c_u, server)) over the session id, the round, the sender and the content:
AES-256-GCM with no plaintext and the framed message as associated data, a fresh random
96-bit nonce sent with the 128-bit tag, which is how TLS 1.3's AES-GCM records are
authenticated (the channel a deployment gets from TLS). A tampered masked vector or a
message replayed from another session or round is refused; a second message from one
client in a round is refused as a replay. GHASH, not HMAC-SHA256: it authenticates a
long masked vector at a small fraction of the cost. The server is honest-but-curious and the
graph is complete (SecAgg, not SecAgg+'s sparse graph: hospitals are few).

Primitives. X25519, Ed25519, HKDF-SHA256, AES-GCM and ChaCha20 from `cryptography`.
Masks: the ChaCha20 keystream under the 32-byte seed (nonce: the round; each seed
defines one mask, as b_u and s_uv are fresh each session), read as little-endian
words of Z_{2^k}: a cryptographic PRG, so masked words are uniform to any efficient
observer; numpy's Philox is fast too but is not a cryptographic PRG and takes a 128-bit
key. The masks are generated 64 Ki words at a time into one reusable buffer
(`update_into`) and added in place to that block of the vector, which stays in cache
while all K are added (AES-256-CTR is only slightly faster where the CPU has AES
instructions: not worth a second primitive). Shamir: pycryptodome's
`Crypto.Protocol.SecretSharing.Shamir` over GF(2^128), the scheme Flower's SecAgg+ uses,
on each 16-byte half of a 32-byte secret, called directly (Flower's own wrapper starts a
thread pool at every call, which costs more than the split). Flower's
Fernet encryption has no associated data and its mask PRG is `np.random.RandomState`
seeded with 32 bits: neither is used.

Fixed point (`FixedPoint`). A float x with |x| ≤ clip is encoded as rint(x·scale) mod 2^k
(k = `bits`, 32 or 64; scale a power of two, so x·scale is exact and the only error is the
rounding, at most 1/(2·scale) per entry and client). The product is computed in x's own
format, float32 or float64: times a power of two it is exact there too, unless it would
overflow (|x| ≤ clip keeps it below 2^63) or fall below the smallest normal float, where
|x·scale| < 1/2 rounds to 0 either way; so a float32 reply is encoded without a float64
copy and to the same words. A vector with an entry outside [−clip, clip], NaN or ±inf
is refused, not clipped: clip before if clipping is wanted (after the DP noise it is
post-processing). With Q = rint(clip·scale), K clients are
accepted only if K·Q ≤ 2^(k−1) − 1, so the sum never wraps and decodes as a signed word;
a decoded word beyond K·Q (a wrong reconstruction) is refused. The decoded sum, returned
in float32, satisfies |total − Σx| ≤ K/(2·scale) + |Σx|·2^−24 (`FixedPoint.error_bound`).
Defaults: k = 32, scale = 2^16, clip = 128: resolution 1.5e-5, up to 255 clients, and a
masked vector as long as a float32 one.

Threshold. t Shamir shares reconstruct a secret and t − 1 reveal nothing; default
t = ⌊K/2⌋ + 1 (a majority), and t ≥ 2 always. A sum is revealed only if at least t
clients' masked inputs arrived and at least t of them answer the unmasking round; else
`SecureAggregationError`, and nothing is revealed. Dropouts up to K − t are tolerated.
A threshold below a majority is refused (`check_threshold`, by `Setup` itself, so no
client or server can be built with one): each client answers one unmasking
announcement, but nothing makes the announcements it and others receive the same. A
server that tells one group "v survived" and another "v dropped" gets shares of b_v from
the first and of s_v from the second, both of v's masks, and unmasks v's input alone if
each group holds t clients (K = 5, t = 2: two and two). Two disjoint groups of t clients
cannot exist when 2t > K. What holds: against a server that follows the protocol and
colludes with fewer than t clients, every input stays private; against a server that
lies in its announcements and controls c clients (who answer both), every input stays
private while 2t − c > K: with the majority threshold, c = 0 for an odd K and c ≤ 1
for an even K; a larger t protects against more (t = K: any c, but no dropout). A
consistency round (SecAgg+: clients sign the announcement they received and check t
signatures on it before answering) would not raise this bound: each group can sign
its own announcement. A caller's `at_least` m
(`Setup.min_inputs`) raises the bar for the masked inputs: every client refuses to help
unmask a sum of fewer than max(t, m) inputs, so a DP algorithm whose hospitals charged
the event of m noise shares never sees a sum with fewer.

Cost. Each client draws K words of keystream a parameter and the server K more, where
the plaintext sum reads each reply once; the masked vector is the float32 size plus a
28-byte tag. The times, against the plaintext sum, are in benchmarks/README.md.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from Crypto.Protocol.SecretSharing import Shamir
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from torch import Tensor

from dpfl.federation.messages import Summed
from dpfl.secure.base import Dropouts, SecureMode, dropped

__all__ = [
    "MODE",
    "STATS_MASKING",
    "AdvertiseKeys",
    "Client",
    "EncryptedShare",
    "FixedPoint",
    "MaskedInput",
    "PairwiseMasking",
    "SecureAggregationError",
    "Server",
    "Setup",
    "ShareKeys",
    "Transcript",
    "UnmaskReply",
    "UnmaskRequest",
]

RandomBytes = Callable[[int], bytes]
Part = bytes | np.ndarray
"""A piece of an authenticated message: bytes, or a uint8 view of a vector's words."""
_NONCE_BYTES, _TAG_BYTES = 12, 16  # AES-GCM


class SecureAggregationError(ValueError):
    """The protocol was aborted and no sum revealed: too few clients, a message that fails
    authentication (wrong key, tampered, replayed) or an inconsistent input."""


# ---------------------------------------------------------------------------------------
# Fixed point


@dataclass(frozen=True)
class FixedPoint:
    """Floats in [−clip, clip] as words of Z_{2^bits}: rint(x·scale) mod 2^bits."""

    bits: int = 32
    scale: float = 2.0**16
    clip: float = 128.0

    def __post_init__(self) -> None:
        if self.bits not in (32, 64):
            raise ValueError(f"the ring is Z_2^32 or Z_2^64, not Z_2^{self.bits}")
        mantissa, _ = np.frexp(self.scale)
        if not (np.isfinite(self.scale) and self.scale > 0 and mantissa == 0.5):
            raise ValueError(f"scale must be a positive power of two, got {self.scale}")
        if not (np.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip must be positive and finite, got {self.clip}")
        if self.max_word > (1 << (self.bits - 1)) - 1:
            raise ValueError(
                f"clip·scale = {self.clip * self.scale:g} does not fit a signed "
                f"{self.bits}-bit word"
            )

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(np.uint32 if self.bits == 32 else np.uint64)

    @property
    def max_word(self) -> int:
        """Q: the largest |rint(x·scale)| of an accepted entry."""
        return round(self.clip * self.scale)

    def max_clients(self) -> int:
        """The most clients whose sum cannot wrap: K·Q ≤ 2^(bits−1) − 1."""
        return ((1 << (self.bits - 1)) - 1) // self.max_word

    def error_bound(self, clients: int) -> float:
        """Worst |decoded − exact| per entry before the float32 output rounding."""
        return clients / (2 * self.scale)

    def check_clients(self, clients: int) -> None:
        if clients > self.max_clients():
            raise SecureAggregationError(
                f"{clients} clients could overflow Z_2^{self.bits} with clip {self.clip} and "
                f"scale {self.scale:g} (at most {self.max_clients()}): lower the scale or clip, "
                "or use bits=64"
            )

    def check(self, x: np.ndarray) -> None:
        """Refuses NaN, ±inf and entries beyond ±clip (one min and one max: NaN propagates)."""
        if not x.size:
            return
        lo, hi = float(x.min()), float(x.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise SecureAggregationError("a vector contains NaN or infinity; refusing to encode it")
        if max(-lo, hi) > self.clip:
            raise SecureAggregationError(
                f"an entry of magnitude {max(-lo, hi):g} exceeds the clipping range "
                f"±{self.clip:g} of the fixed-point encoding; refusing it (clip before masking)"
            )

    def encode(self, x: np.ndarray) -> np.ndarray:
        """Words of x, computed in x's own precision if float32 or float64 (x·scale is exact
        in either: module docstring); refuses what `check` refuses."""
        self.check(x)
        if x.dtype not in (np.float32, np.float64):
            x = x.astype(np.float64)
        signed = np.rint(x * x.dtype.type(self.scale)).astype(
            np.int32 if self.bits == 32 else np.int64
        )
        words: np.ndarray = signed.view(self.dtype)
        return words

    def decode(self, words: np.ndarray, clients: int) -> np.ndarray:
        """The float64 values of a sum of `clients` encodings; refuses impossible words."""
        signed = np.ascontiguousarray(words, dtype=self.dtype).view(
            np.int32 if self.bits == 32 else np.int64
        )
        if signed.size and max(-int(signed.min()), int(signed.max())) > clients * self.max_word:
            raise SecureAggregationError(
                "the unmasked sum lies outside the range of a sum of "
                f"{clients} encoded vectors: masks did not cancel (wrong key or tampered "
                "message); refusing it"
            )
        values: np.ndarray = np.true_divide(signed, self.scale)
        return values


# ---------------------------------------------------------------------------------------
# Primitives


def _agreed_key(own: X25519PrivateKey, other: bytes, session: bytes, purpose: bytes) -> bytes:
    """HKDF-SHA256 of the X25519 agreement between `own` and the public key `other`, salted
    with the session and bound to what the key is for: one key per pair, session and use."""
    shared = own.exchange(X25519PublicKey.from_public_bytes(other))
    info = b"dpfl/secagg/" + purpose
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=session, info=info).derive(shared)


def _pair(setup: Setup, u: str, v: str) -> bytes:
    """The unordered pair {u, v} by their places in the roster: both ends derive one key."""
    lo, hi = sorted((setup.names.index(u), setup.names.index(v)))
    return _idx(lo) + _idx(hi)


def _frame(*parts: bytes) -> bytes:
    """Length-prefixed concatenation: an unambiguous byte string for tags and AAD."""
    return b"".join(len(p).to_bytes(8, "little") + p for p in parts)


def _idx(i: int) -> bytes:
    return i.to_bytes(4, "little")


_BLOCK_WORDS = 1 << 16
"""Words masked at a time: a block of the vector and of each keystream stays in cache while
every mask is added to it, instead of a pass over the whole vector a mask."""


def _add_masks(
    words: np.ndarray,
    masks: Sequence[tuple[bytes, int]],
    nonce: int,
    addends: Sequence[np.ndarray] = (),
) -> None:
    """words += Σ addends + Σ sign·PRG(seed) mod 2^k in place, for (seed, sign) in `masks`.
    PRG(seed): the ChaCha20 keystream under the 32-byte seed (counter from 0, nonce the
    protocol round) read as little-endian words, generated block by block into one
    reusable buffer."""
    counter_and_nonce = bytes(4) + nonce.to_bytes(12, "little")
    encryptors = [
        (Cipher(algorithms.ChaCha20(seed, counter_and_nonce), None).encryptor(), sign)
        for seed, sign in masks
    ]
    size = words.dtype.itemsize
    zeros = memoryview(bytes(_BLOCK_WORDS * size))
    buffer = bytearray(_BLOCK_WORDS * size)
    keystream = np.frombuffer(buffer, dtype=words.dtype.newbyteorder("<"))
    for start in range(0, len(words), _BLOCK_WORDS):
        block = words[start : start + _BLOCK_WORDS]
        for addend in addends:
            np.add(block, addend[start : start + _BLOCK_WORDS], out=block)
        for encryptor, sign in encryptors:
            encryptor.update_into(zeros[: len(block) * size], buffer)
            (np.add if sign > 0 else np.subtract)(block, keystream[: len(block)], out=block)


def _x25519_raw(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )


def _public_raw(key: X25519PublicKey | Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


_SECRET_BYTES, _HALF = 32, 16
"""Secrets (mask seeds, X25519 keys) are 32 bytes; pycryptodome's Shamir shares 16."""


def _split(secret: bytes, threshold: int, n: int) -> list[bytes]:
    """Shamir shares for x = 1..n of a 32-byte secret: pycryptodome's scheme over
    GF(2^128) (the one Flower's SecAgg+ uses) on each 16-byte half; share x is
    x ‖ its shares of the two halves."""
    if len(secret) != _SECRET_BYTES:
        raise ValueError(f"secrets are {_SECRET_BYTES} bytes, got {len(secret)}")
    halves = [Shamir.split(threshold, n, secret[i : i + _HALF], ssss=False) for i in (0, _HALF)]
    return [_idx(x) + b"".join(dict(half)[x] for half in halves) for x in range(1, n + 1)]


def _combine(shares: Sequence[bytes]) -> bytes:
    """The secret from shares of distinct x (fewer than t give a wrong secret, which the
    caller's commitment or public key check catches)."""
    points: dict[int, bytes] = {}
    for share in shares:
        x = int.from_bytes(share[:4], "little")
        if len(share) != 4 + _SECRET_BYTES or x == 0 or x in points:
            raise SecureAggregationError("Shamir reconstruction failed: a malformed share")
        points[x] = share[4:]
    try:
        return b"".join(
            Shamir.combine([(x, y[i : i + _HALF]) for x, y in points.items()], ssss=False)
            for i in (0, _HALF)
        )
    except ValueError as error:
        raise SecureAggregationError(f"Shamir reconstruction failed: {error}") from None


ROUND_SHARE_KEYS, ROUND_MASKED_INPUT, ROUND_UNMASK = 1, 2, 3


def majority(clients: int) -> int:
    """⌊K/2⌋ + 1, and at least 2: the least threshold (module docstring, Threshold)."""
    return max(2, clients // 2 + 1)


def check_threshold(threshold: int, clients: int) -> None:
    """Refuse a threshold under which a server announcing different dropouts to two
    groups of clients could collect both masks of one client (module docstring)."""
    if threshold < majority(clients):
        raise SecureAggregationError(
            f"a threshold of {threshold} for {clients} clients is below a majority "
            f"({majority(clients)}): two groups of {threshold} could each answer a different "
            "unmasking announcement and reveal one client's input; use at least "
            f"{majority(clients)}"
        )


# ---------------------------------------------------------------------------------------
# Messages


@dataclass(frozen=True)
class Setup:
    """What every party knows before round 0: the session, the roster of names with their
    identity (Ed25519) public keys, the threshold, the encoding, the vector length and
    the server's X25519 public key for the authenticated channels."""

    session: bytes
    names: tuple[str, ...]
    identities: Mapping[str, bytes]
    threshold: int
    codec: FixedPoint
    length: int
    server_public: bytes
    min_inputs: int = 1
    """The fewest masked inputs whose sum the clients help to unmask (the caller's
    `at_least`: its privacy event assumes that many noise shares in the sum)."""

    def __post_init__(self) -> None:
        check_threshold(self.threshold, len(self.names))

    @property
    def quorum(self) -> int:
        """Masked inputs needed before unmasking: the threshold, or more if asked."""
        return max(self.threshold, self.min_inputs)


@dataclass(frozen=True)
class AdvertiseKeys:
    session: bytes
    sender: str
    c_public: bytes
    s_public: bytes
    signature: bytes

    def signed_bytes(self) -> bytes:
        return _frame(
            b"advertise", self.session, self.sender.encode(), self.c_public, self.s_public
        )


@dataclass(frozen=True)
class EncryptedShare:
    """Shares of the sender's b and s private key for one recipient, AES-GCM encrypted
    under their pairwise key; the server only relays it."""

    session: bytes
    sender: str
    recipient: str
    nonce: bytes
    ciphertext: bytes


@dataclass(frozen=True)
class ShareKeys:
    session: bytes
    sender: str
    commitment: bytes
    shares: tuple[EncryptedShare, ...]
    tag: bytes

    def parts(self) -> list[Part]:
        parts: list[Part] = [self.commitment]
        for s in self.shares:
            parts += [s.recipient.encode(), s.nonce, s.ciphertext]
        return parts


@dataclass(frozen=True, eq=False)
class MaskedInput:
    session: bytes
    sender: str
    words: np.ndarray
    tag: bytes

    def parts(self) -> list[Part]:
        little = np.ascontiguousarray(self.words, dtype=self.words.dtype.newbyteorder("<"))
        return [str(self.words.dtype).encode(), little.reshape(-1).view(np.uint8)]


@dataclass(frozen=True)
class UnmaskRequest:
    session: bytes
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]


@dataclass(frozen=True)
class UnmaskReply:
    """The replying client's shares: of b_v for each survivor v, of s_v for each dropped v."""

    session: bytes
    sender: str
    self_mask_shares: tuple[tuple[str, bytes], ...]
    key_shares: tuple[tuple[str, bytes], ...]
    tag: bytes

    def parts(self) -> list[Part]:
        parts: list[Part] = []
        for shares in (self.self_mask_shares, self.key_shares):
            parts.append(_idx(len(shares)))
            for name, share in shares:
                parts += [name.encode(), share]
        return parts


Message = AdvertiseKeys | ShareKeys | EncryptedShare | MaskedInput | UnmaskRequest | UnmaskReply


def _authenticate(
    context: Any, session: bytes, round_: int, sender: str, parts: Sequence[Part]
) -> None:
    """Feed the framed message (as `_frame` lays it out) to a GCM context as associated data."""
    for part in (session, _idx(round_), sender.encode(), *parts):
        context.authenticate_additional_data(len(part).to_bytes(8, "little"))
        context.authenticate_additional_data(part)


def _channel_tag(
    key: bytes, nonce: bytes, session: bytes, round_: int, sender: str, parts: Sequence[Part]
) -> bytes:
    """The nonce and the AES-256-GCM tag of the message as associated data (GMAC)."""
    encryptor = Cipher(algorithms.AES(key), modes.GCM(nonce)).encryptor()
    _authenticate(encryptor, session, round_, sender, parts)
    encryptor.finalize()
    return nonce + encryptor.tag


def _tag_matches(
    key: bytes, tag: bytes, session: bytes, round_: int, sender: str, parts: Sequence[Part]
) -> bool:
    if len(tag) != _NONCE_BYTES + _TAG_BYTES:
        return False
    decryptor = Cipher(
        algorithms.AES(key), modes.GCM(tag[:_NONCE_BYTES], tag[_NONCE_BYTES:])
    ).decryptor()
    _authenticate(decryptor, session, round_, sender, parts)
    try:
        decryptor.finalize()
    except InvalidTag:
        return False
    return True


def _commitment(session: bytes, name: str, seed: bytes) -> bytes:
    return hashlib.sha256(_frame(b"commit", session, name.encode(), seed)).digest()


# ---------------------------------------------------------------------------------------
# Parties


class Client:
    """One hospital's side of the protocol: its secrets never leave it except as shares."""

    def __init__(
        self,
        setup: Setup,
        name: str,
        identity: Ed25519PrivateKey,
        random_bytes: RandomBytes,
        *,
        saved: Mapping[str, Any] | None = None,
    ) -> None:
        """A new client, or with `saved` (what `saved()` returned) the same client resumed
        where it stopped: a deployed hospital answers each round in a new process."""
        if name not in setup.names:
            raise SecureAggregationError(f"{name!r} is not in the session's roster")
        self.setup, self.name, self._identity, self._rng = setup, name, identity, random_bytes
        c, s = (saved["c"], saved["s"]) if saved else (random_bytes(32), random_bytes(32))
        self._c = X25519PrivateKey.from_private_bytes(c)
        self._s = X25519PrivateKey.from_private_bytes(s)
        self._channel = _channel_key(self._c, setup.server_public, setup.session, name)
        self._roster: dict[str, AdvertiseKeys] = {}
        self._u2: tuple[str, ...] = ()
        self._b = b""
        self._held: dict[str, tuple[bytes, bytes]] = {}  # v -> (share of b_v, share of s_v)
        self._answered = False
        unsigned = AdvertiseKeys(
            setup.session,
            name,
            _public_raw(self._c.public_key()),
            _public_raw(self._s.public_key()),
            b"",
        )
        signature = identity.sign(unsigned.signed_bytes())
        self._advert = AdvertiseKeys(
            setup.session, name, unsigned.c_public, unsigned.s_public, signature
        )
        if saved:
            self._roster = {m.sender: m for m in roster_of(setup.session, saved)}
            self._u2, self._b = tuple(saved["u2"]), saved["b"]
            self._held = dict(
                zip(saved["held"], zip(saved["held-b"], saved["held-s"], strict=True), strict=True)
            )
            self._answered = bool(saved["answered"])

    def saved(self) -> dict[str, Any]:
        """The client's secrets and progress as flat fields (bytes, strings and lists of
        them), to resume it with `Client(..., saved=)`; they must stay with the client."""
        return {
            "c": _x25519_raw(self._c),
            "s": _x25519_raw(self._s),
            "b": self._b,
            "u2": list(self._u2),
            "held": list(self._held),
            "held-b": [b for b, _ in self._held.values()],
            "held-s": [s for _, s in self._held.values()],
            "answered": self._answered,
            **roster_fields(self._roster.values()),
        }

    def _index(self, name: str) -> int:
        return self.setup.names.index(name)

    def _share_key(self, other: AdvertiseKeys) -> bytes:
        pair = _pair(self.setup, self.name, other.sender)
        return _agreed_key(self._c, other.c_public, self.setup.session, b"share" + pair)

    def _share_aad(self, sender: str, recipient: str) -> bytes:
        return _frame(b"share", self.setup.session, sender.encode(), recipient.encode())

    def advertise(self) -> AdvertiseKeys:
        """Round 0: both public keys, signed with the identity key."""
        return self._advert

    def share_keys(self, roster: Sequence[AdvertiseKeys]) -> ShareKeys:
        """Round 1: check the roster's signatures, share b and s among it."""
        self._roster = _check_roster(self.setup, roster)
        if self.name not in self._roster or self._roster[self.name] != self._advert:
            raise SecureAggregationError(f"{self.name}: the roster does not hold my own keys")
        names = tuple(self._roster)
        self._b = self._rng(32)
        t = self.setup.threshold
        b_shares = _split(self._b, t, len(names))
        s_shares = _split(_x25519_raw(self._s), t, len(names))
        out = []
        for v, b_share, s_share in zip(names, b_shares, s_shares, strict=True):
            if v == self.name:
                self._held[v] = (b_share, s_share)
                continue
            nonce = self._rng(12)
            plaintext = _frame(b_share, s_share)
            ciphertext = AESGCM(self._share_key(self._roster[v])).encrypt(
                nonce, plaintext, self._share_aad(self.name, v)
            )
            out.append(EncryptedShare(self.setup.session, self.name, v, nonce, ciphertext))
        commitment = _commitment(self.setup.session, self.name, self._b)
        message = ShareKeys(self.setup.session, self.name, commitment, tuple(out), b"")
        tag = self._tag(ROUND_SHARE_KEYS, message.parts())
        return ShareKeys(message.session, self.name, commitment, message.shares, tag)

    def masked_input(self, inbox: Sequence[EncryptedShare], vector: np.ndarray) -> MaskedInput:
        """Round 2: decrypt the shares received (their senders are U2), mask the vector."""
        if not self._roster:
            raise SecureAggregationError(f"{self.name}: masked input before the key sharing")
        for share in inbox:
            if share.session != self.setup.session:
                raise SecureAggregationError(
                    f"{self.name}: a share from another session (replayed) claims to be from "
                    f"{share.sender!r}"
                )
            if share.recipient != self.name or share.sender not in self._roster:
                raise SecureAggregationError(
                    f"{self.name}: a share from {share.sender!r} to {share.recipient!r} is not "
                    "for me or not from the roster"
                )
            if share.sender in self._held:
                raise SecureAggregationError(
                    f"{self.name}: a second share from {share.sender!r} (replayed)"
                )
            try:
                plaintext = AESGCM(self._share_key(self._roster[share.sender])).decrypt(
                    share.nonce, share.ciphertext, self._share_aad(share.sender, self.name)
                )
            except InvalidTag:
                raise SecureAggregationError(
                    f"{self.name}: the share from {share.sender!r} fails authentication "
                    "(wrong key, tampered or replayed)"
                ) from None
            self._held[share.sender] = _unframe_pair(plaintext)
        self._u2 = tuple(v for v in self._roster if v in self._held)
        if len(self._u2) < self.setup.threshold:
            raise SecureAggregationError(
                f"{self.name}: shares from {len(self._u2)} clients, fewer than the threshold "
                f"{self.setup.threshold}"
            )
        codec = self.setup.codec
        if vector.shape != (self.setup.length,):
            raise SecureAggregationError(
                f"{self.name}: a vector of shape {vector.shape}, the session's length is "
                f"{self.setup.length}"
            )
        words = codec.encode(vector)
        me = self._index(self.name)
        masks = [(self._b, +1)] + [
            (self._pair_seed(v), +1 if me < self._index(v) else -1)
            for v in self._u2
            if v != self.name
        ]
        _add_masks(words, masks, ROUND_MASKED_INPUT)
        message = MaskedInput(self.setup.session, self.name, words, b"")
        return replace(message, tag=self._tag(ROUND_MASKED_INPUT, message.parts()))

    def _pair_seed(self, other: str) -> bytes:
        return _pair_seed(self.setup, self._s, self.name, self._roster[other])

    def _tag(self, round_: int, parts: Sequence[Part]) -> bytes:
        nonce = self._rng(_NONCE_BYTES)
        return _channel_tag(self._channel, nonce, self.setup.session, round_, self.name, parts)

    def unmask(self, request: UnmaskRequest) -> UnmaskReply:
        """Round 3: shares of b for the survivors, of s for the dropped, after checking that
        the announcement is consistent and the first of this session."""
        if request.session != self.setup.session:
            raise SecureAggregationError(f"{self.name}: an unmask request from another session")
        if self._answered:
            raise SecureAggregationError(
                f"{self.name}: a second unmask request in one session; refusing (it could "
                "reveal both masks of one client)"
            )
        survivors, dropped = set(request.survivors), set(request.dropped)
        if (
            survivors & dropped
            or survivors | dropped != set(self._u2)
            or len(request.survivors) != len(survivors)
            or len(request.dropped) != len(dropped)
        ):
            raise SecureAggregationError(
                f"{self.name}: an inconsistent unmask request (survivors and dropped must "
                "partition the clients that shared keys)"
            )
        if self.name not in survivors or len(survivors) < self.setup.quorum:
            raise SecureAggregationError(
                f"{self.name}: {len(survivors)} masked inputs, fewer than the "
                f"{self.setup.quorum} required (threshold {self.setup.threshold}, the "
                f"sum's minimum {self.setup.min_inputs}), or I am not among them; refusing "
                "to unmask"
            )
        self._answered = True
        b_part = tuple((v, self._held[v][0]) for v in request.survivors)
        s_part = tuple((v, self._held[v][1]) for v in request.dropped)
        reply = UnmaskReply(self.setup.session, self.name, b_part, s_part, b"")
        return replace(reply, tag=self._tag(ROUND_UNMASK, reply.parts()))


def roster_fields(roster: Iterable[AdvertiseKeys]) -> dict[str, list[Any]]:
    """Advertised keys as parallel lists (a roster on the wire, or in a saved client)."""
    roster = list(roster)
    return {
        "senders": [m.sender for m in roster],
        "c-public": [m.c_public for m in roster],
        "s-public": [m.s_public for m in roster],
        "signatures": [m.signature for m in roster],
    }


def roster_of(session: bytes, fields: Mapping[str, Any]) -> list[AdvertiseKeys]:
    """The advertised keys of `roster_fields` (checked later, by `Client.share_keys`)."""
    columns = [fields[k] for k in ("senders", "c-public", "s-public", "signatures")]
    return [
        AdvertiseKeys(session, str(n), bytes(c), bytes(s), bytes(g))
        for n, c, s, g in zip(*columns, strict=True)
    ]


def _unframe_pair(data: bytes) -> tuple[bytes, bytes]:
    n = int.from_bytes(data[:8], "little")
    first = data[8 : 8 + n]
    m = int.from_bytes(data[8 + n : 16 + n], "little")
    second = data[16 + n : 16 + n + m]
    if 16 + n + m != len(data):
        raise SecureAggregationError("a malformed share")
    return first, second


def _pair_seed(setup: Setup, own: X25519PrivateKey, name: str, other: AdvertiseKeys) -> bytes:
    pair = _pair(setup, name, other.sender)
    return _agreed_key(own, other.s_public, setup.session, b"mask" + pair)


def _channel_key(own: X25519PrivateKey, other: bytes, session: bytes, client: str) -> bytes:
    """The key of a client's authenticated channel to the server, derived at either end."""
    return _agreed_key(own, other, session, b"channel" + client.encode())


def _check_roster(setup: Setup, roster: Sequence[AdvertiseKeys]) -> dict[str, AdvertiseKeys]:
    out: dict[str, AdvertiseKeys] = {}
    for message in roster:
        if message.session != setup.session:
            raise SecureAggregationError(
                f"the keys of {message.sender!r} are from another session (replayed)"
            )
        if message.sender not in setup.identities:
            raise SecureAggregationError(f"keys from {message.sender!r}, who is not in the roster")
        if message.sender in out:
            raise SecureAggregationError(f"a second set of keys from {message.sender!r}")
        try:
            Ed25519PublicKey.from_public_bytes(setup.identities[message.sender]).verify(
                message.signature, message.signed_bytes()
            )
        except InvalidSignature:
            raise SecureAggregationError(
                f"the keys of {message.sender!r} are not signed by its identity key "
                "(wrong or substituted key)"
            ) from None
        out[message.sender] = message
    if len(out) < setup.threshold:
        raise SecureAggregationError(
            f"keys from {len(out)} clients, fewer than the threshold {setup.threshold}"
        )
    return {name: out[name] for name in setup.names if name in out}


class Server:
    """The aggregator: it routes messages and sees masked words and shares only."""

    def __init__(self, setup: Setup, key: X25519PrivateKey) -> None:
        self.setup, self._key = setup, key
        self.received: list[Message] = []
        self._roster: dict[str, AdvertiseKeys] = {}
        self._channels: dict[str, bytes] = {}
        self._commitments: dict[str, bytes] = {}
        self._masked: dict[str, MaskedInput] = {}
        self._u2: tuple[str, ...] = ()
        self._request: UnmaskRequest | None = None

    def _verify(
        self, round_: int, sender: str, session: bytes, parts: Sequence[Part], tag: bytes
    ) -> None:
        if sender not in self._channels:
            raise SecureAggregationError(f"a message from {sender!r}, who did not advertise keys")
        key = self._channels[sender]
        if not _tag_matches(key, tag, session, round_, sender, parts) or (
            session != self.setup.session
        ):
            raise SecureAggregationError(
                f"the round-{round_} message from {sender!r} fails authentication (tampered, "
                "wrong key, or replayed from another session or round)"
            )

    def collect_keys(self, messages: Sequence[AdvertiseKeys]) -> tuple[AdvertiseKeys, ...]:
        """Round 0: verify and broadcast the roster U1."""
        self.received += messages
        self._roster = _check_roster(self.setup, messages)
        for name, message in self._roster.items():
            self._channels[name] = _channel_key(
                self._key, message.c_public, self.setup.session, name
            )
        return tuple(self._roster.values())

    def collect_shares(self, messages: Sequence[ShareKeys]) -> dict[str, list[EncryptedShare]]:
        """Round 1: store commitments, route each encrypted share to its recipient."""
        self.received += messages
        inboxes: dict[str, list[EncryptedShare]] = {}
        for message in messages:
            if message.sender in self._commitments:
                raise SecureAggregationError(
                    f"a second ShareKeys from {message.sender!r} (replayed)"
                )
            self._verify(
                ROUND_SHARE_KEYS, message.sender, message.session, message.parts(), message.tag
            )
            self._commitments[message.sender] = message.commitment
            for share in message.shares:
                if share.sender != message.sender:
                    raise SecureAggregationError(
                        f"{message.sender!r} relays a share claiming to be from {share.sender!r}"
                    )
                inboxes.setdefault(share.recipient, []).append(share)
        self._u2 = tuple(v for v in self._roster if v in self._commitments)
        if len(self._u2) < self.setup.threshold:
            raise SecureAggregationError(
                f"shares from {len(self._u2)} clients, fewer than the threshold "
                f"{self.setup.threshold}"
            )
        return {v: inboxes.get(v, []) for v in self._u2}

    def collect_masked(self, messages: Sequence[MaskedInput]) -> UnmaskRequest:
        """Round 2: keep the masked vectors; announce who is in the sum (U3) and who not."""
        self.received += messages
        for message in messages:
            if message.sender in self._masked:
                raise SecureAggregationError(
                    f"a second masked input from {message.sender!r} (replayed)"
                )
            if message.sender not in self._u2:
                raise SecureAggregationError(
                    f"a masked input from {message.sender!r}, who did not share keys"
                )
            self._verify(
                ROUND_MASKED_INPUT, message.sender, message.session, message.parts(), message.tag
            )
            if message.words.dtype != self.setup.codec.dtype or message.words.shape != (
                self.setup.length,
            ):
                raise SecureAggregationError(
                    f"the masked input of {message.sender!r} has {message.words.dtype} words of "
                    f"shape {message.words.shape}, not "
                    f"{self.setup.codec.dtype} × {self.setup.length}"
                )
            self._masked[message.sender] = message
        survivors = tuple(v for v in self._u2 if v in self._masked)
        if len(survivors) < self.setup.quorum:
            raise SecureAggregationError(
                f"masked inputs from {len(survivors)} clients, fewer than the "
                f"{self.setup.quorum} required (threshold {self.setup.threshold}, the sum's "
                f"minimum {self.setup.min_inputs}); aborting without revealing a sum"
            )
        dropped = tuple(v for v in self._u2 if v not in self._masked)
        self._request = UnmaskRequest(self.setup.session, survivors, dropped)
        return self._request

    def aggregate(self, replies: Sequence[UnmaskReply]) -> Summed:
        """Round 3: reconstruct the masks to remove; the decoded sum of the survivors."""
        self.received += replies
        request = self._request
        if request is None:
            raise SecureAggregationError("unmasking before the masked inputs")
        seen: dict[str, UnmaskReply] = {}
        for reply in replies:
            if reply.sender in seen:
                raise SecureAggregationError(f"a second unmask reply from {reply.sender!r}")
            if reply.sender not in request.survivors:
                raise SecureAggregationError(
                    f"an unmask reply from {reply.sender!r}, not a survivor"
                )
            self._verify(ROUND_UNMASK, reply.sender, reply.session, reply.parts(), reply.tag)
            if (
                tuple(v for v, _ in reply.self_mask_shares) != request.survivors
                or tuple(v for v, _ in reply.key_shares) != request.dropped
            ):
                raise SecureAggregationError(f"the unmask reply of {reply.sender!r} is incomplete")
            seen[reply.sender] = reply
        t = self.setup.threshold
        if len(seen) < t:
            raise SecureAggregationError(
                f"unmask replies from {len(seen)} clients, fewer than the threshold {t}; the sum "
                "cannot be unmasked and is not revealed"
            )
        helpers = list(seen.values())[:t]
        codec, n = self.setup.codec, self.setup.length
        masks: list[tuple[bytes, int]] = []
        for v in request.survivors:
            seed = _combine([dict(h.self_mask_shares)[v] for h in helpers])
            if not hmac.compare_digest(
                _commitment(self.setup.session, v, seed), self._commitments[v]
            ):
                raise SecureAggregationError(
                    f"the reconstructed self-mask seed of {v!r} does not match its commitment "
                    "(a wrong share)"
                )
            masks.append((seed, -1))
        for v in request.dropped:
            raw = _combine([dict(h.key_shares)[v] for h in helpers])
            try:
                key = X25519PrivateKey.from_private_bytes(raw)
            except ValueError:
                raise SecureAggregationError(
                    f"the reconstructed mask key of {v!r} is malformed (a wrong share)"
                ) from None
            if _public_raw(key.public_key()) != self._roster[v].s_public:
                raise SecureAggregationError(
                    f"the reconstructed mask key of {v!r} does not match its public key "
                    "(a wrong share)"
                )
            dv = self.setup.names.index(v)
            for u in request.survivors:
                # y_u holds +mask if u < v, −mask if u > v: take it out.
                sign = -1 if self.setup.names.index(u) < dv else +1
                masks.append((_pair_seed(self.setup, key, v, self._roster[u]), sign))
        total = np.zeros(n, dtype=codec.dtype)
        addends = [self._masked[v].words for v in request.survivors]
        _add_masks(total, masks, ROUND_MASKED_INPUT, addends)
        values = codec.decode(total, len(request.survivors))
        return Summed(torch.from_numpy(values.astype(np.float32)), request.survivors)


# ---------------------------------------------------------------------------------------
# The secure sum


def _as_array(vector: Tensor) -> np.ndarray:
    """The vector's values without a copy if float32 or float64 (the encoding is exact in
    both), else as float64."""
    vector = vector.detach().cpu()
    if vector.dtype not in (torch.float32, torch.float64):
        vector = vector.to(torch.float64)
    return vector.numpy()


@dataclass(frozen=True)
class Transcript:
    """One run: the setup, every message the server received (in order), and the sum."""

    setup: Setup
    server_received: tuple[Message, ...]
    summed: Summed


@dataclass(frozen=True)
class PairwiseMasking:
    """SecAgg over the replies: the server receives masked words only (module docstring).

    `threshold`: t, default ⌊K/2⌋ + 1 (at least 2). `bits`, `scale`, `clip`: the
    fixed-point ring (`FixedPoint`). `dropouts`: clients that drop after sharing keys,
    before their masked input reaches the server (names, or a function of the round's
    names); they are not in the sum, and the survivors' masks with them are removed from
    their shares. `late_dropouts`: clients that drop after sending their masked input and
    do not answer the unmasking round; their input is in the sum. Names not in a round
    are ignored. `random_bytes`: the source of every key and seed (os.urandom; tests pass
    a seeded one). `network`: every message passes through it on its way (tests tamper,
    misroute or replay with it).
    """

    threshold: int | None = None
    bits: int = 32
    scale: float = 2.0**16
    clip: float = 128.0
    dropouts: Dropouts = frozenset()
    late_dropouts: Dropouts = frozenset()
    random_bytes: RandomBytes | None = field(default=None, compare=False)
    network: Callable[[Any], Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        self.codec  # noqa: B018 - validates bits, scale and clip
        if self.threshold is not None and self.threshold < 2:
            raise ValueError(f"the threshold must be at least 2, got {self.threshold}")

    @property
    def reveals_inputs(self) -> bool:
        return False

    @property
    def codec(self) -> FixedPoint:
        return FixedPoint(self.bits, self.scale, self.clip)

    def threshold_for(self, clients: int) -> int:
        """t for a round of `clients`: the one asked for, refused below a majority."""
        if self.threshold is None:
            return majority(clients)
        check_threshold(self.threshold, clients)
        return self.threshold

    def __call__(self, vectors: Mapping[str, Tensor], *, at_least: int = 1) -> Summed:
        return self.run(vectors, at_least=at_least).summed

    def run(self, vectors: Mapping[str, Tensor], *, at_least: int = 1) -> Transcript:
        names = tuple(vectors)
        if not names:
            raise SecureAggregationError("nothing to sum: no replies")
        shapes = {tuple(v.shape) for v in vectors.values()}
        if len(shapes) != 1 or len(next(iter(shapes))) != 1:
            raise SecureAggregationError(
                f"replies must be flat vectors of one length, got shapes {shapes}"
            )
        t = self.threshold_for(len(names))
        if len(names) < max(t, at_least):
            raise SecureAggregationError(
                f"{len(names)} clients, fewer than the threshold {t} or the sum's minimum "
                f"{at_least}; refusing to sum"
            )
        codec = self.codec
        codec.check_clients(len(names))
        arrays = {n: _as_array(vectors[n]) for n in names}
        for name, x in arrays.items():  # refuse before any message is sent
            try:
                codec.check(x)
            except SecureAggregationError as error:
                raise SecureAggregationError(f"{name}: {error}") from None
        rng = self.random_bytes or os.urandom
        net = self.network or (lambda message: message)
        identities = {n: Ed25519PrivateKey.from_private_bytes(rng(32)) for n in names}
        server_key = X25519PrivateKey.from_private_bytes(rng(32))
        setup = Setup(
            session=rng(16),
            names=names,
            identities={n: _public_raw(k.public_key()) for n, k in identities.items()},
            threshold=t,
            codec=codec,
            length=next(iter(shapes))[0],
            server_public=_public_raw(server_key.public_key()),
            min_inputs=at_least,
        )
        early, late = dropped(self.dropouts, names), dropped(self.late_dropouts, names)
        clients = {n: Client(setup, n, identities[n], rng) for n in names}
        server = Server(setup, server_key)
        roster = server.collect_keys([net(c.advertise()) for c in clients.values()])
        inboxes = server.collect_shares(
            [net(c.share_keys([net(m) for m in roster])) for c in clients.values()]
        )
        masked = [
            net(clients[v].masked_input([net(s) for s in inbox], arrays[v]))
            for v, inbox in inboxes.items()
            if v not in early
        ]
        request = server.collect_masked(masked)
        replies = [net(clients[v].unmask(net(request))) for v in request.survivors if v not in late]
        summed = server.aggregate(replies)
        return Transcript(setup, tuple(server.received), summed)


STATS_MASKING = PairwiseMasking(bits=64, scale=2.0**16, clip=2.0**40)
"""Pairwise masking of the statistics' vectors: a 64-bit ring wide enough for counts."""

MODE = SecureMode(
    name="masking",
    described="pairwise masking (SecAgg with dropout recovery: X25519, ChaCha20 masks, "
    "Shamir shares; fixed point 2^-16 in Z_2^32)",
    hides_replies=True,
    exact=False,
    deployed_in="masking",
    key_holder=False,
    sums=PairwiseMasking,
    stats_sums=lambda: STATS_MASKING,
)
"""A study's `secure_aggregation = "masking"`."""
