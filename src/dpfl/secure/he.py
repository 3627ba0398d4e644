"""Secure sum by homomorphic encryption (TenSEAL, BFV with batching; Dopamine Appendix D).

The server adds ciphertexts and never holds the secret key; it learns the sum of the
replies that reached it, and nothing else, once the key holder has decrypted it.

Scheme: BFV, not CKKS. BFV is exact on integers: a sum of K ciphertexts decrypts to exactly
the sum of the K fixed-point encodings (mod t), so the only error is the fixed-point
rounding below and a test can state it exactly. CKKS decrypts to the sum plus the
scheme's own noise, and releasing such an approximate decryption to the server leaks
information about the secret key (Li and Micciancio, Eurocrypt 2021); Dopamine used BFV
too (PySEAL, N = 4096, t = 40961, three decimal digits).

Parameters (`BFVParams()`, the default):

* ring degree N = 8192, so a ciphertext batches N = 8192 slots (BFV batches N integers,
  CKKS N/2 reals); a vector of n parameters is cut into ceil(n / 8192) ciphertexts;
* coefficient modulus 3 × 60 bits (two data primes and SEAL's special prime): 180 bits,
  within the 218 bits the HomomorphicEncryption.org standard allows at N = 8192 for
  128-bit classical security (ternary secret); `BFVParams` refuses parameters beyond the
  standard's table;
* plain modulus t = 576460752303210497, the largest prime below 2^59 with t ≡ 1 mod 2N
  (needed for batching);
* fixed point: x is sent as round(x · 2^30) (`scale_bits = 30`);
* at most `max_clients` = 1024 summands: each hospital refuses a value whose encoding
  exceeds ⌊(t − 1)/2 / 1024⌋, about |x| ≤ 2^18 = 262,144, so no sum of up to 1024
  replies can wrap around mod t (overflow is refused at the hospital, never wrapped).

Error bound: each hospital rounds each value once (≤ 2^-31 from x); BFV adds exactly; so
the decoded sum of K replies is within K · 2^-31 of their exact sum
(`BFVParams.error_bound(K)`: 4.7e-9 for K = 10), then rounded once to the replies' dtype.
Decryption is exact while the noise of a sum stays below q/(2t): the data modulus is 120
bits against t's 59, and the tests decrypt a sum of 1024 copies of one ciphertext (the
coherent worst case) exactly. `BFVParams.compact()` (N = 4096, 3 × 36-37 bits = 109 bits,
t a 30-bit prime, 2^16 scale, 16 clients, |x| ≤ 512) is the cheaper Dopamine-sized choice.

Who holds what (trust model):

* A `KeyHolder` that is not the server (one designated hospital, or a context the
  hospitals share) creates the context and the secret key. It hands out the *public*
  context (`serialize(save_secret_key=False)`: public key only); hospitals encrypt with
  it and the `Aggregator` (the server) deserialises the replies with it and can only
  add: decrypting at the server raises (TenSEAL: "doesn't hold a secret_key").
* The key holder decrypts one sum per round and releases its plaintext (the server's
  `Summed.total`).
* Honest-but-curious server. The server colluding with the key holder breaks it (they
  decrypt every reply); so does a malicious server that sends one hospital's ciphertext
  to the key holder as if it were a sum: the key holder decrypts at most one sum per
  round, of at least `min_clients` claimed replies, which narrows but cannot exclude
  this. Threshold decryption (the key split among hospitals, so no single party can
  decrypt) is not available in TenSEAL/SEAL; a deployment that needs it needs another
  library (e.g. OpenFHE's threshold CKKS/BFV) or pairwise masking (`dpfl.secure`).

Messages cross as bytes: a reply is its header, its ciphertexts (`BFVVector.serialize()`),
a random 96-bit nonce and a GMAC tag (AES-GCM with no plaintext and everything before it
as associated data, as TLS 1.3 authenticates its records); the sum is the same for the
server's summed ciphertexts (GHASH, not HMAC-SHA256: a small fraction of the cost over a
reply of tens of MB). TenSEAL itself detects a flipped byte in a
ciphertext's header and a truncated ciphertext, but not a flipped byte inside the
coefficient data, nor a ciphertext under another key (both decrypt silently to garbage).
So every message is authenticated with an AES key (`mac_key`, 32 bytes) shared by the
hospitals and the aggregator, not by outsiders on the wire; the tag covers the key id
(SHA-256 of the public context), the session (random per `HomomorphicSum`), the round
counter, the sender and the length: a tampered or truncated message, a reply under
another key, a reply of another round or session (replay), a second reply from one
hospital, replies of different lengths, NaN or infinity, all raise `HomomorphicError`
(a `ValueError`). As a second line, the key holder refuses a decrypted sum outside the
range its summands allow. The shared MAC key authenticates the federation, not one
hospital to another (a hospital could forge another's reply); per-hospital keys over
mutually authenticated TLS remove that in a deployment.

Dropouts: a hospital whose reply never arrives is simply not added; `Summed.included`
names exactly the replies in the sum. A caller whose hospitals charged the privacy event
of m noise shares passes `at_least=m`, and the key holder refuses to decrypt a sum that
claims fewer replies (against an honest-but-curious server; a malicious one could lie
about who is in the sum, as above).

Size. A ciphertext at the default N = 8192 holds 8,192 values in 2 polynomials × 2 data
primes × 8 bytes a coefficient, 8× float32 (SEAL's compression gains nothing on 60-bit
coefficients); `compact()` (N = 4096) compresses its 36-bit coefficients to about 5×.
The public context is sent once per study. Replies are passed to TenSEAL as int64 slices
and read through memoryviews, without copies. The times (each operation, a round against
the plaintext sum, TenSEAL's published figures) are in benchmarks/README.md.
"""

from __future__ import annotations

import functools
import hashlib
import math
import secrets
import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from torch import Tensor

from dpfl.federation.messages import Summed
from dpfl.secure.base import Dropouts, SecureMode, dropped

if TYPE_CHECKING:  # imported where used: loading TenSEAL takes a quarter second
    import tenseal as ts

__all__ = [
    "MODE",
    "Aggregator",
    "BFVParams",
    "HomomorphicError",
    "HomomorphicSum",
    "HospitalEncryptor",
    "KeyFile",
    "KeyHolder",
]

# HomomorphicEncryption.org standard (2018), 128-bit classical security, ternary secret:
# the largest coefficient modulus, in bits, for each ring degree.
MAX_COEFF_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}

_MAGIC = b"dpfl-he1"
_NONCE, _TAG = 12, 16  # AES-GCM
_REPLY = b"reply"
_SUM = b"sum"
_SECRET_FILE = b"dpfl-he-secret-key-file"
_PUBLIC_FILE = b"dpfl-he-public-key-file"


class HomomorphicError(ValueError):
    """A message the protocol refuses: it would otherwise give a wrong sum or leak one."""


def _is_prime(n: int) -> bool:
    """Miller-Rabin with the first 12 prime bases: deterministic below 3.3e24."""
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    if n < 2:
        return False
    for p in bases:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@dataclass(frozen=True)
class BFVParams:
    """BFV parameters and the fixed-point encoding (see the module docstring)."""

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 60, 60)
    plain_modulus: int = 576460752303210497
    scale_bits: int = 30
    max_clients: int = 1024

    def __post_init__(self) -> None:
        n = self.poly_modulus_degree
        if n not in MAX_COEFF_BITS_128:
            raise ValueError(f"poly_modulus_degree must be one of {sorted(MAX_COEFF_BITS_128)}")
        if len(self.coeff_mod_bit_sizes) < 2:
            raise ValueError("the coefficient modulus needs a data prime and a special prime")
        if sum(self.coeff_mod_bit_sizes) > MAX_COEFF_BITS_128[n]:
            raise ValueError(
                f"a {sum(self.coeff_mod_bit_sizes)}-bit coefficient modulus at N = {n} is "
                f"below 128-bit security (the HE standard allows {MAX_COEFF_BITS_128[n]} bits)"
            )
        t = self.plain_modulus
        if not (_is_prime(t) and t % (2 * n) == 1 and t.bit_length() <= 60):
            raise ValueError(f"batching needs a prime plain modulus ≡ 1 mod 2N of ≤ 60 bits; {t}")
        if self.max_clients < 1 or self.scale_bits < 0:
            raise ValueError("max_clients must be ≥ 1 and scale_bits ≥ 0")
        if self.max_int < 1:
            raise ValueError("the plain modulus leaves no room for max_clients summands")

    @classmethod
    def compact(cls) -> BFVParams:
        """N = 4096 (Dopamine's degree), 109-bit modulus, 30-bit t: 16 clients, |x| ≤ 512."""
        return cls(4096, (36, 36, 37), 1073692673, scale_bits=16, max_clients=16)

    @property
    def slots(self) -> int:
        """Values per ciphertext (BFV batches N integers)."""
        return self.poly_modulus_degree

    @property
    def max_int(self) -> int:
        """The largest |encoding| a hospital may send: max_clients of them cannot wrap."""
        return (self.plain_modulus - 1) // 2 // self.max_clients

    @property
    def max_abs(self) -> float:
        """Values up to this magnitude are always accepted."""
        return (self.max_int - 1) / 2.0**self.scale_bits

    def error_bound(self, k: int) -> float:
        """How far the decoded sum of k replies can be from their exact sum."""
        return k * 2.0 ** -(self.scale_bits + 1)

    def encode(self, vector: Tensor) -> np.ndarray:
        """The fixed-point integers of a flat finite vector; refuses what could wrap."""
        if vector.ndim != 1:
            raise HomomorphicError(f"replies are flat vectors, got shape {tuple(vector.shape)}")
        values = vector.detach().cpu().to(torch.float64).numpy()
        if not np.isfinite(values).all():
            raise HomomorphicError("a reply contains NaN or infinity; refusing to encrypt it")
        ints = np.rint(values * 2.0**self.scale_bits)
        if ints.size and np.abs(ints).max() > self.max_int:
            raise HomomorphicError(
                f"a reply value of magnitude {np.abs(values).max():.6g} exceeds "
                f"{self.max_abs:.6g}, the most {self.max_clients} summands can carry at "
                f"2^{self.scale_bits} scale without wrapping around the plain modulus"
            )
        return ints.astype(np.int64)


def _pack(fields: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(f)) + f for f in fields)


def _unpack(data: bytes | memoryview) -> list[bytes]:
    fields, at = [], 0
    while at < len(data):
        if at + 4 > len(data):
            raise HomomorphicError("truncated message")
        (size,) = struct.unpack_from("<I", data, at)
        at += 4
        if at + size > len(data):
            raise HomomorphicError("truncated message")
        fields.append(bytes(data[at : at + size]))
        at += size
    return fields


def _gmac(context: Any, parts: list[bytes | memoryview]) -> None:
    for part in parts:
        context.authenticate_additional_data(part)


def _seal(mac_key: bytes, fields: list[bytes]) -> bytes:
    """Magic, length-prefixed fields, then a random nonce and the GMAC tag of all before it:
    the message is copied once, into the result."""
    parts: list[bytes | memoryview] = [_MAGIC]
    for f in fields:
        parts += [struct.pack("<I", len(f)), f]
    nonce = secrets.token_bytes(_NONCE)
    encryptor = Cipher(algorithms.AES(mac_key), modes.GCM(nonce)).encryptor()
    _gmac(encryptor, parts)
    encryptor.finalize()
    return b"".join([*parts, nonce, encryptor.tag])


def _open(mac_key: bytes, message: bytes, kind: bytes) -> list[bytes]:
    """The fields of an authentic message of this kind, or HomomorphicError."""
    if len(message) < len(_MAGIC) + _NONCE + _TAG or not message.startswith(_MAGIC):
        raise HomomorphicError("not a dpfl HE message (wrong magic or too short)")
    view = memoryview(message)
    body, nonce, tag = view[: -_NONCE - _TAG], view[-_NONCE - _TAG : -_TAG], view[-_TAG:]
    decryptor = Cipher(algorithms.AES(mac_key), modes.GCM(bytes(nonce), bytes(tag))).decryptor()
    _gmac(decryptor, [body])
    try:
        decryptor.finalize()
    except InvalidTag:
        raise HomomorphicError(
            "message authentication failed: tampered, truncated or forged"
        ) from None
    fields = _unpack(body[len(_MAGIC) :])
    if not fields or fields[0] != kind:
        raise HomomorphicError(f"expected a {kind.decode()} message")
    return fields[1:]


def _u64(x: int) -> bytes:
    return struct.pack("<Q", x)


def _from_u64(b: bytes) -> int:
    if len(b) != 8:
        raise HomomorphicError("malformed integer field")
    return int(struct.unpack("<Q", b)[0])


def _n_chunks(n_params: int, slots: int) -> int:
    return max(1, math.ceil(n_params / slots))


def _chunk_len(n_params: int, slots: int, i: int) -> int:
    return max(0, min(slots, n_params - i * slots))


def _public_context(public_context: bytes) -> ts.Context:
    import tenseal as ts

    context = ts.context_from(public_context, n_threads=1)
    if context.has_secret_key():
        raise HomomorphicError("this context holds the secret key; only the key holder may")
    return context


class KeyHolder:
    """Creates the BFV keys, hands out the public context, decrypts one sum per round.

    Not the server: one designated hospital, or the hospitals sharing this context."""

    def __init__(
        self,
        params: BFVParams | None = None,
        *,
        mac_key: bytes,
        session: bytes,
        min_clients: int = 1,
        secret_context: bytes | None = None,
        last_round: int = -1,
    ) -> None:
        """New keys, or with `secret_context` (from `key_files`) the same key holder in
        another process, which decrypted up to `last_round` already."""
        import tenseal as ts

        self.params = params or BFVParams()
        if secret_context is not None:
            self._context = ts.context_from(secret_context, n_threads=1)
            if not self._context.has_secret_key():
                raise HomomorphicError("the key holder's context holds no secret key")
        else:
            self._context = ts.context(
                ts.SCHEME_TYPE.BFV,
                poly_modulus_degree=self.params.poly_modulus_degree,
                plain_modulus=self.params.plain_modulus,
                coeff_mod_bit_sizes=list(self.params.coeff_mod_bit_sizes),
                n_threads=1,
            )
        self.public_context: bytes = self._context.serialize(
            save_public_key=True,
            save_secret_key=False,
            save_galois_keys=False,
            save_relin_keys=False,
        )
        self.key_id = hashlib.sha256(self.public_context).digest()
        self._mac_key, self._session = mac_key, session
        self.min_clients = min_clients
        self._last_round = last_round

    def key_files(self) -> tuple[bytes, bytes]:
        """The key holder's file (the secret context, the MAC key and the session: keep it
        as a private key) and every other party's (the same with the public context)."""
        secret = self._context.serialize(
            save_public_key=True,
            save_secret_key=True,
            save_galois_keys=False,
            save_relin_keys=False,
        )
        return (
            _pack([_SECRET_FILE, secret, self._mac_key, self._session]),
            _pack([_PUBLIC_FILE, self.public_context, self._mac_key, self._session]),
        )

    @property
    def last_round(self) -> int:
        """The last round whose sum this holder decrypted (-1: none)."""
        return self._last_round

    def hospital(self, name: str) -> HospitalEncryptor:
        """What a hospital needs: the public context and the federation's MAC key."""
        return HospitalEncryptor(
            name, self.params, self.public_context, mac_key=self._mac_key, session=self._session
        )

    def aggregator(self) -> Aggregator:
        """What the server needs: the public context only (it can add, not decrypt)."""
        return Aggregator(
            self.params, self.public_context, mac_key=self._mac_key, session=self._session
        )

    def decrypt_sum(
        self,
        message: bytes,
        round_: int,
        at_least: int = 1,
        among: Collection[str] | None = None,
    ) -> tuple[Tensor, tuple[str, ...]]:
        """The float64 sum in an authentic sum message of this round, and whose it is; a
        sum of fewer than `at_least` (or `min_clients`) replies, or one that claims a
        reply from outside `among` (the federation's hospitals), is not decrypted."""
        import tenseal as ts

        fields = _open(self._mac_key, message, _SUM)
        if len(fields) < 6:
            raise HomomorphicError("malformed sum message")
        key_id, session, rnd, names, n_field, *chunks = fields
        if key_id != self.key_id:
            raise HomomorphicError("the sum is under another key")
        if session != self._session or _from_u64(rnd) != round_:
            raise HomomorphicError(f"the sum is not this session's round {round_} (a replay?)")
        if round_ <= self._last_round:
            raise HomomorphicError(f"round {round_} was already decrypted; one sum per round")
        included = tuple(n.decode() for n in _unpack(names))
        k = len(included)
        if len(set(included)) != k or not self.min_clients <= k <= self.params.max_clients:
            raise HomomorphicError(f"a sum of {k} replies {included} is not one this holder opens")
        if k < at_least:
            raise HomomorphicError(
                f"a sum of {k} replies, fewer than the {at_least} it must hold; not decrypted"
            )
        if among is not None and not set(included) <= set(among):
            raise HomomorphicError(
                f"a sum that claims replies of {sorted(set(included) - set(among))}, who are "
                "not among the federation's hospitals; not decrypted"
            )
        n_params, slots = _from_u64(n_field), self.params.slots
        if len(chunks) != _n_chunks(n_params, slots):
            raise HomomorphicError("the sum has the wrong number of ciphertexts")
        self._last_round = round_
        total = np.empty(n_params, dtype=np.float64)
        bound = k * self.params.max_int
        for i, chunk in enumerate(chunks):
            size = _chunk_len(n_params, slots, i)
            try:
                vector = ts.bfv_vector_from(self._context, chunk)
            except Exception as error:
                raise HomomorphicError(f"ciphertext {i} of the sum does not parse") from error
            if vector.size() != size:
                raise HomomorphicError(f"ciphertext {i} holds {vector.size()} values, not {size}")
            ints = np.asarray(vector.decrypt(), dtype=np.int64)
            if size and np.abs(ints).max() > bound:
                raise HomomorphicError(
                    "the decrypted sum is outside what its summands allow: "
                    "a ciphertext under another key or corrupted"
                )
            total[i * slots : i * slots + size] = ints
        return torch.from_numpy(total / 2.0**self.params.scale_bits), included


@dataclass(frozen=True)
class KeyFile:
    """A party's key file (`KeyHolder.key_files`), read."""

    secret: bool
    """Whether it is the key holder's (its context holds the secret key)."""
    context: bytes
    mac_key: bytes
    session: bytes

    @classmethod
    def read(cls, data: bytes) -> KeyFile:
        fields = _unpack(data)
        if len(fields) != 4 or fields[0] not in (_SECRET_FILE, _PUBLIC_FILE):
            raise HomomorphicError("not a dpfl HE key file")
        return cls(fields[0] == _SECRET_FILE, fields[1], fields[2], fields[3])

    def key_holder(self, *, min_clients: int = 1, last_round: int = -1) -> KeyHolder:
        if not self.secret:
            raise HomomorphicError("this key file is not the key holder's (no secret key)")
        return KeyHolder(
            mac_key=self.mac_key,
            session=self.session,
            min_clients=min_clients,
            secret_context=self.context,
            last_round=last_round,
        )

    @property
    def public_context(self) -> bytes:
        import tenseal as ts

        if not self.secret:
            return self.context
        public: bytes = ts.context_from(self.context, n_threads=1).serialize(
            save_public_key=True,
            save_secret_key=False,
            save_galois_keys=False,
            save_relin_keys=False,
        )
        return public

    def hospital(self, name: str) -> HospitalEncryptor:
        return HospitalEncryptor(
            name, BFVParams(), self.public_context, mac_key=self.mac_key, session=self.session
        )

    def aggregator(self) -> Aggregator:
        if self.secret:
            raise HomomorphicError("the server must not hold the key holder's file")
        return Aggregator(BFVParams(), self.context, mac_key=self.mac_key, session=self.session)


class HospitalEncryptor:
    """A hospital's half: encrypts its reply under the public key, chunk by chunk."""

    def __init__(
        self,
        name: str,
        params: BFVParams,
        public_context: bytes,
        *,
        mac_key: bytes,
        session: bytes,
    ) -> None:
        self.name, self.params = name, params
        self._context = _public_context(public_context)
        self.key_id = hashlib.sha256(public_context).digest()
        self._mac_key, self._session = mac_key, session

    def encrypt(self, vector: Tensor, round_: int) -> bytes:
        """The reply message of this round: header, ciphertexts, tag."""
        import tenseal as ts

        ints = self.params.encode(vector)
        slots = self.params.slots
        chunks = [  # TenSEAL takes the int64 slices as they are: no list round trip
            ts.bfv_vector(self._context, ints[i * slots : (i + 1) * slots]).serialize()
            for i in range(_n_chunks(len(ints), slots))
        ]
        header = [_REPLY, self.key_id, self._session, _u64(round_), self.name.encode()]
        return _seal(self._mac_key, [*header, _u64(len(ints)), *chunks])


class Aggregator:
    """The server's half: checks each reply and adds its ciphertexts; holds no secret key."""

    def __init__(
        self,
        params: BFVParams,
        public_context: bytes,
        *,
        mac_key: bytes,
        session: bytes,
    ) -> None:
        self.params = params
        self.context = _public_context(public_context)
        self.key_id = hashlib.sha256(public_context).digest()
        self._mac_key, self._session = mac_key, session
        self._round = -1
        self._open = False
        self._sum: list[ts.BFVVector] = []
        self._included: list[str] = []
        self._n_params: int | None = None

    def open_round(self, round_: int) -> None:
        """Start summing the replies of a new round (rounds only increase)."""
        if round_ <= self._round:
            raise HomomorphicError(f"round {round_} is not after round {self._round}")
        self._round, self._open = round_, True
        self._sum, self._included, self._n_params = [], [], None

    def add(self, sender: str, message: bytes) -> None:
        """Add one hospital's reply; refuses anything that is not its reply of this round."""
        import tenseal as ts

        if not self._open:
            raise HomomorphicError("no round is open")
        fields = _open(self._mac_key, message, _REPLY)
        if len(fields) < 6:
            raise HomomorphicError("malformed reply message")
        key_id, session, rnd, name, n_field, *chunks = fields
        if key_id != self.key_id:
            raise HomomorphicError(f"{sender}'s reply is under another key")
        if session != self._session or _from_u64(rnd) != self._round:
            raise HomomorphicError(
                f"{sender}'s reply is not for this session's round {self._round} (a replay?)"
            )
        if name.decode() != sender:
            raise HomomorphicError(f"a reply from {sender} claims to be {name.decode()!r}'s")
        if sender in self._included:
            raise HomomorphicError(f"a second reply from {sender} this round (a replay?)")
        if len(self._included) >= self.params.max_clients:
            raise HomomorphicError(f"more than {self.params.max_clients} replies would wrap")
        n_params, slots = _from_u64(n_field), self.params.slots
        if self._n_params is not None and n_params != self._n_params:
            raise HomomorphicError(
                f"{sender}'s reply has {n_params} values, the others {self._n_params}"
            )
        if len(chunks) != _n_chunks(n_params, slots):
            raise HomomorphicError(f"{sender}'s reply has the wrong number of ciphertexts")
        vectors = []
        for i, chunk in enumerate(chunks):
            try:
                vector = ts.bfv_vector_from(self.context, chunk)
            except Exception as error:
                raise HomomorphicError(f"{sender}'s ciphertext {i} does not parse") from error
            if vector.size() != _chunk_len(n_params, slots, i):
                raise HomomorphicError(f"{sender}'s ciphertext {i} has the wrong length")
            vectors.append(vector)
        if self._sum:
            for acc, vector in zip(self._sum, vectors, strict=True):
                acc.add_(vector)
        else:
            self._sum = vectors
        self._n_params = n_params
        self._included.append(sender)

    def close(self) -> bytes:
        """The sum message for the key holder: the added ciphertexts and whose they are."""
        if not self._open or not self._included or self._n_params is None:
            raise HomomorphicError("nothing to sum: no replies were added")
        self._open = False
        names = _pack([n.encode() for n in self._included])
        header = [_SUM, self.key_id, self._session, _u64(self._round), names]
        chunks = [v.serialize() for v in self._sum]
        return _seal(self._mac_key, [*header, _u64(self._n_params), *chunks])

    @property
    def included(self) -> tuple[str, ...]:
        return tuple(self._included)


class HomomorphicSum:
    """`SecureSum` by BFV: hospitals encrypt, the server adds, a key holder decrypts.

    One object plays every party in one process (as `IdealSecureSum` does), with only
    bytes crossing between them; `last_bytes` holds each message's size from the last
    call (the replies by hospital, and "sum" for the server's message to the key holder).
    `included` names exactly the replies added; `at_least` makes the key holder refuse
    to decrypt a sum of fewer. `dropouts`: hospitals whose replies never reach the
    server. Each call is a new round (its counter is in every message's authenticated
    data)."""

    def __init__(
        self,
        params: BFVParams | None = None,
        *,
        mac_key: bytes | None = None,
        min_clients: int = 1,
        dropouts: Dropouts = frozenset(),
    ) -> None:
        self.params = params or BFVParams()
        self.dropouts = dropouts
        self.key_holder = KeyHolder(
            self.params,
            mac_key=mac_key if mac_key is not None else secrets.token_bytes(32),
            session=secrets.token_bytes(16),
            min_clients=min_clients,
        )
        self.server = self.key_holder.aggregator()
        self._hospitals: dict[str, HospitalEncryptor] = {}
        self._round = 0
        self.last_bytes: dict[str, int] = {}

    @property
    def reveals_inputs(self) -> bool:
        return False

    def hospital(self, name: str) -> HospitalEncryptor:
        if name not in self._hospitals:
            self._hospitals[name] = self.key_holder.hospital(name)
        return self._hospitals[name]

    def __call__(self, vectors: Mapping[str, Tensor], *, at_least: int = 1) -> Summed:
        if not vectors:
            raise ValueError("nothing to sum: no replies")
        round_ = self._round
        self._round += 1
        lost = dropped(self.dropouts, tuple(vectors))
        messages = {
            name: self.hospital(name).encrypt(v, round_)
            for name, v in vectors.items()
            if name not in lost
        }
        self.server.open_round(round_)
        for name, message in messages.items():
            self.server.add(name, message)
        summed = self.server.close()
        self.last_bytes = {name: len(m) for name, m in messages.items()} | {"sum": len(summed)}
        total, included = self.key_holder.decrypt_sum(summed, round_, at_least)
        dtype = functools.reduce(torch.promote_types, (v.dtype for v in vectors.values()))
        return Summed(total.to(dtype if dtype.is_floating_point else torch.float32), included)


MODE = SecureMode(
    name="he",
    described="BFV homomorphic encryption (TenSEAL, N = 8192, 128-bit security, fixed point "
    "2^-30); a key holder that is not the server decrypts the sum only",
    hides_replies=True,
    exact=False,
    deployed_in="he",
    key_holder=True,
    sums=HomomorphicSum,
)
"""A study's `secure_aggregation = "he"`."""
