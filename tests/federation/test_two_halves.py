"""The two halves of every algorithm: the hospital half gives the same replies, local
states and charges whether the simulator batches many members or a deployment calls one
at a time; charges come before replies; the secure-sum seam is honoured."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import simulate
from dpfl.federation.aggregators import coordinate_median
from dpfl.federation.algorithms import (
    BY_NAME,
    Algorithm,
    Centralized,
    FedAvg,
    FedSGDSecure,
    HospitalContext,
    Member,
)
from dpfl.federation.algorithms.centralized import POOL, pool
from dpfl.federation.messages import Summed
from dpfl.federation.silo import Silo, SiloInfo
from dpfl.local.mechanisms import STREAMS
from dpfl.local.mechanisms.bandmf import BandedMF
from dpfl.local.mechanisms.blt import BLT
from dpfl.local.noise import SeededNoise
from dpfl.privacy import Ledger, events
from dpfl.secure import IdealSecureSum, InTheClear, plain_sum

from .test_golden import ALGORITHMS

Charges = list[tuple[Any, str | None, str]]


def _context(trial: int, k: int, book: Charges) -> HospitalContext:
    """A hospital's context whose n-th stream is the same whenever it is rebuilt."""
    rngs, noises = itertools.count(), itertools.count()

    def ledger(charges: Sequence[tuple[Any, str | None, events.PrivacyEvent]]) -> None:
        book.extend((key, view, event.to_json()) for key, view, event in charges)

    return HospitalContext(
        round=0,
        rng=lambda: np.random.default_rng([11, trial, k + 1, next(rngs)]),
        noise=lambda: SeededNoise(1000 * trial + 10 * (k + 1) + next(noises)),
        ledger=ledger,
        account=(trial, k),
    )


def _members(algorithm: Algorithm, silos: list[Silo], trials: int, book: Charges) -> list[Member]:
    infos = [s.info for s in silos]
    curator = pool(silos) if algorithm.pools_data else None
    members = []
    for r in range(trials):
        state = algorithm.initial_state(infos)
        server = np.random.default_rng([5, r])
        orders = algorithm.configure(state, 0, infos, lambda server=server: server)
        for name, instruction in orders.items():
            k = -1 if name == POOL else [s.name for s in silos].index(name)
            silo = curator if curator is not None else silos[k]
            local = algorithm.initial_local_state(state["global"])
            members.append(Member(instruction, silo, local, _context(r, k, book)))
    return members


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


CORRELATED = {
    f"{name}+{noise.name}": (name, noise)
    for name, noise in [
        ("fedavg", BandedMF(3, band=2)),
        ("cyclic", BLT(3, buffers=2)),
        ("mrmtl", BandedMF(3, band=3)),
        ("ditto", BLT(3, buffers=2)),
        ("finetune", BandedMF(3, band=2)),
        ("local", BLT(3, buffers=1)),
        ("centralized", BandedMF(3, band=4)),
    ]
}
"""Every algorithm that takes correlated noise, with one of the mechanisms."""


def _algorithm(name: str) -> Algorithm:
    """A registered algorithm by its golden settings, or one of them with `CORRELATED`
    noise."""
    if name in CORRELATED:
        base, noise = CORRELATED[name]
        return dataclasses.replace(ALGORITHMS[base](), noise=noise)  # type: ignore[type-var]
    return ALGORITHMS[name]()


@pytest.mark.parametrize("name", sorted(ALGORITHMS) + sorted(CORRELATED))
def test_the_hospital_half_batched_equals_one_hospital_at_a_time(
    name: str, breast_cancer_silos: Callable[[int], list[Silo]]
) -> None:
    """With correlated noise, its secret stream (kept in the local state) too."""
    algorithm, silos = _algorithm(name), breast_cancer_silos(3)
    together: Charges = []
    batched = algorithm.client_updates(_members(algorithm, silos, 2, together))
    alone: Charges = []
    single = [
        algorithm.client_update(m.instruction, m.silo, m.state, m.ctx)
        for m in _members(algorithm, silos, 2, alone)
    ]
    assert len(batched) == len(single) > 0
    for (reply, local), (reply1, local1) in zip(batched, single, strict=True):
        assert (reply is None) == (reply1 is None)
        if reply is not None and reply1 is not None:
            assert reply.encoding == reply1.encoding
            assert torch.equal(reply.vector, reply1.vector)  # bit for bit
        assert _same(local, local1)
    assert sorted(together, key=repr) == sorted(alone, key=repr)
    assert together or not algorithm.private


@pytest.mark.parametrize("name", sorted(ALGORITHMS) + sorted(CORRELATED))
def test_one_more_record_changes_no_declared_event(
    name: str, breast_cancer_silos: Callable[[int], list[Silo]]
) -> None:
    """The record count is private: with the public sizes fixed, a hospital holding one
    more record declares and charges exactly the same events."""
    algorithm, silos = _algorithm(name), breast_cancer_silos(3)
    first = silos[0]
    grown = Silo(
        first.name,
        torch.cat([first.x, first.x[:1]]),
        torch.cat([first.y, first.y[:1]]),
        public_size=first.public_size,
    )
    charged: list[Charges] = [[], []]
    for book, cohort in zip(charged, (silos, [grown, *silos[1:]]), strict=True):
        algorithm.client_updates(_members(algorithm, cohort, 1, book))
    assert sorted(charged[0], key=repr) == sorted(charged[1], key=repr)
    infos = [s.info for s in silos]
    assert grown.info == first.info
    assert algorithm.participation_event(grown.info, infos).to_json() == (
        algorithm.participation_event(first.info, infos).to_json()
    )


def test_a_hospital_charges_before_its_reply_exists(
    breast_cancer_silos: Callable[[int], list[Silo]],
) -> None:
    """A ledger that refuses (an exhausted budget) stops the hospital: no reply."""
    algorithm, silo = ALGORITHMS["fedavg"](), breast_cancer_silos(3)[0]
    instruction = algorithm.configure(
        algorithm.initial_state([silo.info]), 0, [silo.info], np.random.default_rng
    )[silo.name]

    def exhausted(charges: Sequence[tuple[Any, str | None, events.PrivacyEvent]]) -> None:
        raise RuntimeError("budget exhausted")

    ctx = HospitalContext(0, np.random.default_rng, lambda: SeededNoise(0), exhausted)
    with pytest.raises(RuntimeError, match="exhausted"):
        algorithm.client_update(instruction, silo, {}, ctx)


def test_dopamine_refuses_a_sum_in_the_clear_or_one_that_lost_a_hospital(
    breast_cancer_silos: Callable[[int], list[Silo]],
) -> None:
    algorithm = ALGORITHMS["fedsgd_secure"]()
    assert isinstance(algorithm, FedSGDSecure) and algorithm.needs_secure_sum
    silos = breast_cancer_silos(3)
    with pytest.raises(ValueError, match="in the clear each reply carries only σ/√K"):
        simulate(
            algorithm,
            silos,
            RunPlan(rounds=1, epsilon=8.0, secure_sum=InTheClear(), progress=False),
        )

    class LosesOne:  # and ignores `at_least`, which it must not: the server half checks
        reveals_inputs = False

        def __call__(self, vectors: dict[str, torch.Tensor], *, at_least: int = 1) -> Summed:
            return plain_sum(dict(list(vectors.items())[1:]))

    with pytest.raises(ValueError, match=r"holds 2 of 3 replies.*σ√\(2/3\)"):
        simulate(
            algorithm, silos, RunPlan(rounds=1, epsilon=8.0, secure_sum=LosesOne(), progress=False)
        )


def test_a_robust_aggregator_refuses_a_sum_that_hides_the_updates(
    breast_cancer_silos: Callable[[int], list[Silo]],
) -> None:
    algorithm = ALGORITHMS["fedavg"]()
    assert isinstance(algorithm, FedAvg)
    robust = FedAvg(
        model=algorithm.model, loss=algorithm.loss, dpsgd=algorithm.dpsgd, robust=coordinate_median
    )
    silos = breast_cancer_silos(3)
    with pytest.raises(ValueError, match="needs every update in the clear"):
        simulate(robust, silos, RunPlan(rounds=1, secure_sum=IdealSecureSum(), progress=False))
    assert simulate(robust, silos, RunPlan(rounds=1, progress=False)).rounds_completed == 1


def test_participation_events_need_public_facts_only() -> None:
    """The pooled reference's event comes from declared sizes: no record is touched."""
    algorithm = ALGORITHMS["centralized"]()
    assert isinstance(algorithm, Centralized)
    cohort = [SiloInfo("a", 300), SiloInfo("b", 100)]
    event = algorithm.participation_event(cohort[0], cohort)
    expected = events.poisson_gaussian(16 / 400, 1.0, steps=round(0.2 / (16 / 400)))
    assert event.to_json() == expected.to_json()


def test_every_algorithm_is_registered_by_its_name_with_its_facts() -> None:
    assert set(BY_NAME) == {a().name for a in ALGORITHMS.values()}
    assert [n for n, k in BY_NAME.items() if k.pools_data] == ["centralized"]
    assert [n for n, k in BY_NAME.items() if k.needs_secure_sum] == ["fedsgd_secure"]
    assert [n for n, k in BY_NAME.items() if k.sets_own_noise] == ["aop"]
    assert all(k.threat_model for k in BY_NAME.values())


@pytest.mark.parametrize("name", ["fedavg", "sign", "fedsgd_secure", "aop", "mrmtl", "cyclic"])
def test_a_non_finite_model_is_refused_where_it_reaches_the_hospital_half(
    name: str,
    breast_cancer_silos: Callable[[int], list[Silo]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The simulator's server state holds ∞ in one input weight (issue 46's audit): each
    hospital half refuses it, with a clear error, before anything is computed or
    charged (it used to train, charge, and fail at the sum of NaN replies)."""
    algorithm = ALGORITHMS[name]()
    start = type(algorithm).initial_state

    def poisoned(self: Algorithm, silos: Sequence[SiloInfo], model: Any = None) -> Any:
        state = start(self, silos, model)
        weight = state["global"]["weight"].clone()
        weight[..., 3] = torch.inf
        return {**state, "global": {**state["global"], "weight": weight}}

    monkeypatch.setattr(type(algorithm), "initial_state", poisoned)
    ledger = tmp_path / "ledger.sqlite"
    with pytest.raises(ValueError, match=r"^the model sent to silo '.+' holds NaN or infinity"):
        simulate(
            algorithm,
            breast_cancer_silos(3),
            RunPlan(rounds=1, epsilon=8.0, progress=False),
            ledger=ledger,
        )
    with Ledger(ledger, create=False) as book:
        assert [book.entries(a.silo) for a in book.accounts()] == [[]] * len(book.accounts())


def test_a_correlated_training_leaves_the_stream_it_was_given(
    breast_cancer_silos: Callable[[int], list[Silo]],
) -> None:
    """A hospital keeps its state before an exchange (to train it again from there): a
    training moves on a copy of its stream, never the one it was given."""
    algorithm, silos = _algorithm("fedavg+bandmf"), breast_cancer_silos(3)
    members = _members(algorithm, silos, 1, [])
    (_, before), *_ = algorithm.client_updates(members)
    given = before[STREAMS]["model"]
    step, memory = given["step"], given["memory"].clone()
    again = dataclasses.replace(members[0], state=dict(before))
    ((_, after),) = algorithm.client_updates([again])
    assert before[STREAMS]["model"] is given
    assert given["step"] == step and torch.equal(given["memory"], memory)
    assert after[STREAMS]["model"]["step"] == 2 * step
