"""The exponential-mechanism quantiles: their laws equal a brute-force enumeration of the
utility's definition, neighbouring datasets' densities stay within e^ε, and on real ages
they land within a year of the exact quantiles."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
from scipy.special import logsumexp
from sksurv.datasets import load_flchain

from dpfl.analytics.exponential import (
    _joint_sample_intervals,
    _joint_tables,
    _quantile_log_probabilities,
    exponential_quantile,
    joint_exponential_quantiles,
    rank_error_bound,
)

LOW, HIGH = 0.0, 5.0
TINY = [3.5, -1.0, 2.0, 2.0]
"""n = 4: a value clipped to low and a tie make two intervals of width 0."""


def _cells(x: list[float]) -> list[tuple[float, float]]:
    """Every interval between consecutive clipped order statistics, of any width."""
    edges = [LOW, *sorted(min(max(v, LOW), HIGH) for v in x), HIGH]
    return list(itertools.pairwise(edges))


def _utility(x: list[float], outputs: list[float], ps: list[float]) -> float:
    """−Σ_j |n_j − (q_j − q_{j−1})·n|, n_j the values in [o_{j−1}, o_j): by definition."""
    clipped = [min(max(v, LOW), HIGH) for v in x]
    ends, levels = [-math.inf, *outputs, math.inf], [0.0, *ps, 1.0]
    return -sum(
        abs(sum(a <= v < b for v in clipped) - (q1 - q0) * len(x))
        for a, b, q0, q1 in zip(ends, ends[1:], levels, levels[1:], strict=False)
    )


def _enumerated(x: list[float], ps: list[float], epsilon: float) -> dict[tuple[int, ...], float]:
    """The log-mass of each sorted tuple of intervals (one per quantile), from the
    definition: ∫ exp(ε·u/(2Δ)) over the sorted outputs in them, Δ = 2·(1 − min gap)."""
    gaps = np.diff([0.0, *ps, 1.0])
    exponent = epsilon / (2 * 2 * (1 - gaps.min()))
    cells, log_mass = _cells(x), {}
    for chosen in itertools.combinations_with_replacement(range(len(cells)), len(ps)):
        widths = {i: cells[i][1] - cells[i][0] for i in chosen}
        if min(widths.values()) == 0:
            continue
        log_volume = sum(
            chosen.count(i) * math.log(w) - math.lgamma(chosen.count(i) + 1)
            for i, w in widths.items()
        )
        # the t-th of c outputs in one interval at (t + 1)/(c + 1) of it, inside it
        outputs = [
            cells[i][0] + (chosen[:j].count(i) + 1) / (chosen.count(i) + 1) * widths[i]
            for j, i in enumerate(chosen)
        ]
        log_mass[chosen] = log_volume + exponent * _utility(x, outputs, ps)
    return log_mass


@pytest.mark.parametrize("p", [0.25, 0.5, 0.8])
@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_exp_probabilities_equal_the_enumeration(p: float, epsilon: float) -> None:
    cut, log_probs = _quantile_log_probabilities(TINY, p, LOW, HIGH, epsilon)
    log_mass = _enumerated(TINY, [p], epsilon)
    assert [(i,) for i in cut.ranks] == list(log_mass)
    expected = np.array(list(log_mass.values()))
    assert log_probs == pytest.approx(expected - logsumexp(expected), rel=1e-12)
    cells = _cells(TINY)
    assert list(zip(cut.lefts, cut.rights, strict=True)) == [cells[i] for i in cut.ranks]


@pytest.mark.parametrize("p", [0.3, 0.5])
def test_joint_exp_with_one_quantile_is_exp(p: float) -> None:
    joint = _joint_tables(TINY, [p], LOW, HIGH, 1.0)
    _, log_probs = _quantile_log_probabilities(TINY, p, LOW, HIGH, 1.0)
    logits = joint.last_step()[:, 0]
    assert logits - logsumexp(logits) == pytest.approx(log_probs, rel=1e-12)


@pytest.mark.parametrize(
    ("x", "ps"),
    [
        ([1.0, 2.5, 4.0], [0.3, 0.7]),
        ([1.0, 1.0, 4.0], [0.25, 0.5]),
        ([1.5, 3.0], [0.2, 0.5, 0.9]),
        # targets up to 12 values: the forward pass's windows span several blocks
        (list(np.round(np.random.default_rng(5).uniform(-0.5, 5.5, 30), 1)), [0.4, 0.6]),
        (list(np.round(np.random.default_rng(6).uniform(0, 5, 12))), [0.3, 0.5, 0.8]),
    ],
)
def test_joint_exp_law_equals_the_enumeration(x: list[float], ps: list[float]) -> None:
    """The forward pass's normaliser exactly, and the backward draws' frequencies."""
    epsilon, draws = 1.5, 20_000
    log_mass = _enumerated(x, ps, epsilon)
    joint = _joint_tables(x, ps, LOW, HIGH, epsilon)
    log_z = logsumexp(list(log_mass.values()))
    assert logsumexp(joint.last_step()) == pytest.approx(log_z, rel=1e-12)

    rng = np.random.default_rng(7)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(draws):
        drawn = tuple(int(i) for i in joint.cut.ranks[_joint_sample_intervals(joint, rng)])
        counts[drawn] = counts.get(drawn, 0) + 1
    assert set(counts) <= set(log_mass)
    for chosen, log_m in log_mass.items():
        prob = math.exp(log_m - log_z)
        sigma = math.sqrt(prob * (1 - prob) / draws)
        assert counts.get(chosen, 0) / draws == pytest.approx(prob, abs=4.5 * sigma + 1e-4)


NEIGHBOURS = [[*TINY, y] for y in (-3.0, 0.5, 2.0, 4.9, 9.0)] + [TINY[1:], TINY[:-1]]
"""TINY with one record added (below low, inside, on the tie, near high, above high) or
removed."""


def _exp_log_density(x: list[float], p: float, epsilon: float, at: np.ndarray) -> np.ndarray:
    """Exp's log-density at each output: its interval's log-probability over its width."""
    cut, log_probs = _quantile_log_probabilities(x, p, LOW, HIGH, epsilon)
    i = np.searchsorted(cut.rights, at)
    return log_probs[i] - np.log(cut.rights[i] - cut.lefts[i])


@pytest.mark.parametrize("p", [0.25, 0.5, 0.9])
@pytest.mark.parametrize("epsilon", [0.3, 1.0, 3.0])
def test_exp_density_ratio_between_neighbours_is_at_most_e_to_the_epsilon(
    p: float, epsilon: float
) -> None:
    at = np.linspace(LOW, HIGH, 2003)[1:-1]  # avoids every value and tie
    here = _exp_log_density(TINY, p, epsilon, at)
    worst = max(np.abs(here - _exp_log_density(y, p, epsilon, at)).max() for y in NEIGHBOURS)
    assert worst <= epsilon * (1 + 1e-12)


@pytest.mark.parametrize(("ps", "epsilon"), [([0.25, 0.5], 1.0), ([0.3, 0.6], 3.0)])
def test_joint_exp_density_ratio_between_neighbours_is_at_most_e_to_the_epsilon(
    ps: list[float], epsilon: float
) -> None:
    """The density at sorted outputs (o1, o2): exp(scale·u)/Z, Z from the forward pass."""
    grid = np.linspace(LOW, HIGH, 41)[1:-1] + 1e-3  # off every value
    pairs = [(a, b) for a in grid for b in grid if a <= b]

    def log_density(x: list[float]) -> np.ndarray:
        joint = _joint_tables(x, ps, LOW, HIGH, epsilon)
        u = np.array([_utility(x, list(pair), ps) for pair in pairs])
        return joint.scale * u - logsumexp(joint.last_step())

    here = log_density(TINY)
    worst = max(np.abs(here - log_density(y)).max() for y in NEIGHBOURS)
    assert worst <= epsilon * (1 + 1e-12)


@pytest.fixture(scope="module")
def ages() -> np.ndarray:
    """FLCHAIN's 7874 ages: integers from 50 to 101, hence many ties."""
    return load_flchain()[0]["age"].to_numpy()


@pytest.mark.parametrize("p", [0.25, 0.5, 0.75])
def test_exp_quantile_of_ages_is_within_a_year(ages: np.ndarray, p: float) -> None:
    exact = np.quantile(ages, p, method="inverted_cdf")
    draws = np.array(
        [
            exponential_quantile(ages, p, 0.0, 120.0, 1.0, np.random.default_rng(s))
            for s in range(200)
        ]
    )
    assert np.abs(draws - exact).mean() < 1.0  # measured 0.50 for each p


def test_joint_exp_quantiles_of_ages_are_within_a_year_and_a_half(ages: np.ndarray) -> None:
    ps = [0.1, 0.25, 0.5, 0.75, 0.9]
    exact = np.quantile(ages, ps, method="inverted_cdf")
    draws = np.array(
        [
            joint_exponential_quantiles(ages, ps, 0.0, 120.0, 1.0, np.random.default_rng(s))
            for s in range(200)
        ]
    )
    assert np.all(np.diff(draws, axis=1) >= 0)
    assert np.all((draws >= 0.0) & (draws <= 120.0))
    assert np.all(np.abs(draws - exact).mean(axis=0) < 1.5)  # measured 0.48 to 0.54


def _tail(
    x: np.ndarray | list[float], p: float, epsilon: float, bound: float, high: float
) -> float:
    """Exp's exact probability of a rank error above `bound`, from its log-probabilities."""
    cut, log_probs = _quantile_log_probabilities(x, p, LOW, high, epsilon)
    return float(np.exp(log_probs)[np.abs(cut.ranks - p * cut.n) > bound].sum())


@pytest.mark.parametrize(("p", "epsilon", "beta"), [(0.5, 1.0, 0.05), (0.25, 0.3, 0.2)])
def test_rank_error_bound_holds_with_probability_one_minus_beta(
    ages: np.ndarray, p: float, epsilon: float, beta: float
) -> None:
    """Exactly, from the log-probabilities; and informative: a small share of the ranks
    (measured: 11 and 37 of 300 uniform values, 43 and 53 of 7874 ages, whose ties of
    about 150 records put every interval of positive width ≥ 20 ranks from the median)."""
    uniform = np.random.default_rng(3).uniform(0, 1, 300)
    for x, high in [(uniform, HIGH), (ages, 120.0)]:
        bound = rank_error_bound(x, p, LOW, high, epsilon, beta)
        assert _tail(x, p, epsilon, bound, high) <= beta
        assert bound < len(x) / 5


def test_rank_error_bound_is_tight_where_the_domain_is_mostly_bad() -> None:
    """22 values in [0, 0.01] of [0, 5]: the interval up to 5 has error 11 and probability
    0.075, so no bound under 11 holds with β = 0.05; the bound is 12.2."""
    x = np.linspace(0.0, 0.01, 22)
    bound = rank_error_bound(x, 0.5, LOW, HIGH, 1.0, 0.05)
    assert _tail(x, 0.5, 1.0, bound, HIGH) <= 0.05 < _tail(x, 0.5, 1.0, 0.9 * bound, HIGH)


BAD = [
    ({"epsilon": 0.0}, "epsilon"),
    ({"epsilon": -1.0}, "epsilon"),
    ({"epsilon": math.nan}, "epsilon"),
    ({"low": 5.0, "high": 5.0}, "low < high"),
    ({"low": 0.0, "high": math.inf}, "low < high"),
    ({"x": [1.0, math.nan]}, "NaN"),
    ({"p": 0.0}, "(0, 1)"),
    ({"p": 1.0}, "(0, 1)"),
]


@pytest.mark.parametrize(("bad", "message"), BAD)
def test_bad_input_is_refused_in_one_line(bad: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"x": TINY, "p": 0.5, "low": LOW, "high": HIGH, "epsilon": 1.0}
    args.update(bad)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=re.escape(message)) as single:
        exponential_quantile(rng=rng, **args)  # type: ignore[arg-type]
    p = args.pop("p")
    with pytest.raises(ValueError, match=re.escape(message)) as joint:
        joint_exponential_quantiles(ps=[0.1, p], rng=rng, **args)  # type: ignore[arg-type, list-item]
    assert "\n" not in str(single.value) + str(joint.value)


@pytest.mark.parametrize("ps", [[], [0.5, 0.5], [0.7, 0.2]])
def test_joint_exp_refuses_levels_that_are_not_strictly_increasing(ps: list[float]) -> None:
    with pytest.raises(ValueError, match="quantile levels"):
        joint_exponential_quantiles(TINY, ps, LOW, HIGH, 1.0, np.random.default_rng(0))


def test_rank_error_bound_refuses_beta_outside_zero_one() -> None:
    with pytest.raises(ValueError, match="beta"):
        rank_error_bound(TINY, 0.5, LOW, HIGH, 1.0, 1.0)
