"""Federated statistics under DP: counts, histograms, means, quantiles and Kaplan–Meier
curves of the hospitals' records, each charged to every hospital's ledger before release
and summed across hospitals by the study's secure sum (docs/analytics.md).

Each statistic is a `Query`: a hospital's half (`Query.vector`) is a pure function of its
own records, a vector of sums whose L2 sensitivity to one unit (a record, or a patient of
at most `max_records` records) is declared; the hospital adds Gaussian noise of std
σ·Δ to it (`release`), after its ledger has recorded the event; the server sees the
sum of the noisy vectors only (`pooled`) and post-processes it (`Query.figures`), every
figure with the standard deviation of its noise beside it.
"""

from dpfl.analytics.exponential import (
    ExponentialQuantiles,
    exponential_quantile,
    joint_exponential_quantiles,
)
from dpfl.analytics.mechanisms import (
    COHORT,
    POPULATION,
    Z95,
    Count,
    Figure,
    Histogram,
    LocalQuery,
    Mean,
    Quantiles,
    Query,
    Records,
    Released,
    bounded,
    describe,
    event_of,
    figures_of,
    group,
    is_local,
    neighbouring_of,
    plan_event,
    plan_refusal,
    pooled,
    release,
    released,
    vectors,
)
from dpfl.analytics.survival import KaplanMeier, SurvivalComparison, curve, survival_counts
from dpfl.analytics.table_one import Continuous, TableOne

__all__ = [
    "COHORT",
    "POPULATION",
    "Z95",
    "Continuous",
    "Count",
    "ExponentialQuantiles",
    "Figure",
    "Histogram",
    "KaplanMeier",
    "LocalQuery",
    "Mean",
    "Quantiles",
    "Query",
    "Records",
    "Released",
    "SurvivalComparison",
    "TableOne",
    "bounded",
    "curve",
    "describe",
    "event_of",
    "exponential_quantile",
    "figures_of",
    "group",
    "is_local",
    "joint_exponential_quantiles",
    "neighbouring_of",
    "plan_event",
    "plan_refusal",
    "pooled",
    "release",
    "released",
    "survival_counts",
    "vectors",
]
