"""Survival metrics of a model's outputs, by scikit-survival.

Labels are (time, event) pairs. A model has either one output, a risk score (Cox), or
one hazard logit per public time interval (`losses.logistic_hazard`), whose survival
curve S(t) = Π (1 − h_k) over the intervals completed by t gives the integrated Brier
score, and whose expected survival time (`expected_survival`) ranks the patients
(risk = its negative). Metrics:

* `c_index`: Harrell's concordance (FLamby's Fed-TCGA-BRCA metric);
* `c_index_uno`: Uno's IPCW concordance, less biased under heavy censoring;
* `td_auc`: the mean cumulative/dynamic AUROC at the cut points inside the follow-up
  (for a risk score, at the quartiles of the test set's observed event times);
* `ibs`: the integrated Brier score over those cut points (lower is better; discrete-
  time models only: a Cox risk score has no survival curve without a baseline hazard).

The censoring distribution of Uno's C, td-AUC and the IBS is estimated from the test
labels themselves (scored without noise: metrics on held-out records are outside ε).
A metric that is undefined on the given labels (no event, fewer than two cut points
inside the follow-up) is NaN, never a made-up number.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import sklearn

__all__ = [
    "SURVIVAL_METRICS",
    "expected_survival",
    "risk_scores",
    "survival_curves",
    "survival_metrics",
]

SURVIVAL_METRICS = ("c_index", "c_index_uno", "td_auc", "ibs")


def survival_curves(logits: np.ndarray, cuts: Sequence[float], times: np.ndarray) -> np.ndarray:
    """S(t) for each record (rows) at each of `times` (columns): the product of 1 − h_k
    over the intervals k that end at or before t."""
    hazards = 1.0 / (1.0 + np.exp(-np.asarray(logits, np.float64)))
    surviving = np.cumprod(1.0 - hazards[:, :-1], axis=1)  # S at each cut point
    completed = np.searchsorted(np.asarray(cuts, np.float64), times, side="right")
    with_start = np.hstack([np.ones((len(hazards), 1)), surviving])
    result: np.ndarray = with_start[:, completed]
    return result


def expected_survival(logits: np.ndarray, cuts: Sequence[float]) -> np.ndarray:
    """Each record's expected survival time under its hazards: S(t) linear within each
    closed interval (the trapezoid rule), and beyond the last cut the open interval's
    hazard repeated over intervals as wide as the last closed one (a geometric tail:
    w·S·(2 − h)/(2h)). Every interval's hazard moves it, the open one's included."""
    cuts_ = np.asarray(cuts, np.float64)
    widths = np.diff(np.concatenate([[0.0], cuts_]))
    at_cuts = survival_curves(logits, cuts, cuts_)  # S at the end of each closed interval
    starts = np.hstack([np.ones((len(at_cuts), 1)), at_cuts[:, :-1]])
    closed = (widths * (starts + at_cuts) / 2).sum(axis=1)
    last = 1.0 / (1.0 + np.exp(-np.asarray(logits, np.float64)[:, -1]))
    tail = widths[-1] * at_cuts[:, -1] * (2.0 - last) / (2.0 * np.maximum(last, 1e-300))
    result: np.ndarray = closed + tail
    return result


def risk_scores(outputs: np.ndarray, cuts: Sequence[float] | None) -> np.ndarray:
    """What the concordance ranks: a risk score itself, or hazard logits' negative
    expected survival time."""
    if outputs.shape[1] == 1:
        return np.asarray(outputs[:, 0], np.float64)
    assert cuts is not None
    return -expected_survival(outputs, cuts)


def survival_metrics(
    labels: np.ndarray, outputs: np.ndarray, cuts: Sequence[float] | None
) -> dict[str, float]:
    """`labels` (n, 2) (time, event); `outputs` (n, 1) risk scores, or (n, K) hazard
    logits over the K intervals that `cuts` (K − 1 cut points) make."""
    from sksurv.util import Surv

    labels, outputs = np.asarray(labels, np.float64), np.asarray(outputs, np.float64)
    if labels.ndim != 2 or labels.shape[1] != 2 or len(labels) == 0:
        raise ValueError(f"survival labels must be (time, event) pairs, got {labels.shape}")
    if outputs.ndim != 2 or len(outputs) != len(labels):
        raise ValueError(f"{outputs.shape} outputs for {len(labels)} labelled records")
    if not np.all(np.isfinite(outputs)):
        raise ValueError("outputs contain NaN or infinity")
    time, event = labels[:, 0], labels[:, 1].astype(bool)
    truth = Surv.from_arrays(event, time)
    curves = outputs.shape[1] > 1
    if curves and (cuts is None or len(cuts) != outputs.shape[1] - 1):
        raise ValueError(f"{outputs.shape[1]} hazard logits need {outputs.shape[1] - 1} cuts")
    risk = risk_scores(outputs, cuts)
    # td-AUC and the IBS at the cut points inside the follow-up (where they are defined);
    # a risk score has none: td-AUC at the quartiles of the observed event times
    if cuts:
        grid = np.asarray(cuts, np.float64)
    else:
        quartiles = np.quantile(time[event], (0.25, 0.5, 0.75)) if event.any() else []
        grid = np.unique(np.asarray(quartiles, np.float64))
    grid = grid[(grid >= time[event].min(initial=np.inf)) & (grid < time.max())]
    with sklearn.config_context(assume_finite=True):  # checked above; the check is slow
        return _metrics(truth, time, event, risk, outputs, cuts, grid, curves)


def _metrics(
    truth: np.ndarray,
    time: np.ndarray,
    event: np.ndarray,
    risk: np.ndarray,
    outputs: np.ndarray,
    cuts: Sequence[float] | None,
    grid: np.ndarray,
    curves: bool,
) -> dict[str, float]:
    from sksurv.metrics import (
        concordance_index_censored,
        concordance_index_ipcw,
        cumulative_dynamic_auc,
        integrated_brier_score,
    )

    return {
        "c_index": _defined(lambda: concordance_index_censored(event, time, risk)[0]),
        "c_index_uno": _defined(lambda: concordance_index_ipcw(truth, truth, risk)[0]),
        "td_auc": _defined(lambda: cumulative_dynamic_auc(truth, truth, risk, grid)[1])
        if len(grid)
        else math.nan,
        "ibs": _defined(
            lambda: integrated_brier_score(
                truth, truth, survival_curves(outputs, cuts or (), grid), grid
            )
        )
        if curves and len(grid) >= 2
        else math.nan,
    }


def _defined(metric: Callable[[], float]) -> float:
    """The metric, or NaN where scikit-survival finds it undefined on these labels (all
    censored, no comparable pair, a time outside the censoring estimate's support)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(metric())
    except (ValueError, ZeroDivisionError):
        return math.nan
