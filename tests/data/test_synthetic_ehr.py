"""The Kerkouche-shaped synthetic EHR matches the paper's hospital-size statistics."""

from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

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


def _lr_and_mlp_test_auroc(seed: int, min_count: int = 300) -> tuple[float, float]:
    """Test AUROC of L2 logistic regression (C chosen on a validation fifth of the
    training split, then refit on all of it) and of a small MLP (torch Adam with a small
    weight decay, one fixed recipe, no tuning) trained on the whole training split, on a
    reduced dataset restricted to the dense features and the codes seen >= `min_count`
    times in the training split."""
    data = synthetic.synthetic_ehr(seed=seed, n_hospitals=40, size_scale=0.5)
    train, test = data.split == "train", data.split == "test"
    keep = np.asarray(data.features[train].sum(axis=0)).ravel() >= min_count
    keep[: len(synthetic.EHR_DENSE)] = True
    x = data.features[:, np.flatnonzero(keep)].tocsr()
    y = data.labels
    rng = np.random.default_rng(seed)
    rows = rng.permutation(np.flatnonzero(train))
    valid, fit = rows[: len(rows) // 5], rows[len(rows) // 5 :]

    def logistic(c: float, subset: np.ndarray) -> LogisticRegression:
        return LogisticRegression(C=c, max_iter=1000).fit(x[subset], y[subset])

    best_c = max(
        (0.01, 0.03, 0.1, 0.3, 1.0),
        key=lambda c: roc_auc_score(y[valid], logistic(c, fit).decision_function(x[valid])),
    )
    lr_auroc = roc_auc_score(y[test], logistic(best_c, rows).decision_function(x[test]))

    torch.manual_seed(seed)
    inputs = torch.from_numpy(x.toarray())
    targets = torch.from_numpy(y.astype(np.float32))
    width = 64
    mlp = torch.nn.Sequential(
        torch.nn.Linear(inputs.shape[1], width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 1),
    )
    optimiser = torch.optim.Adam(mlp.parameters(), lr=2e-3, weight_decay=1e-4)
    train_rows = torch.from_numpy(np.flatnonzero(train))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for _ in range(15):
            for batch in train_rows[torch.randperm(len(train_rows))].split(1024):
                loss = torch.nn.functional.binary_cross_entropy_with_logits(
                    mlp(inputs[batch]).squeeze(1), targets[batch]
                )
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        with torch.no_grad():
            scores = mlp(inputs[torch.from_numpy(np.flatnonzero(test))]).squeeze(1).numpy()
    finally:
        torch.set_num_threads(threads)
    return lr_auroc, roc_auc_score(y[test], scores)


def test_an_mlp_beats_logistic_regression() -> None:
    """The label model's interactions (drug class x age, drug class x admission type,
    drug x drug) are out of reach of a linear model but learnable by a small MLP.

    Measured with this recipe on generator seeds 0-9: LR 0.75-0.86 (mean 0.80), MLP
    0.86-0.90 (mean 0.88), MLP - LR between +0.033 and +0.107 (seed 0: 0.794 vs 0.875);
    the 0.03 margin holds on every seed tried. Takes ~5 s on 2 cores."""
    lr_auroc, mlp_auroc = _lr_and_mlp_test_auroc(seed=0)
    assert mlp_auroc > lr_auroc + 0.03


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
