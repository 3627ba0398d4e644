"""dpfl.engines.accounts: the rules an engine keeps around an algorithm's rounds.

1. The resume rule: a rerun over one ledger pays for every round; only a resume of the
   same run instance from its own checkpoint may count an entry as paid.
2. Public sizes: the record count never shapes the mechanism (q, steps, normaliser, AOP's
   σ), although events are declared add/remove; mechanisms are shaped by a public size,
   declared or released as a DP count charged first.
3. The progress status shows the worst trial by the accountant that enforces the budget.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_breast_cancer

from dpfl.data.sampling import PoissonSampler
from dpfl.engines.accounts import DEFAULT_SIZE_NOISE
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import simulate
from dpfl.federation.algorithms import AOP, Centralized, FedAvg
from dpfl.federation.silo import Silo
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.local.output_perturbation import AOPConfig
from dpfl.models import logistic_regression
from dpfl.privacy import Ledger, events
from dpfl.privacy.accounts import account

_X, _Y = load_breast_cancer(return_X_y=True)
_X = (_X - _X.mean(0)) / _X.std(0)
CONFIG = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=0.5)


def _silos(public: bool = True, extra: int = 0) -> list[Silo]:
    """Three silos of 60 training records (+`extra` in the first), declared 60 each."""
    silos = []
    for k in range(3):
        rows = slice(100 * k, 100 * k + 60 + (extra if k == 0 else 0))
        silos.append(
            Silo.from_arrays(
                f"h{k}",
                _X[rows],
                _Y[rows],
                _X[400 + 20 * k : 420 + 20 * k],
                _Y[400 + 20 * k : 420 + 20 * k],
                public_size=60 if public else None,
            )
        )
    return silos


def _fedavg() -> FedAvg:
    torch.manual_seed(0)
    return FedAvg(model=logistic_regression(30), loss=bce, dpsgd=CONFIG, expected_batch_size=10)


def _rounds_recorded(ledger: Path, silos: list[Silo]) -> list[list[int | None]]:
    with Ledger(ledger) as book:
        return [[e.round for e in book.entries(account(s, 0))] for s in silos]


# -- 1. reruns pay in full --------------------------------------------------------------


def test_a_rerun_after_its_checkpoint_is_deleted_pays_for_every_round(tmp_path: Path) -> None:
    silos, ledger, checkpoint = _silos(), tmp_path / "ledger.sqlite", tmp_path / "run.pt"
    plan = RunPlan(rounds=1, research_noise=False, checkpoint=checkpoint, progress=False)
    simulate(_fedavg(), silos, plan, ledger=ledger)
    checkpoint.unlink()
    again = simulate(_fedavg(), silos, plan, ledger=ledger)
    assert _rounds_recorded(ledger, silos) == [[0, 0]] * 3  # two fresh releases of round 0
    two = simulate(_fedavg(), silos, RunPlan(rounds=2, progress=False))
    assert again.epsilon[0]["h0"].epsilon == pytest.approx(two.epsilon[0]["h0"].epsilon)


def test_a_longer_run_with_a_new_checkpoint_pays_for_every_round(tmp_path: Path) -> None:
    silos, ledger = _silos(), tmp_path / "ledger.sqlite"
    plan = RunPlan(rounds=2, research_noise=False, checkpoint=tmp_path / "a.pt", progress=False)
    simulate(_fedavg(), silos, plan, ledger=ledger)
    plan = dataclasses.replace(plan, rounds=3, checkpoint=tmp_path / "b.pt")
    simulate(_fedavg(), silos, plan, ledger=ledger)
    assert _rounds_recorded(ledger, silos) == [[0, 1, 0, 1, 2]] * 3


def test_the_same_run_instance_extended_from_its_checkpoint_pays_once(tmp_path: Path) -> None:
    silos, ledger, checkpoint = _silos(), tmp_path / "ledger.sqlite", tmp_path / "run.pt"
    plan = RunPlan(rounds=2, checkpoint=checkpoint, research_noise=False, progress=False)
    first = simulate(_fedavg(), silos, plan, ledger=ledger)
    second = simulate(_fedavg(), silos, dataclasses.replace(plan, rounds=4), ledger=ledger)
    assert second.metadata["instance"] == first.metadata["instance"]
    assert _rounds_recorded(ledger, silos) == [[0, 1, 2, 3]] * 3


_KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from sklearn.datasets import load_breast_cancer
    from dpfl.engines import simulation
    from dpfl.engines.plan import RunPlan
    from dpfl.federation.algorithms import FedAvg
    from dpfl.federation.silo import Silo
    from dpfl.local.dpsgd import DPSGDConfig
    from dpfl.local.losses import bce
    from dpfl.models import logistic_regression
    from dpfl.privacy import Ledger

    torch.set_num_threads(1)
    point, at, directories = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    silos = [Silo.from_arrays(f"h{k}", x[100*k:100*k+60], y[100*k:100*k+60],
                              x[400:420], y[400:420], public_size=60) for k in range(3)]

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    record, save = Ledger.record_many, simulation._save

    def record_many(self, charges, *, label="", round=None):
        if point == "before-charge" and round == at:
            die()
        entries = record(self, charges, label=label, round=round)
        if point == "after-charge" and round == at:
            die()
        return entries

    def checkpointed(path, fingerprint, instance, round_, *rest):
        save(path, fingerprint, instance, round_, *rest)
        if point == "after-checkpoint" and round_ == at:
            die()

    Ledger.record_many = record_many
    simulation._save = checkpointed
    for directory in directories:
        torch.manual_seed(0)
        algorithm = FedAvg(model=logistic_regression(30), loss=bce,
                           dpsgd=DPSGDConfig(1.0, 1.0, 0.5), expected_batch_size=10)
        # an RDP ledger: what is paid for each round is tested, not PLD's ε (slower)
        ledger = Ledger(f"{directory}/ledger.sqlite", accountant="rdp")
        plan = RunPlan(rounds=3, checkpoint=f"{directory}/run.pt", research_noise=False,
                       progress=False)
        simulation.simulate(algorithm, silos, plan, ledger=ledger)
        ledger.close()
    """
)


def test_kill_9_anywhere_in_a_round_ends_with_each_round_paid_once(tmp_path: Path) -> None:
    """Secure noise: every attempt at a round draws fresh noise, but an attempt killed
    before its checkpoint released nothing; so the ledger ends with each round once.
    The four kill points run side by side, each in its own directory."""
    points = [
        ("before-charge", 0),
        ("after-charge", 0),
        ("after-charge", 1),
        ("after-checkpoint", 1),
    ]

    def start(point: str, at: int, *directories: Path) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", _KILLED_RUN, point, str(at), *map(str, directories)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    directories = [tmp_path / f"{point}-{at}" for point, at in points]
    for directory in directories:
        directory.mkdir()
    killed = [start(point, at, d) for d, (point, at) in zip(directories, points, strict=True)]
    for process in killed:
        _, err = process.communicate(timeout=300)
        assert process.returncode == -signal.SIGKILL, err
    finished = start("none", -1, *directories)  # one process resumes them all
    _, err = finished.communicate(timeout=300)
    assert finished.returncode == 0, err
    for directory in directories:
        assert _rounds_recorded(directory / "ledger.sqlite", _silos()) == [[0, 1, 2]] * 3


# -- 2. the record count does not shape the mechanism -------------------------------------


def test_adding_a_record_changes_no_quantity_that_shapes_the_mechanism(tmp_path: Path) -> None:
    """q, steps, the normaliser and the calibrated σ depend on the public size only."""
    algorithm = _fedavg()
    plain, plus_one = _silos(), _silos(extra=1)
    assert plus_one[0].size == plain[0].size + 1
    assert algorithm.sample_rate(plus_one[0]) == algorithm.sample_rate(plain[0])
    assert algorithm.local_steps(plus_one[0]) == algorithm.local_steps(plain[0])
    assert algorithm.participation_event(plus_one[0], plus_one) == (
        algorithm.participation_event(plain[0], plain)
    )
    normalisers = [
        PoissonSampler(
            s.size, algorithm.sample_rate(s), np.random.default_rng(0), public_size=s.declared_size
        ).expected_batch_size
        for s in (plain[0], plus_one[0])
    ]
    assert normalisers == [10.0, 10.0]
    sigmas = [
        simulate(
            _fedavg(),
            silos,
            RunPlan(rounds=3, epsilon=1.0, calibrate="common", progress=False),
            ledger=Ledger(tmp_path / f"{len(silos[0].y)}.sqlite", accountant="rdp"),
        ).noise_multiplier
        for silos in (plain, plus_one)
    ]
    assert sigmas[0] == sigmas[1]


def test_aop_noise_does_not_depend_on_the_record_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """AOP's σ is Δ(n)·σ₁ with n the public size: the release sees the same n either way."""
    from dpfl.federation.algorithms import aop as aop_module

    torch.manual_seed(0)
    aop = AOP(
        model=logistic_regression(30),
        loss=bce,
        config=AOPConfig(1.0, 1e-5, 5.0, gradient_tolerance=1e-4, feature_norm_bound=5.0),
        epochs=1,
    )
    stds: list[float] = []
    release = aop_module.output_perturbation

    def spy(*args: object, **kwargs: object) -> object:
        result = release(*args, **kwargs)  # type: ignore[arg-type]
        stds.append(result.metadata["noise_std"])
        return result

    monkeypatch.setattr(aop_module, "output_perturbation", spy)
    for silos in (_silos(), _silos(extra=1)):
        simulate(aop, silos[:1], RunPlan(rounds=1, progress=False))
    assert len(stds) == 2 and stds[0] == stds[1]


def test_centralized_plans_from_public_sizes_without_pooling_data() -> None:
    torch.manual_seed(0)
    cdp = Centralized(model=logistic_regression(30), loss=bce, dpsgd=CONFIG, expected_batch_size=9)
    silos = [dataclasses.replace(s, public_size=100) for s in _silos()]  # 60 records each
    event = cdp.participation_event(silos[0], silos)
    assert event == events.poisson_gaussian(9 / 300, 1.0, steps=round(300 / 9))


def test_a_silo_without_a_public_size_gets_a_dp_count_charged_first(tmp_path: Path) -> None:
    silos, ledger = _silos(public=False), tmp_path / "ledger.sqlite"
    first = simulate(_fedavg(), silos, RunPlan(rounds=1, trials=2, progress=False), ledger=ledger)
    released = first.metadata["public_sizes"]
    count = events.gaussian(DEFAULT_SIZE_NOISE)
    with Ledger(ledger) as book:
        for silo in silos:
            for trial in range(2):
                entries = book.entries(account(silo, trial))
                assert entries[0].event == count  # charged before round 0
                assert entries[0].label == f"release record count of {silo.name}"
            assert released[silo.name] == round(book.released(f"record count of {silo.name}"))
    assert released != {s.name: s.size for s in silos}  # noise was added
    # a later run over the ledger re-uses the released count; a new trial pays for it
    again = simulate(_fedavg(), silos, RunPlan(rounds=1, trials=3, progress=False), ledger=ledger)
    assert again.metadata["public_sizes"] == released
    with Ledger(ledger) as book:
        counts = [
            sum(e.event == count for e in book.entries(account(silos[0], trial)))
            for trial in range(3)
        ]
    assert counts == [1, 1, 1]


def test_calibration_makes_room_for_the_released_count(tmp_path: Path) -> None:
    result = simulate(
        _fedavg(),
        _silos(public=False),
        RunPlan(rounds=2, epsilon=1.0, calibrate="common", progress=False),
        ledger=Ledger(tmp_path / "ledger.sqlite", accountant="rdp"),
    )
    spent = max(report.epsilon for report in result.epsilon[0].values())
    assert 0.9 < spent <= 1.0


def test_non_private_runs_need_no_public_size() -> None:
    torch.manual_seed(0)
    reference = FedAvg(
        model=logistic_regression(30),
        loss=bce,
        dpsgd=DPSGDConfig.non_private(0.5),
        expected_batch_size=10,
    )
    result = simulate(reference, _silos(public=False), RunPlan(rounds=1, progress=False))
    assert result.metadata["public_sizes"] == {"h0": 60, "h1": 60, "h2": 60}


def test_the_progress_status_shows_the_worst_trial_by_the_enforcing_accountant(
    tmp_path: Path,
) -> None:
    from dpfl.engines.simulation import _status

    silos, step = _silos(), events.poisson_gaussian(0.1, 1.0, steps=10)
    with Ledger(tmp_path / "l.sqlite") as book:
        for silo in silos:
            for trial in range(2):
                book.register_silo(account(silo, trial), epsilon=50.0, delta=1e-5)
        book.record(account(silos[2], 1), events.repeat(step, 3))  # trial 1 spent most
        book.record(account(silos[0], 0), step)
        worst = book.spent(account(silos[2], 1))
        status = _status(book, [s.info for s in silos], 2, [], _fedavg())
    assert worst.accountant.value == "pld"
    assert status.startswith(f"max ε {worst.epsilon:.3f} (PLD)")
