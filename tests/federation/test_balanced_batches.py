"""Kerkouche's balanced batches as a study option: every silo's batches are downsampled
by the sampler that declares their event, the plan charges the same σ/2, and the
algorithms that declare their own events refuse it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpfl.data.sampling import BalancedPoissonSampler, PoissonSampler
from dpfl.experiments.results.store import ResultsStore
from dpfl.experiments.study.build import build_algorithm
from dpfl.experiments.study.config import ConfigError, Study
from dpfl.experiments.study.point import STORE
from dpfl.experiments.study.runner import run_study
from dpfl.federation.silo import Silo
from dpfl.privacy import Ledger, epsilon, events
from dpfl.privacy.accounts import account

STUDY: dict[str, Any] = {
    "name": "balanced",
    "rounds": 2,
    "eval_every": "end",
    "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 2}},
    "algorithm": {"name": "fedavg", "sampling": "balanced", "expected_batch_size": 32},
    "privacy": {"noise_multiplier": 1.0, "delta": 1e-5},
}


def test_balanced_batches_are_planned_and_charged_at_half_the_noise(tmp_path: Path) -> None:
    (run,) = run_study(Study(STUDY), tmp_path)
    assert run.status == "finished", run.error
    sheet = run.datasheet["silos"]["hospital-0"]
    (rate,) = sheet["sample_rates"]
    steps = round(1 / rate)
    with ResultsStore(tmp_path / STORE) as store:
        with Ledger(store.ledger_of(run), create=False) as book:
            charged = {entry.event for entry in book.entries(account("hospital-0", 0))}
        spent = store.epsilon_by_silo(run).by_silo["hospital-0"]
    assert charged == {events.poisson_gaussian(rate, 0.5, steps=steps)}
    plain = events.repeat(events.poisson_gaussian(rate, 1.0, steps=steps), 2)
    assert spent > epsilon(plain, 1e-5).epsilon  # σ/2: more than plain Poisson batches


def test_every_local_batch_comes_from_the_balanced_sampler() -> None:
    ((_, config),) = Study(STUDY).points
    rng = np.random.default_rng(0)
    y = (rng.random(200) < 0.1).astype(int)
    silo = Silo.from_arrays("h", rng.normal(size=(200, 30)), y, public_size=200)
    algorithm = build_algorithm(config, [silo])
    sampler = algorithm.sampler_of(silo, np.random.default_rng(1))
    assert isinstance(sampler, BalancedPoissonSampler)
    for _ in range(20):
        batch = sampler.sample()
        assert (y[batch] == 1).sum() == (y[batch] == 0).sum()
    plan = algorithm.training_event(silo.info)
    assert plan == sampler.privacy_event(1.0, algorithm.local_steps(silo.info))
    # one more patient (a death) changes the batches, never the declared event
    grown = Silo.from_arrays("h", rng.normal(size=(201, 30)), np.append(y, 1), public_size=200)
    bigger = algorithm.sampler_of(grown, np.random.default_rng(1))
    assert bigger.expected_batch_size == sampler.expected_batch_size
    assert bigger.privacy_event(1.0, algorithm.local_steps(grown.info)) == plan
    plain = build_algorithm(Study({**STUDY, "algorithm": {"name": "fedavg"}}).points[0][1], [silo])
    assert type(plain.sampler_of(silo, np.random.default_rng(1))) is PoissonSampler


@pytest.mark.parametrize("name", ["fedsgd_secure", "aop"])
def test_algorithms_that_declare_their_own_events_refuse_balanced_batches(name: str) -> None:
    study = {
        **STUDY,
        "algorithm": {"name": name, "sampling": "balanced"},
        "privacy": {"epsilon": 1.0, "delta": 1e-5},
    }
    with pytest.raises(ConfigError, match="cannot draw balanced batches"):
        Study(study)


def test_survival_labels_cannot_be_balanced() -> None:
    labels = np.column_stack([np.arange(1.0, 41.0), np.ones(40)])
    silo = Silo.from_arrays("h", np.zeros((40, 30)), labels, public_size=40)
    ((_, config),) = Study({**STUDY, "model": {"time_bins": [5.0]}}).points
    algorithm = build_algorithm(config, [silo])
    with pytest.raises(ValueError, match="class labels"):
        algorithm.sampler_of(silo, np.random.default_rng(0))
