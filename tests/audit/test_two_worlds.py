"""The two-world audit: power where the ledger's ε is huge, never above the ledger at a
calibrated σ, and it catches an implementation that drops its noise in one round."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest

import dpfl
from dpfl.audit.canaries import Canary, dirac_canaries, outlier_canary
from dpfl.audit.two_worlds import two_world_audit
from dpfl.federation.algorithms import FedAvg
from dpfl.federation.algorithms.base import Algorithm, Job, Member, Outcome, received
from dpfl.federation.algorithms.fedavg import update_replies
from dpfl.federation.silo import Silo
from dpfl.local.output_perturbation import AOPConfig

from .common import calibrated, fedavg, synthetic_silos

SILOS = synthetic_silos()
DIRAC = dirac_canaries(SILOS[0], 1, 1000.0)[0]
CONFIG = dpfl.DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=1.0)
COMMON = {"model": dpfl.models.logistic_regression(12), "loss": dpfl.local.bce, "dpsgd": CONFIG}


def test_power_at_sigma_one_tenth() -> None:
    # one full-batch step (q = 1) at σ = 0.1: the ledger says ε ≈ 96
    audit = two_world_audit(
        fedavg(0.1, expected_batch_size=100.0), SILOS, DIRAC, rounds=1, trials=1600
    )
    assert audit.epsilon_ledger == pytest.approx(96.09, abs=0.01)
    assert audit.epsilon_lower >= 5


ALGORITHMS: dict[str, tuple[Callable[[], Algorithm], int, Callable[[Silo], Canary]]] = {
    "fedavg": (lambda: FedAvg(**COMMON, expected_batch_size=50.0), 2, lambda s: DIRAC),
    "cyclic": (
        lambda: dpfl.algorithms.Cyclic(**COMMON, expected_batch_size=50.0, steps_per_visit=2),
        2,
        lambda s: DIRAC,
    ),
    "sign": (
        lambda: dpfl.algorithms.Sign(**COMMON, expected_batch_size=50.0, server_learning_rate=0.05),
        2,
        lambda s: DIRAC,
    ),
    "fedsgd_secure": (
        lambda: dpfl.algorithms.FedSGDSecure(**COMMON, expected_batch_size=50.0),
        4,
        lambda s: DIRAC,
    ),
    "centralized": (  # CDP: plain DP-SGD on the pooled records, 2 steps a round at q = 0.5
        lambda: dpfl.algorithms.Centralized(**COMMON, expected_batch_size=150.0),
        2,
        lambda s: DIRAC,
    ),
    "aop": (
        lambda: dpfl.algorithms.AOP(
            model=dpfl.models.logistic_regression(12),
            loss=dpfl.local.bce,
            config=AOPConfig(1.0, 1e-5, 1.0, 1e-3, 1.0),
            epochs=1,
        ),
        1,
        outlier_canary,
    ),
}


@pytest.mark.parametrize("name", ALGORITHMS)
def test_never_above_the_ledger_at_a_calibrated_sigma(name: str) -> None:
    # every plan is 4 Poisson steps at q = 0.5 (AOP: one (1, 1e-5) release); with 100
    # trials per world deciding, a bound up to 3.3 (AOP, 20: 1.6) could show an excess
    make, rounds, canary = ALGORITHMS[name]
    algorithm = calibrated(make(), SILOS, rounds, epsilon=1.0)
    silos, trials = (SILOS[:2], 40) if name == "aop" else (SILOS, 200)  # AOP minimises: slow
    audit = two_world_audit(
        algorithm, silos, canary(silos[0]), rounds=rounds, trials=trials, epsilon_budget=1.0
    )
    assert audit.epsilon_ledger <= 1.0
    assert not audit.exceeds_ledger, audit  # an excess is a bug to report


@dataclasses.dataclass(frozen=True)
class NoiselessFirstRound(FedAvg):
    """A broken FedAvg: round 0 trains without noise but charges the noisy event (with
    one step a round, noise dropped on one step)."""

    def client_updates(self, members: Sequence[Member]) -> list[Outcome]:
        if members[0].ctx.round:
            return super().client_updates(members)
        quiet = dataclasses.replace(self.dpsgd, noise_multiplier=0.0)
        trained = self.train([Job(received(m), m) for m in members], config=quiet)
        for m in members:
            m.ctx.charge(self.training_event(m.silo.info))
        replies = update_replies(members, [t.params for t in trained], self.weighting)
        return [(reply, m.state) for reply, m in zip(replies, members, strict=True)]


def test_catches_noise_dropped_on_one_step() -> None:
    # one step a round (half an epoch at q = 0.5), four rounds: the noiseless step is
    # round 0's, and the server sees its reply
    rounds = 4
    honest = FedAvg(**COMMON, expected_batch_size=50.0, local_epochs=0.5)
    honest = calibrated(honest, SILOS, rounds, epsilon=1.0)
    broken = NoiselessFirstRound(
        **{f.name: getattr(honest, f.name) for f in dataclasses.fields(honest)}
    )
    audits = [two_world_audit(a, SILOS, DIRAC, rounds=rounds, trials=300) for a in (honest, broken)]
    assert [a.epsilon_ledger for a in audits] == [audits[0].epsilon_ledger] * 2  # same charges
    assert audits[0].epsilon_ledger <= 1.0
    assert not audits[0].exceeds_ledger, audits[0]
    assert audits[1].exceeds_ledger, audits[1]
    assert audits[1].statistic.startswith("round 0, exchange 0")


def test_tight_enough_to_matter() -> None:
    # one full-batch step at the σ of ε = 4: the audit reaches a good part of the ledger's ε
    algorithm = calibrated(fedavg(1.0, expected_batch_size=100.0), SILOS, 1, epsilon=4.0)
    audit = two_world_audit(algorithm, SILOS, DIRAC, rounds=1, trials=1000)
    assert 0.5 < audit.epsilon_lower <= audit.epsilon_ledger <= 4.0


def test_another_hospitals_view_of_dopamine() -> None:
    # hospital silo-1 subtracts its own reply from the mean it receives: its ledger view
    # ("hospitals", noise σ√(2/3)) is what the audit is set against
    dopamine = dpfl.algorithms.FedSGDSecure(**COMMON, expected_batch_size=100.0)
    weak = two_world_audit(
        dopamine.with_noise(0.1),
        SILOS,
        DIRAC,
        rounds=1,
        trials=300,
        observer="silo-1",
        epsilon_budget=1000.0,
    )
    assert weak.observer == "silo-1"
    assert 2 < weak.epsilon_lower <= weak.epsilon_ledger
    calibrated_sigma = calibrated(dopamine, SILOS, 1, epsilon=1.0)
    strong = two_world_audit(
        calibrated_sigma,
        SILOS,
        DIRAC,
        rounds=1,
        trials=200,
        observer="silo-1",
        epsilon_budget=1.0,
    )
    assert strong.epsilon_ledger > 1.0  # the hospitals' view is weaker than the server's
    assert not strong.exceeds_ledger, strong
    with pytest.raises(ValueError, match="accounts no view of another hospital"):
        two_world_audit(fedavg(1.0), SILOS, DIRAC, rounds=1, trials=4, observer="silo-1")
