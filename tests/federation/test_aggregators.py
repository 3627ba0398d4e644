"""Aggregators: the right statistic, over any leading trial dimensions, robust where claimed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfl.federation import aggregators

torch.manual_seed(0)


def _updates(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


def test_mean_and_weighted_mean() -> None:
    updates = _updates(4, 6)
    assert torch.allclose(aggregators.mean(updates), updates.sum(0) / 4)
    sizes = torch.tensor([100.0, 300.0, 0.0, 600.0])
    expected = (0.1 * updates[0] + 0.3 * updates[1] + 0.6 * updates[3]).float()
    assert torch.allclose(aggregators.weighted_mean(updates, sizes), expected, atol=1e-6)
    with pytest.raises(ValueError, match="not all be zero"):
        aggregators.weighted_mean(updates, torch.zeros(4))
    with pytest.raises(ValueError, match="4 non-negative weights"):
        aggregators.weighted_mean(updates, torch.tensor([1.0, -1.0, 1.0, 1.0]))


def test_sign_majority_votes_coordinate_wise_and_ties_do_not_move() -> None:
    votes = torch.tensor([[1.0, 1.0, -1.0, 1.0], [1.0, -1.0, -1.0, -1.0], [-1.0, 1.0, -1.0, 1.0]])
    assert aggregators.sign_majority(votes).tolist() == [1.0, 1.0, -1.0, 1.0]
    assert aggregators.sign_majority(votes[:2]).tolist() == [1.0, 0.0, -1.0, 0.0]
    with pytest.raises(ValueError, match="±1"):
        aggregators.sign_majority(torch.tensor([[0.0, 1.0]]))


@pytest.mark.parametrize(
    "aggregate",
    [
        aggregators.mean,
        aggregators.coordinate_median,
        lambda u: aggregators.trimmed_mean(u, 0.2),
        lambda u: aggregators.norm_bounded_mean(u, 1.0),
        lambda u: aggregators.weighted_mean(u, torch.arange(1.0, 8.0)),
    ],
)
def test_trials_aggregate_like_a_loop(aggregate) -> None:  # type: ignore[no-untyped-def]
    stacked = _updates(5, 7, 11)  # 5 trials × 7 clients × 11 parameters
    looped = torch.stack([aggregate(stacked[r]) for r in range(5)])
    assert torch.allclose(aggregate(stacked), looped, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(bad=st.floats(-1e6, 1e6), column=st.integers(0, 4))
def test_one_bad_client_cannot_drag_robust_aggregates(bad: float, column: int) -> None:
    honest = _updates(9, 5)
    attacked = honest.clone()
    attacked[0, column] = bad
    low, high = honest.min(0).values, honest.max(0).values
    for aggregate in (aggregators.coordinate_median, lambda u: aggregators.trimmed_mean(u, 0.2)):
        result = aggregate(attacked)
        assert bool(((result >= low - 1e-6) & (result <= high + 1e-6)).all())
    shift = aggregators.norm_bounded_mean(attacked, 2.0) - aggregators.norm_bounded_mean(
        honest, 2.0
    )
    assert float(torch.linalg.vector_norm(shift)) <= 2 * 2.0 / 9 + 1e-6


def test_median_and_trimmed_mean_values() -> None:
    updates = torch.tensor([[1.0], [2.0], [3.0], [10.0]])
    assert aggregators.coordinate_median(updates).item() == 2.5
    assert aggregators.trimmed_mean(updates, 0.25).item() == 2.5
    assert aggregators.trimmed_mean(updates, 0.0).item() == 4.0
    with pytest.raises(ValueError, match="trim fraction"):
        aggregators.trimmed_mean(updates, 0.5)


def test_bad_updates_are_refused() -> None:
    with pytest.raises(ValueError, match="NaN or infinity"):
        aggregators.mean(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match=r"\[\.\.\., K, P\]"):
        aggregators.mean(torch.ones(3))
    with pytest.raises(ValueError, match="max_norm"):
        aggregators.norm_bounded_mean(torch.ones(2, 2), 0.0)
