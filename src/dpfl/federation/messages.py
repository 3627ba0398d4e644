"""Wire encodings of model messages and their exact sizes.

A message carries one flat parameter vector. FLOAT32 sends 32 bits a parameter; SIGN
sends one bit a parameter, packed 8 to a byte (FL-SIGN's 32× saving); TERNARY sends a
vote in {−1, 0, 1}, five to a byte as the digits of a base-3 number (3⁵ = 243 ≤ 256, so
1.6 bits a parameter: a 20× saving). The sizes the simulator reports are
`len(encode(...))` of these very encodings, so they are what a deployment sends (headers
of the transport aside).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor


class Encoding(StrEnum):
    FLOAT32 = "float32"
    SIGN = "sign"
    TERNARY = "ternary"


_TRITS = np.array([1, 3, 9, 27, 81], dtype=np.uint8)
"""The place values of a byte's five base-3 digits."""


def payload_bytes(encoding: Encoding, n_params: int) -> int:
    """Bytes of one encoded vector of `n_params` parameters."""
    if n_params < 0:
        raise ValueError(f"a vector cannot have {n_params} parameters")
    per_byte = {Encoding.SIGN: 8, Encoding.TERNARY: len(_TRITS)}.get(encoding)
    return 4 * n_params if per_byte is None else -(-n_params // per_byte)


def encode(encoding: Encoding, vector: Tensor) -> bytes:
    """Serialise a flat vector (SIGN: entries must be exactly ±1, +1 is bit 1; TERNARY:
    entries in {−1, 0, 1}, each stored as the digit value + 1)."""
    if vector.ndim != 1:
        raise ValueError(f"messages carry flat vectors, got shape {tuple(vector.shape)}")
    values = vector.detach().cpu()
    if encoding is Encoding.FLOAT32:
        return values.to(torch.float32).numpy().astype("<f4").tobytes()
    allowed = (values == 1) | (values == -1)
    if encoding is Encoding.SIGN:
        if not bool(allowed.all()):
            raise ValueError("a sign message must hold only ±1")
        return np.packbits((values > 0).numpy()).tobytes()
    if not bool((allowed | (values == 0)).all()):
        raise ValueError("a ternary message must hold only -1, 0 and 1")
    digits = np.zeros(payload_bytes(encoding, len(values)) * len(_TRITS), dtype=np.uint8)
    digits[: len(values)] = (values + 1).to(torch.uint8).numpy()
    return (digits.reshape(-1, len(_TRITS)) @ _TRITS).astype(np.uint8).tobytes()


def decode(encoding: Encoding, data: bytes, n_params: int) -> Tensor:
    """Inverse of `encode`; refuses a payload of the wrong length."""
    if len(data) != payload_bytes(encoding, n_params):
        raise ValueError(
            f"a {encoding.value} message of {n_params} parameters has "
            f"{payload_bytes(encoding, n_params)} bytes, got {len(data)}"
        )
    if encoding is Encoding.FLOAT32:
        return torch.from_numpy(np.frombuffer(data, dtype="<f4").astype(np.float32))
    if encoding is Encoding.TERNARY:
        packed = np.frombuffer(data, dtype=np.uint8)
        if bool((packed >= 3 ** len(_TRITS)).any()):
            raise ValueError("a ternary message's bytes must be below 243")
        digits = (packed[:, None] // _TRITS) % 3
        return torch.from_numpy(digits.reshape(-1)[:n_params].astype(np.float32) - 1)
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), count=n_params)
    return torch.from_numpy(bits.astype(np.float32) * 2 - 1)


@dataclass(frozen=True)
class Summed:
    """The sum of the replies that made it into it, and whose they are."""

    total: Tensor
    included: tuple[str, ...]


@runtime_checkable
class SecureSum(Protocol):
    """How the server learns the sum of the silos' reply vectors: in the clear, or by
    secure aggregation (masking, HE). `reveals_inputs` says whether the server also sees
    each reply; an algorithm that needs the individual replies (a robust aggregator)
    refuses a sum that hides them, and one whose privacy needs them hidden (Dopamine)
    refuses a sum that shows them.

    Replies can be lost on the way (a hospital drops out); `Summed.included` names those
    in the sum. `at_least`: the sum is revealed only if it holds at least that many
    replies, else the call raises and nothing is revealed; the parties that can reveal it
    (the masking clients, the key holder), not the server, enforce this. An algorithm
    whose charged privacy event assumes m noise shares in the sum passes m."""

    @property
    def reveals_inputs(self) -> bool: ...

    def __call__(self, vectors: Mapping[str, Tensor], *, at_least: int = 1) -> Summed: ...
