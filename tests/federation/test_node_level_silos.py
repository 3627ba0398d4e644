"""Silos whose persons are in several records (neighbourhoods of a pruned contact graph):
the sampler declares the node-level event, the ledger accounts replace-one-person, the
plan and calibration read the same event, and what cannot be analysed is refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from dpfl.data import Dataset
from dpfl.data.sampling import BalancedPoissonSampler, PoissonSampler
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import simulate
from dpfl.federation.algorithms import MRMTL, FedAvg
from dpfl.federation.algorithms.aop import AOP
from dpfl.federation.algorithms.centralized import Centralized
from dpfl.federation.algorithms.fedsgd_secure import FedSGDSecure
from dpfl.federation.silo import Silo, silos_from_dataset
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.local.output_perturbation import AOPConfig
from dpfl.models import logistic_regression
from dpfl.privacy import Ledger, Neighbouring, calibrate_noise, epsilon, events
from dpfl.privacy.accounts import account
from dpfl.privacy.errors import UnsupportedAccountingError

APPEARANCES = 4
CONFIG = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=0.5)


def _silos(appearances: int = APPEARANCES) -> list[Silo]:
    rng = np.random.default_rng(0)
    silos = []
    for k, n in enumerate((300, 120)):
        x = rng.normal(size=(n, 5))
        y = (x[:, 0] + rng.normal(size=n) > 0).astype(int)
        silos.append(Silo.from_arrays(f"region-{k}", x, y, x[:40], y[:40], public_size=n))
    return [dataclasses.replace(s, appearances=appearances) for s in silos]


def _fedavg() -> FedAvg:
    torch.manual_seed(0)
    return FedAvg(model=logistic_regression(5), loss=bce, dpsgd=CONFIG, expected_batch_size=30)


def test_the_sampler_declares_the_node_level_event_that_the_plan_charges(tmp_path: Path) -> None:
    silos = _silos()
    algorithm = _fedavg()
    sampler = algorithm.sampler_of(silos[0], np.random.default_rng(0))
    steps = algorithm.local_steps(silos[0].info)
    declared = events.node_gaussian(1.0, appearances=APPEARANCES, sample_rate=0.1, steps=steps)
    assert sampler.privacy_event(1.0, steps) == declared
    assert algorithm.training_event(silos[0].info) == declared
    result = simulate(
        algorithm, silos, RunPlan(rounds=3, progress=False), ledger=tmp_path / "l.sqlite"
    )
    with Ledger(tmp_path / "l.sqlite", create=False) as book:
        assert book.budget(account("region-0", 0)).neighbouring is Neighbouring.REPLACE_ONE
        charged = [entry.event for entry in book.entries(account("region-0", 0))]
    assert charged == [declared] * 3
    report = result.epsilon[0]["region-0"]
    assert report.neighbouring is Neighbouring.REPLACE_ONE and report.accountant.value == "rdp"
    assert report.epsilon == pytest.approx(epsilon(events.repeat(declared, 3), 1e-5).epsilon)


def test_one_more_row_changes_neither_the_declared_event_nor_the_normaliser() -> None:
    """q, steps and the normaliser come from the declared size, not the rows held."""
    silo = _silos()[0]
    grown = dataclasses.replace(
        silo, x=torch.cat([silo.x, silo.x[:1]]), y=torch.cat([silo.y, silo.y[:1]])
    )
    algorithm = _fedavg()
    plan = algorithm.training_event(silo.info)
    assert algorithm.training_event(grown.info) == plan
    before, after = (algorithm.sampler_of(s, np.random.default_rng(0)) for s in (silo, grown))
    assert after.expected_batch_size == before.expected_batch_size
    steps = algorithm.local_steps(grown.info)
    assert after.privacy_event(1.0, steps) == before.privacy_event(1.0, steps) == plan


def test_calibration_reaches_the_budget_through_the_node_level_bound() -> None:
    """Every silo ends within its budget, at far more noise than one record a person
    would need (RDP, for both)."""
    algorithm, silos = _fedavg(), _silos()
    result = simulate(
        algorithm, silos, RunPlan(rounds=3, epsilon=4.0, calibrate="common", progress=False)
    )
    assert all(r.epsilon <= 4.0 for r in result.epsilon[0].values())
    steps = 3 * algorithm.local_steps(silos[0].info)
    record_level = calibrate_noise(
        4.0,
        1e-5,
        lambda sigma: events.poisson_gaussian(0.1, sigma, steps=steps),
        accountant="rdp",
    )
    assert result.noise_multiplier is not None
    assert result.noise_multiplier > 3 * record_level


def test_the_rows_a_replacement_changes_are_binomial_in_a_batch() -> None:
    """The declared event assumes the 2S − 1 rows that replacing a person changes join a
    batch independently at q: count, over many batches, how many of them were drawn."""
    sampler = PoissonSampler(
        1000, 0.2, np.random.default_rng(3), public_size=1000, appearances=APPEARANCES
    )
    rows = np.array([5, 77, 400, 401, 650, 998, 999])  # 2S − 1 rows
    assert len(rows) == events.replacement_rows(APPEARANCES)
    counts = np.array([np.isin(rows, sampler.sample()).sum() for _ in range(4000)])
    observed = np.bincount(np.minimum(counts, 4), minlength=5)  # 4 or more: one cell
    pmf = stats.binom.pmf(np.arange(4), len(rows), 0.2)
    expected = 4000 * np.append(pmf, 1 - pmf.sum())
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_mrmtl_and_the_pooled_reference_charge_node_level_steps() -> None:
    silos = _silos()
    torch.manual_seed(0)
    mrmtl = MRMTL(model=logistic_regression(5), loss=bce, dpsgd=CONFIG, expected_batch_size=30)
    event = mrmtl.participation_event(silos[0].info, [s.info for s in silos])
    assert event.neighbouring is Neighbouring.REPLACE_ONE
    pooled = Centralized(model=logistic_regression(5), loss=bce, dpsgd=CONFIG)
    event = pooled.participation_event(silos[0].info, [s.info for s in silos])
    assert "node-level(≤4 rows a person, 7 per replacement)" in event.describe()


@pytest.mark.parametrize("kind", ["fedsgd_secure", "aop"])
def test_algorithms_analysed_for_one_record_a_person_refuse_node_level_silos(kind: str) -> None:
    silos = _silos()
    algorithm = (
        FedSGDSecure(model=logistic_regression(5), loss=bce, dpsgd=CONFIG)
        if kind == "fedsgd_secure"
        else AOP(
            model=logistic_regression(5),
            loss=bce,
            config=AOPConfig(1.0, 1e-5, 0.1, 1e-4, 1.0),
            epochs=2,
        )
    )
    with pytest.raises(ValueError, match="node-level"):
        algorithm.participation_event(silos[0].info, [s.info for s in silos])


def test_balanced_batches_have_no_node_level_analysis() -> None:
    with pytest.raises(UnsupportedAccountingError, match="node-level"):
        BalancedPoissonSampler.event(0.1, 1.0, 3, appearances=2)


def test_node_level_data_keeps_its_own_split_and_declares_its_size() -> None:
    data = Dataset(
        "graph",
        np.zeros((20, 2), np.float32),
        np.arange(20) % 2,
        ("a", "b"),
        "rows are neighbourhoods",
        appearances=3,
    )
    with pytest.raises(ValueError, match="official"):
        silos_from_dataset(data, [np.arange(20)])
    undeclared = Silo.from_arrays("g", np.zeros((5, 2)), np.zeros(5))
    with pytest.raises(ValueError, match="declare it"):
        dataclasses.replace(undeclared, appearances=2)
