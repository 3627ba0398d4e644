"""The Kerkouche-shaped synthetic EHR matches the paper's hospital-size statistics."""

from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.sparse as sp

from dpfl.data import synthetic


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hospital_sizes_match_table_4(seed: int) -> None:
    sizes = synthetic.kerkouche_train_sizes(seed)
    assert len(sizes) == 314
    assert (sizes.min(), sizes.max()) == (804, 12_447)
    assert abs(sizes.mean() - 3_114.42) < 0.1
    assert abs(sizes.std() - 1_913.39) < 0.1
    assert abs(sizes.sum() - 977_927) < 20  # Table 3's training total


def test_small_generation_shape_labels_and_determinism() -> None:
    data = synthetic.synthetic_ehr(seed=3, n_hospitals=30, size_scale=0.1)
    assert isinstance(data.features, sp.csr_matrix)
    assert data.features.shape[1] == 24_428
    codes = data.features[:, len(synthetic.EHR_DENSE) :]
    assert np.all(codes.data == 1)
    assert 5 < codes.getnnz(axis=1).mean() < 30
    dense = data.features[:, : len(synthetic.EHR_DENSE)].toarray()
    assert dense.min() >= 0 and dense.max() <= 1
    assert np.all(dense[:, 1:4].sum(1) == 1) and np.all(dense[:, 4:8].sum(1) == 1)
    assert 0.02 < data.labels.mean() < 0.045
    for h in range(30):
        rows = data.site_ids == h
        assert abs((data.split[rows] == "test").mean() - 0.2) < 0.01
    again = synthetic.synthetic_ehr(seed=3, n_hospitals=30, size_scale=0.1)
    assert np.array_equal(again.labels, data.labels)
    assert (again.features != data.features).nnz == 0
    other = synthetic.synthetic_ehr(seed=4, n_hospitals=30, size_scale=0.1)
    assert not np.array_equal(other.labels[:1000], data.labels[:1000])


def test_hospitals_differ_in_case_mix() -> None:
    data = synthetic.synthetic_ehr(seed=0, n_hospitals=40, size_scale=0.2)
    emergency = data.features[:, synthetic.EHR_DENSE.index("admission=emergency")].toarray()[:, 0]
    share = np.array([emergency[data.site_ids == h].mean() for h in range(40)])
    assert share.std() > 0.05  # far above the ~0.01 sampling noise of ~750 records


def test_age_and_emergency_interact_in_the_true_risk() -> None:
    """Smoke check of one interaction term (age x emergency admission): in the true
    death probability, old emergency admissions are riskier than additive age and
    admission effects on the log-odds predict."""
    data = synthetic.synthetic_ehr(seed=1, n_hospitals=60, size_scale=0.3)
    old = data.features[:, 0].toarray()[:, 0] > 0.6
    column = synthetic.EHR_DENSE.index("admission=emergency")
    emergency = data.features[:, column].toarray()[:, 0] > 0
    risk = data.extra["true_risk"]
    cells = {(a, e): risk[(old == a) & (emergency == e)].mean() for a in (0, 1) for e in (0, 1)}
    log_odds = {k: np.log(v / (1 - v)) for k, v in cells.items()}
    interaction = log_odds[1, 1] - log_odds[1, 0] - log_odds[0, 1] + log_odds[0, 0]
    assert interaction > 0.15
    assert abs(data.labels.mean() - risk.mean()) < 0.005


def test_full_scale_generation_is_fast() -> None:
    start = time.perf_counter()
    data = synthetic.synthetic_ehr(seed=0)
    elapsed = time.perf_counter() - start
    assert elapsed < 120
    assert len(data.site_names) == 314
    assert 1_215_000 < len(data) < 1_230_000  # ~1.22 M admissions
    assert abs((data.split == "train").sum() - 977_927) < 20
    assert abs(data.labels[data.split == "train"].mean() - 0.0315) < 0.002
    test_sizes = np.bincount(data.site_ids[data.split == "test"])
    assert (test_sizes.min(), test_sizes.max()) == (201, 3112)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="size_scale"):
        synthetic.synthetic_ehr(seed=0, size_scale=2.0)
    with pytest.raises(ValueError, match="at least 3 hospitals"):
        synthetic.kerkouche_train_sizes(0, n_hospitals=2)
