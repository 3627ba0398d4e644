"""Classification metrics of a model's scores, by scikit-learn.

Binary tasks take one score per record (a probability: the ranking metrics only need
the order; thresholded metrics predict the positive class from a threshold on, 0.5
unless one was chosen, see `dpfl.federation.threshold`). Multi-class tasks
take a [n, C] matrix of probabilities; AUROC/AUPRC are then one-vs-rest macro averages.
A metric that is undefined on the given labels (AUROC with one class present) is NaN,
never a made-up number.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import sklearn
from sklearn import metrics as skm


def classification_metrics(
    labels: np.ndarray, probabilities: np.ndarray, threshold: float | np.ndarray = 0.5
) -> dict[str, float]:
    """accuracy, balanced_accuracy, auroc, auprc, precision, recall and log loss.
    `threshold`: binary tasks only; one for all records, or one per record (records
    scored by models with thresholds of their own)."""
    labels = np.asarray(labels)
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if labels.ndim != 1 or len(labels) == 0:
        raise ValueError(f"labels must be a non-empty 1-D array, got shape {labels.shape}")
    if len(probabilities) != len(labels):
        raise ValueError(f"{len(probabilities)} scores for {len(labels)} labels")
    if not np.all(np.isfinite(probabilities)):
        raise ValueError("scores contain NaN or infinity")
    # the inputs are checked above; scikit-learn's own validation of each call's
    # parameters costs more than the metrics on test sets of this size
    with sklearn.config_context(skip_parameter_validation=True):
        if probabilities.ndim == 1:
            return _binary(labels, probabilities, threshold)
        if np.any(np.asarray(threshold) != 0.5):
            raise ValueError("a decision threshold is for binary tasks; these scores have classes")
        return _multiclass(labels, probabilities)


def _binary(labels: np.ndarray, p: np.ndarray, threshold: float | np.ndarray) -> dict[str, float]:
    if np.any((p < 0) | (p > 1)):
        raise ValueError("binary scores must be probabilities in [0, 1]")
    if np.ndim(threshold) and np.shape(threshold) != p.shape:
        raise ValueError(f"{np.size(threshold)} thresholds for {len(p)} scores")
    predicted = (p >= threshold).astype(int)
    both = len(np.unique(labels)) == 2
    return {
        "accuracy": float(skm.accuracy_score(labels, predicted)),
        "balanced_accuracy": balanced_accuracy(labels, predicted),
        "auroc": float(skm.roc_auc_score(labels, p)) if both else math.nan,
        "auprc": float(skm.average_precision_score(labels, p)) if both else math.nan,
        "precision": float(skm.precision_score(labels, predicted, zero_division=0)),
        "recall": float(skm.recall_score(labels, predicted, zero_division=0)),
        "loss": float(skm.log_loss(labels, p, labels=[0, 1])),
    }


def _multiclass(labels: np.ndarray, p: np.ndarray) -> dict[str, float]:
    classes = np.arange(p.shape[1])
    if not np.allclose(p.sum(axis=1), 1.0, atol=1e-4):
        raise ValueError("multi-class scores must be probabilities summing to 1 per record")
    predicted = p.argmax(axis=1)
    present = np.unique(labels)
    all_present = len(present) == len(classes)
    onehot = labels[:, None] == classes[None, :]
    return {
        "accuracy": float(skm.accuracy_score(labels, predicted)),
        "balanced_accuracy": balanced_accuracy(labels, predicted),
        "auroc": (
            float(skm.roc_auc_score(labels, p, multi_class="ovr", labels=classes))
            if all_present
            else math.nan
        ),
        "auprc": float(skm.average_precision_score(onehot, p)) if all_present else math.nan,
        "precision": float(
            skm.precision_score(labels, predicted, average="macro", zero_division=0)
        ),
        "recall": float(skm.recall_score(labels, predicted, average="macro", zero_division=0)),
        "loss": float(skm.log_loss(labels, p, labels=classes)),
    }


def balanced_accuracy(labels: np.ndarray, predicted: np.ndarray) -> float:
    """Mean recall over the classes present in `labels` (a silo's test set may lack one;
    scikit-learn then warns about classes it cannot score, which is expected)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="y_pred contains classes not in y_true")
        warnings.filterwarnings("ignore", message="A single label was found")
        return float(skm.balanced_accuracy_score(labels, predicted))
