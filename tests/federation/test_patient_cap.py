"""A patient with many records under a declared cap (issue 46): every release of a
patient-level silo moves by at most its declared sensitivity when one patient with
m ≫ max_records records joins it, for every algorithm that takes such a silo, with a
fixed or a balanced threshold. The releases that count records (the threshold's
histograms, AOP's minimiser) read each patient's first max_records (`Silo.capped`);
DP-SGD reads them all and clips each patient's as one; the patient count moves by one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from dpfl.engines.evaluation import chosen_thresholds, released_histograms
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import simulate
from dpfl.federation.algorithms import AOP, Algorithm, DPSGDAlgorithm
from dpfl.federation.silo import Silo
from dpfl.federation.threshold import FIXED, BalancedThreshold, sensitivity
from dpfl.local.clipping import ClippedGradientSum, Params
from dpfl.local.output_perturbation import sensitivity as aop_sensitivity

from .test_golden import ALGORITHMS

K, M, PATIENTS = 3, 40, 30
CUT = BalancedThreshold(noise=5.0)
REFUSED = {"centralized", "fedsgd_secure"}  # they sample records: no patient unit


def _silo(many: int = 0) -> Silo:
    """PATIENTS patients of 1 to K records each, declared capped at K; with `many`, one
    more patient, in `many` copies of one positive record (every copy in one bin)."""
    rng = np.random.default_rng(0)
    units = np.repeat(np.arange(PATIENTS), rng.integers(1, K + 1, PATIENTS))
    x = rng.normal(size=(len(units), 30))
    y = (x[:, 0] > 0).astype(np.int64)
    if many:
        units = np.concatenate([units, np.full(many, PATIENTS)])
        x = np.vstack([x, np.repeat(x[y == 1][:1], many, axis=0)])
        y = np.concatenate([y, np.ones(many, np.int64)])
    silo = Silo.from_arrays("h", x, y, x[:20], y[:20], public_size=PATIENTS, units=units)
    return dataclasses.replace(silo, max_records=K)


def _run(algorithm: Algorithm, silo: Silo, threshold: float | BalancedThreshold) -> list[Params]:
    """One round on the silo; its model per trial."""
    result = simulate(
        algorithm, [silo], RunPlan(rounds=1, seed=3, threshold=threshold, progress=False)
    )
    return [{k: v[0] for k, v in result.silo_models[silo.name].items()}]


def _flat(params: Params) -> torch.Tensor:
    return torch.cat([v.double().flatten() for v in params.values()])


@pytest.mark.parametrize("threshold", [FIXED, CUT], ids=["fixed", "balanced"])
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_many_record_patient_moves_no_release_beyond_its_sensitivity(
    name: str, threshold: float | BalancedThreshold
) -> None:
    small, grown = _silo(), _silo(many=M)
    assert grown.unit_count - small.unit_count == 1  # a DP count of patients: sensitivity 1
    if name in REFUSED:  # before round 0 (fedsgd_secure refuses a threshold first)
        refused = ALGORITHMS[name]()
        with pytest.raises(ValueError, match=r"protects a patient|budget is spent"):
            simulate(
                refused,
                [small],
                RunPlan(rounds=1, epsilon=5.0, threshold=threshold, progress=False),
            )
        return
    models = [_run(ALGORITHMS[name](), small, threshold)]
    algorithm = ALGORITHMS[name]()
    if isinstance(threshold, BalancedThreshold):
        # the model is the one released before the histogram, the same in both worlds
        before, after = (
            released_histograms(threshold, algorithm.model, models, [s], None)[0][0]
            for s in (small, grown)
        )
        assert np.linalg.norm(after - before) <= sensitivity(small.info)
    else:  # a public threshold: nothing of the records is read
        for s in (small, grown):
            assert chosen_thresholds(threshold, algorithm.model, models, [s], None) == [[FIXED]]
    if isinstance(algorithm, AOP):  # the same seeded noise: the minimisers' distance
        moved = _flat(_run(ALGORITHMS[name](), grown, threshold)[0]) - _flat(models[0][0])
        bound = aop_sensitivity(PATIENTS, algorithm.loss, algorithm.epoch_config, K)
        assert 0 < float(moved.norm()) <= bound * (1 + 1e-5)
    else:
        assert isinstance(algorithm, DPSGDAlgorithm)
        clip = algorithm.dpsgd.clip_norm
        sums = [
            _flat(
                ClippedGradientSum(algorithm.model, algorithm.loss).grouped(
                    models[0][0], s.x, s.y, torch.as_tensor(s.units), clip
                )[0]
            )
            for s in (small, grown)
        ]
        assert float((sums[1] - sums[0]).norm()) <= clip * (1 + 1e-5)


def test_the_capped_view_keeps_each_patients_first_records() -> None:
    """`Silo.capped`: a patient's first max_records records in the silo's order, the
    other patients' untouched; a record-level or uncapped silo as it is."""
    grown = _silo(many=M)
    view = grown.capped
    assert view.units is not None and grown.units is not None
    assert np.bincount(view.units).max() == K
    assert view.size == grown.size - (M - K)
    kept = np.isin(np.arange(grown.size), np.flatnonzero(grown.units == PATIENTS)[K:], invert=True)
    assert torch.equal(view.x, grown.x[torch.as_tensor(kept)])
    assert torch.equal(view.y, grown.y[torch.as_tensor(kept)])
    assert view.public_size == grown.public_size and view.max_records == K
    sparse = dataclasses.replace(grown, x=grown.x.to_sparse())
    assert torch.equal(sparse.capped.x.to_dense(), view.x)
    record = Silo.from_arrays("r", grown.x.numpy(), grown.y.numpy(), public_size=PATIENTS)
    for whole in (record, _silo(), dataclasses.replace(grown, max_records=None), view):
        assert whole.capped is whole
