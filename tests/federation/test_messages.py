"""Message encodings: exact sizes, lossless round trips, FL-SIGN's 32× saving."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dpfl.federation.messages import Encoding, decode, encode, payload_bytes


@given(values=st.lists(st.floats(width=32, allow_nan=False), min_size=0, max_size=300))
def test_float32_round_trip_and_size(values: list[float]) -> None:
    vector = torch.tensor(values, dtype=torch.float32)
    data = encode(Encoding.FLOAT32, vector)
    assert len(data) == payload_bytes(Encoding.FLOAT32, len(values)) == 4 * len(values)
    assert torch.equal(decode(Encoding.FLOAT32, data, len(values)), vector)


@given(bits=st.lists(st.booleans(), min_size=0, max_size=300))
def test_sign_round_trip_packs_eight_to_a_byte(bits: list[bool]) -> None:
    vector = torch.tensor([1.0 if b else -1.0 for b in bits])
    data = encode(Encoding.SIGN, vector)
    assert len(data) == payload_bytes(Encoding.SIGN, len(bits)) == (len(bits) + 7) // 8
    assert torch.equal(decode(Encoding.SIGN, data, len(bits)), vector)


def test_sign_messages_are_a_32nd_of_float_messages() -> None:
    n = 4_886_001  # Kerkouche's MLP: 24,428·200 + 200 + 200·200 + 200 + 200 + 1
    ratio = payload_bytes(Encoding.FLOAT32, n) / payload_bytes(Encoding.SIGN, n)
    assert ratio == pytest.approx(32, rel=1e-5)


def test_malformed_messages_are_refused() -> None:
    with pytest.raises(ValueError, match="only ±1"):
        encode(Encoding.SIGN, torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="flat vectors"):
        encode(Encoding.FLOAT32, torch.ones(2, 2))
    with pytest.raises(ValueError, match="has 12 bytes, got 8"):
        decode(Encoding.FLOAT32, b"\x00" * 8, 3)
