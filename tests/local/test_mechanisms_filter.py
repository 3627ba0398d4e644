"""`Correlation.apply` is C⁻¹ as `scipy.signal.lfilter` runs it: each member's noise over a
stream of draws, and its memory, equal lfilter's output and final state, also where
the stream is split between trainings and taken up again from the memories."""

import numpy as np
import pytest
import torch
from scipy import signal

from dpfl.local.mechanisms import CorrelatedNoise, Correlation
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


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=str)
@pytest.mark.parametrize("split", [0, 7, 13])
def test_correlation_is_lfilter(mechanism: CorrelatedNoise, split: int) -> None:
    draws = np.random.default_rng(0).standard_normal((STEPS, len(RATES), WIDTH))
    noise, memories = _filtered(mechanism, draws, split)
    for member, rate in enumerate(RATES):
        numerator, denominator = mechanism.noise_filter(rate, STEPS)
        order = max(len(numerator), len(denominator)) - 1
        expected, final = signal.lfilter(
            numerator, denominator, draws[:, member], axis=0, zi=np.zeros((order, WIDTH))
        )
        np.testing.assert_allclose(noise[:, member], expected, rtol=0, atol=1e-12)
        memory = memories[member]
        assert memory is not None
        np.testing.assert_allclose(memory.numpy(), final, rtol=0, atol=1e-12)
