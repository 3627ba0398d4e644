"""The simulator with FedAvg-DP and cyclic DP: learning, exact ledger ε, determinism,
resumption, budgets, client sampling, traffic and interruption."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_breast_cancer

from dpfl.data import partition
from dpfl.engines import simulation, streams
from dpfl.engines.accounts import note_release
from dpfl.engines.plan import Observer, RunPlan
from dpfl.engines.simulation import SimulationResult, simulate
from dpfl.federation.algorithms import Cyclic, FedAvg, Instruction, Local, State
from dpfl.federation.silo import Silo, SiloInfo
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.local.noise import SecureNoise, SeededNoise
from dpfl.models import logistic_regression
from dpfl.privacy import Ledger
from dpfl.privacy.accounts import account

# Public standardisation constants would be declared in a real study; here the whole
# table is only a test fixture, so its own moments are fine.
_X, _Y = load_breast_cancer(return_X_y=True)
_X = (_X - _X.mean(0)) / _X.std(0)
CONFIG = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=0.5)


def _silos(n: int = 3) -> list[Silo]:
    silos = []
    for k, idx in enumerate(partition.iid_stratified(_Y, n, seed=0)):
        cut = int(0.8 * len(idx))
        silos.append(
            Silo.from_arrays(
                f"h{k}",
                _X[idx[:cut]],
                _Y[idx[:cut]],
                _X[idx[cut:]],
                _Y[idx[cut:]],
                public_size=cut,
            )
        )
    return silos


def _fedavg(**kwargs: object) -> FedAvg:
    torch.manual_seed(0)
    return FedAvg(model=logistic_regression(30), loss=bce, dpsgd=CONFIG, **kwargs)  # type: ignore[arg-type]


def _cyclic() -> Cyclic:
    torch.manual_seed(0)
    return Cyclic(model=logistic_regression(30), loss=bce, dpsgd=CONFIG, steps_per_visit=5)


@pytest.mark.parametrize("make", [_fedavg, _cyclic], ids=["fedavg", "cyclic"])
def test_algorithms_learn_on_breast_cancer_over_three_silos(make) -> None:  # type: ignore[no-untyped-def]
    result = simulate(make(), _silos(), RunPlan(rounds=8, progress=False))
    majority = max(np.mean(_Y), 1 - np.mean(_Y))
    assert result.final_metrics()["accuracy"] > majority + 0.25
    assert result.final_metrics()["auroc"] > 0.95
    assert set(result.silo_metrics[0]) == {"h0", "h1", "h2"}
    assert [h["round"] for h in result.history] == list(range(8))  # every round, per silo
    assert result.history[-1]["silos"] == result.silo_metrics[0]
    first, last = result.history[0]["silos"]["h1"], result.history[-1]["silos"]["h1"]
    assert last["loss"] < first["loss"]


@pytest.mark.parametrize("make", [_fedavg, _cyclic], ids=["fedavg", "cyclic"])
def test_ledger_epsilon_equals_an_independent_composition(
    make, tmp_path: Path, independent_epsilon
) -> None:  # type: ignore[no-untyped-def]
    algorithm = make()
    silos = _silos()
    result = simulate(
        algorithm, silos, RunPlan(rounds=4, progress=False), ledger=tmp_path / "l.sqlite"
    )
    for silo in silos:
        q = 16 / silo.size
        steps = 4 * algorithm.local_steps(silo)
        expected = independent_epsilon(1.0, q, steps)
        assert result.epsilon[0][silo.name].epsilon == pytest.approx(expected, rel=1e-9)
    with Ledger(tmp_path / "l.sqlite", create=False) as ledger:
        assert len(ledger.entries(account(silos[0], 0))) == 4


def test_same_seed_same_model_bit_for_bit() -> None:
    silos = _silos()
    first = simulate(_fedavg(), silos, RunPlan(rounds=3, trials=2, seed=5, progress=False))
    again = simulate(_fedavg(), silos, RunPlan(rounds=3, trials=2, seed=5, progress=False))
    other = simulate(_fedavg(), silos, RunPlan(rounds=3, trials=2, seed=6, progress=False))
    for name in first.params:
        assert torch.equal(first.params[name], again.params[name])
        assert not torch.equal(first.params[name], other.params[name])
        assert not torch.equal(first.params[name][0], first.params[name][1])  # trials differ


def test_silos_that_share_the_model_share_its_tensors_and_personal_ones_do_not() -> None:
    """At Kerkouche's scale a copy of the shared model per silo was 6 GB (314 × 4.9M)."""
    silos = _silos()
    shared = simulate(_fedavg(), silos, RunPlan(rounds=2, trials=2, progress=False))
    assert all(models is shared.params for models in shared.silo_models.values())
    torch.manual_seed(0)
    alone = Local(model=logistic_regression(30), loss=bce, dpsgd=CONFIG)
    personal = simulate(alone, silos, RunPlan(rounds=2, trials=2, progress=False)).silo_models
    assert not torch.equal(personal["h0"]["weight"], personal["h1"]["weight"])


def test_random_streams_are_keyed_repeatable_and_independent() -> None:
    """The n-th call of a (trial, silo) pair gets the n-th stream of that pair, whatever
    the other pairs draw; keys that differ anywhere give uncorrelated uniform streams;
    research noise is seeded by the key, and without it the noise is the CSPRNG's."""
    rng = streams.Streams(3, 2, streams.stream_rng)
    first = [rng(0, 0).random(4) for _ in range(2)]
    again = streams.Streams(3, 2, streams.stream_rng)
    again(1, 0)  # another member and the server draw first: nothing moves
    again(0, -1)
    assert all(np.array_equal(a, again(0, 0).random(4)) for a in first)
    keys = [(3, 0, 1, 2, 0), (3, 0, 1, 2, 1), (3, 1, 1, 2, 0), (3, 0, 2, 2, 0), (3, 0, 1, 3, 0)]
    keys += [(4, 0, 1, 2, 0), (30, 1, 2, 0, 0), (3, 0, 12, 0, 0), (3, 1, 20, 0, 0)]
    draws = np.stack([streams.stream_rng(key).random(20_000) for key in keys])
    assert np.abs(draws.mean(1) - 0.5).max() < 0.01  # uniform: std of a mean 0.002
    correlations = np.corrcoef(draws)[np.triu_indices(len(keys), 1)]
    assert np.abs(correlations).max() < 0.04  # independent: std 0.007
    seeded = [streams.stream_noise(True, key) for key in keys]
    assert isinstance(seeded[0], SeededNoise) and len({n.seed for n in seeded}) == len(keys)
    assert streams.stream_noise(True, keys[0]).seed == seeded[0].seed
    assert isinstance(streams.stream_noise(False, keys[0]), SecureNoise)


def test_without_research_noise_a_silos_batches_cannot_be_replayed_from_the_seed() -> None:
    """Only the server's stream (its public cohorts) stays seeded; a silo's draws (its
    Poisson batches) come from the OS, as in a deployment."""
    member, server = (3, 0, 1, 2, 0), (3, 0, 0, 2, 0)
    draw = streams.member_rng
    assert np.array_equal(draw(True, member).random(8), draw(True, member).random(8))
    assert not np.array_equal(draw(False, member).random(8), draw(False, member).random(8))
    assert np.array_equal(draw(False, server).random(8), streams.stream_rng(server).random(8))
    # through a run without noise: the same seed, the same cohorts, other batches (the
    # only randomness left, so other models)
    silos = _silos()
    plain = DPSGDConfig.non_private(learning_rate=0.5)

    def run(research: bool) -> SimulationResult:
        torch.manual_seed(0)  # one initial model
        fedavg = FedAvg(model=logistic_regression(30), loss=bce, dpsgd=plain, client_rate=0.5)
        return simulate(
            fedavg, silos, RunPlan(rounds=4, seed=2, research_noise=research, progress=False)
        )

    seeded = [run(True) for _ in range(2)]
    assert torch.equal(seeded[0].params["weight"], seeded[1].params["weight"])
    runs = [run(False) for _ in range(2)]
    assert runs[0].traffic == runs[1].traffic  # who took part, and so what they sent
    assert not torch.equal(runs[0].params["weight"], runs[1].params["weight"])


def test_resuming_from_a_checkpoint_ends_with_the_same_model(tmp_path: Path) -> None:
    silos = _silos()
    whole = simulate(_fedavg(), silos, RunPlan(rounds=5, seed=1, progress=False))
    checkpoint = tmp_path / "run.pt"
    simulate(_fedavg(), silos, RunPlan(rounds=2, seed=1, checkpoint=checkpoint, progress=False))
    resumed = simulate(
        _fedavg(), silos, RunPlan(rounds=5, seed=1, checkpoint=checkpoint, progress=False)
    )
    for name in whole.params:
        assert torch.equal(whole.params[name], resumed.params[name])
    with pytest.raises(ValueError, match="different run"):
        simulate(_fedavg(), silos, RunPlan(rounds=5, seed=2, checkpoint=checkpoint, progress=False))


@pytest.mark.parametrize("crash", [0, 2])
def test_a_crash_between_paying_for_a_round_and_checkpointing_it_is_not_charged_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash: int
) -> None:
    silos, ledger, checkpoint = _silos(), tmp_path / "ledger.sqlite", tmp_path / "run.pt"
    whole = simulate(_fedavg(), silos, RunPlan(rounds=4, seed=3, trials=2, progress=False))

    def run(checkpoint: Path = checkpoint) -> SimulationResult:
        return simulate(
            _fedavg(),
            silos,
            RunPlan(rounds=4, seed=3, trials=2, checkpoint=checkpoint, progress=False),
            ledger=ledger,
        )

    real_save = simulation._save

    def crash_in_round(*args: object) -> None:
        if args[3] == crash:  # the round was paid for in the ledger, never checkpointed
            raise RuntimeError("power cut")
        real_save(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(simulation, "_save", crash_in_round)
    with pytest.raises(RuntimeError, match="power cut"):
        run()
    monkeypatch.setattr(simulation, "_save", real_save)
    with Ledger(ledger) as book:
        assert [e.round for e in book.entries(account(silos[0], 1))] == list(range(crash + 1))
    resumed = run()
    for name in whole.params:
        assert torch.equal(whole.params[name], resumed.params[name])
    assert resumed.rounds_completed == 4
    with Ledger(ledger) as book:
        for silo in silos:
            for trial in range(2):
                assert [e.round for e in book.entries(account(silo, trial))] == [0, 1, 2, 3]
    assert resumed.epsilon == whole.epsilon
    finished = run()  # resuming a finished run trains nothing and charges nothing
    assert finished.rounds_completed == 4 and finished.epsilon == whole.epsilon
    again = run(tmp_path / "fresh.pt")  # the same run anew over the ledger: a second release
    with Ledger(ledger) as book:
        assert len(book.entries(account(silos[2], 0))) == 8
    assert again.epsilon[0]["h2"].epsilon > whole.epsilon[0]["h2"].epsilon


def _rounds_charged(ledger: Path, silos: Sequence[Silo]) -> list[list[int | None]]:
    """Per silo, the rounds its first trial's account was charged for, in order."""
    with Ledger(ledger, create=False) as book:
        return [[e.round for e in book.entries(account(s, 0))] for s in silos]


def test_an_older_copy_of_a_checkpoint_pays_for_the_round_it_releases_again(
    tmp_path: Path,
) -> None:
    """The audit's attack: 2 rounds, copy the checkpoint, resume to 3 (round 2 released
    and charged), restore the copy and run to 3 again: round 2 is released again, with
    fresh noise, and must be charged again (it was free: the ledger showed it once)."""
    silos, ledger, checkpoint = _silos(), tmp_path / "ledger.sqlite", tmp_path / "run.pt"
    plan = RunPlan(rounds=2, checkpoint=checkpoint, research_noise=False, progress=False)
    simulate(_fedavg(), silos, plan, ledger=ledger)
    copy = checkpoint.read_bytes()
    first = simulate(_fedavg(), silos, dataclasses.replace(plan, rounds=3), ledger=ledger)
    checkpoint.write_bytes(copy)
    second = simulate(_fedavg(), silos, dataclasses.replace(plan, rounds=3), ledger=ledger)
    assert second.metadata["instance"] == first.metadata["instance"]  # resumed, not new
    assert not torch.equal(first.params["weight"], second.params["weight"])  # a new release
    assert _rounds_charged(ledger, silos) == [[0, 1, 2, 2]] * 3


def test_a_round_released_meanwhile_by_another_resume_is_not_released_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two resumes of one crashed run both find round 1 paid for and unreleased: the one
    that notes it released second stops before its checkpoint and result."""
    silos, ledger, checkpoint = _silos(), tmp_path / "ledger.sqlite", tmp_path / "run.pt"
    real_save = simulation._save

    def crash_in_round_1(*args: object) -> None:
        if args[3] == 1:  # round 1 was paid for, never released
            raise RuntimeError("power cut")
        real_save(*args)  # type: ignore[arg-type]

    def run(observe: Observer | None = None) -> SimulationResult:
        plan = RunPlan(rounds=2, checkpoint=checkpoint, progress=False, observe=observe)
        return simulate(_fedavg(), silos, plan, ledger=ledger)

    monkeypatch.setattr(simulation, "_save", crash_in_round_1)
    with pytest.raises(RuntimeError, match="power cut"):
        run()
    monkeypatch.setattr(simulation, "_save", real_save)
    with Ledger(ledger) as book:
        run_name = book.entries(account(silos[0], 0))[-1].label.split(" instance ")[0]

    def other_resume_releases(round_: int, *_: object) -> None:
        with Ledger(ledger) as other:  # another process, its own connection
            note_release(other, run_name, round_)

    with pytest.raises(RuntimeError, match=r"round 1 of fedavg run .* released meanwhile"):
        run(observe=other_resume_releases)
    assert torch.load(checkpoint, weights_only=False)["round"] == 0
    assert _rounds_charged(ledger, silos) == [[0, 1]] * 3
    assert run().rounds_completed == 2  # a resume now pays for the round it releases
    assert _rounds_charged(ledger, silos) == [[0, 1, 1]] * 3


@pytest.mark.parametrize("charged", [False, True], ids=["before-charges", "after-charges"])
def test_ctrl_c_in_a_round_charges_it_again_on_resume_only_once_it_was_charged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, charged: bool
) -> None:
    """An interrupted result holds the round under way once it was charged (its update
    may be aggregated): a resume pays for that round again. Interrupted before its
    charges, it holds nothing of the round, and the resume pays once."""
    silos, ledger, checkpoint = _silos(), tmp_path / "ledger.sqlite", tmp_path / "run.pt"
    plan = RunPlan(rounds=4, checkpoint=checkpoint, progress=False)
    real = simulation._RunState.exchange

    def interrupted_in_round_2(self: object, *args: object) -> object:
        if args[3] == 2 and not charged:
            raise KeyboardInterrupt
        out = real(self, *args)  # type: ignore[arg-type]
        if args[3] == 2:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(simulation._RunState, "exchange", interrupted_in_round_2)
    stopped = simulate(_fedavg(), silos, plan, ledger=ledger)
    assert stopped.interrupted and stopped.rounds_completed == 2
    monkeypatch.setattr(simulation._RunState, "exchange", real)
    simulate(_fedavg(), silos, plan, ledger=ledger)
    again = [2] if charged else []
    assert _rounds_charged(ledger, silos) == [[0, 1, 2, *again, 3]] * 3


def test_a_plan_over_budget_fails_before_training_and_calibration_fits_it() -> None:
    silos = _silos()
    with pytest.raises(ValueError, match=r"would exceed ε=1.*calibrate the noise"):
        simulate(_fedavg(), silos, RunPlan(rounds=10, epsilon=1.0, progress=False))
    result = simulate(
        _fedavg(), silos, RunPlan(rounds=10, epsilon=1.0, calibrate="common", progress=False)
    )
    spent = [report.epsilon for report in result.epsilon[0].values()]
    assert max(spent) <= 1.0
    assert max(spent) > 0.99  # the least noise: the tightest silo is at its budget
    assert result.noise_multiplier > 1.0


def test_client_sampling_charges_the_rounds_a_silo_took_part_in(
    tmp_path: Path, independent_epsilon: Callable[..., float]
) -> None:
    silos = _silos()
    algorithm = _fedavg(clients_per_round=2)
    result = simulate(
        algorithm, silos, RunPlan(rounds=6, progress=False), ledger=tmp_path / "l.sqlite"
    )
    with Ledger(tmp_path / "l.sqlite", create=False) as ledger:
        taken = {s.name: len(ledger.entries(account(s, 0))) for s in silos}
    assert sum(taken.values()) == 2 * 6
    for silo in silos:
        assert result.traffic[account(silo, 0)]["messages"] == 2 * taken[silo.name]
        steps = taken[silo.name] * algorithm.local_steps(silo)
        expected = independent_epsilon(1.0, 16 / silo.size, steps)
        assert result.epsilon[0][silo.name].epsilon == pytest.approx(expected, rel=1e-9)


def test_traffic_is_one_float32_model_each_way_per_participation() -> None:
    silos = _silos()
    for algorithm in (_fedavg(), _cyclic()):
        result = simulate(algorithm, silos, RunPlan(rounds=3, progress=False))
        for silo in silos:
            assert result.traffic[account(silo, 0)] == {
                "down": 3 * 124,
                "up": 3 * 124,
                "messages": 6,
            }


@dataclass(frozen=True)
class _StopsInRoundTwo(FedAvg):
    def configure(
        self,
        state: State,
        round: int,
        silos: Sequence[SiloInfo],
        rng: Callable[[], np.random.Generator],
        exchange: int = 0,
    ) -> dict[str, Instruction]:
        if round == 2:
            raise KeyboardInterrupt
        return super().configure(state, round, silos, rng, exchange)


def test_ctrl_c_stops_cleanly_with_the_ledger_intact(tmp_path: Path) -> None:
    torch.manual_seed(0)
    algorithm = _StopsInRoundTwo(model=logistic_regression(30), loss=bce, dpsgd=CONFIG)
    silos = _silos()
    result = simulate(
        algorithm, silos, RunPlan(rounds=5, progress=False), ledger=tmp_path / "l.sqlite"
    )
    assert result.interrupted
    assert result.rounds_completed == 2
    with Ledger(tmp_path / "l.sqlite", create=False) as ledger:
        assert all(len(ledger.entries(account(s, 0))) == 2 for s in silos)


def test_bad_runs_are_refused() -> None:
    silos = _silos()
    with pytest.raises(ValueError, match="unique"):
        simulate(_fedavg(), [silos[0], silos[0]], RunPlan(rounds=1, progress=False))
    with pytest.raises(ValueError, match="≥ 1"):
        simulate(_fedavg(), silos, RunPlan(rounds=0, progress=False))
    with pytest.raises(ValueError, match="fewer than the expected batch"):
        simulate(_fedavg(expected_batch_size=1000.0), silos, RunPlan(rounds=1, progress=False))
    with pytest.raises(ValueError, match="NaN"):
        Silo.from_arrays("bad", np.array([[np.nan, 1.0]]), np.array([1]))


def test_non_private_reference_learns_and_charges_nothing(tmp_path: Path) -> None:
    torch.manual_seed(0)
    algorithm = FedAvg(
        model=logistic_regression(30), loss=bce, dpsgd=DPSGDConfig.non_private(learning_rate=0.5)
    )
    result = simulate(
        algorithm, _silos(), RunPlan(rounds=5, progress=False), ledger=tmp_path / "l.sqlite"
    )
    assert result.final_metrics()["accuracy"] > 0.9
    assert result.epsilon == [{}]
    with Ledger(tmp_path / "l.sqlite", create=False) as ledger:
        assert ledger.silos() == []
    with pytest.raises(ValueError, match="needs a private algorithm"):
        simulate(
            algorithm, _silos(), RunPlan(rounds=1, epsilon=1.0, calibrate="common", progress=False)
        )


def test_a_run_resumes_in_another_process(tmp_path: Path) -> None:
    """A crash ends the process: the checkpoint must be recognised by a new one."""
    import subprocess
    import sys

    script = (
        "import torch, sys\n"
        "from dpfl.engines.simulation import _fingerprint\n"
        "from dpfl.federation.algorithms import FedAvg\n"
        "from dpfl.federation.silo import Silo\n"
        "from dpfl.local.dpsgd import DPSGDConfig\n"
        "from dpfl.local.losses import weighted_bce\n"
        "from dpfl.models import logistic_regression\n"
        "torch.manual_seed(0)\n"
        "silo = Silo.from_arrays('h0', [[0.0, 1.0]] * 20, [0, 1] * 10)\n"
        "algorithm = FedAvg(model=logistic_regression(2), loss=weighted_bce(float(sys.argv[1])),\n"
        "                   dpsgd=DPSGDConfig(1.0, 1.0, 0.5))\n"
        'print(_fingerprint(algorithm, [silo], 1, 0, True, "per-trial"))\n'
    )

    def fingerprint(weight: str) -> str:
        return subprocess.run(
            [sys.executable, "-c", script, weight], capture_output=True, text=True, check=True
        ).stdout.strip()

    assert fingerprint("3.0") == fingerprint("3.0")
    assert fingerprint("3.0") != fingerprint("4.0")  # captured settings count


def test_a_robust_aggregator_limits_a_poisoned_silo(breast_cancer_silos) -> None:  # type: ignore[no-untyped-def]
    """One of five silos has its labels flipped: the coordinate median keeps the model
    better than the weighted mean does (aggregation is post-processing: same ε)."""
    from dpfl.federation import aggregators

    silos = breast_cancer_silos(5)
    bad = silos[0]
    silos[0] = Silo(bad.name, bad.x, 1 - bad.y, bad.x_test, bad.y_test, bad.public_size)
    accuracy = {}
    for name, robust in (("mean", None), ("median", aggregators.coordinate_median)):
        torch.manual_seed(0)
        algorithm = FedAvg(
            model=logistic_regression(30),
            loss=bce,
            dpsgd=DPSGDConfig.non_private(0.5),
            robust=robust,
        )
        result = simulate(algorithm, silos[1:] + silos[:1], RunPlan(rounds=5, progress=False))
        accuracy[name] = np.mean([m["accuracy"] for m in result.silo_metrics[0].values()][:4])
    assert accuracy["median"] >= accuracy["mean"]
    assert accuracy["median"] > 0.9


def test_messages_are_logged_per_round_and_add_up_to_the_totals() -> None:
    silos = _silos()
    result = simulate(_fedavg(clients_per_round=2), silos, RunPlan(rounds=4, progress=False))
    assert sorted({row["round"] for row in result.messages}) == [0, 1, 2, 3]
    for round_ in range(4):
        rows = [row for row in result.messages if row["round"] == round_]
        assert len(rows) == 2  # two clients a round, one float32 model each way
        assert all(row["down"] == row["up"] == 124 for row in rows)
    total_up = sum(t["up"] for t in result.traffic.values())
    assert total_up == sum(row["up"] for row in result.messages) == 4 * 2 * 124


def test_trials_start_from_their_own_initialisation_unless_shared() -> None:
    """Trial 0 starts from the model as given; with "per-trial" every other trial from a
    fresh initialisation seeded by (seed, trial), so ± sd over trials includes it."""
    silos = _silos()

    def starts(init: str, seed: int = 0) -> list[torch.Tensor]:
        result = simulate(
            _fedavg(), silos, RunPlan(rounds=1, trials=3, seed=seed, init=init, progress=False)
        )
        return [result.params["weight"][r] for r in range(3)]

    own, shared = starts("per-trial"), starts("shared")
    assert torch.equal(own[0], shared[0])  # trial 0 is the same run either way
    assert not torch.equal(own[1], shared[1]) and not torch.equal(own[1], own[2])
    assert all(torch.equal(a, b) for a, b in zip(own, starts("per-trial"), strict=True))
    assert not torch.equal(own[1], starts("per-trial", seed=1)[1])
    with pytest.raises(ValueError, match="'per-trial' or 'shared'"):
        starts("random")
