"""Where the Gaussian noise of DP-SGD and output perturbation comes from.

Two sources, and the run records which one it used (`metadata()`):

* `SecureNoise` (the default for deployment): uniform bits from an AES-256 keystream in
  counter mode keyed by the operating system's CSPRNG (`os.urandom`) — the core of NIST
  SP 800-90A's CTR_DRBG (`keystream`) — turned into normals by Box–Muller at the
  precision of the requested dtype. A seeded PRNG such as Mersenne Twister or Philox
  can be predicted from its outputs, and whoever predicts the noise can subtract it.
  Floating-point attacks (Holohan & Braghin, "Secure random sampling in differential
  privacy", ESORICS 2021, after Mironov 2012 on the Laplace mechanism): the values one
  Box–Muller draw can take are a sparse, uneven subset of the floats, so the low bits
  of a released x + z tell some x from x'. Following Opacus' secure mode, which adopted
  their mitigation, each value is the sum of four independent normals of half the
  standard deviation, each from its own radius and angle words of the keystream (one
  Box–Muller pair gives a value its cosine normal and another value its sine normal,
  independent of it), so the sum's law is exactly N(0, std²) and its possible values
  are dense where one draw's are not (`BoxMuller4`; the structure is tested).
* `SeededNoise` (research mode): a seeded `torch.Generator`, so that runs repeat exactly
  and stacked trials can be compared with single ones. Not private against anyone who
  knows or guesses the seed.

Cost. A secure value takes 16 keystream bytes (four uniforms from 32-bit words; 32 bytes
in float64) and four Box–Muller normals: the keystream plus twice the log, sqrt, cos and
sin of a seeded draw's pair. It runs block by block over buffers made once and small
enough to stay in cache, in place (`BoxMuller4`, with NumPy's vectorised math: a float32
draw 1.8× faster than with torch's), and straight into the caller's tensor
(`normal_into`), so no draw allocates more than its result (the times:
benchmarks/README.md). Two cheaper routes
measured and not taken: Marsaglia's polar method (no sin or cos, but 28 % more uniforms
and a rejection compaction that made its math 2.5× Box–Muller's), and 3-byte float32
uniforms (a quarter less keystream, but the unaligned stride-3 gather cost more than
it saved). `cryptography`'s `update_into` holds the GIL, so the keystream cannot run
beside the math on a second thread.
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes
from torch import Tensor

from dpfl.errors import InternalError

__all__ = ["BLOCK_BYTES", "BoxMuller4", "NoiseSource", "SecureNoise", "SeededNoise", "keystream"]

# Keystream bytes per block of `SecureNoise`: a block's words, uniforms and sines stay in
# cache between its ~20 vector ops, whose Python overhead stays small next to their work;
# 1 MiB is as fast as larger blocks and keeps the buffers of many sources (stacked
# trials) small.
BLOCK_BYTES = 1 << 20

# The word and the significand bits m of each working dtype: uniforms carry the working
# dtype's full precision, read from the top m bits of a 32- or 64-bit keystream word.
_WORDS = {torch.float32: (torch.int32, 24), torch.float64: (torch.int64, 53)}


def keystream(key: bytes, counter: bytes) -> CipherContext:
    """AES-256 in counter mode from a 32-byte key and a 16-byte initial counter block: the
    encryptor whose output on zeros is `SecureNoise`'s keystream. Twice ChaCha20's rate
    where the CPU has AES instructions (x86 AES-NI, Armv8 AES), and OpenSSL falls back to
    constant-time code where it has none."""
    return Cipher(algorithms.AES256(key), modes.CTR(counter)).encryptor()


class NoiseSource(ABC):
    """A source of N(0, std²) tensors."""

    @abstractmethod
    def normal(self, shape: tuple[int, ...], std: float, dtype: torch.dtype) -> Tensor:
        """A tensor of independent N(0, std²) values."""

    def normal_into(self, out: Tensor, std: float) -> None:
        """Overwrite `out` with the values `normal(out.shape, std, out.dtype)` would give
        (the same draws from the same stream); sources may write them in place. On
        another device than the CPU they are drawn on the CPU and copied to it."""
        out.copy_(self.normal(tuple(out.shape), std, out.dtype))

    @abstractmethod
    def metadata(self) -> dict[str, Any]:
        """What a run's record should say about its noise."""


class SeededNoise(NoiseSource):
    """Reproducible noise from a seeded generator: research mode only."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._generator = torch.Generator().manual_seed(seed)

    def normal(self, shape: tuple[int, ...], std: float, dtype: torch.dtype) -> Tensor:
        return torch.empty(shape, dtype=dtype).normal_(0.0, std, generator=self._generator)

    def normal_into(self, out: Tensor, std: float) -> None:
        # `normal_` draws strided tensors in another order; the generator is the CPU's
        if not out.is_contiguous() or out.device.type != "cpu":
            super().normal_into(out, std)
            return
        out.normal_(0.0, std, generator=self._generator)

    def metadata(self) -> dict[str, Any]:
        return {"noise": "seeded", "secure": False, "seed": self.seed}


class BoxMuller4:
    """The map from one block of keystream words to `count` values of noise.

    `words` holds 8p words, p = ⌈count/2⌉ (int32 for float32, int64 for float64), read
    as [term 0..3][radius, angle][p]: term t's normals are r·cos θ for its p pairs, then
    r·sin θ (the last one dropped if `count` is odd), with r = √(−2 ln u₁), θ = 2π·u₂
    and u = (k + 1)·2^-m, where k is the word's top m bits (m = 24 for float32, 53 for
    float64: the dtype's significand). So every uniform lies on the exact 2^-m grid in
    (0, 1] and ln u is finite. A call writes std/2 · (term 0 + term 1 + term 2 + term 3)
    into `out` (1-D, contiguous, `count` values of `dtype`).

    The math runs on NumPy views of the same buffers wherever NumPy is faster (its
    AVX-512/AVX2 float32 log2, sqrt, sin and cos take a third to a half of torch's time;
    `einsum` multiplies and sums the four terms in one pass): r = √(2 ln 2)·√(−log₂ u),
    the constant folded into the final scale. Their float32 errors, measured over 2M
    uniforms against float64 (log2 2.1 ulps, sin and cos 1.4, sqrt 0.5; torch's log,
    sin, cos 0.9, 0.6, 0.6), vanish in the four-term sum's own rounding: against a
    float64 reference the values err by at most 9.6 ε·std, 1.3 in root mean square, as
    with torch's kernels (10.7 and 1.3; tested).
    NumPy's float64 sin and cos are scalar (8 ns a value against torch's 3), so float64
    angles go through torch.

    The views are made once; a call overwrites `words` (the uniforms take their place)
    and `sines` (≥ 4p values of `dtype`) in place and allocates no buffer."""

    def __init__(self, words: Tensor, count: int, dtype: torch.dtype, sines: Tensor) -> None:
        word, self.mantissa = _WORDS[dtype]
        if words.dtype != word:
            raise InternalError(f"{dtype} noise is made from {word} words, not {words.dtype}")
        self.count, self.pairs = count, (count + 1) // 2
        self.words = words[: 8 * self.pairs]
        if len(self.words) < 8 * self.pairs or len(sines) < 4 * self.pairs:
            raise InternalError(
                f"{count} values need {8 * self.pairs} words, {4 * self.pairs} sines"
            )
        self.shift = torch.iinfo(word).bits - self.mantissa
        self.bits = self.words.numpy().view(f"u{self.words.element_size()}")  # unsigned
        self.uniform = self.words.view(dtype)
        terms = self.uniform.view(4, 2, self.pairs)
        self.radius, self.angle = terms[:, 0], terms[:, 1]
        self.sines = sines[: 4 * self.pairs].view(4, self.pairs)
        kept = count - self.pairs  # the sines of the last pair past `count` are dropped
        # NumPy views: (angles, radii), whose cosines the angles become, and (sines, radii)
        self.cosines = self.angle.numpy(), self.radius.numpy()
        self.kept_sines = self.sines[:, :kept].numpy(), self.radius[:, :kept].numpy()
        self.sine_values = self.sines.numpy()
        # u = 2^-m + 2^-m·k and θ = 2π·2^-m + 2π·2^-m·k: (constant, its float)
        self.step = torch.tensor(2.0**-self.mantissa, dtype=dtype), 2.0**-self.mantissa
        arc = 2.0 * math.pi * 2.0**-self.mantissa
        self.arc = torch.tensor(arc, dtype=dtype), arc
        self.numpy_trig = dtype == torch.float32

    def __call__(self, out: Tensor, std: float) -> None:
        np.right_shift(self.bits, self.shift, out=self.bits)  # k, the top m bits
        # k < 2^m is exact in the float: converting in place, over the words, loses nothing
        self.uniform.copy_(self.words)
        # u = (k + 1)·2^-m, exact; θ = 2π·u, within an ulp of its rounding
        torch.add(self.step[0], self.radius, alpha=self.step[1], out=self.radius)
        torch.add(self.arc[0], self.angle, alpha=self.arc[1], out=self.angle)
        angle, radius = self.cosines
        np.sqrt(np.negative(np.log2(radius, out=radius), out=radius), out=radius)
        if self.numpy_trig:
            np.sin(angle, out=self.sine_values)
            np.cos(angle, out=angle)
        else:
            torch.sin(self.angle, out=self.sines)
            self.angle.cos_()
        # the four terms summed (r·cos θ, then r·sin θ), then scaled
        values = out.detach().numpy()
        np.einsum("tp,tp->p", *self.cosines, out=values[: self.pairs])
        np.einsum("tp,tp->p", *self.kept_sines, out=values[self.pairs :])
        np.multiply(values, std / 2.0 * math.sqrt(2.0 * math.log(2.0)), out=values)


class SecureNoise(NoiseSource):
    """Noise from a CSPRNG keyed by the operating system; cannot be replayed, by design."""

    def __init__(self) -> None:
        self._keystream = keystream(os.urandom(32), os.urandom(16))
        self._zeros = memoryview(b"")  # what the keystream encrypts
        self._blocks: dict[torch.dtype, tuple[memoryview, BoxMuller4]] = {}
        self._tails: dict[torch.dtype, BoxMuller4] = {}

    def normal(self, shape: tuple[int, ...], std: float, dtype: torch.dtype) -> Tensor:
        work = torch.float32 if torch.finfo(dtype).bits <= 32 else torch.float64
        out = torch.empty(shape, dtype=work)
        self._fill(out.view(-1), std)
        return out.to(dtype)

    def normal_into(self, out: Tensor, std: float) -> None:
        if out.dtype in _WORDS and out.is_contiguous() and out.device.type == "cpu":
            self._fill(out.view(-1), std)  # straight into `out`: no n-sized temporary
        else:
            super().normal_into(out, std)

    def metadata(self) -> dict[str, Any]:
        return {
            "noise": "secure",
            "secure": True,
            "source": "AES-256-CTR keyed by os.urandom, Box-Muller, 4-sum",
        }

    def _fill(self, out: Tensor, std: float) -> None:
        """Fill `out` (flat, contiguous, float32 or float64) block by block."""
        raw, full = self._block(out.dtype, len(out))
        for start in range(0, len(out), full.count):
            values = out[start : start + full.count]
            transform = full
            if len(values) < full.count:  # a shorter last block: the same buffers
                transform = self._tail(full, len(values), out.dtype)
            used = transform.words.numel() * transform.words.element_size()
            # the keystream: AES-256-CTR of zeros, written over the block's words
            self._keystream.update_into(self._zeros[:used], raw[:used])
            transform(values, std)

    def _tail(self, full: BoxMuller4, count: int, dtype: torch.dtype) -> BoxMuller4:
        """The transform of a last block of `count` values over `full`'s buffers, kept for
        the next draw of that length: a model of odd size draws one every step, and
        making its views again costs as much as a small draw."""
        held = self._tails.get(dtype)
        if held is None or held.count != count or held.words.data_ptr() != full.words.data_ptr():
            held = self._tails[dtype] = BoxMuller4(full.words, count, dtype, full.sines.view(-1))
        return held

    def _block(self, dtype: torch.dtype, count: int) -> tuple[memoryview, BoxMuller4]:
        """The keystream buffer of a block of `dtype` and its transform, kept for the next
        draws: as large as `count` values need, grown up to BLOCK_BYTES."""
        word, _ = _WORDS[dtype]
        size = torch.iinfo(word).bits // 8
        pairs = max(1, min(BLOCK_BYTES // (8 * size), (count + 1) // 2))
        held = self._blocks.get(dtype)
        if held is None or held[1].pairs < pairs:
            raw = bytearray(8 * pairs * size)
            words = torch.frombuffer(raw, dtype=word)  # the same memory
            sines = torch.empty(4 * pairs, dtype=dtype)
            transform = BoxMuller4(words, 2 * pairs, dtype, sines)
            held = self._blocks[dtype] = (memoryview(raw), transform)
            if len(self._zeros) < len(raw):
                self._zeros = memoryview(bytes(len(raw)))
        return held
