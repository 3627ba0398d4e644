"""Message encodings: exact sizes, lossless round trips, FL-SIGN's 32× and ternary 20× savings."""

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


@given(votes=st.lists(st.sampled_from([-1.0, 0.0, 1.0]), min_size=0, max_size=300))
def test_ternary_round_trip_packs_five_to_a_byte(votes: list[float]) -> None:
    vector = torch.tensor(votes)
    data = encode(Encoding.TERNARY, vector)
    assert len(data) == payload_bytes(Encoding.TERNARY, len(votes)) == (len(votes) + 4) // 5
    assert torch.equal(decode(Encoding.TERNARY, data, len(votes)), vector)


def test_ternary_bytes_are_base_3_numbers() -> None:
    # digits value + 1, least significant first: (0, 1, -1, 0, 1) -> 1 + 2·3 + 0·9 + 1·27 + 2·81
    assert encode(Encoding.TERNARY, torch.tensor([0.0, 1.0, -1.0, 0.0, 1.0])) == bytes([196])
    assert encode(Encoding.TERNARY, torch.ones(5)) == bytes([242])


def test_sign_messages_are_a_32nd_of_float_messages() -> None:
    n = 4_886_001  # Kerkouche's MLP: 24,428·200 + 200 + 200·200 + 200 + 200 + 1
    ratio = payload_bytes(Encoding.FLOAT32, n) / payload_bytes(Encoding.SIGN, n)
    assert ratio == pytest.approx(32, rel=1e-5)
    assert payload_bytes(Encoding.FLOAT32, n) / payload_bytes(Encoding.TERNARY, n) == (
        pytest.approx(20, rel=1e-5)
    )


def test_malformed_messages_are_refused() -> None:
    with pytest.raises(ValueError, match="only ±1"):
        encode(Encoding.SIGN, torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="only -1, 0 and 1"):
        encode(Encoding.TERNARY, torch.tensor([1.0, 0.5]))
    with pytest.raises(ValueError, match="below 243"):
        decode(Encoding.TERNARY, bytes([243]), 5)
    with pytest.raises(ValueError, match="has 2 bytes, got 1"):
        decode(Encoding.TERNARY, bytes([0]), 6)
    with pytest.raises(ValueError, match="flat vectors"):
        encode(Encoding.FLOAT32, torch.ones(2, 2))
    with pytest.raises(ValueError, match="has 12 bytes, got 8"):
        decode(Encoding.FLOAT32, b"\x00" * 8, 3)
