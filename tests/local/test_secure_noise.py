"""`SecureNoise`: its keystream-to-noise map against an independent NumPy Box–Muller,
block by block over a known keystream; its law; its range, shapes, dtypes and in-place
draws (issue 18)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from scipy import stats

from dpfl.errors import InternalError
from dpfl.local import noise
from dpfl.local.noise import BoxMuller4, NoiseSource, SecureNoise, SeededNoise

KEY, NONCE = bytes(range(32)), bytes(range(100, 116))
# (word bytes, significand bits) of each working dtype
WORD = {torch.float32: (4, 24), torch.float64: (8, 53)}
# NumPy's log, cos and sin against torch's: a few ulps of each of four terms
ATOL = {torch.float32: 2e-5, torch.float64: 1e-13}


def reference(raw: bytes, count: int, std: float, dtype: torch.dtype) -> np.ndarray:
    """The noise of `count` values from one block of keystream bytes, as the module
    docstring of `BoxMuller4` defines it, written out in float64 NumPy: unsigned
    little-endian words, top m bits, u = (k + 1)/2^m, four terms each of p radii then p
    angles, r·cos θ then r·sin θ, summed and scaled by std/2."""
    size, bits = WORD[dtype]
    pairs = (count + 1) // 2
    words = np.frombuffer(raw, dtype=f"<u{size}", count=8 * pairs).astype(np.uint64)
    u = np.ldexp(((words >> np.uint64(8 * size - bits)) + np.uint64(1)).astype(np.float64), -bits)
    total = np.zeros(count)
    for term in u.reshape(4, 2, pairs):
        r, theta = np.sqrt(-2.0 * np.log(term[0])), 2.0 * np.pi * term[1]
        total += np.concatenate([r * np.cos(theta), r * np.sin(theta)])[:count]
    return total * std / 2.0


def transform(raw: bytes, count: int, std: float, dtype: torch.dtype) -> torch.Tensor:
    """`BoxMuller4` fed the bytes `raw`."""
    size, _ = WORD[dtype]
    pairs = (count + 1) // 2
    words = torch.frombuffer(bytearray(raw[: 8 * pairs * size]), dtype=noise._WORDS[dtype][0])
    out = torch.full((count,), math.nan, dtype=dtype)
    BoxMuller4(words, count, dtype, torch.empty(4 * pairs, dtype=dtype))(out, std)
    return out


def keystream(nbytes: int) -> bytes:
    """AES-256-CTR on the known key, computed here through `cryptography` directly."""
    return Cipher(algorithms.AES(KEY), modes.CTR(NONCE)).encryptor().update(bytes(nbytes))


def keyed() -> SecureNoise:
    """A `SecureNoise` on the known key: only tests may replay a keystream."""
    source = SecureNoise()
    source._keystream = noise.keystream(KEY, NONCE)
    return source


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("count", [1, 2, 7, 1000, 1001])
def test_the_transform_is_box_muller_of_the_words_summed_four_times(
    dtype: torch.dtype, count: int
) -> None:
    size, _ = WORD[dtype]
    raw = np.random.default_rng(count).bytes(8 * ((count + 1) // 2) * size)
    out = transform(raw, count, 3.0, dtype)
    assert out.dtype == dtype and out.shape == (count,)
    np.testing.assert_allclose(
        out.numpy(), reference(raw, count, 3.0, dtype), rtol=0, atol=ATOL[dtype]
    )


def test_float32_noise_errs_by_the_dtypes_rounding_only() -> None:
    """NumPy's float32 kernels (issue 42) keep the transform at float32's precision: over
    200,001 values against the float64 reference, at most 16 ε·std off and 2 ε·std in
    root mean square (9.6 and 1.3 measured, as with torch's kernels: 10.7 and 1.3)."""
    count, eps = 200_001, float(np.finfo(np.float32).eps)
    raw = np.random.default_rng(1).bytes(8 * ((count + 1) // 2) * 4)
    error = transform(raw, count, 1.0, torch.float32).numpy() - reference(
        raw, count, 1.0, torch.float32
    )
    assert np.abs(error).max() < 16 * eps
    assert np.sqrt(np.mean(error**2)) < 2 * eps


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_uniforms_are_the_top_m_bits_on_a_grid_in_0_1(dtype: torch.dtype) -> None:
    """All-zero words give the least uniform, 2^-m, not 0: finite noise of the largest
    radius √(2m ln 2); the m-th bit from the top moves it and the bits below do not; all
    ones give u = 1, radius 0, noise 0."""
    size, bits = WORD[dtype]
    count, pairs = 6, 3

    def words(value: int) -> bytes:
        return value.to_bytes(size, "little") * (8 * pairs)

    least = transform(words(0), count, 2.0, dtype).numpy()
    assert np.isfinite(least).all()
    radius, theta = math.sqrt(2 * bits * math.log(2)), 2 * math.pi * 2.0**-bits
    expected = 4 * radius * np.array([math.cos(theta)] * 3 + [math.sin(theta)] * 3)
    np.testing.assert_allclose(least, expected, rtol=1e-6)
    below = (1 << (8 * size - bits)) - 1  # the discarded low bits, all set
    assert np.array_equal(transform(words(below), count, 2.0, dtype).numpy(), least)
    lowest_kept = transform(words(below + 1), count, 2.0, dtype).numpy()
    assert not np.array_equal(lowest_kept, least) and np.isfinite(lowest_kept).all()
    ones = transform(b"\xff" * (8 * pairs * size), count, 2.0, dtype)
    assert torch.equal(ones.abs(), torch.zeros(count, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_secure_noise_is_the_transform_of_its_keystream_block_by_block(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Draws of up to P = BLOCK_BYTES/(8·word) output pairs are one block; longer ones
    are blocks of 2P values, the last shorter, each from the next keystream words; draw
    after draw the stream goes on. A shorter last block's transform is kept for the next
    draw of its length, and not once its block has grown (5 → 2P → 5)."""
    monkeypatch.setattr(noise, "BLOCK_BYTES", 64 * 37)
    size, _ = WORD[dtype]
    pairs = noise.BLOCK_BYTES // (8 * size)
    counts = [5, 2 * pairs, 5, 5, 1001, 0, 1001, 2 * pairs + 1, 2 * pairs + 1, 1, 2 * pairs - 1]
    stream = keystream(sum(8 * ((c + 1) // 2) * size for c in counts) + 64 * 37)
    source, offset = keyed(), 0
    for count in counts:
        expected = [np.zeros(0)]  # a draw of 0 values takes no keystream
        for start in range(0, count, 2 * pairs):
            values = min(2 * pairs, count - start)
            used = 8 * ((values + 1) // 2) * size
            expected.append(reference(stream[offset : offset + used], values, 1.5, dtype))
            offset += used
        out = source.normal((count,), 1.5, dtype)
        np.testing.assert_allclose(out.numpy(), np.concatenate(expected), rtol=0, atol=ATOL[dtype])
        raw, _ = source._blocks[dtype]
        assert len(raw) <= noise.BLOCK_BYTES  # a block's buffer, not a draw's


@pytest.mark.parametrize("source", [keyed, lambda: SeededNoise(5)], ids=["secure", "seeded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normal_into_writes_the_draws_of_normal(
    source: Callable[[], NoiseSource], dtype: torch.dtype
) -> None:
    """Either source, draw after draw: contiguous rows in place, strided views and other
    dtypes drawn and copied, the same values as `normal` from the same stream, and
    nothing else written."""
    fresh, into = source(), source()
    for shape in [(1, 22), (1,), (3, 7), (40_000,), (5,)] * 2:
        expected = fresh.normal(shape, 1.5, dtype)
        buffer = torch.zeros(2, *shape, dtype=dtype)
        into.normal_into(buffer[1], 1.5)
        assert torch.equal(buffer[1], expected) and not buffer[0].any()
    strided = torch.zeros(4, 20, dtype=dtype)
    into.normal_into(strided[:, 3], 2.0)
    assert torch.equal(strided[:, 3], fresh.normal((4,), 2.0, dtype))
    into.normal_into(strided.t()[::2], 2.0)  # 10 × 4, non-contiguous
    assert torch.equal(strided.t()[::2], fresh.normal((10, 4), 2.0, dtype))
    half = torch.zeros(3, 3, dtype=torch.float16)
    into.normal_into(half, 1.0)
    assert torch.equal(half, fresh.normal((3, 3), 1.0, torch.float16))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(), (0,), (1,), (3, 4, 5), (2, 0, 3)])
def test_secure_noise_keeps_shape_and_dtype(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    out = SecureNoise().normal(shape, 1.0, dtype)
    assert out.shape == shape and out.dtype == dtype and torch.isfinite(out).all()


def test_a_large_draw_is_finite() -> None:
    source = SecureNoise()
    assert torch.isfinite(source.normal((1_000_001,), 1.0, torch.float32)).all()
    out = torch.empty(300_001, dtype=torch.float64)
    source.normal_into(out, 1e-3)
    assert torch.isfinite(out).all() and out.abs().max() < 4 * math.sqrt(2 * 53 * math.log(2))


@pytest.mark.parametrize(
    ("dtype", "shape", "std"),
    [
        (torch.float32, (200_000,), 1.0),
        (torch.float32, (500, 401), 0.01),  # several blocks, one odd
        (torch.float64, (400, 500), 3.0),
        (torch.float16, (200_000,), 0.5),  # its rounding moves the KS statistic by ≤ 2e-4
    ],
)
def test_secure_noise_follows_the_normal_law(
    dtype: torch.dtype, shape: tuple[int, ...], std: float
) -> None:
    """Kolmogorov–Smirnov against N(0, std²) at p > 1e-3. The draws are not seedable, so
    the test is random: for a correct source p is uniform whatever the sample size, so
    one draw would fail 1 time in 1,000 (the 200,000 values give the power: a std off
    by 5%, or a term missing from the four, fails every time). A second draw is taken
    when the first fails, and both must: a false alarm 1 time in 10^6."""
    source = SecureNoise()
    pvalues = []
    for _ in range(2):
        draws = source.normal(shape, std, dtype).to(torch.float64).numpy().ravel() / std
        pvalues.append(stats.kstest(draws, "norm").pvalue)
        if pvalues[-1] > 1e-3:
            break
    assert max(pvalues) > 1e-3, pvalues


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_million_values_follow_the_normal_law(dtype: torch.dtype) -> None:
    """On the known key, so deterministic: 10^6 values of N(0, 2.5²) drawn in several
    blocks, the last shorter. Mean within 5 standard errors, variance within 5 of its
    standard errors (√(2/n)), Kolmogorov–Smirnov p > 10^-3, and the count beyond 4σ
    inside its binomial 1 − 10^-6 interval (63 expected)."""
    n, std = 1_000_000, 2.5
    out = torch.empty(n, dtype=dtype)
    keyed().normal_into(out, std)
    z = out.to(torch.float64).numpy() / std
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / n)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    low, high = stats.binom.interval(1 - 1e-6, n, 2 * stats.norm.sf(4))
    assert low <= np.count_nonzero(np.abs(z) > 4) <= high


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_each_value_is_four_independent_box_muller_normals(dtype: torch.dtype) -> None:
    """The mitigation's structure, not only its law: term t alone (the other terms'
    radius words all ones: u = 1, r = 0) gives std/2 times one Box–Muller normal of its
    own words, N(0, (std/2)²); the four terms alone add up to the whole draw, are
    uncorrelated, and a word of term t's pair i moves values i and i + p only."""
    size, _ = WORD[dtype]
    count, std = 100_001, 2.0
    pairs = (count + 1) // 2
    raw = np.random.default_rng(42).bytes(8 * pairs * size)
    whole = transform(raw, count, std, dtype).numpy()
    terms = []
    for t in range(4):
        alone = np.frombuffer(raw, dtype=np.uint8).reshape(4, 2, pairs * size).copy()
        alone[np.arange(4) != t, 0] = 0xFF
        terms.append(transform(alone.tobytes(), count, std, dtype).numpy().astype(np.float64))
        assert stats.kstest(terms[-1] / (std / 2), "norm").pvalue > 1e-3
    np.testing.assert_allclose(sum(terms), whole, rtol=0, atol=ATOL[dtype])
    correlations = np.corrcoef(terms)[np.triu_indices(4, 1)]
    assert np.abs(correlations).max() < 5 / math.sqrt(count)
    moved = bytearray(raw)
    word = (2 * 2 + 1) * pairs + 7  # term 2's angle word of pair 7
    moved[word * size + size - 1] ^= 0x80  # its top bit
    changed = np.flatnonzero(transform(bytes(moved), count, std, dtype).numpy() != whole)
    assert changed.tolist() == [7, 7 + pairs]


def test_two_sources_draw_different_streams() -> None:
    """Each `SecureNoise` keys its own keystream from the operating system: two sources'
    float64 draws share no value (a shared key would make them equal; independent keys
    give one equal pair in 10^5 with a chance near 10^-11)."""
    first, second = SecureNoise(), SecureNoise()
    draws = [source.normal((100_000,), 1.0, torch.float64) for source in (first, second)]
    assert not (draws[0] == draws[1]).any()


def test_buffers_that_do_not_fit_the_transform_are_an_internal_error() -> None:
    """`SecureNoise` makes `BoxMuller4`'s buffers: too few words or sines, or words of
    another width, are a bug in dpfl."""
    words = torch.zeros(8, dtype=torch.int32)
    with pytest.raises(InternalError, match="3 values need 16 words, 8 sines"):
        BoxMuller4(words, 3, torch.float32, torch.empty(8))
    with pytest.raises(InternalError, match=r"made from torch\.int64 words"):
        BoxMuller4(words, 2, torch.float64, torch.empty(4, dtype=torch.float64))
