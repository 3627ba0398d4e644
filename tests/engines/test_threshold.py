"""A balanced threshold in a run: each evaluation's histogram releases are charged to
every (silo, trial) account before they are drawn, planned with the rounds (calibration
leaves room for them, the check refuses a run they do not fit), pooled where the silos
share one model and kept per silo where they do not; a non-private run chooses on exact
histograms. Refused where it cannot apply."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import balanced_accuracy_score

from dpfl.data import partition
from dpfl.engines import simulation
from dpfl.engines.evaluation import scores
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import SimulationResult, simulate
from dpfl.federation.algorithms import FedAvg, FedSGDSecure, Local
from dpfl.federation.silo import Silo
from dpfl.federation.threshold import BalancedThreshold
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.models import logistic_regression
from dpfl.privacy import Accountant, Ledger, events
from dpfl.privacy.accounts import account

_X, _Y = load_breast_cancer(return_X_y=True)
_X = (_X - _X.mean(0)) / _X.std(0)  # a test fixture: its own moments are fine
CONFIG = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=0.5)
CUT = BalancedThreshold(noise=5.0)
ROUNDS, TRIALS = 6, 2


def _silos() -> list[Silo]:
    return [
        Silo.from_arrays(
            f"h{k}", _X[idx], _Y[idx], _X[idx[:40]], _Y[idx[:40]], public_size=len(idx)
        )
        for k, idx in enumerate(partition.iid_stratified(_Y, 3, seed=0))
    ]


def _fedavg(dpsgd: DPSGDConfig = CONFIG) -> FedAvg:
    torch.manual_seed(0)
    return FedAvg(model=logistic_regression(30), loss=bce, dpsgd=dpsgd, expected_batch_size=16)


def _local() -> Local:
    torch.manual_seed(0)
    return Local(model=logistic_regression(30), loss=bce, dpsgd=CONFIG, expected_batch_size=16)


def test_each_evaluation_charges_one_release_per_silo_and_trial(tmp_path: Path) -> None:
    result = simulate(
        _fedavg(),
        _silos(),
        RunPlan(rounds=ROUNDS, trials=TRIALS, eval_every=2, threshold=CUT, progress=False),
        ledger=tmp_path / "l",
    )
    release = CUT.event(_silos()[0].info).to_json()
    with Ledger(tmp_path / "l", create=False) as book:
        for silo in _silos():
            for trial in range(TRIALS):
                entries = book.entries(account(silo, trial))
                rounds = Counter(e.round for e in entries if e.event.to_json() == release)
                assert rounds == Counter({1: 1, 3: 1, 5: 1})  # rounds 2, 4, 6 evaluated
    # one shared model: one threshold for every silo, reported among its metrics
    for row in result.history:
        cuts = {metrics["threshold"] for metrics in row["silos"].values()}
        assert len(cuts) == 1 and 0 < cuts.pop() < 1


def test_personalised_models_get_thresholds_of_their_own(tmp_path: Path) -> None:
    result = simulate(
        _local(),
        _silos(),
        RunPlan(
            rounds=2,
            trials=1,
            threshold=BalancedThreshold(noise=5.0, bins=64),
            progress=False,
            cross_silo=True,
        ),
        ledger=tmp_path / "l",
    )
    assert len(result.cross_silo) == 9
    cuts = {m["threshold"] for m in result.history[-1]["silos"].values()}
    assert len(cuts) == 3
    # every silo's model is read at its own threshold on every test set too
    for row in result.cross_silo:
        assert row["metrics"]["threshold"] == result.silo_metrics[0][row["model"]]["threshold"]
        if row["model"] == row["test"]:
            assert row["metrics"] == result.silo_metrics[0][row["model"]]


def test_a_non_private_run_chooses_the_best_edge_on_its_exact_training_scores() -> None:
    """No noise and no ledger: the threshold is the candidate edge of the best balanced
    accuracy on the pooled training records, found again with scikit-learn, and the
    test metrics are read at it."""
    silos = _silos()
    algorithm = _fedavg(DPSGDConfig.non_private(learning_rate=0.5))
    result = simulate(algorithm, silos, RunPlan(rounds=3, threshold=CUT, progress=False))
    chosen = result.history[-1]["silos"]["h0"]["threshold"]
    params = {name: value[0] for name, value in result.params.items()}
    p = np.concatenate([scores(algorithm.model, params, s.x) for s in silos])
    y = np.concatenate([s.y.numpy() for s in silos])
    best = max(balanced_accuracy_score(y, p >= t) for t in 1 / (1 + np.exp(-CUT.edges)))
    assert balanced_accuracy_score(y, p >= chosen) == pytest.approx(best)
    tested = np.concatenate([scores(algorithm.model, params, s.x_test) for s in silos])
    truth = np.concatenate([s.y_test.numpy() for s in silos if s.y_test is not None])
    assert result.final_metrics()["balanced_accuracy"] == pytest.approx(
        balanced_accuracy_score(truth, tested >= chosen)
    )


def test_calibration_leaves_room_for_the_releases(tmp_path: Path) -> None:
    """With the releases planned, σ is larger than without, and the run still ends at
    its budget (RDP: PLD's calibration is slower and not the point here)."""
    sigmas, spent = [], []
    for k, cut in enumerate([0.5, CUT]):
        with Ledger(tmp_path / f"l{k}", accountant=Accountant.RDP) as book:
            result = simulate(
                _fedavg(),
                _silos(),
                RunPlan(
                    rounds=ROUNDS,
                    epsilon=2.0,
                    calibrate="common",
                    eval_every=ROUNDS,
                    threshold=cut,
                    progress=False,
                ),
                ledger=book,
            )
        sigmas.append(result.noise_multiplier)
        spent.append(max(r.epsilon for r in result.epsilon[0].values()))
    assert sigmas[1] > sigmas[0] * 1.02
    assert 0.98 * 2.0 < spent[1] <= 2.0 + 1e-9
    # six releases at noise 5 alone spend more than ε = 2: said, not searched for
    with pytest.raises(ValueError, match=r"alone spend ε=2\.\d+ of its ε=2"):
        simulate(
            _fedavg(),
            _silos(),
            RunPlan(rounds=ROUNDS, epsilon=2.0, calibrate="common", threshold=CUT, progress=False),
            ledger=Ledger(tmp_path / "l2", accountant=Accountant.RDP),
        )


def test_a_run_whose_releases_do_not_fit_is_refused_before_round_0(tmp_path: Path) -> None:
    with Ledger(tmp_path / "fits", accountant=Accountant.RDP) as book:
        simulate(_fedavg(), _silos(), RunPlan(rounds=ROUNDS, progress=False), ledger=book)
        budget = max(r.epsilon for r in [book.spent(account("h0", 0))])
    with pytest.raises(ValueError, match="Gaussian") as refused:
        simulate(
            _fedavg(),
            _silos(),
            RunPlan(rounds=ROUNDS, epsilon=budget * 1.001, threshold=CUT, progress=False),
            ledger=Ledger(tmp_path / "l", accountant=Accountant.RDP),
        )
    assert "h0/trial-0" in str(refused.value)
    with Ledger(tmp_path / "l", create=False) as book:
        assert not book.entries(account("h0", 0))  # nothing was charged


def test_a_threshold_the_run_cannot_use_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"lies in \(0, 1\)"):
        simulate(_fedavg(), _silos(), RunPlan(rounds=1, threshold=1.5, progress=False))
    torch.manual_seed(0)
    dopamine = FedSGDSecure(
        model=logistic_regression(30), loss=bce, dpsgd=CONFIG, expected_batch_size=16
    )
    with pytest.raises(ValueError, match="budget is spent"):
        simulate(dopamine, _silos(), RunPlan(rounds=2, epsilon=5.0, threshold=CUT, progress=False))
    three = [
        Silo.from_arrays("h", _X[:60], np.arange(60) % 3, public_size=60),
    ]
    with pytest.raises(ValueError, match="binary"):
        simulate(_fedavg(), three, RunPlan(rounds=1, threshold=CUT, progress=False))


def test_the_release_event_is_what_the_ledger_holds() -> None:
    """The charged event is a Gaussian of σ = noise / 1 on the full histogram."""
    assert CUT.event(_silos()[0].info).to_json() == events.gaussian(5.0).to_json()


def test_a_crash_after_a_release_resumes_without_paying_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calibrated to end at the budget, a run that paid round 1's step and release but
    crashed before checkpointing it resumes (its plan does not count them twice) and
    ends with the uninterrupted run's charges and thresholds."""
    cut = BalancedThreshold(noise=20.0)

    def run(folder: Path) -> SimulationResult:
        return simulate(
            _fedavg(),
            _silos(),
            RunPlan(
                rounds=3,
                epsilon=3.0,
                calibrate="common",
                threshold=cut,
                checkpoint=folder / "run.pt",
                progress=False,
            ),
            ledger=Ledger(folder / "l", accountant=Accountant.RDP),
        )

    (tmp_path / "whole").mkdir()
    (tmp_path / "cut").mkdir()
    whole = run(tmp_path / "whole")
    real_save = simulation._save

    def crash_in_round_1(*args: object) -> None:
        if args[3] == 1:
            raise RuntimeError("power cut")
        real_save(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(simulation, "_save", crash_in_round_1)
    with pytest.raises(RuntimeError, match="power cut"):
        run(tmp_path / "cut")
    monkeypatch.setattr(simulation, "_save", real_save)
    resumed = run(tmp_path / "cut")
    assert resumed.history == whole.history
    for folder in ("whole", "cut"):
        with Ledger(tmp_path / folder / "l", create=False) as book:
            charged = Counter(e.round for e in book.entries(account("h1", 0)))
            assert charged == Counter({0: 2, 1: 2, 2: 2})  # a step and a release a round


def test_a_checkpoint_resumes_only_into_the_same_threshold(tmp_path: Path) -> None:
    checkpoint = tmp_path / "run.pt"
    simulate(
        _fedavg(), _silos(), RunPlan(rounds=2, threshold=CUT, checkpoint=checkpoint, progress=False)
    )
    for other in (0.5, BalancedThreshold(noise=6.0)):
        with pytest.raises(ValueError, match="different run"):
            simulate(
                _fedavg(),
                _silos(),
                RunPlan(rounds=2, threshold=other, checkpoint=checkpoint, progress=False),
            )
