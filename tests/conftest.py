"""Shared fixtures. Real datasets live in ../shared/data beside the project checkout."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution
from sklearn.datasets import load_breast_cancer

from dpfl.data.partition import iid_stratified
from dpfl.federation.silo import Silo
from dpfl.privacy.accounting import PLD_DISCRETISATION
from studies import toml_text

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("DPFL_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data directory: skipped (with the reason) on a user's machine without
    it, but a hard failure under CI, where a missing file must not pass silently."""
    if SHARED_DATA.is_dir():
        return SHARED_DATA
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but the shared data directory {SHARED_DATA} is missing")
    pytest.skip(f"shared data not found at {SHARED_DATA} (set DPFL_SHARED_DATA to use it)")


@pytest.fixture(scope="session")
def breast_cancer_silos() -> Callable[[int], list[Silo]]:
    """scikit-learn's breast-cancer table in n IID silos, 80/20 train/test in each.

    Standardised with the table's own moments: acceptable for a test fixture; a study
    would declare public constants instead (dpfl.data.preprocess)."""
    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)

    def make(n: int = 3) -> list[Silo]:
        silos = []
        for k, members in enumerate(iid_stratified(y, n, seed=0)):
            idx = np.random.default_rng(k).permutation(members)  # the table is ordered
            cut = int(0.8 * len(idx))
            train, test = idx[:cut], idx[cut:]
            silos.append(
                Silo.from_arrays(
                    f"h{k}", x[train], y[train], x[test], y[test], public_size=len(train)
                )
            )
        return silos

    return make


@pytest.fixture(scope="session")
def independent_epsilon() -> Callable[..., float]:
    """ε of `steps` Poisson-sampled Gaussian steps built directly with dp_accounting's PLD,
    outside dpfl's accounting code: what a ledger's figure is checked against."""

    def epsilon(sigma: float, q: float, steps: int, delta: float = 1e-5) -> float:
        pld = privacy_loss_distribution.from_gaussian_mechanism(
            sigma, sampling_prob=q, value_discretization_interval=PLD_DISCRETISATION
        )
        return float(pld.self_compose(steps).get_epsilon_for_delta(delta))

    return epsilon


@pytest.fixture(scope="session")
def study_text() -> Callable[[Mapping[str, Any]], str]:
    """A study file's text (TOML) for a study given as the dict `Study` takes: the commands'
    tests read the very study the API's tests build, instead of a copy written by hand."""
    return toml_text
