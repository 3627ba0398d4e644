"""Secure sum by BFV homomorphic encryption: the server adds ciphertexts only."""

from __future__ import annotations

import numpy as np
import pytest
import tenseal as ts
import torch

from dpfl.federation.messages import SecureSum
from dpfl.secure import he
from dpfl.secure.he import (
    BFVParams,
    HomomorphicError,
    HomomorphicSum,
    KeyHolder,
)

MAC_KEY = b"k" * 32
SESSION = b"s" * 16


@pytest.fixture(scope="module")
def holder() -> KeyHolder:
    return KeyHolder(BFVParams(), mac_key=MAC_KEY, session=SESSION)


@pytest.fixture(scope="module")
def compact() -> KeyHolder:
    return KeyHolder(BFVParams.compact(), mac_key=MAC_KEY, session=SESSION)


def _replies(k: int, n: int, seed: int = 0, dtype: torch.dtype = torch.float64):
    g = torch.Generator().manual_seed(seed)
    return {f"hospital-{i}": (torch.randn(n, generator=g, dtype=dtype) * 3) for i in range(k)}


def _chunks(message: bytes) -> list[bytes]:
    fields = he._open(MAC_KEY, message, he._REPLY)
    return fields[5:]


def test_parameters_follow_the_standard_and_batching() -> None:
    p = BFVParams()
    assert p.slots == 8192 and sum(p.coeff_mod_bit_sizes) <= he.MAX_COEFF_BITS_128[8192]
    assert he._is_prime(p.plain_modulus) and p.plain_modulus % (2 * 8192) == 1
    assert p.max_abs >= 2.0**18 - 1e-6 and p.error_bound(10) == 10 * 2.0**-31
    c = BFVParams.compact()
    assert c.slots == 4096 and c.max_abs >= 511
    with pytest.raises(ValueError, match="128-bit"):
        BFVParams(4096, (60, 60), 1073692673)
    with pytest.raises(ValueError, match="batching"):
        BFVParams(plain_modulus=1073692673 + 2)
    assert isinstance(HomomorphicSum(BFVParams.compact()), SecureSum)
    assert HomomorphicSum(BFVParams.compact()).reveals_inputs is False


def test_the_server_receives_ciphertext_and_cannot_decrypt(holder: KeyHolder) -> None:
    vector = torch.arange(1, 301, dtype=torch.float64) / 8  # distinctive, exactly encodable
    message = holder.hospital("a").encrypt(vector, round_=0)
    ints = holder.params.encode(vector)
    for plain in (
        ints.astype("<i8").tobytes()[:64],
        ints.astype(">i8").tobytes()[:64],
        vector.to(torch.float32).numpy().astype("<f4").tobytes()[:64],
        vector.numpy().astype("<f8").tobytes()[:64],
    ):
        assert plain not in message
    server = holder.aggregator()
    assert not server.context.has_secret_key() and server.context.is_public()
    (chunk,) = _chunks(message)
    with pytest.raises(ValueError, match="secret"):
        ts.bfv_vector_from(server.context, chunk).decrypt()
    # ciphertext expansion: one 8192-slot ciphertext, 2 polynomials × 2 primes × 8 bytes
    assert len(message) > 2 * 8192 * 2 * 8 > 8 * 4 * 8192 // 2
    # a server context that holds the secret key is refused
    private = holder._context.serialize(save_secret_key=True)
    with pytest.raises(HomomorphicError, match="secret key"):
        he.Aggregator(holder.params, private, mac_key=MAC_KEY, session=SESSION)


@pytest.mark.parametrize("k", [2, 3, 10])
def test_decrypted_sum_equals_the_plain_sum_within_the_stated_error(k: int) -> None:
    secure = HomomorphicSum()  # the production parameters (N = 8192), one chunk
    replies = _replies(k, 100, seed=k)
    summed = secure(replies)
    exact = torch.stack(list(replies.values())).sum(0)
    assert summed.included == tuple(replies)
    assert summed.total.dtype == torch.float64
    error = (summed.total - exact).abs().max().item()
    assert error <= secure.params.error_bound(k) + exact.abs().max().item() * 2.0**-52
    # float32 replies come back float32, within the bound plus one float32 rounding
    replies32 = {n: v.float() for n, v in replies.items()}
    total32 = secure(replies32).total
    assert total32.dtype == torch.float32
    exact32 = torch.stack([v.double() for v in replies32.values()]).sum(0)
    bound = secure.params.error_bound(k)
    assert torch.allclose(total32.double(), exact32, rtol=2.0**-23, atol=bound)
    assert set(secure.last_bytes) == {*replies, "sum"}


def test_long_vectors_are_chunked_into_ciphertexts_of_n_slots() -> None:
    params = BFVParams.compact()
    secure = HomomorphicSum(params, mac_key=MAC_KEY)
    n = 2 * params.slots + 5
    replies = _replies(3, n, seed=7)
    summed = secure(replies)
    exact = torch.stack(list(replies.values())).sum(0)
    assert summed.total.shape == (n,)
    assert (summed.total - exact).abs().max().item() <= params.error_bound(3) + 1e-12
    message = secure.hospital("hospital-0").encrypt(replies["hospital-0"], round_=99)
    assert len(_chunks(message)) == 3


def test_a_full_house_at_the_value_bound_does_not_wrap(compact: KeyHolder) -> None:
    params = compact.params
    edge = torch.full((params.slots,), params.max_abs, dtype=torch.float64)
    edge[::2] *= -1
    replies = {f"h{i}": edge for i in range(params.max_clients)}
    secure = HomomorphicSum(params)
    total = secure(replies).total
    assert torch.equal(total, edge * params.max_clients)
    with pytest.raises(HomomorphicError, match="exceeds"):
        secure({"a": edge * 1.01})


def test_default_noise_budget_holds_1024_coherent_additions(holder: KeyHolder) -> None:
    p = holder.params
    ints = [p.max_int if i % 2 else -p.max_int for i in range(64)]
    public = ts.context_from(holder.public_context)
    one = ts.bfv_vector(public, ints)
    acc = one.copy()
    for _ in range(p.max_clients - 1):
        acc.add_(one)
    decrypted = ts.bfv_vector_from(holder._context, acc.serialize()).decrypt()
    assert decrypted == [p.max_clients * x for x in ints]


def test_dropouts_sum_only_the_replies_that_arrived(holder: KeyHolder) -> None:
    replies = _replies(3, 50, seed=3)
    messages = {n: holder.hospital(n).encrypt(v, round_=5) for n, v in replies.items()}
    server = holder.aggregator()
    server.open_round(5)
    for name in ("hospital-0", "hospital-2"):  # hospital-1 dropped
        server.add(name, messages[name])
    total, included = holder.decrypt_sum(server.close(), round_=5)
    assert included == ("hospital-0", "hospital-2")
    exact = replies["hospital-0"] + replies["hospital-2"]
    assert (total - exact).abs().max().item() <= holder.params.error_bound(2) + 1e-12
    # the same through the SecureSum: only the replies handed over are in the sum
    summed = HomomorphicSum(BFVParams.compact())({"hospital-1": replies["hospital-1"]})
    assert summed.included == ("hospital-1",)


def _server(holder: KeyHolder, round_: int = 0) -> he.Aggregator:
    server = holder.aggregator()
    server.open_round(round_)
    return server


def test_tampered_or_truncated_messages_are_refused(holder: KeyHolder) -> None:
    message = holder.hospital("a").encrypt(torch.ones(10), round_=0)
    for at in (len(message) // 2, len(message) - 40, len(message) - 1, 20):
        tampered = bytearray(message)
        tampered[at] ^= 1
        with pytest.raises(HomomorphicError, match=r"authentication|magic"):
            _server(holder).add("a", bytes(tampered))
    for cut in (len(message) - 1, len(message) // 2, 10):
        with pytest.raises(HomomorphicError):
            _server(holder).add("a", message[:cut])
    with pytest.raises(HomomorphicError, match="authentication"):
        _server(holder).add("a", message[:-32] + bytes(32))


def test_a_reply_under_another_key_is_refused(holder: KeyHolder) -> None:
    other = KeyHolder(BFVParams(), mac_key=MAC_KEY, session=SESSION)
    with pytest.raises(HomomorphicError, match="another key"):
        _server(holder).add("a", other.hospital("a").encrypt(torch.ones(10), round_=0))
    # a hospital that holds the MAC key but encrypts under another context and claims
    # this key id: the key holder's range check refuses the garbage it decrypts to
    fields = he._open(MAC_KEY, other.hospital("a").encrypt(torch.ones(100), 100), he._REPLY)
    forged = he._seal(MAC_KEY, [he._REPLY, holder.key_id, *fields[1:]])
    server = _server(holder, 100)
    server.add("a", forged)
    with pytest.raises(HomomorphicError, match="another key or corrupted"):
        holder.decrypt_sum(server.close(), round_=100)


def test_replays_are_refused() -> None:
    holder = KeyHolder(BFVParams.compact(), mac_key=MAC_KEY, session=SESSION)
    old = holder.hospital("a").encrypt(torch.ones(10), round_=0)
    server = _server(holder, 0)
    server.add("a", old)
    with pytest.raises(HomomorphicError, match="second reply"):
        server.add("a", old)
    with pytest.raises(HomomorphicError, match="claims"):
        server.add("b", old)
    summed = server.close()
    holder.decrypt_sum(summed, round_=0)
    with pytest.raises(HomomorphicError, match="already decrypted"):
        holder.decrypt_sum(summed, round_=0)
    with pytest.raises(HomomorphicError, match="round 1"):
        holder.decrypt_sum(summed, round_=1)
    server.open_round(1)
    with pytest.raises(HomomorphicError, match="replay"):
        server.add("a", old)
    with pytest.raises(HomomorphicError, match="not after"):
        server.open_round(1)
    other_session = KeyHolder(BFVParams.compact(), mac_key=MAC_KEY, session=b"t" * 16)
    stranger = he.HospitalEncryptor(
        "a", holder.params, holder.public_context, mac_key=MAC_KEY, session=b"t" * 16
    )
    assert other_session.key_id != holder.key_id
    with pytest.raises(HomomorphicError, match="replay"):
        server.add("a", stranger.encrypt(torch.ones(10), round_=1))


def test_inconsistent_lengths_and_non_finite_values_are_refused() -> None:
    secure = HomomorphicSum(BFVParams.compact())
    with pytest.raises(HomomorphicError, match="values, the others"):
        secure({"a": torch.ones(10), "b": torch.ones(11)})
    for bad in (float("nan"), float("inf"), float("-inf")):
        reply = torch.ones(10)
        reply[3] = bad
        with pytest.raises(HomomorphicError, match="NaN or infinity"):
            secure({"a": torch.ones(10), "b": reply})
    with pytest.raises(HomomorphicError, match="flat"):
        secure({"a": torch.ones(2, 5)})
    with pytest.raises(ValueError, match="no replies"):
        secure({})
    # after refused rounds the next round still sums correctly
    summed = secure({"a": torch.ones(4), "b": 2 * torch.ones(4)})
    assert torch.equal(summed.total, 3 * torch.ones(4))
    np.testing.assert_array_equal(summed.included, ["a", "b"])


def test_the_key_holder_refuses_a_sum_of_fewer_replies_than_asked() -> None:
    holder = KeyHolder(BFVParams.compact(), mac_key=MAC_KEY, session=SESSION)
    replies = _replies(3, 20, seed=4)
    server = _server(holder, round_=2)
    for name in ("hospital-0", "hospital-2"):  # hospital-1 dropped
        server.add(name, holder.hospital(name).encrypt(replies[name], round_=2))
    with pytest.raises(HomomorphicError, match="a sum of 2 replies, fewer than the 3"):
        holder.decrypt_sum(server.close(), round_=2, at_least=3)
    lossy = HomomorphicSum(BFVParams.compact(), dropouts={"hospital-1"})
    assert lossy(replies, at_least=2).included == ("hospital-0", "hospital-2")
    with pytest.raises(HomomorphicError, match="fewer than the 3"):
        lossy(replies, at_least=3)
