r"""Approximate output perturbation (A*STAR, Algorithm 2), with a sensitivity that holds.

A*STAR minimise a regularised logistic loss without noise until the gradient norm is at
most γ, then add N(0, σ²I) with σ = (nγ/Λ)(1 + √(2 ln(1/δ)))/ε. That σ is the last step
of Iyengar et al. 2019's Approximate Minima Perturbation (AMP, Alg. 1): there the exact
minimiser θ* is already private, because AMP perturbs the *objective* with a random
linear term b₁ (budget ε₁ + ε₂, δ₁), and the output noise only has to hide the distance
nγ/Λ between the approximate and the exact minimiser. A*STAR dropped b₁, so nothing
hides θ* itself, and with γ → 0 their σ → 0 while the minimisers of neighbouring
datasets still differ. dpfl keeps their algorithm but calibrates σ to the whole
sensitivity, derived below; `paper_noise_std` gives their σ for comparison.

Derivation (add/remove-one neighbours, dpfl's default). The record count is private
under add/remove, so the objective is normalised by the silo's *public* size n (declared,
or a DP count), which neighbouring datasets share; the true count never shapes σ.

Objective, in Iyengar et al.'s convention (the regulariser is divided by n, which the
n in nγ/Λ depends on):

    J_D(θ) = (1/n) [Σ_i ℓ(θ; d_i) + (Λ/2) ‖θ‖²],    stop when ‖∇J_D(θ̂)‖ ≤ γ.

Let F_D = n·J_D = Σ_i ℓ(θ; d_i) + (Λ/2)‖θ‖², which is Λ-strongly convex, and let every
ℓ(·; d) be convex and L-Lipschitz.

1. Approximation: strong convexity gives ‖∇F_D(θ)‖ ≥ Λ‖θ − θ*_D‖, and
   ‖∇F_D(θ̂)‖ = n‖∇J_D(θ̂)‖ ≤ nγ, so ‖θ̂_D − θ*_D‖ ≤ nγ/Λ.  (A*STAR's term.)
2. Exact minimisers: for D' = D ∪ {d}, F_D' = F_D + ℓ(·; d). Strong convexity of F_D
   and ∇F_D(θ*_D) = 0, ∇F_D(θ*_D') = −∇ℓ(θ*_D'; d) give
   Λ‖θ*_D' − θ*_D‖² ≤ ⟨∇F_D(θ*_D') − ∇F_D(θ*_D), θ*_D' − θ*_D⟩ ≤ L‖θ*_D' − θ*_D‖,
   so ‖θ*_D' − θ*_D‖ ≤ L/Λ.  (The term A*STAR leave out; AMP's b₁ covers it.)
3. Triangle inequality, both neighbours normalised by the same public n:
   Δ = ‖θ̂_D − θ̂_D'‖ ≤ (L + 2nγ) / Λ.
4. Gaussian mechanism: σ = Δ·σ₁(ε, δ), σ₁ the noise multiplier of the analytic
   Gaussian mechanism (Balle & Wang 2018), exactly (ε, δ)-DP for every ε. A*STAR's
   factor (1 + √(2 ln 1/δ))/ε is larger, and valid only for ε ≤ 2(1 + √(2 ln 1/δ)).

Patient-level (add/remove one patient with all their records). Each patient keeps their
first k = max_records records (`dpfl.data.dataset.first_records`, the contribution bounding of
dpfl's statistics: a rule over the patient's own records, blind to every other patient),
so D' = D ∪ {d_1, …, d_m} with m ≤ k. Then F_D' = F_D + Σ_j ℓ(·; d_j), whose added part
is mL-Lipschitz, and step 2 gives ‖θ*_D' − θ*_D‖ ≤ kL/Λ; step 1 is unchanged, so

    Δ_k = (kL + 2nγ)/Λ ≤ k·Δ,

tighter than k single-record steps by the triangle inequality (each of which would pay
the approximation 2nγ/Λ again). n is the public number of patients P (declared, or a DP
count of patients): the proof needs the same n for D and D' (it fixes the stopping rule
‖∇F‖ ≤ nγ; θ* does not depend on n), so n must be public, and the record count, up to
kP, is private. The objective is the sum of the kept records' losses over n: not a mean
of records, and it need not be one.

For logistic regression on rows clipped to ‖x‖ ≤ R (a per-record map, free of privacy
cost), the gradient of ℓ with respect to (W, b) is (p − y) ⊗ (x, 1), so L = √(R² + 1)
for binary BCE (|p − y| ≤ 1) and √2·√(R² + 1) for multinomial CE (‖p − e_y‖ ≤ √2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dpfl.data.dataset import first_records
from dpfl.local.clipping import Params
from dpfl.local.losses import Loss, bce, cross_entropy
from dpfl.local.noise import NoiseSource, SecureNoise
from dpfl.privacy import Neighbouring, events, gaussian_noise_multiplier

__all__ = [
    "AOPConfig",
    "AOPResult",
    "ConvergenceError",
    "approximate_minimizer",
    "capped",
    "output_perturbation",
    "paper_noise_std",
]

_LIPSCHITZ_PER_UNIT_NORM = {bce: 1.0, cross_entropy: math.sqrt(2.0)}


class ConvergenceError(RuntimeError):
    """‖∇J‖ ≤ γ was not reached; releasing the iterate would void the sensitivity bound."""


@dataclass(frozen=True)
class AOPConfig:
    """(ε, δ) of one release, Λ, the gradient bound γ and the feature-norm bound R."""

    epsilon: float
    delta: float
    regularization: float
    gradient_tolerance: float
    feature_norm_bound: float
    max_rounds: int = 200

    def __post_init__(self) -> None:
        if not (self.epsilon > 0 and 0 < self.delta < 1):
            raise ValueError(f"need ε > 0 and 0 < δ < 1, got {self.epsilon}, {self.delta}")
        if min(self.regularization, self.gradient_tolerance, self.feature_norm_bound) <= 0:
            raise ValueError("Λ, γ and R must be positive")


@dataclass(frozen=True)
class AOPResult:
    """The perturbed parameters and the (ε, δ) event to record in the silo's ledger."""

    params: Params
    event: events.PrivacyEvent
    metadata: dict[str, Any]


def lipschitz(loss: Loss, feature_norm_bound: float) -> float:
    """L of the per-record loss over (W, b) when ‖x‖ ≤ R; only convex logistic losses."""
    if loss not in _LIPSCHITZ_PER_UNIT_NORM:
        raise ValueError("output perturbation needs a convex Lipschitz loss: bce or cross_entropy")
    return _LIPSCHITZ_PER_UNIT_NORM[loss] * math.sqrt(feature_norm_bound**2 + 1.0)


def sensitivity(n: int, loss: Loss, config: AOPConfig, records: int = 1) -> float:
    """Δ_k = (kL + 2nγ)/Λ, n the public size: how far θ̂ can move when one unit of at most
    k = `records` records (a record, or a patient's capped records) is added or removed."""
    lip = lipschitz(loss, config.feature_norm_bound)
    return (records * lip + 2 * n * config.gradient_tolerance) / config.regularization


def noise_std(n: int, loss: Loss, config: AOPConfig, records: int = 1) -> float:
    """σ that makes θ̂ + N(0, σ²I) (ε, δ)-DP for units of at most `records` records
    (step 4 of the derivation)."""
    multiplier = gaussian_noise_multiplier(config.epsilon, config.delta)
    return sensitivity(n, loss, config, records) * multiplier


def paper_noise_std(n: int, config: AOPConfig) -> float:
    """A*STAR's σ = (nγ/Λ)(1 + √(2 ln 1/δ))/ε, which omits the L/Λ of the minimiser."""
    factor = (1.0 + math.sqrt(2.0 * math.log(1.0 / config.delta))) / config.epsilon
    return n * config.gradient_tolerance / config.regularization * factor


def clip_rows(x: Tensor, bound: float) -> Tensor:
    """Scale each record to ‖x‖ ≤ R: a per-record map, so it costs no privacy."""
    norms = x.norm(dim=1, keepdim=True)
    return x * torch.clamp(bound / (norms + 1e-12), max=1.0)


def capped(
    data: tuple[Tensor, Tensor], units: np.ndarray, max_records: int
) -> tuple[Tensor, Tensor]:
    """Each patient's first `max_records` records (`units`: each record's patient), by the
    statistics' contribution bounding: a patient then moves θ* by at most that many
    records' L/Λ."""
    x, y = data
    keep = torch.as_tensor(first_records(np.asarray(units), max_records))
    return x[keep], y[keep]


def approximate_minimizer(
    model: nn.Linear,
    init: Params,
    x: Tensor,
    y: Tensor,
    loss: Loss,
    config: AOPConfig,
    public_size: int,
) -> Params:
    """θ̂ with ‖∇J_D(θ̂)‖ ≤ γ (J normalised by the public size n), by L-BFGS, in float64
    (the precision the condition was checked in). Not private: never release it as is."""
    if not isinstance(model, nn.Linear) or model.bias is None:
        raise ValueError("output perturbation is implemented for logistic regression (nn.Linear)")
    if public_size < 1:
        raise ValueError(f"public size must be positive, got {public_size}")
    x = clip_rows(x.double(), config.feature_norm_bound)
    n = public_size
    k, d = model.weight.shape
    theta = torch.cat([init["weight"].double().flatten(), init["bias"].double()]).requires_grad_()

    def objective() -> Tensor:
        weight, bias = theta[: k * d].view(k, d), theta[k * d :]
        total = loss(x @ weight.t() + bias, y).sum()
        return (total + config.regularization / 2 * theta.square().sum()) / n

    optimizer = torch.optim.LBFGS(
        [theta],
        max_iter=50,
        tolerance_grad=0.0,
        tolerance_change=0.0,
        line_search_fn="strong_wolfe",
    )

    def closure() -> Tensor:
        value = objective()
        (theta.grad,) = torch.autograd.grad(value, theta)
        return value.detach()

    for _ in range(config.max_rounds):
        (gradient,) = torch.autograd.grad(objective(), theta)
        if float(gradient.norm()) <= config.gradient_tolerance:
            out = theta.detach()
            return {"weight": out[: k * d].view(k, d), "bias": out[k * d :]}
        optimizer.step(closure)  # type: ignore[no-untyped-call]
    raise ConvergenceError(
        f"‖∇J‖ = {float(gradient.norm()):.3g} > γ = {config.gradient_tolerance} after "
        f"{config.max_rounds} L-BFGS rounds; raise γ or max_rounds"
    )


def output_perturbation(
    model: nn.Linear,
    init: Params,
    data: tuple[Tensor, Tensor],
    loss: Loss,
    config: AOPConfig,
    public_size: int,
    noise: NoiseSource | None = None,
    *,
    units: np.ndarray | None = None,
    max_records: int | None = None,
) -> AOPResult:
    """A*STAR's AOP with σ calibrated to the full sensitivity: one (ε, δ)-DP release;
    `public_size` is the silo's public record count (σ must not depend on the true one).
    With `units` (each record's patient) the unit is the patient: each keeps their first
    `max_records` records, σ covers that many, and `public_size` counts patients.

    Noise is cryptographically secure unless a `SeededNoise` is passed (research mode).
    """
    noise = noise or SecureNoise()
    records, relation = 1, Neighbouring.ADD_REMOVE
    if units is not None:
        if max_records is None:
            raise ValueError(
                "patient-level output perturbation needs a declared cap on a patient's "
                "records (data.max_records): each record moves the minimiser, so an "
                "uncapped patient moves it without bound"
            )
        data = capped(data, units, max_records)
        records, relation = max_records, Neighbouring.ADD_REMOVE_PATIENT
    x, y = data
    n = public_size
    minimizer = approximate_minimizer(model, init, x, y, loss, config, n)
    std = noise_std(n, loss, config, records)
    # Noise in float64 first, then the cast: rounding θ̂ before the noise would move it by
    # a data-dependent amount the sensitivity does not cover; after, it is post-processing.
    params = {
        k: (v + noise.normal(tuple(v.shape), std, v.dtype)).to(init[k].dtype)
        for k, v in minimizer.items()
    }
    event = events.approximate_dp(config.epsilon, config.delta, neighbouring=relation)
    metadata = {
        "mechanism": "approximate-output-perturbation",
        "noise_std": std,
        "sensitivity": sensitivity(n, loss, config, records),
        "records_per_unit": records,
        "paper_noise_std": paper_noise_std(n, config),
        "event": event.describe(),
        **noise.metadata(),
    }
    return AOPResult(params, event, metadata)
