"""The random streams of a run, shared by every engine: each draw (a batch, a coin, a
noise source) is keyed by (seed, trial, silo, round, call), so a run repeats bit for
bit, trials stacked together equal trials run alone, a resumed run ends with the model
of an uninterrupted one, and a deployment with research noise repeats the simulator's
draws. Without research noise a silo's draws come from the OS (`member_rng`,
`stream_noise`): nothing a silo draws can be replayed from the seed."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import numpy as np
from numpy.random.bit_generator import ISeedSequence

from dpfl.errors import InternalError
from dpfl.local.noise import NoiseSource, SecureNoise, SeededNoise

__all__ = ["Streams", "count_noise", "member_rng", "stats_noise", "stream_noise", "stream_rng"]

_T = TypeVar("_T")


class Streams(Generic[_T]):
    """Independent random streams for one round: the n-th call for (trial, silo) gets the
    n-th stream of that pair, so no two draws (batches, noise) of a round ever share
    randomness, and the same calls in the same order repeat exactly (and on resume).
    `calls`: the calls each pair already made this round (a hospital resuming its round).
    """

    def __init__(
        self,
        seed: int,
        round_: int,
        make: Callable[[tuple[int, ...]], _T],
        calls: Mapping[tuple[int, int], int] | None = None,
    ) -> None:
        self._seed, self._round, self._make = seed, round_, make
        self._calls: dict[tuple[int, int], int] = dict(calls or {})

    def __call__(self, trial: int, silo: int) -> _T:
        call = self._calls.get((trial, silo), 0)
        self._calls[trial, silo] = call + 1
        return self._make((self._seed, trial, silo + 1, self._round, call))

    def calls(self, trial: int, silo: int) -> int:
        """How many streams (trial, silo) has drawn this round."""
        return self._calls.get((trial, silo), 0)


class _Key(ISeedSequence):
    """Seed words already drawn by `_digest`, handed to a bit generator as they are (a
    `SeedSequence` would hash them again, at several times the cost of the hash)."""

    def __init__(self, digest: bytes) -> None:
        self._digest = digest

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        wanted = np.dtype(dtype)
        if n_words * wanted.itemsize > len(self._digest):
            raise InternalError(
                f"a stream key holds {len(self._digest)} bytes, not {n_words} words"
            )
        # little-endian words: the same streams on every machine
        return np.frombuffer(self._digest, wanted.newbyteorder("<"), n_words).astype(wanted)


def _digest(key: tuple[int, ...], size: int) -> bytes:
    """`size` bytes from a key of integers: BLAKE2b of the integers in decimal, comma
    separated (one text per key, whatever its integers' sizes), personalised to dpfl's
    streams. A cryptographic hash makes the bytes of distinct keys (members, rounds,
    calls, purposes) look independent and uniform, which is what `SeedSequence` is for,
    at a fraction of its cost (thousands of streams a run)."""
    text = ",".join(map(str, key)).encode()
    return hashlib.blake2b(text, digest_size=size, person=b"dpfl.streams").digest()


def stream_rng(key: tuple[int, ...]) -> np.random.Generator:
    """PCG64 with all 256 bits of its seed (state and stream increment) from the key."""
    # bit generators take any ISeedSequence (numpy's documented interface); its stubs
    # name only SeedSequence
    seeded = np.random.PCG64(_Key(_digest((*key, 0), 32)))  # type: ignore[arg-type]
    return np.random.Generator(seeded)


def member_rng(research: bool, key: tuple[int, ...]) -> np.random.Generator:
    """The generator for a `Streams` key: seeded (`stream_rng`) with research noise, and
    always for the server (silo index 0 of the key), whose cohorts are public, drawn into
    the plan from the seed. A silo's own draws (its batches, its coins) otherwise come
    from the OS, as in a deployment: Poisson amplification assumes the batches secret,
    and anyone with the study's seed could replay seeded ones."""
    if research or key[2] == 0:
        return stream_rng(key)
    return np.random.default_rng()


def stream_noise(research: bool, key: tuple[int, ...]) -> NoiseSource:
    """Seeded noise from the key, or with `research` False the CSPRNG (no key at all)."""
    if not research:
        return SecureNoise()
    # torch's CPU generator seeds its Mersenne Twister with 32 bits: give it exactly those
    return SeededNoise(int.from_bytes(_digest((*key, 1), 4), "little"))


def stats_noise(research: bool, seed: int, hospital: int) -> NoiseSource:
    """A hospital's noise for its statistics (`dpfl stats`, simulated or deployed): from
    the study's seed and its index among the run's hospitals with research noise, so that
    a deployment repeats the simulator's release; else the CSPRNG."""
    return stream_noise(research, (seed, -1, hospital))


def evaluation_noise(research: bool, seed: int, hospital: int) -> NoiseSource:
    """A deployed hospital's noise for its DP evaluation (`flower_protocol.Evaluation`):
    seeded by the study's seed and its index among the run's hospitals with research
    noise (tests), else the CSPRNG."""
    return stream_noise(research, (seed, -2, hospital))


def count_noise(research: bool, seed: int, hospital: int) -> NoiseSource:
    """The noise of a hospital's released record count (drawn once, before round 0), by
    its index among the run's hospitals: the simulator's and a deployed hospital's alike."""
    return stream_noise(research, (seed, 0, hospital + 1, 0, 0, 2))
