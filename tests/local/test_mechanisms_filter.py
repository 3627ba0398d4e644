"""`Correlation.apply` is C⁻¹: each member's noise over a stream of draws, and its memory,
equal the dense inverse's product and the filter's state, also where the stream is split
between trainings and taken up again from the memories; and it stays exact in float32."""

import numpy as np
import pytest
import torch
from scipy import signal

from dpfl.local.mechanisms import Buffered, CorrelatedNoise, Correlation, Recursive
from dpfl.local.mechanisms.bandmf import BandedMF
from dpfl.local.mechanisms.blt import BLT

STEPS, WIDTH = 24, 5
RATES = [0.1, 0.05, 0.2]  # BLT's separations 10, 20 and 5: three filters
MECHANISMS = [  # no memory; a ring of 3 slots, all-pole; 3 slots, a numerator beyond n₀
    BandedMF(1, band=1),
    BandedMF(1, band=4),
    BLT(1, buffers=3),
]


def _filtered(
    mechanism: CorrelatedNoise, draws: np.ndarray, split: int
) -> tuple[np.ndarray, list[torch.Tensor | None]]:
    """The correlated noise of `draws` [steps, members, width] through `Correlation`, the
    stream taken up again after `split` steps by a new one from the memories."""
    names = [f"silo {i}" for i in range(len(RATES))]
    memories: list[torch.Tensor | None] = [None] * len(RATES)
    out = []
    for part in (draws[:split], draws[split:]):
        correlation = Correlation(mechanism, RATES, names, STEPS, memories)
        correlation.start(WIDTH, torch.float64, torch.device("cpu"))
        for z in part:
            rows = torch.from_numpy(z.copy())
            correlation.apply(rows)
            out.append(rows.numpy())
        memories = correlation.memories()
    return np.stack(out), memories


def _toeplitz(column: np.ndarray) -> np.ndarray:
    n = len(column)
    return np.array([[column[i - j] if i >= j else 0.0 for j in range(n)] for i in range(n)])


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=str)
@pytest.mark.parametrize("split", [0, 7, 13])
def test_correlation_is_the_inverse_strategy(mechanism: CorrelatedNoise, split: int) -> None:
    """Each member's noise is the dense C⁻¹ (from its filter's impulse response) times its
    draws, and its memory the state that continues it: lfilter's final state for a
    recursive filter, Σ_k λ^(k−1) z_(t−k) per buffer for a buffered one."""
    draws = np.random.default_rng(0).standard_normal((STEPS, len(RATES), WIDTH))
    noise, memories = _filtered(mechanism, draws, split)
    for member, rate in enumerate(RATES):
        noise_filter = mechanism.noise_filter(rate, STEPS)
        inverse = _toeplitz(noise_filter.impulse_response(STEPS))
        np.testing.assert_allclose(noise[:, member], inverse @ draws[:, member], atol=1e-12)
        memory = memories[member]
        assert memory is not None
        if isinstance(noise_filter, Recursive):
            zi = np.zeros((noise_filter.order, WIDTH))
            final = signal.lfilter(
                noise_filter.numerator, noise_filter.denominator, draws[:, member], axis=0, zi=zi
            )[1]
        else:
            assert isinstance(noise_filter, Buffered)
            ages = np.arange(STEPS)[::-1]  # the last draw is 0 steps old
            decay = noise_filter.rates[:, None] ** ages  # [buffers, steps]
            final = decay @ draws[:, member]
        np.testing.assert_allclose(memory.numpy()[: len(final)], final, rtol=0, atol=1e-12)


def test_blt_noise_stays_exact_in_float32() -> None:
    """The BLT planned for 10,000 steps at separation 100 in float32: its prefix sums
    within 1e-5 of float64's (as one product polynomial, they were off by half)."""
    blt = BLT(100, buffers=4)
    draws = torch.randn(10_000, 1, 40, generator=torch.Generator().manual_seed(1))
    noise = []
    memories: list[torch.Tensor | None] = [None]
    for training in range(100):
        correlation = Correlation(blt, [0.01], ["h"], 100, memories)
        correlation.start(40, torch.float32, torch.device("cpu"))
        for z in draws[training * 100 : (training + 1) * 100]:
            rows = z.clone()
            correlation.apply(rows)
            noise.append(rows[0].double().numpy())
        memories = correlation.memories()
    inverse = blt.noise_filter(0.01, 100).impulse_response(10_000)
    exact = signal.fftconvolve(draws[:, 0].double().numpy(), inverse[:, None], axes=0)[:10_000]
    sums, exact_sums = np.cumsum(noise, axis=0), np.cumsum(exact, axis=0)
    assert np.abs(sums - exact_sums).max() < 1e-5 * np.abs(exact_sums).max()
