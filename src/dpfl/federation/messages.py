"""Wire encodings of model messages and their exact sizes.

A message carries one flat parameter vector. FLOAT32 sends 32 bits a parameter; SIGN
sends one bit a parameter, packed 8 to a byte (FL-SIGN's 32× saving). The sizes the
simulator reports are `len(encode(...))` of these very encodings, so they are what a
deployment sends (headers of the transport aside).
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


def payload_bytes(encoding: Encoding, n_params: int) -> int:
    """Bytes of one encoded vector of `n_params` parameters."""
    if n_params < 0:
        raise ValueError(f"a vector cannot have {n_params} parameters")
    return 4 * n_params if encoding is Encoding.FLOAT32 else -(-n_params // 8)


def encode(encoding: Encoding, vector: Tensor) -> bytes:
    """Serialise a flat vector (SIGN: entries must be exactly ±1; +1 is bit 1)."""
    if vector.ndim != 1:
        raise ValueError(f"messages carry flat vectors, got shape {tuple(vector.shape)}")
    values = vector.detach().cpu()
    if encoding is Encoding.FLOAT32:
        return values.to(torch.float32).numpy().astype("<f4").tobytes()
    if not bool(((values == 1) | (values == -1)).all()):
        raise ValueError("a sign message must hold only ±1")
    return np.packbits((values > 0).numpy()).tobytes()


def decode(encoding: Encoding, data: bytes, n_params: int) -> Tensor:
    """Inverse of `encode`; refuses a payload of the wrong length."""
    if len(data) != payload_bytes(encoding, n_params):
        raise ValueError(
            f"a {encoding.value} message of {n_params} parameters has "
            f"{payload_bytes(encoding, n_params)} bytes, got {len(data)}"
        )
    if encoding is Encoding.FLOAT32:
        return torch.from_numpy(np.frombuffer(data, dtype="<f4").astype(np.float32))
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
