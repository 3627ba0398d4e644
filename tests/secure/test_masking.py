"""SecAgg pairwise masking: what the server receives, the sum, dropouts, refusals."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from scipy import stats

from dpfl.federation.messages import SecureSum
from dpfl.secure import masking as masking_module
from dpfl.secure.masking import (
    AdvertiseKeys,
    Client,
    EncryptedShare,
    FixedPoint,
    MaskedInput,
    PairwiseMasking,
    SecureAggregationError,
    Server,
    Setup,
    ShareKeys,
    UnmaskReply,
    UnmaskRequest,
)


def seeded(seed: int = 0) -> Any:
    return random.Random(seed).randbytes


def replies(k: int, n: int = 64, seed: int = 0, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"hospital-{i}": scale * torch.randn(n, generator=g) for i in range(k)}


def exact_sum(vectors: dict[str, torch.Tensor], names: tuple[str, ...]) -> torch.Tensor:
    return torch.stack([vectors[n].double() for n in names]).sum(0)


def assert_within_bound(masking: PairwiseMasking, total: torch.Tensor, exact: torch.Tensor, k: int):
    bound = masking.codec.error_bound(k) + exact.abs() * 2.0**-24
    assert bool(((total.double() - exact).abs() <= bound).all())


def test_is_a_secure_sum_that_hides_inputs():
    masking = PairwiseMasking()
    assert isinstance(masking, SecureSum)
    assert masking.reveals_inputs is False


@pytest.mark.parametrize("k", [2, 3, 10])
def test_sum_equals_plaintext_sum_within_fixed_point_error(k: int):
    vectors = replies(k, seed=k)
    masking = PairwiseMasking(random_bytes=seeded(k))
    summed = masking(vectors)
    assert summed.included == tuple(vectors)
    assert summed.total.dtype == torch.float32 and summed.total.shape == (64,)
    assert_within_bound(masking, summed.total, exact_sum(vectors, tuple(vectors)), k)


def test_server_receives_uniform_masked_words_only():
    n = 4096
    vectors = {f"h{i}": torch.full((n,), 0.5) for i in range(3)}
    masking = PairwiseMasking(random_bytes=seeded(1))
    transcript = masking.run(vectors)
    plaintext = masking.codec.encode(np.full(n, 0.5))
    masked = [m for m in transcript.server_received if isinstance(m, MaskedInput)]
    assert {m.sender for m in masked} == set(vectors)
    for message in masked:
        words = message.words
        assert words.dtype == np.uint32
        assert int((words == plaintext).sum()) <= 1  # a constant input leaves no trace
        for bins in (words >> 28, words & 0xF, (words >> 12) & 0xF):  # high, low, middle bits
            counts = np.bincount(bins.astype(np.int64), minlength=16)
            assert stats.chisquare(counts).pvalue > 1e-3
        assert stats.kstest(words / 2.0**32, "uniform").pvalue > 1e-3
    # Nothing else the server receives holds the plaintext: keys, ciphertexts, shares.
    encoded = plaintext.tobytes()[:64]
    for message in transcript.server_received:
        assert encoded not in repr(message).encode()
    assert_within_bound(masking, transcript.summed.total, torch.full((n,), 1.5).double(), 3)


def test_the_server_cannot_read_shares_in_transit():
    transcript = PairwiseMasking(random_bytes=seeded(2)).run(replies(3))
    share_messages = [m for m in transcript.server_received if isinstance(m, ShareKeys)]
    assert len(share_messages) == 3
    for message in share_messages:
        assert {s.recipient for s in message.shares} == {
            "hospital-0",
            "hospital-1",
            "hospital-2",
        } - {message.sender}


@pytest.mark.parametrize(
    ("k", "dropped"), [(3, {"hospital-1"}), (10, {"hospital-0", "hospital-7"})]
)
def test_dropouts_after_masking_give_the_survivors_sum(k: int, dropped: set[str]):
    vectors = replies(k, seed=3)
    masking = PairwiseMasking(random_bytes=seeded(3), dropouts=dropped)
    summed = masking(vectors)
    survivors = tuple(n for n in vectors if n not in dropped)
    assert summed.included == survivors
    assert_within_bound(masking, summed.total, exact_sum(vectors, survivors), len(survivors))


def test_late_dropouts_are_in_the_sum_and_a_callable_chooses_dropouts():
    vectors = replies(5, seed=4)
    masking = PairwiseMasking(
        random_bytes=seeded(4),
        dropouts=lambda names: {names[-1]},
        late_dropouts={"hospital-0", "not-in-this-round"},
    )
    summed = masking(vectors)
    survivors = ("hospital-0", "hospital-1", "hospital-2", "hospital-3")
    assert summed.included == survivors
    assert_within_bound(masking, summed.total, exact_sum(vectors, survivors), 4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dropouts": {"hospital-0", "hospital-1"}}, "masked inputs from 1 clients"),
        ({"threshold": 3, "dropouts": {"hospital-2"}}, "fewer than the 3 required"),
        ({"late_dropouts": {"hospital-0", "hospital-1"}}, "unmask replies from 1"),
        ({"threshold": 4}, "3 clients, fewer than the threshold 4"),
    ],
)
def test_fewer_than_threshold_survivors_is_refused(kwargs: dict[str, Any], match: str):
    with pytest.raises(SecureAggregationError, match=match):
        PairwiseMasking(random_bytes=seeded(5), **kwargs)(replies(3))


def test_threshold_defaults_to_a_majority_of_at_least_two():
    masking = PairwiseMasking()
    assert [masking.threshold_for(k) for k in (2, 3, 4, 10)] == [2, 2, 3, 6]
    with pytest.raises(ValueError, match="at least 2"):
        PairwiseMasking(threshold=1)


def split_announcement(threshold: int) -> tuple[np.ndarray, np.ndarray | None]:
    """A server that tells the first t of five clients "all survived" and the others "c0
    dropped", then unmasks c0's input alone from the shares: c0's encoded input, and
    what the server recovers of it (None: its shares of s_c0 do not reconstruct it)."""
    rng = seeded(20)
    names = tuple(f"c{i}" for i in range(5))
    inputs = {n: np.random.default_rng(i).uniform(-1, 1, 16) for i, n in enumerate(names)}
    identities = {n: Ed25519PrivateKey.from_private_bytes(rng(32)) for n in names}
    server_key = X25519PrivateKey.from_private_bytes(rng(32))
    setup = Setup(
        session=rng(16),
        names=names,
        identities={n: k.public_key().public_bytes_raw() for n, k in identities.items()},
        threshold=threshold,
        codec=FixedPoint(),
        length=16,
        server_public=server_key.public_key().public_bytes_raw(),
    )
    clients = {n: Client(setup, n, identities[n], rng) for n in names}
    server = Server(setup, server_key)
    roster = server.collect_keys([c.advertise() for c in clients.values()])
    inboxes = server.collect_shares([c.share_keys(roster) for c in clients.values()])
    masked = {v: clients[v].masked_input(inboxes[v], inputs[v]) for v in names}
    server.collect_masked(list(masked.values()))
    everyone = UnmaskRequest(setup.session, names, ())
    without_c0 = UnmaskRequest(setup.session, names[1:], names[:1])
    told_all = [clients[v].unmask(everyone) for v in names[:threshold]]
    told_dropped = [clients[v].unmask(without_c0) for v in names[threshold:]]
    with pytest.raises(SecureAggregationError, match="second unmask request"):
        clients["c1"].unmask(without_c0)  # each client answers one announcement
    b = masking_module._combine([dict(r.self_mask_shares)["c0"] for r in told_all])
    raw = masking_module._combine([dict(r.key_shares)["c0"] for r in told_dropped[:threshold]])
    s = X25519PrivateKey.from_private_bytes(raw)
    encoded = setup.codec.encode(inputs["c0"])
    if s.public_key().public_bytes_raw() != roster[0].s_public:
        return encoded, None
    words = masked["c0"].words.copy()  # c0 is first: it added +PRG(s_c0v) for every v
    seeds = [masking_module._pair_seed(setup, s, "c0", m) for m in roster[1:]]
    masking_module._add_masks(
        words, [(b, -1)] + [(seed, -1) for seed in seeds], masking_module.ROUND_MASKED_INPUT
    )
    return encoded, words


def test_a_threshold_below_a_majority_is_refused_so_a_split_announcement_reveals_nothing(
    monkeypatch: pytest.MonkeyPatch,
):
    """With K = 5 and t = 2, telling two clients "all survived" and three "c0 dropped"
    reconstructs both of c0's masks: the server reads c0's input. Such a setup is
    refused; at the majority t = 3 the second group is too small to rebuild s_c0."""
    with pytest.raises(SecureAggregationError, match="below a majority"):
        split_announcement(threshold=2)
    with monkeypatch.context() as unchecked:  # the clients as they were before the check
        unchecked.setattr(masking_module, "check_threshold", lambda threshold, clients: None)
        encoded, recovered = split_announcement(threshold=2)
    assert recovered is not None and np.array_equal(recovered, encoded)
    for refused in (
        lambda: PairwiseMasking(threshold=2).threshold_for(5),
        lambda: PairwiseMasking(threshold=2, random_bytes=seeded(21))(replies(5)),
        lambda: PairwiseMasking(threshold=3).threshold_for(6),
    ):
        with pytest.raises(SecureAggregationError, match="below a majority"):
            refused()
    assert PairwiseMasking(threshold=3).threshold_for(5) == 3
    encoded, recovered = split_announcement(threshold=3)
    assert recovered is None


def tamper_with(kind: type, change: Any) -> Any:
    """A network that changes the first message of a kind on its way."""
    done = []

    def network(message: Any) -> Any:
        if isinstance(message, kind) and not done:
            done.append(message)
            return change(message)
        return message

    return network


def flip_word(m: MaskedInput) -> MaskedInput:
    words = m.words.copy()
    words[0] ^= 1
    return dataclasses.replace(m, words=words)


def flip_byte(data: bytes) -> bytes:
    return bytes([data[0] ^ 1]) + data[1:]


@pytest.mark.parametrize(
    ("kind", "change", "match"),
    [
        (MaskedInput, flip_word, "fails authentication"),
        (
            EncryptedShare,
            lambda s: dataclasses.replace(s, ciphertext=flip_byte(s.ciphertext)),
            "fails authentication",
        ),
        (
            ShareKeys,
            lambda m: dataclasses.replace(m, commitment=flip_byte(m.commitment)),
            "fails authentication",
        ),
        (
            UnmaskReply,
            lambda r: dataclasses.replace(
                r,
                self_mask_shares=(
                    (r.self_mask_shares[0][0], b"\x00" * 52),
                    *r.self_mask_shares[1:],
                ),
            ),
            "fails authentication",
        ),
        (
            AdvertiseKeys,  # the server substitutes a mask key: not signed by the identity
            lambda a: dataclasses.replace(a, s_public=flip_byte(a.s_public)),
            "not signed by its identity key",
        ),
    ],
)
def test_tampering_is_refused(kind: type, change: Any, match: str):
    masking = PairwiseMasking(random_bytes=seeded(6), network=tamper_with(kind, change))
    with pytest.raises(SecureAggregationError, match=match):
        masking(replies(3))


def test_a_share_under_the_wrong_key_fails_authentication():
    first: dict[str, EncryptedShare] = {}

    def swap(message: Any) -> Any:
        # hand the recipient a share the sender encrypted for someone else
        if not isinstance(message, EncryptedShare):
            return message
        earlier = first.setdefault(message.sender, message)
        if earlier.recipient == message.recipient:
            return message
        return dataclasses.replace(message, nonce=earlier.nonce, ciphertext=earlier.ciphertext)

    masking = PairwiseMasking(random_bytes=seeded(7), network=swap)
    with pytest.raises(SecureAggregationError, match="fails authentication"):
        masking(replies(3))


def test_a_message_replayed_from_another_session_is_refused():
    captured: list[Any] = []

    def record(message: Any) -> Any:
        captured.append(message)
        return message

    PairwiseMasking(random_bytes=seeded(8), network=record)(replies(3))
    old_masked = next(m for m in captured if isinstance(m, MaskedInput))
    old_share = next(m for m in captured if isinstance(m, EncryptedShare))

    def replay(old: Any) -> Any:
        return lambda message: (
            old if type(message) is type(old) and message.sender == old.sender else message
        )

    with pytest.raises(SecureAggregationError, match=r"fails authentication|replayed"):
        PairwiseMasking(random_bytes=seeded(9), network=replay(old_masked))(replies(3))
    with pytest.raises(SecureAggregationError, match="another session"):
        PairwiseMasking(random_bytes=seeded(9), network=replay(old_share))(replies(3))


def test_a_duplicated_masked_input_is_refused():
    kept: list[MaskedInput] = []

    def duplicate(message: Any) -> Any:
        if isinstance(message, MaskedInput):
            kept.append(message)
            return kept[0]
        return message

    masking = PairwiseMasking(random_bytes=seeded(10), network=duplicate)
    with pytest.raises(SecureAggregationError, match="second masked input"):
        masking(replies(3))


@pytest.mark.parametrize(
    ("vectors", "match"),
    [
        ({"a": torch.zeros(4), "b": torch.zeros(5)}, "one length"),
        ({"a": torch.zeros(4), "b": torch.tensor([0.0, float("nan"), 0.0, 0.0])}, "NaN"),
        ({"a": torch.zeros(4), "b": torch.tensor([0.0, float("inf"), 0.0, 0.0])}, "NaN or inf"),
        ({"a": torch.zeros(4), "b": torch.tensor([0.0, 200.0, 0.0, 0.0])}, "clipping range"),
        ({"a": torch.zeros(2, 2), "b": torch.zeros(2, 2)}, "flat vectors"),
        ({}, "no replies"),
    ],
)
def test_bad_inputs_are_refused_before_any_message(vectors: dict[str, torch.Tensor], match: str):
    sent: list[Any] = []
    masking = PairwiseMasking(random_bytes=seeded(11), network=lambda m: sent.append(m) or m)
    with pytest.raises(SecureAggregationError, match=match):
        masking(vectors)
    assert sent == []


def test_clients_that_could_overflow_the_ring_are_refused():
    codec = FixedPoint(bits=32, scale=2.0**16, clip=128.0)
    assert codec.max_clients() == 255
    with pytest.raises(SecureAggregationError, match="could overflow"):
        PairwiseMasking(clip=2.0**14)(replies(2))  # K·Q = 2·2^30 > 2^31 − 1
    with pytest.raises(ValueError, match="power of two"):
        FixedPoint(scale=1000.0)
    with pytest.raises(ValueError, match="does not fit"):
        FixedPoint(bits=32, scale=2.0**16, clip=2.0**15)


def test_fixed_point_64_bit_and_extremes():
    codec = FixedPoint(bits=64, scale=2.0**32, clip=2.0**16)
    x = np.array([-(2.0**16), 2.0**16, 1e-12, -3.25, 0.0])
    words = codec.encode(x)
    assert words.dtype == np.uint64
    assert np.array_equal(codec.decode(words, 1), np.rint(x * 2.0**32) / 2.0**32)
    vectors = {"a": torch.full((3,), 2.0**16), "b": torch.full((3,), 2.0**16), "c": -torch.ones(3)}
    masking = PairwiseMasking(bits=64, scale=2.0**32, clip=2.0**16, random_bytes=seeded(12))
    summed = masking.run(vectors).summed
    assert summed.total.tolist() == [2.0**17 - 1] * 3


def test_a_wrong_reconstruction_never_decodes_silently():
    codec = FixedPoint()
    garbage = np.frombuffer(random.Random(13).randbytes(4 * 64), dtype=np.uint32)
    with pytest.raises(SecureAggregationError, match="masks did not cancel"):
        codec.decode(garbage, 3)


def test_deterministic_given_the_random_source():
    vectors = replies(3, seed=14)
    a = PairwiseMasking(random_bytes=seeded(14)).run(vectors)
    b = PairwiseMasking(random_bytes=seeded(14)).run(vectors)
    words = [[m.words for m in t.server_received if isinstance(m, MaskedInput)] for t in (a, b)]
    assert all(np.array_equal(x, y) for x, y in zip(*words, strict=True))
    assert torch.equal(a.summed.total, b.summed.total)


def test_a_sum_smaller_than_the_callers_minimum_is_never_unmasked():
    """`at_least` (the inputs a DP caller's charged event assumes) binds the clients, not
    only the server: a server that announces two inputs as lost is refused."""
    vectors = replies(5)
    names = tuple(vectors)
    one_lost = PairwiseMasking(threshold=3, dropouts={names[4]}, random_bytes=seeded(1))
    assert one_lost(vectors, at_least=4).included == names[:4]
    with pytest.raises(SecureAggregationError, match="fewer than the 5 required"):
        one_lost(vectors, at_least=5)

    def lose_two(message: Any) -> Any:
        if isinstance(message, UnmaskRequest):
            return dataclasses.replace(
                message, survivors=message.survivors[:3], dropped=message.survivors[3:]
            )
        return message

    forged = PairwiseMasking(threshold=3, network=lose_two, random_bytes=seeded(2))
    with pytest.raises(SecureAggregationError, match="3 masked inputs, fewer than the 5"):
        forged(vectors, at_least=5)


def test_shamir_any_threshold_of_shares_reconstructs_and_fewer_do_not():
    secret = seeded(15)(32)
    shares = masking_module._split(secret, 3, 5)
    assert len(shares) == 5 and {len(s) for s in shares} == {4 + 32}
    for subset in ((0, 1, 2), (4, 2, 0), (1, 3, 4), (0, 1, 2, 3, 4)):
        assert masking_module._combine([shares[i] for i in subset]) == secret
    assert masking_module._combine(shares[:2]) != secret  # t − 1 shares: a wrong secret
    for bad in ([shares[0], shares[0], shares[1]], [shares[0][:-1], shares[1], shares[2]]):
        with pytest.raises(SecureAggregationError, match="malformed share"):
            masking_module._combine(bad)
    # the same secret shared twice: fresh coefficients, different shares
    assert masking_module._split(secret, 3, 5) != shares


def test_float32_replies_encode_to_the_words_of_their_float64_values():
    codec = FixedPoint()
    g = np.random.default_rng(16)
    ties = (np.arange(-8, 8) + 0.5) / codec.scale  # rint's ties, to even in both formats
    x = np.concatenate(
        [g.uniform(-128, 128, 1000), ties, [-128.0, 128.0, 1e-30, -1e-40, 0.0]]
    ).astype(np.float32)
    words = codec.encode(x)
    assert words.dtype == np.uint32
    assert np.array_equal(words, codec.encode(x.astype(np.float64)))
    assert np.array_equal(codec.decode(words, 1), np.rint(x.astype(np.float64) * 2**16) / 2**16)
