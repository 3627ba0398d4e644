"""Runs with correlated noise: each hospital's ledger holds its mechanism's events, the
secret stream lives in its local state and checkpoint and a resumed run continues it
bit for bit, an older copy of a checkpoint starts a new stream, and what the analysis
does not cover is refused before anything is drawn."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sklearn.datasets import load_breast_cancer

from dpfl.data import partition
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import simulate
from dpfl.federation.algorithms import FedAvg, FedSGDSecure
from dpfl.federation.algorithms.ditto import Ditto
from dpfl.federation.silo import Silo
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.local.mechanisms import STREAMS, NoiseMechanism
from dpfl.local.mechanisms.bandmf import BandedMF
from dpfl.local.mechanisms.blt import BLT
from dpfl.models import logistic_regression
from dpfl.privacy import epsilon, events

_X, _Y = load_breast_cancer(return_X_y=True)
_X = (_X - _X.mean(0)) / _X.std(0)  # a test fixture's own moments
CONFIG = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.5, learning_rate=0.5)
ROUNDS = 4


def _silos(units: bool = False) -> list[Silo]:
    silos = []
    for k, idx in enumerate(partition.iid_stratified(_Y, 3, seed=0)):
        cut = int(0.8 * len(idx))
        patients = np.arange(cut) // 2 if units else None
        silos.append(
            Silo.from_arrays(
                f"h{k}",
                _X[idx[:cut]],
                _Y[idx[:cut]],
                _X[idx[cut:]],
                _Y[idx[cut:]],
                public_size=cut // 2 if units else cut,
                units=patients,
            )
        )
    return silos


def _fedavg(noise: NoiseMechanism, **kwargs: Any) -> FedAvg:
    torch.manual_seed(0)
    return FedAvg(model=logistic_regression(30), loss=bce, dpsgd=CONFIG, noise=noise, **kwargs)


NOISES = [BandedMF(ROUNDS, band=4), BLT(ROUNDS, buffers=2)]


@pytest.mark.parametrize("noise", NOISES, ids=lambda n: n.name)
def test_each_ledger_holds_the_mechanisms_event_per_round(noise: NoiseMechanism) -> None:
    silos = _silos()
    algorithm = _fedavg(noise)
    result = simulate(algorithm, silos, RunPlan(rounds=ROUNDS, trials=2, progress=False))
    for silo in silos:
        info = silo.info
        one = noise.event(algorithm.sample_rate(info), 1.5, algorithm.local_steps(info))
        assert algorithm.participation_event(info, [s.info for s in silos]) == one
        expected = epsilon(events.repeat(one, ROUNDS), 1e-5).epsilon
        for trial in range(2):
            assert result.epsilon[trial][silo.name].epsilon == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("noise", NOISES, ids=lambda n: n.name)
def test_a_resumed_run_continues_the_secret_stream_bit_for_bit(
    noise: NoiseMechanism, tmp_path: Path
) -> None:
    silos, checkpoint = _silos(), tmp_path / "run.pt"
    whole = simulate(_fedavg(noise), silos, RunPlan(rounds=ROUNDS, seed=1, progress=False))
    plan = RunPlan(rounds=2, seed=1, checkpoint=checkpoint, progress=False)
    simulate(_fedavg(noise), silos, plan)
    resumed = simulate(_fedavg(noise), silos, dataclasses.replace(plan, rounds=ROUNDS))
    for name in whole.params:
        assert torch.equal(whole.params[name], resumed.params[name])
    saved = torch.load(checkpoint, weights_only=False)["state"]
    stream = saved.hospitals[0]["h0"][STREAMS]["model"]
    steps = _fedavg(noise).local_steps(silos[0].info)
    assert stream["step"] == ROUNDS * steps
    assert stream["memory"].shape[1] == 31  # the model's parameters
    assert len(stream["partitions"]) == silos[0].size


def test_an_older_copy_of_a_checkpoint_starts_a_new_stream(tmp_path: Path) -> None:
    """Round 2 released from a stream that went on to step 3s; restoring the copy taken
    after round 1 must not continue that stream again (its memory would take the released
    noise back out): round 2 is trained on a new stream, begun at step 0."""
    silos, checkpoint, ledger = _silos(), tmp_path / "run.pt", tmp_path / "ledger.sqlite"
    noise = BandedMF(ROUNDS, band=4)
    plan = RunPlan(rounds=2, checkpoint=checkpoint, research_noise=False, progress=False)
    simulate(_fedavg(noise), silos, plan, ledger=ledger)
    copy = checkpoint.read_bytes()
    simulate(_fedavg(noise), silos, dataclasses.replace(plan, rounds=3), ledger=ledger)
    steps = _fedavg(noise).local_steps(silos[0].info)

    def stream() -> dict[str, Any]:
        state = torch.load(checkpoint, weights_only=False)["state"]
        return dict(state.hospitals[0]["h0"][STREAMS]["model"])

    assert stream()["step"] == 3 * steps
    checkpoint.write_bytes(copy)
    simulate(_fedavg(noise), silos, dataclasses.replace(plan, rounds=3), ledger=ledger)
    assert stream()["step"] == steps


def test_ditto_keeps_one_stream_per_model(tmp_path: Path) -> None:
    silos, checkpoint = _silos(), tmp_path / "run.pt"
    torch.manual_seed(0)
    ditto = Ditto(
        model=logistic_regression(30),
        loss=bce,
        dpsgd=CONFIG,
        strength=0.5,
        noise=BLT(2, buffers=2),
    )
    simulate(ditto, silos, RunPlan(rounds=2, checkpoint=checkpoint, progress=False))
    state = torch.load(checkpoint, weights_only=False)["state"]
    streams = state.hospitals[0]["h1"][STREAMS]
    assert set(streams) == {"model", "personal"}
    assert (
        streams["model"]["step"]
        == streams["personal"]["step"]
        == 2 * ditto.local_steps(silos[1].info)
    )
    with pytest.raises(ValueError, match="planned and charged for 2 trainings"):
        simulate(ditto, silos, RunPlan(rounds=3, checkpoint=checkpoint, progress=False))


def test_what_the_analysis_does_not_cover_is_refused() -> None:
    with pytest.raises(ValueError, match="cyclic batches: balanced batches"):
        _fedavg(BandedMF(2), balanced=True)
    patients = _silos(units=True)
    with pytest.raises(ValueError, match="protects a person with several records"):
        simulate(_fedavg(BandedMF(2)), patients, RunPlan(rounds=2, progress=False))
    with pytest.raises(ValueError, match=r"b·q = .* > 1"):
        simulate(_fedavg(BandedMF(2, band=40)), _silos(), RunPlan(rounds=2, progress=False))
    with pytest.raises(ValueError, match="fedsgd_secure's noise must be independent"):
        FedSGDSecure(model=logistic_regression(30), loss=bce, dpsgd=CONFIG, noise=BLT(2))
