"""Private hyperparameter selection: the number of candidate runs follows the law its
event declares, and the event costs what dp_accounting's RDP accountant says."""

from __future__ import annotations

import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event as dpe
from dp_accounting.rdp import RdpAccountant

from dpfl.privacy import Ledger, epsilon, events
from dpfl.privacy.accounting import RDP_ORDERS
from dpfl.privacy.errors import PrivacyParameterError
from dpfl.privacy.selection import probabilities, repetitions

LAWS = [(10.0, math.inf), (10.0, 0.0), (10.0, 1.0), (5.0, 2.5)]


@pytest.mark.parametrize(("mean", "shape"), LAWS)
def test_the_number_of_runs_follows_the_declared_law(mean: float, shape: float) -> None:
    rng = np.random.default_rng(0)
    draws = np.array([repetitions(mean, shape, rng) for _ in range(20000)])
    ks = np.arange(0 if math.isinf(shape) else 1, 3000)  # the logarithmic tail is long
    expected = probabilities(mean, shape, ks)
    assert expected.sum() == pytest.approx(1.0, abs=1e-6)
    assert (ks * expected).sum() == pytest.approx(mean, rel=1e-6)
    observed = np.bincount(draws, minlength=len(ks) + 1)[ks] / len(draws)
    assert np.abs(observed - expected).max() < 0.01
    assert draws.mean() == pytest.approx(mean, rel=0.05)
    if not math.isinf(shape):
        assert draws.min() >= 1  # a truncated law always runs at least once


def test_tuning_costs_what_dp_accounting_says_far_below_composing_the_runs() -> None:
    run = events.poisson_gaussian(0.01, 1.1, steps=1000)
    tuned = events.tuned(run, mean=10.0, shape=0.0)
    independent = RdpAccountant(list(RDP_ORDERS))
    independent.compose(dpe.RepeatAndSelectDpEvent(run.dp_event, 10.0, 0.0))
    report = epsilon(tuned, 1e-5)  # PLD has no such event: RDP answers
    assert report.accountant == "rdp"
    assert report.epsilon == pytest.approx(independent.get_epsilon(1e-5), rel=1e-9)
    one = epsilon(run, 1e-5, "rdp").epsilon
    ten = epsilon(events.repeat(run, 10), 1e-5, "rdp").epsilon
    assert one < report.epsilon < ten


def test_a_tuned_event_is_kept_in_the_ledger_and_read_back(tmp_path: Path) -> None:
    tuned = events.tuned(events.poisson_gaussian(0.02, 1.0, steps=200), mean=4.0, shape=math.inf)
    with Ledger(tmp_path / "ledger.db") as book:
        book.register_silo("h", epsilon=10.0, delta=1e-5)
        book.record("h", tuned, label="selection")
        spent = book.spent("h").epsilon
    with Ledger(tmp_path / "ledger.db", create=False) as book:
        assert book.spent("h").epsilon == spent
    assert events.PrivacyEvent.from_json(tuned.to_json()) == tuned
    assert "best of Poisson runs (mean 4)" in tuned.describe()


def test_impossible_selections_are_refused() -> None:
    run = events.poisson_gaussian(0.01, 1.0, steps=10)
    with pytest.raises(PrivacyParameterError, match="mean number of runs"):
        events.tuned(run, mean=0.5, shape=1.0)
    with pytest.raises(PrivacyParameterError, match="shape"):
        events.tuned(run, mean=5.0, shape=-1.0)
    with pytest.raises(PrivacyParameterError, match="composed, not sampled"):
        events.tuned(events.approximate_dp(1.0, 1e-6), mean=5.0, shape=1.0)
    with pytest.raises(ValueError, match="mean ≥ 1"):
        repetitions(0.0, 1.0, np.random.default_rng(0))
    assert dp_accounting  # the accountant the event is read by
