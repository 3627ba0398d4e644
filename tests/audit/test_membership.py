"""Membership inference on the final models: an overfit non-private model gives itself
away; a heavily noised one does not."""

from __future__ import annotations

import dpfl
from dpfl.audit.membership import membership_audit

from .common import synthetic_silos

# 40 training records a silo, 200 features: logistic regression memorises them
SILOS = synthetic_silos(records=40, informative=200, unused=0)


def fedavg(config: dpfl.DPSGDConfig) -> dpfl.algorithms.FedAvg:
    return dpfl.algorithms.FedAvg(
        model=dpfl.models.logistic_regression(200),
        loss=dpfl.local.bce,
        dpsgd=config,
        expected_batch_size=8.0,
        local_epochs=5,
    )


NON_PRIVATE = dpfl.DPSGDConfig.non_private(1.0)


def test_an_overfit_non_private_model_is_caught() -> None:
    audits = membership_audit(fedavg(NON_PRIVATE), SILOS, rounds=10, trials=4)
    assert {(a.silo, a.model, a.attack) for a in audits} == {
        (s.name, "shared", attack) for s in SILOS for attack in ("loss", "lira")
    }
    for a in audits:
        assert (a.members, a.non_members, a.trials) == (40, 10, 4)
        assert a.auc > 0.65, a
        assert set(a.tpr_at_fpr) == {0.001, 0.01}
    assert min(a.auc for a in audits if a.attack == "lira") > 0.85


def test_heavy_noise_leaves_the_attacks_near_chance() -> None:
    audits = membership_audit(
        fedavg(dpfl.DPSGDConfig(clip_norm=1.0, noise_multiplier=50.0, learning_rate=1.0)),
        SILOS,
        rounds=10,
        trials=4,
    )
    for a in audits:
        assert 0.3 < a.auc < 0.7, a


def test_personalised_models_are_attacked_beside_the_shared_one() -> None:
    """MR-MTL: each silo's personal model and the shared mean both saw its records; Local's
    shared model never moves, so only the personal models are attacked."""
    options = {"model": dpfl.models.logistic_regression(200), "loss": dpfl.local.bce}
    options |= {"dpsgd": NON_PRIVATE, "expected_batch_size": 8.0, "local_epochs": 5}
    mrmtl = membership_audit(
        dpfl.algorithms.MRMTL(**options, strength=0.1), SILOS, rounds=6, trials=2, shadows=4
    )
    assert {(a.silo, a.model) for a in mrmtl} == {
        (s.name, model) for s in SILOS for model in ("shared", "personal")
    }
    personal = [a.auc for a in mrmtl if a.model == "personal" and a.attack == "lira"]
    assert min(personal) > 0.75, mrmtl  # the personal model fits its own silo's records
    local = membership_audit(dpfl.algorithms.Local(**options), SILOS, rounds=2, trials=2, shadows=4)
    assert {a.model for a in local} == {"personal"}
