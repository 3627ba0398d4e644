"""Approximate output perturbation: the sensitivity bound, measured on neighbours."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from dp_accounting import get_sigma_gaussian

from dpfl.local.dpsgd import parameters_of
from dpfl.local.losses import bce, cross_entropy, focal
from dpfl.local.noise import SeededNoise
from dpfl.local.output_perturbation import (
    AOPConfig,
    approximate_minimizer,
    capped,
    clip_rows,
    noise_std,
    output_perturbation,
    paper_noise_std,
    sensitivity,
)
from dpfl.models import logistic_regression, mlp
from dpfl.privacy import Neighbouring, events

R = 2.0


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g, dtype=torch.float64)
    return x, (x[:, 0] + torch.randn(n, generator=g, dtype=torch.float64) > 0).double()


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return float(torch.cat([(a[k] - b[k]).flatten() for k in a]).norm())


def _neighbour_distances(
    x: torch.Tensor, y: torch.Tensor, config: AOPConfig, classes: int = 2
) -> list[float]:
    """‖θ̂(D) − θ̂(D minus record i)‖ for every i, from a common start."""
    model = logistic_regression(4, classes).double()
    loss = bce if classes == 2 else cross_entropy
    init = parameters_of(model)
    n = len(y)  # the public size: removing a record does not change it
    full = approximate_minimizer(model, init, x, y, loss, config, n)
    out = []
    for i in range(len(y)):
        keep = torch.arange(len(y)) != i
        out.append(
            _distance(full, approximate_minimizer(model, init, x[keep], y[keep], loss, config, n))
        )
    return out


@pytest.mark.parametrize("tolerance", [1e-2, 1e-4])
def test_neighbouring_minimisers_differ_by_at_most_the_sensitivity(tolerance: float) -> None:
    x, y = _data(40, 0)
    x[0] = torch.tensor([-R, 0, 0, 0])  # a record far out on the wrong side: the worst one
    y[0] = 1.0
    config = AOPConfig(
        1.0, 1e-5, regularization=0.5, gradient_tolerance=tolerance, feature_norm_bound=R
    )
    distances = _neighbour_distances(x, y, config)
    assert max(distances) <= sensitivity(40, bce, config)


def test_sensitivity_holds_for_multinomial_logistic_regression() -> None:
    g = torch.Generator().manual_seed(1)
    x = 3 * torch.randn(15, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (15,), generator=g)
    config = AOPConfig(1.0, 1e-5, regularization=0.2, gradient_tolerance=1e-3, feature_norm_bound=R)
    assert max(_neighbour_distances(x, y, config, classes=3)) <= sensitivity(
        15, cross_entropy, config
    )


def test_the_bound_is_attained_within_a_factor_two() -> None:
    """D = {d} against the empty dataset, whose minimiser is 0. The minimiser of D solves
    Λθ = (y − p)(x, 1), and with Λ ≫ L² it stays where p ≈ ½, so ‖θ̂‖ ≈ ½·L/Λ: the bound,
    which allows |p − y| up to 1, is not vacuous."""
    x = torch.tensor([[R, 0.0, 0.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([0.0], dtype=torch.float64)
    lip = math.sqrt(R**2 + 1)
    config = AOPConfig(
        1.0, 1e-5, regularization=1000 * lip**2, gradient_tolerance=1e-9, feature_norm_bound=R
    )
    model = logistic_regression(4).double()
    zero = {k: torch.zeros_like(v) for k, v in parameters_of(model).items()}
    theta = approximate_minimizer(model, zero, x, y, bce, config, len(y))
    assert _distance(theta, zero) > 0.49 * sensitivity(1, bce, config)


def test_the_papers_noise_scale_does_not_cover_the_minimisers_sensitivity() -> None:
    """A*STAR's Δ = nγ/Λ goes to 0 with γ, but neighbouring minimisers do not coincide."""
    x, y = _data(40, 2)
    config = AOPConfig(1.0, 1e-5, regularization=0.5, gradient_tolerance=1e-7, feature_norm_bound=R)
    paper_delta = 40 * config.gradient_tolerance / config.regularization
    assert max(_neighbour_distances(x, y, config)) > 100 * paper_delta
    assert (
        paper_noise_std(40, config)
        < 1e-3
        * output_perturbation(
            logistic_regression(4).double(),
            parameters_of(logistic_regression(4).double()),
            (x, y),
            bce,
            config,
            40,
            SeededNoise(0),
        ).metadata["noise_std"]
    )


def test_minimiser_meets_the_gradient_condition_in_the_papers_convention() -> None:
    x, y = _data(30, 3)
    config = AOPConfig(1.0, 1e-5, regularization=2.0, gradient_tolerance=1e-5, feature_norm_bound=R)
    model = logistic_regression(4).double()
    theta = approximate_minimizer(model, parameters_of(model), x, y, bce, config, 30)
    w = theta["weight"].clone().requires_grad_()
    b = theta["bias"].clone().requires_grad_()
    xc = clip_rows(x, R)
    objective = bce(xc @ w.t() + b, y).mean() + 2.0 / (2 * 30) * (
        w.square().sum() + b.square().sum()
    )
    grads = torch.autograd.grad(objective, [w, b])
    assert math.sqrt(sum(float(g.square().sum()) for g in grads)) <= 1e-5


def test_release_adds_noise_of_the_calibrated_std_and_declares_epsilon_delta() -> None:
    x, y = _data(50, 4)
    config = AOPConfig(0.8, 1e-6, regularization=1.0, gradient_tolerance=1e-4, feature_norm_bound=R)
    model = logistic_regression(4).double()
    init = parameters_of(model)
    result = output_perturbation(model, init, (x, y), bce, config, 50, SeededNoise(3))
    expected_std = sensitivity(50, bce, config) * get_sigma_gaussian(0.8, 1e-6)
    assert result.metadata["noise_std"] == pytest.approx(expected_std, rel=1e-8)
    # the analytic Gaussian needs less noise than the paper's (1 + √(2 ln 1/δ))/ε factor
    assert expected_std < sensitivity(50, bce, config) * (1 + math.sqrt(2 * math.log(1e6))) / 0.8
    assert result.event == events.approximate_dp(0.8, 1e-6)
    minimum = approximate_minimizer(model, init, x, y, bce, config, 50)
    replay = SeededNoise(3)
    for k, v in minimum.items():
        expected = v + replay.normal(tuple(v.shape), expected_std, v.dtype)
        torch.testing.assert_close(result.params[k], expected)


def test_float32_models_get_float32_parameters_noised_before_rounding() -> None:
    x, y = _data(20, 6)
    config = AOPConfig(1.0, 1e-5, regularization=1.0, gradient_tolerance=1e-4, feature_norm_bound=R)
    model = logistic_regression(4)
    result = output_perturbation(
        model, parameters_of(model), (x, y), bce, config, 20, SeededNoise(0)
    )
    assert all(v.dtype == torch.float32 for v in result.params.values())


def test_refuses_what_the_derivation_does_not_cover() -> None:
    config = AOPConfig(1.0, 1e-5, 1.0, 1e-3, 1.0)
    x, y = _data(10, 5)
    with pytest.raises(ValueError, match="convex"):
        sensitivity(10, focal(), config)
    model = mlp(4, (3,))
    with pytest.raises(ValueError, match="logistic regression"):
        approximate_minimizer(model, parameters_of(model), x, y, bce, config, 10)  # type: ignore[arg-type]


K = 4
"""The declared cap on a patient's records (max_records) in the patient-level tests."""


def _patients(seed: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """12 patients of 1 to 2K records each (some above the cap), records in shuffled
    order; patient 0, the one removed, has 3K records far out on the wrong side."""
    g = torch.Generator().manual_seed(seed)
    counts = [3 * K, *torch.randint(1, 2 * K + 1, (11,), generator=g).tolist()]
    units = np.repeat(np.arange(12), counts)
    x = torch.randn(len(units), 4, generator=g, dtype=torch.float64)
    y = (torch.rand(len(units), generator=g, dtype=torch.float64) < 0.5).double()
    x[units == 0] = torch.tensor([-R, 0.0, 0.0, 0.0], dtype=torch.float64)
    y[torch.as_tensor(units == 0)] = 1.0
    order = torch.randperm(len(units), generator=g)
    return x[order], y[order], units[order.numpy()]


def test_a_patients_records_move_the_minimiser_by_at_most_the_capped_sensitivity() -> None:
    """D and D' differ by patient 0 (3K records, capped to K), both normalised by the
    public number of patients P = 12: θ̂ moves by at most (KL + 2Pγ)/Λ (γ = 1e-7, nearly
    the exact minimiser, and 1e-3), and by more than a record's Δ, so a record-level σ
    would not cover a patient; without the cap it moves by more than the bound."""
    moved, beyond = [], []
    for seed in range(4):
        x, y, units = _patients(seed)
        for tolerance in (1e-7, 1e-3):
            config = AOPConfig(1.0, 1e-5, 200.0, tolerance, feature_norm_bound=R)
            model = logistic_regression(4).double()
            init = parameters_of(model)
            with_, without = (
                approximate_minimizer(
                    model, init, *capped((x[keep], y[keep]), units[keep], K), bce, config, 12
                )
                for keep in (units >= 0, units != 0)
            )
            distance = _distance(with_, without)
            assert distance <= sensitivity(12, bce, config, records=K)
            moved.append(distance / sensitivity(12, bce, config))
            loose = [
                approximate_minimizer(model, init, x[keep], y[keep], bce, config, 12)
                for keep in (units >= 0, units != 0)
            ]
            beyond.append(_distance(*loose) / sensitivity(12, bce, config, records=K))
    assert max(moved) > 1 and max(beyond) > 1


def test_capped_keeps_each_patients_first_records() -> None:
    x = torch.arange(7, dtype=torch.float64)[:, None]
    units = np.array([3, 1, 3, 3, 1, 3, 2])
    xs, ys = capped((x, x[:, 0]), units, 2)
    assert xs[:, 0].tolist() == [0.0, 1.0, 2.0, 4.0, 6.0]
    assert ys.tolist() == xs[:, 0].tolist()


def test_patient_level_noise_covers_k_records_at_the_public_patient_count() -> None:
    """σ_K = (KL + 2nγ)/Λ·σ₁: K times the Lipschitz term of one record's, the same
    approximation term (n = the public number of patients, as the record count is for a
    record); the release declares the patient relation."""
    x, y, units = _patients(0)
    config = AOPConfig(1.0, 1e-5, regularization=2.0, gradient_tolerance=1e-4, feature_norm_bound=R)
    lip, multiplier = math.sqrt(R**2 + 1), get_sigma_gaussian(1.0, 1e-5)
    record, patient = (noise_std(12, bce, config, records) for records in (1, K))
    assert patient - record == pytest.approx((K - 1) * lip / 2.0 * multiplier, rel=1e-9)
    assert patient == pytest.approx((K * lip + 2 * 12 * 1e-4) / 2.0 * multiplier, rel=1e-9)
    assert record < patient <= K * record
    model = logistic_regression(4).double()
    result = output_perturbation(
        model,
        parameters_of(model),
        (x, y),
        bce,
        config,
        12,
        SeededNoise(0),
        units=units,
        max_records=K,
    )
    assert result.metadata["noise_std"] == pytest.approx(patient, rel=1e-12)
    assert result.event == events.approximate_dp(
        1.0, 1e-5, neighbouring=Neighbouring.ADD_REMOVE_PATIENT
    )
    with pytest.raises(ValueError, match=r"declared cap .*data\.max_records"):
        output_perturbation(
            model, parameters_of(model), (x, y), bce, config, 12, SeededNoise(0), units=units
        )
