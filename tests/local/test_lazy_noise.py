"""Deferred noise of a sparse first layer's untouched rows (`dpfl.local.lazy_noise`): the
released parameters have the step-by-step law, and the draws fall."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats
from torch import Tensor, nn

from dpfl.data.sampling import PoissonSampler
from dpfl.local.dpsgd import DPSGD, DPSGDConfig, parameters_of
from dpfl.local.lazy_noise import DeferredRows
from dpfl.local.losses import bce
from dpfl.local.noise import NoiseSource, SeededNoise
from dpfl.models import mlp

N, FEATURES, HIDDEN, STEPS, Q = 24, 10, 3, 6, 0.25
CONFIG = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.3, learning_rate=0.5)


def _data() -> tuple[Tensor, Tensor]:
    """Sparse binary records: each has one or two of the first 6 features; features 6–9
    are never set (rows no batch touches)."""
    rng = np.random.default_rng(3)
    x = torch.zeros(N, FEATURES, dtype=torch.float64)
    for i in range(N):
        x[i, rng.choice(6, size=1 + i % 2, replace=False)] = 1.0
    y = torch.from_numpy(rng.integers(0, 2, N)).double()
    return x.to_sparse(), y


def _sampler() -> PoissonSampler:
    """The same batches in every repetition."""
    return PoissonSampler(N, Q, np.random.default_rng(11), public_size=N)


def _released(repetitions: int, seed: int, monkeypatch: pytest.MonkeyPatch | None) -> Tensor:
    """The first weights after STEPS steps, one row per repetition (noise seeds
    seed, seed + 1, ...), from the same start, data and batches; step by step (no
    deferral) when `monkeypatch` is given."""
    torch.manual_seed(0)
    model = mlp(FEATURES, (HIDDEN,)).double()
    start = parameters_of(model)
    data = _data()
    trainer = DPSGD(model, bce, CONFIG)
    if monkeypatch is not None:
        monkeypatch.setattr(DPSGD, "_deferred", lambda *_: None)
    released = [
        trainer.run(start, data, _sampler(), STEPS, noise=SeededNoise(seed + r)).params["0.weight"]
        for r in range(repetitions)
    ]
    return torch.stack(released).flatten(1)


def _law_differences(deferred: Tensor, stepwise: Tensor) -> list[str]:
    """Where two samples of released weights (repetitions × coordinates) differ in law:
    per feature row, the summed variance (ratio beyond ±12 %) and the means (beyond 4
    standard errors); per coordinate, a Kolmogorov–Smirnov test (p < 0.001)."""
    found = []
    by_row_deferred = deferred.view(len(deferred), HIDDEN, FEATURES)
    by_row_stepwise = stepwise.view(len(stepwise), HIDDEN, FEATURES)
    for j in range(FEATURES):
        a, b = by_row_deferred[:, :, j], by_row_stepwise[:, :, j]
        ratio = float(a.var(0).sum() / b.var(0).sum())
        if not 0.88 < ratio < 1.12:
            found.append(f"row {j}: variance ratio {ratio:.3f}")
        error = ((a.var(0) + b.var(0)) / len(a)).sqrt()
        if ((a.mean(0) - b.mean(0)).abs() > 4 * error).any():
            found.append(f"row {j}: means differ")
    for k in range(deferred.shape[1]):
        p = stats.ks_2samp(deferred[:, k].numpy(), stepwise[:, k].numpy()).pvalue
        if p < 0.001:
            found.append(f"coordinate {k}: Kolmogorov–Smirnov p = {p:.2g}")
    return found


REPETITIONS = 1000


@pytest.fixture(scope="module")
def stepwise() -> Tensor:
    with pytest.MonkeyPatch.context() as patch:
        return _released(REPETITIONS, 0, patch)


def test_deferred_noise_releases_the_step_by_step_law(stepwise: Tensor) -> None:
    """Deferred (one draw per touch + 1) against step by step, independent seeds: the
    same per-row variances and means and the same marginals, touched rows and untouched."""
    deferred = _released(REPETITIONS, 10**6, None)
    assert _law_differences(deferred, stepwise) == []


def test_the_law_check_fails_on_a_variance_30_percent_off(
    stepwise: Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above can fail: deferred draws of 1.3× the variance are caught."""
    made = DeferredRows.__init__

    def inflated(self: DeferredRows, *args: Any) -> None:
        made(self, *args)
        self.step_std *= 1.3**0.5

    monkeypatch.setattr(DeferredRows, "__init__", inflated)
    assert any(
        "variance" in d for d in _law_differences(_released(REPETITIONS, 10**6, None), stepwise)
    )


class _Counting(NoiseSource):
    """A seeded source that counts the values it draws."""

    def __init__(self, seed: int) -> None:
        self.inner, self.values = SeededNoise(seed), 0

    def normal(self, shape: tuple[int, ...], std: float, dtype: torch.dtype) -> Tensor:
        self.values += int(np.prod(shape))
        return self.inner.normal(shape, std, dtype)

    def metadata(self) -> dict[str, Any]:
        return self.inner.metadata()


def test_draws_fall_to_one_per_touch_after_the_first_step_and_one_at_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each first-weight row draws once per later step whose batch touches it, plus once
    at the end; every other parameter once a step. Step by step: every value each step."""
    model = mlp(FEATURES, (HIDDEN,)).double()
    start, data = parameters_of(model), _data()
    deferred, stepwise = _Counting(0), _Counting(0)
    DPSGD(model, bce, CONFIG).run(start, data, _sampler(), STEPS, noise=deferred)
    replay, x = _sampler(), data[0].to_dense()
    touches = 0  # (row, step) pairs with a batch touching the row, after the first step
    for t in range(1, STEPS + 1):
        batch = x[torch.from_numpy(replay.sample())]
        touches += int((batch != 0).any(0).sum()) if t > 1 else 0
    others = sum(v.numel() for k, v in start.items() if k != "0.weight")
    assert deferred.values == STEPS * others + HIDDEN * (FEATURES + touches)
    monkeypatch.setattr(DPSGD, "_deferred", lambda *_: None)
    DPSGD(model, bce, CONFIG).run(start, data, _sampler(), STEPS, noise=stepwise)
    total = sum(v.numel() for v in start.values())
    assert stepwise.values == STEPS * total
    assert deferred.values < 0.75 * stepwise.values


class _Shift(nn.Module):
    """A parameterless layer that maps zeros to ones: every first-weight row is read."""

    def forward(self, x: Tensor) -> Tensor:
        return (x.to_dense() if x.is_sparse else x) + 1.0


def test_no_deferral_when_a_parameterless_layer_comes_before_the_first_linear() -> None:
    """A shift before the first `nn.Linear` makes every row read at every step, so no
    row's noise may wait: every value is drawn each step, as step by step."""
    model = nn.Sequential(_Shift(), *mlp(FEATURES, (HIDDEN,)).double())
    start, counting = parameters_of(model), _Counting(0)
    DPSGD(model, bce, CONFIG).run(start, _data(), _sampler(), STEPS, noise=counting)
    assert counting.values == STEPS * sum(v.numel() for v in start.values())
