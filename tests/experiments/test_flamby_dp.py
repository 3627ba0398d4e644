"""FLamby's DP example re-accounted: σ as Opacus chose it, ε by the ledger, each checked
against Opacus or `dp_accounting` called directly, with FLamby's settings typed anew."""

from __future__ import annotations

import math
import re
import sys
import warnings

import dp_accounting
import pytest
from dp_accounting import get_epsilon_gaussian
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from opacus.accountants.utils import get_noise_multiplier

from dpfl.experiments.recipes import flamby_common
from dpfl.experiments.recipes.flamby_common import Reaccounted
from dpfl.privacy import events
from dpfl.privacy.accounting import PLD_DISCRETISATION, RDP_ORDERS, epsilon

DELTA = 1e-4
BATCHES = {0: 50, 1: 43, 2: 8, 3: 22}
"""⌈n/4⌉ for 199, 172, 30 and 85 training records: len() of FLamby's loaders."""
STEPS = 15 * 100
"""15 rounds (get_nb_max_rounds(100)) of num_updates = 100 local steps."""


@pytest.fixture(scope="module")
def at_one() -> list[Reaccounted]:
    return flamby_common.reaccount([(1.0, DELTA)])


def test_flamby_settings() -> None:
    assert flamby_common.ROUNDS == 15
    assert flamby_common.TRAIN_SIZES == (199, 172, 30, 85)
    assert sum(flamby_common.TRAIN_SIZES) == flamby_common.POOLED_TRAIN_SIZE
    assert len(flamby_common.TARGETS) == 20


def test_sigma_is_opacus_own(at_one: list[Reaccounted]) -> None:
    assert [r.client for r in at_one] == [0, 1, 2, 3]
    for r in at_one:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = get_noise_multiplier(
                target_epsilon=1.0,
                target_delta=DELTA,
                sample_rate=1 / BATCHES[r.client],
                epochs=15,
                accountant="rdp",
            )
        assert r.noise_multiplier == theirs
        assert r.sample_rate == 1 / BATCHES[r.client]
        assert r.opacus_steps == 15 * BATCHES[r.client]
        assert (r.steps, r.epochs) == (STEPS, math.ceil(STEPS / BATCHES[r.client]))


def test_sigma_without_opacus_is_dpfl_rdp_calibration(
    at_one: list[Reaccounted], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "opacus.accountants.utils", None)  # import fails
    sigma, source = flamby_common.opacus_noise_multiplier(1.0, DELTA, sample_rate=1 / 50, epochs=15)
    assert source.startswith("dpfl RDP")
    # dpfl's denser orders and sharper conversion ask for a little less noise than Opacus
    opacus_sigma = at_one[0].noise_multiplier
    assert 0.97 * opacus_sigma < sigma <= opacus_sigma + 1e-4


def test_poisson_epsilon_exceeds_nominal_and_matches_dp_accounting(
    at_one: list[Reaccounted],
) -> None:
    for r in at_one:
        assert r.poisson_accountant == "PLD"
        assert r.epsilon_poisson > r.nominal_epsilon
        step = dp_accounting.PoissonSampledDpEvent(
            1 / BATCHES[r.client], dp_accounting.GaussianDpEvent(r.noise_multiplier)
        )
        pld = PLDAccountant(
            dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
            value_discretization_interval=PLD_DISCRETISATION,
        )
        pld.compose(dp_accounting.SelfComposedDpEvent(step, STEPS))
        assert r.epsilon_poisson == pytest.approx(pld.get_epsilon(DELTA), rel=1e-6)
    worst = max(at_one, key=lambda r: r.epsilon_poisson)
    assert (worst.client, worst.records) == (2, 30)
    # the steps, not the accountant: for the steps Opacus was told, the ledger's PLD
    # stays within the target
    told = events.poisson_gaussian(
        worst.sample_rate, worst.noise_multiplier, steps=worst.opacus_steps
    )
    assert epsilon(told, DELTA).epsilon <= 1.0


def test_shuffled_bound_is_sound_and_above_poisson(at_one: list[Reaccounted]) -> None:
    for r in at_one:
        assert r.epsilon_shuffled >= r.epsilon_poisson
        # one Gaussian per epoch: a sum moved by 2C (replace one record) under noise σC;
        # E Gaussians at σ/2 are one at σ/(2√E): the ledger (PLD, or RDP where the PLD
        # would be too large, as here) bounds its exact ε from above, not far
        exact = get_epsilon_gaussian(r.noise_multiplier / 2 / math.sqrt(r.epochs), DELTA)
        assert exact <= r.epsilon_shuffled <= 1.2 * exact
        # RDP, computed independently, bounds the same release no tighter
        rdp = RdpAccountant(list(RDP_ORDERS), dp_accounting.NeighboringRelation.REPLACE_ONE)
        release = dp_accounting.GaussianDpEvent(r.noise_multiplier / 2)
        rdp.compose(dp_accounting.SelfComposedDpEvent(release, r.epochs))
        assert r.epsilon_shuffled <= rdp.get_epsilon(DELTA)


def test_rows_hold_the_ledgers_numbers(at_one: list[Reaccounted]) -> None:
    assert flamby_common.ROW_EPSILONS == (1.0, 10.0) and flamby_common.ROW_CLIENTS == (0, 2)
    # the default rows() also runs target ε = 10 (about 15 s); ε = 1 is what the fixture
    # already accounted for, so rows() reads it from the cache
    rows = flamby_common.rows(epsilons=[1.0])
    assert len(rows) == 4
    for r, (poisson, shuffled) in zip(
        (at_one[0], at_one[2]), zip(rows[::2], rows[1::2], strict=True), strict=True
    ):
        assert f"client {r.client} ({r.records} records)" in poisson.setting
        assert poisson.paper.startswith(f"ε = {r.nominal_epsilon:g} ")
        for row, value, sign in (
            (poisson, r.epsilon_poisson, "="),
            (shuffled, r.epsilon_shuffled, "≤"),
        ):
            shown = re.match(rf"ε {sign} ([0-9.]+) ", row.ours)
            assert shown is not None, row.ours
            assert float(shown.group(1)) == pytest.approx(value, abs=0.051)
        assert "Poisson" in poisson.note and "replace one record" in shuffled.note
    assert at_one[2].epsilon_poisson > 3 * at_one[2].nominal_epsilon
