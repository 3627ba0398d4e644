"""Metrics equal scikit-learn's on known cases; undefined ones are NaN, not invented."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpfl.federation.metrics import classification_metrics


def test_binary_metrics_on_a_known_case() -> None:
    labels = np.array([0, 0, 0, 1, 1, 1, 1, 0])
    p = np.array([0.1, 0.4, 0.6, 0.7, 0.9, 0.3, 0.8, 0.2])
    m = classification_metrics(labels, p)
    assert m["accuracy"] == pytest.approx(6 / 8)
    assert m["precision"] == pytest.approx(3 / 4)
    assert m["recall"] == pytest.approx(3 / 4)
    assert m["balanced_accuracy"] == pytest.approx(0.75)
    assert m["auroc"] == pytest.approx(14 / 16)  # 14 of 16 positive-negative pairs ordered
    loss = -np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p))
    assert m["loss"] == pytest.approx(loss)


def test_perfect_scores() -> None:
    m = classification_metrics(np.array([0, 1, 0, 1]), np.array([0.01, 0.99, 0.02, 0.98]))
    for name in ("accuracy", "balanced_accuracy", "auroc", "auprc", "precision", "recall"):
        assert m[name] == 1.0


def test_ranking_metrics_are_nan_with_one_class_present() -> None:
    m = classification_metrics(np.array([1, 1, 1]), np.array([0.2, 0.9, 0.6]))
    assert math.isnan(m["auroc"]) and math.isnan(m["auprc"])
    assert m["accuracy"] == pytest.approx(2 / 3)


def test_multiclass_metrics() -> None:
    labels = np.array([0, 1, 2, 2, 1, 0])
    p = np.array(
        [
            [0.8, 0.1, 0.1],
            [0.2, 0.7, 0.1],
            [0.1, 0.2, 0.7],
            [0.3, 0.4, 0.3],
            [0.1, 0.8, 0.1],
            [0.6, 0.3, 0.1],
        ]
    )
    m = classification_metrics(labels, p)
    assert m["accuracy"] == pytest.approx(5 / 6)
    assert m["balanced_accuracy"] == pytest.approx((1 + 1 + 0.5) / 3)
    assert 0.9 < m["auroc"] <= 1.0


@pytest.mark.parametrize(
    ("labels", "scores", "message"),
    [
        (np.array([0, 1]), np.array([0.5]), "1 scores for 2 labels"),
        (np.array([0, 1]), np.array([0.5, np.nan]), "NaN"),
        (np.array([0, 1]), np.array([0.5, 1.5]), "probabilities in"),
        (np.array([], dtype=int), np.array([]), "non-empty"),
        (np.array([0, 1]), np.array([[0.5, 0.2], [0.5, 0.5]]), "summing to 1"),
    ],
)
def test_bad_inputs(labels: np.ndarray, scores: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        classification_metrics(labels, scores)
