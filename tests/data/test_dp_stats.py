"""DP statistics spend the silo's budget in its ledger, before anything is released."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from dpfl.data import dp_preprocess, preprocess, public_tables
from dpfl.data.dataset import Dataset
from dpfl.privacy import Ledger
from dpfl.privacy.errors import BudgetExceededError

RANGES = {"mean radius": (5.0, 30.0), "mean texture": (5.0, 40.0), "mean area": (100.0, 2600.0)}


@pytest.fixture
def wdbc() -> Dataset:
    return public_tables.breast_cancer_wisconsin()


@pytest.fixture
def ledger(tmp_path: Path, wdbc: Dataset) -> Ledger:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.register_silo("hospital", epsilon=2.0, delta=1e-5, size=len(wdbc))
    return ledger


def _columns(data: Dataset) -> np.ndarray:
    return np.stack([data.features[:, data.feature_names.index(n)] for n in RANGES], axis=1)


def test_dp_mean_std_is_accurate_and_spends_budget(wdbc: Dataset, ledger: Ledger) -> None:
    before = ledger.spent("hospital").epsilon
    moments = dp_preprocess.dp_mean_std(
        wdbc,
        RANGES,
        noise_multiplier=5.0,
        ledger=ledger,
        silo="hospital",
        rng=np.random.default_rng(0),
    )
    after = ledger.spent("hospital").epsilon
    assert before == 0 < after < 2
    (entry,) = ledger.entries("hospital")
    assert entry.label == "dp mean/std of 3 features of breast_cancer_wisconsin"
    x = _columns(wdbc)
    scale = np.array([hi - lo for lo, hi in RANGES.values()])
    # noise std on each sum: 5 x sqrt(1 + 1.25 x 3) ≈ 10.9, i.e. ≈ 2% of a range over n = 569
    assert np.all(np.abs(moments.mean - x.mean(0)) < 0.05 * scale)
    assert np.all(np.abs(moments.std - x.std(0)) < 0.1 * scale)
    assert abs(moments.noisy_count - 569) < 60


def test_refused_release_reveals_nothing(wdbc: Dataset, ledger: Ledger) -> None:
    """Over budget: BudgetExceededError, and the rng was not touched (no noise drawn)."""
    rng = np.random.default_rng(1)
    with pytest.raises(BudgetExceededError):
        for _ in range(1000):
            dp_preprocess.dp_mean_std(
                wdbc, RANGES, noise_multiplier=1.0, ledger=ledger, silo="hospital", rng=rng
            )
    state = rng.bit_generator.state
    with pytest.raises(BudgetExceededError):
        dp_preprocess.dp_mean_std(
            wdbc, RANGES, noise_multiplier=1.0, ledger=ledger, silo="hospital", rng=rng
        )
    assert rng.bit_generator.state == state


def test_clipping_bounds_each_records_influence(wdbc: Dataset, ledger: Ledger) -> None:
    """A wild record moves the noiseless sums by no more than the stated sensitivity."""
    ranges = dict(RANGES)
    clean = dp_preprocess._normalised(wdbc, ranges)
    features = wdbc.features.copy()
    features[0, wdbc.feature_names.index("mean area")] = 1e9
    wild = dp_preprocess._normalised(dataclasses.replace(wdbc, features=features), ranges)
    assert np.abs(wild).max() <= 1
    assert np.linalg.norm(wild.sum(0) - clean.sum(0)) <= 2 * np.sqrt(len(ranges))


def test_dp_top_k_finds_strong_features(wdbc: Dataset, ledger: Ledger) -> None:
    ranges = {"mean radius": (5.0, 30.0), "worst concave points": (0.0, 0.3)}
    ranges |= {f"noise{i}": (0.0, 1.0) for i in range(4)}
    rng = np.random.default_rng(2)
    noise = rng.random((len(wdbc), 4)).astype(np.float32)
    data = dataclasses.replace(
        wdbc,
        features=np.concatenate([wdbc.features, noise], axis=1),
        feature_names=(*wdbc.feature_names, *(f"noise{i}" for i in range(4))),
    )
    top = dp_preprocess.dp_top_k_features(
        data, ranges, 2, noise_multiplier=3.0, ledger=ledger, silo="hospital", rng=rng
    )
    assert top == ("mean radius", "worst concave points")
    assert ledger.spent("hospital").epsilon > 0


def test_bad_requests(wdbc: Dataset, heart_like: Dataset, ledger: Ledger) -> None:
    rng = np.random.default_rng(0)
    kwargs = {"ledger": ledger, "silo": "hospital", "rng": rng}
    with pytest.raises(ValueError, match="noise_multiplier must be positive"):
        dp_preprocess.dp_mean_std(wdbc, RANGES, noise_multiplier=0.0, **kwargs)
    with pytest.raises(ValueError, match="no feature 'weight'"):
        dp_preprocess.dp_mean_std(wdbc, {"weight": (0, 1)}, noise_multiplier=1.0, **kwargs)
    with pytest.raises(ValueError, match="non-finite value"):
        dp_preprocess.dp_mean_std(heart_like, {"age": (20, 90)}, noise_multiplier=1.0, **kwargs)
    with pytest.raises(ValueError, match="k must be in"):
        dp_preprocess.dp_top_k_features(wdbc, RANGES, 4, noise_multiplier=1.0, **kwargs)
    assert ledger.spent("hospital").epsilon == 0


@pytest.fixture
def heart_like(wdbc: Dataset) -> Dataset:
    features = wdbc.features[:, :1].copy()
    features[3, 0] = np.nan
    return Dataset("with-missing", features, wdbc.labels, ("age",), "one missing value")


def test_imputed_data_is_accepted(heart_like: Dataset, ledger: Ledger) -> None:
    imputed = preprocess.zero_impute(heart_like)
    moments = dp_preprocess.dp_mean_std(
        imputed,
        {"age": (0, 40)},
        noise_multiplier=3.0,
        ledger=ledger,
        silo="hospital",
        rng=np.random.default_rng(0),
    )
    assert moments.feature_names == ("age",)
