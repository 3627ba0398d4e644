"""Survival losses: the logistic hazard's likelihood and gradient, and Cox's partial
likelihood, against independent computations; Cox refused wherever DP would be claimed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sksurv.linear_model import CoxPHSurvivalAnalysis
from sksurv.util import Surv

from dpfl.data.sampling import PoissonSampler
from dpfl.local import losses
from dpfl.local.clipping import ClippedGradientSum
from dpfl.local.dpsgd import DPSGD, DPSGDConfig

CUTS = (10.0, 20.0, 40.0)


def exponential_survival(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features, (time, event) labels with hazard exp(x·β), administrative censoring at
    a uniform time, and the true β."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    beta = np.linspace(1.0, -1.0, d)
    time = rng.exponential(20.0 / np.exp(x @ beta))
    censor = rng.uniform(5, 60, size=n)
    labels = np.column_stack([np.minimum(time, censor), (time <= censor).astype(float)])
    return x.astype(np.float32), labels.astype(np.float32), beta


def test_the_logistic_hazard_is_the_discrete_time_likelihood_written_out() -> None:
    loss = losses.logistic_hazard(CUTS)
    torch.manual_seed(0)
    logits = torch.randn(5, 4, dtype=torch.float64)
    # times in intervals 0, 1, 2, 3 (open-ended) and on a cut point (interval 2)
    target = torch.tensor(
        [[5.0, 1], [15.0, 0], [30.0, 1], [99.0, 0], [20.0, 1]], dtype=torch.float64
    )
    h = torch.sigmoid(logits)
    expected = torch.stack(
        [
            -torch.log(h[0, 0]),
            -torch.log(1 - h[1, 0]),  # censored in interval 1: survived interval 0 only
            -(torch.log(1 - h[2, :2]).sum() + torch.log(h[2, 2])),
            -torch.log(1 - h[3, :3]).sum(),
            -(torch.log(1 - h[4, :2]).sum() + torch.log(h[4, 2])),
        ]
    )
    assert torch.allclose(loss(logits, target), expected)


def test_the_logistic_hazards_closed_form_gradient_is_autograds() -> None:
    loss = losses.logistic_hazard(CUTS)
    _, labels, _ = exponential_survival(50, 3, seed=1)
    logits = torch.randn(50, 4, requires_grad=True)
    target = torch.as_tensor(labels)
    loss(logits, target).sum().backward()
    closed = losses.output_gradient(loss)
    assert closed is not None and losses.time_cuts(loss) == CUTS
    assert torch.allclose(closed(logits.detach(), target), logits.grad, atol=1e-6)


def test_the_logistic_hazard_refuses_cuts_and_shapes_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="increasing cut points"):
        losses.logistic_hazard([10.0, 5.0])
    with pytest.raises(ValueError, match="increasing cut points"):
        losses.logistic_hazard([0.0, 5.0])
    with pytest.raises(ValueError, match="4 intervals needs that many logits"):
        losses.logistic_hazard(CUTS)(torch.zeros(3, 2), torch.ones(3, 2))


def test_a_patients_logistic_hazard_gradient_is_clipped_on_its_own() -> None:
    """A sum over patients: the clipped sum of a batch equals the sum of each patient's
    clipped gradient computed alone, so one patient moves it by at most C."""
    loss = losses.logistic_hazard(CUTS)
    x, labels, _ = exponential_survival(12, 3, seed=2)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    params = {k: v.detach() for k, v in model.named_parameters()}
    clipped = ClippedGradientSum(model, loss)
    xs, ys = torch.as_tensor(x), torch.as_tensor(labels)
    together, _ = clipped(params, xs, ys, torch.ones(12), 0.1)
    alone = [
        clipped(params, xs[i : i + 1], ys[i : i + 1], torch.ones(1), 0.1)[0] for i in range(12)
    ]
    for name in params:
        assert torch.allclose(together[name], sum(a[name] for a in alone), atol=1e-6)
    # without patient 0 the sum moves by at most C
    rest, _ = clipped(params, xs[1:], ys[1:], torch.ones(11), 0.1)
    moved = torch.sqrt(sum(((together[k] - rest[k]) ** 2).sum() for k in params))
    assert float(moved) <= 0.1 + 1e-6


def test_the_cox_loss_is_the_negative_log_partial_likelihood() -> None:
    rng = np.random.default_rng(3)
    risk = rng.normal(size=8)
    time = np.array([5.0, 3, 3, 9, 1, 7, 7, 2])
    event = np.array([1.0, 1, 0, 1, 0, 1, 1, 0])
    expected = [
        event[i]
        * (math.log(sum(math.exp(risk[j]) for j in range(8) if time[j] >= time[i])) - risk[i])
        for i in range(8)
    ]
    got = losses.cox(torch.tensor(risk).unsqueeze(-1), torch.tensor(np.column_stack([time, event])))
    assert np.allclose(got.numpy(), expected)
    # padding (mask 0) neither scores nor enters anyone's risk set
    mask = torch.tensor([1.0] * 6 + [0, 0])
    padded = losses.cox(
        torch.tensor(risk).unsqueeze(-1), torch.tensor(np.column_stack([time, event])), mask
    )
    alone = losses.cox(
        torch.tensor(risk[:6]).unsqueeze(-1), torch.tensor(np.column_stack([time, event])[:6])
    )
    assert torch.allclose(padded[:6], alone) and torch.all(padded[6:] == 0)


def test_a_cox_model_trained_by_dpfl_finds_scikit_survivals_coefficients() -> None:
    """Full-batch gradient descent on dpfl's Cox loss (the non-private path, through the
    batch gradient) converges to scikit-survival's Breslow partial-likelihood fit."""
    x, labels, _ = exponential_survival(300, 3, seed=4)
    reference = CoxPHSurvivalAnalysis(ties="breslow").fit(
        x.astype(np.float64), Surv.from_arrays(labels[:, 1].astype(bool), labels[:, 0])
    )
    model = torch.nn.Linear(3, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    trainer = DPSGD(model, losses.cox, DPSGDConfig.non_private(learning_rate=2.0))
    # every record in every batch
    sampler = PoissonSampler(300, 1.0, np.random.default_rng(0), public_size=300)
    result = trainer.run(
        {"weight": model.weight.detach().clone()},
        (torch.as_tensor(x), torch.as_tensor(labels)),
        sampler,
        steps=400,
    )
    assert np.allclose(result.params["weight"].numpy()[0], reference.coef_, atol=2e-3)


def test_cox_is_refused_where_each_patients_gradient_would_be_clipped() -> None:
    x, labels, _ = exponential_survival(20, 3, seed=5)
    clipped = ClippedGradientSum(torch.nn.Linear(3, 1), losses.cox)
    params = {k: v.detach() for k, v in torch.nn.Linear(3, 1).named_parameters()}
    with pytest.raises(ValueError, match="cannot be trained with DP"):
        clipped(params, torch.as_tensor(x), torch.as_tensor(labels), torch.ones(20), 1.0)
    assert losses.couples_examples(losses.cox)
    assert not losses.couples_examples(losses.logistic_hazard(CUTS))
