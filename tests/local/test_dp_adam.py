"""DP-Adam: Adam on DP-SGD's noisy gradient, post-processing with the same privacy event."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from dpfl.data.sampling import PoissonSampler
from dpfl.experiments.study.build import build_algorithm
from dpfl.experiments.study.config import ConfigError, Study, StudyConfig
from dpfl.experiments.study.datasets import build_silos
from dpfl.experiments.study.runner import run_study
from dpfl.federation.algorithms import DPSGDAlgorithm
from dpfl.local.dpsgd import DPSGD, DPSGDConfig, parameters_of, stack
from dpfl.local.losses import bce
from dpfl.local.noise import SeededNoise
from dpfl.local.regularised import ProximalDPSGD, check_strength
from dpfl.models import logistic_regression, mlp

ADAM = {"optimizer": "adam"}


def _data(n: int, d: int, seed: int, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype)
    return x, (x[:, 0] + 0.5 * torch.randn(n, generator=g, dtype=dtype) > 0).to(dtype)


def _model(d: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = logistic_regression(d).double()
    for p in model.parameters():
        nn.init.normal_(p, std=0.5)
    return model


def test_non_private_adam_is_torch_adam_on_the_mean_gradient() -> None:
    """Noise 0, C = ∞ and every record in every batch (q = 1): each step is
    torch.optim.Adam's step on the full-batch mean gradient."""
    n, d, lr, steps = 50, 4, 0.05, 7
    x, y = _data(n, d, 0)
    model = _model(d, 1)
    start = parameters_of(model)
    config = DPSGDConfig.non_private(lr, optimizer="adam", betas=(0.8, 0.99), eps=1e-6)
    sampler = PoissonSampler(n, 1.0, np.random.default_rng(0), public_size=n)
    result = DPSGD(model, bce, config).run(start, (x, y), sampler, steps)
    assert result.event is None and result.metadata["mechanism"] == "adam (non-private)"

    reference = {k: v.clone().requires_grad_() for k, v in start.items()}
    adam = torch.optim.Adam(reference.values(), lr=lr, betas=(0.8, 0.99), eps=1e-6)
    for _ in range(steps):
        out = torch.func.functional_call(model, reference, (x,))
        grads = torch.autograd.grad(bce(out, y).mean(), list(reference.values()))
        for p, g in zip(reference.values(), grads, strict=True):
            p.grad = g
        adam.step()
    for k in start:
        assert not torch.allclose(result.params[k], start[k])
        torch.testing.assert_close(result.params[k], reference[k].detach(), rtol=0, atol=1e-6)
        torch.testing.assert_close(result.params[k], reference[k].detach(), rtol=1e-9, atol=1e-12)
        # the returned velocity is Adam's first moment
        torch.testing.assert_close(result.velocity[k], adam.state[reference[k]]["exp_avg"])


def test_private_adam_applies_adams_formula_to_the_noisy_gradients() -> None:
    """Each step's noisy normalised gradient g̃ is recovered as the velocity of one SGD
    step from the same parameters with the same batch and noise draw; Adam's update is
    then applied by hand."""
    n, d, q, sigma, clip, lr, steps = 60, 5, 0.3, 1.2, 0.7, 0.05, 5
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    x, y = _data(n, d, 2)
    model = _model(d, 3)
    start = parameters_of(model)
    width = sum(v.numel() for v in start.values())

    def sampler(skip: int) -> PoissonSampler:
        s = PoissonSampler(n, q, np.random.default_rng(7), public_size=n)
        for _ in range(skip):
            s.sample()
        return s

    def noise(skip: int) -> SeededNoise:
        source = SeededNoise(11)
        for _ in range(skip):  # one draw of every parameter's noise per step
            source.normal_into(torch.empty(width, dtype=torch.float64), sigma * clip)
        return source

    adam = DPSGD(model, bce, DPSGDConfig(clip, sigma, lr, optimizer="adam"))
    result = adam.run(start, (x, y), sampler(0), steps, noise=noise(0))
    assert result.metadata["mechanism"] == "dp-adam"

    sgd = DPSGD(model, bce, DPSGDConfig(clip, sigma, 1.0))
    params = {k: v.clone() for k, v in start.items()}
    m = {k: torch.zeros_like(v) for k, v in start.items()}
    s = {k: torch.zeros_like(v) for k, v in start.items()}
    for t in range(1, steps + 1):
        noisy = sgd.run(params, (x, y), sampler(t - 1), 1, noise=noise(t - 1)).velocity
        for k in params:
            g = noisy[k]
            m[k] = beta1 * m[k] + (1 - beta1) * g
            s[k] = beta2 * s[k] + (1 - beta2) * g * g
            m_hat, s_hat = m[k] / (1 - beta1**t), s[k] / (1 - beta2**t)
            params[k] = params[k] - lr * m_hat / (torch.sqrt(s_hat) + eps)
    for k in start:
        torch.testing.assert_close(result.params[k], params[k], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(result.velocity[k], m[k], rtol=1e-10, atol=1e-12)


def test_adam_declares_the_event_sgd_declares() -> None:
    n, d, q, sigma, steps = 80, 3, 0.1, 1.5, 9
    x, y = _data(n, d, 4)
    model = _model(d, 5)

    def run(config: DPSGDConfig) -> DPSGD:
        return DPSGD(model, bce, config)

    declared = [
        run(config)
        .run(
            parameters_of(model),
            (x, y),
            PoissonSampler(n, q, np.random.default_rng(0), public_size=n),
            steps,
            noise=SeededNoise(0),
        )
        .event
        for config in (
            DPSGDConfig(1.0, sigma, 0.1),
            DPSGDConfig(1.0, sigma, 0.1, optimizer="adam", betas=(0.5, 0.9)),
        )
    ]
    sampler = PoissonSampler(n, q, np.random.default_rng(0), public_size=n)
    assert declared[0] is not None
    assert declared[0] == declared[1] == sampler.privacy_event(sigma, steps)


@pytest.mark.parametrize("kind", ["logistic", "mlp_float32"])
def test_a_member_has_the_same_bits_alone_as_inside_a_stack_of_three(kind: str) -> None:
    dtype = torch.float32 if kind == "mlp_float32" else torch.float64
    torch.manual_seed(0)
    model = (mlp(6, (5,)) if kind == "mlp_float32" else logistic_regression(6)).to(dtype)
    datasets = [_data(40 - 7 * i, 6, 20 + i, dtype) for i in range(3)]  # different sizes
    inits = []
    for i in range(3):
        torch.manual_seed(100 + i)
        for p in model.parameters():
            nn.init.normal_(p, std=0.3)
        inits.append(parameters_of(model))
    trainer = DPSGD(model, bce, DPSGDConfig(0.8, 1.1, 0.05, optimizer="adam"))

    def sampler(i: int) -> PoissonSampler:
        size = len(datasets[i][1])
        return PoissonSampler(size, 0.25, np.random.default_rng(i), public_size=size)

    stacked = trainer.run_stacked(
        stack(inits),
        datasets,
        [sampler(i) for i in range(3)],
        [SeededNoise(i) for i in range(3)],
        6,
    )
    for i in range(3):  # every position of the stack, the middle one among them
        alone = trainer.run(inits[i], datasets[i], sampler(i), 6, noise=SeededNoise(i))
        for k in inits[0]:
            assert torch.equal(alone.params[k], stacked.params[k][i]), (i, k)
            assert torch.equal(alone.velocity[k], stacked.velocity[k][i]), (i, k)
    assert not torch.equal(stacked.params[k][0], stacked.params[k][1])


def test_adam_configurations_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="momentum must be 0 with optimizer 'adam'"):
        DPSGDConfig(1.0, 1.0, 0.1, 0.9, optimizer="adam")
    with pytest.raises(ValueError, match="betas"):
        DPSGDConfig(1.0, 1.0, 0.1, optimizer="adam", betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="eps"):
        DPSGDConfig(1.0, 1.0, 0.1, optimizer="adam", eps=0.0)
    with pytest.raises(ValueError, match="optimizer"):
        DPSGDConfig(1.0, 1.0, 0.1, optimizer="rmsprop")  # type: ignore[arg-type]
    assert DPSGDConfig.non_private(0.1, optimizer="adam").clip_norm == math.inf

    x, y = _data(20, 3, 0)
    model = _model(3, 0)
    start = parameters_of(model)
    trainer = DPSGD(model, bce, DPSGDConfig(1.0, 1.0, 0.1, optimizer="adam"))
    sampler = PoissonSampler(20, 0.5, np.random.default_rng(0), public_size=20)
    velocity = {k: torch.zeros_like(v) for k, v in start.items()}
    with pytest.raises(ValueError, match="adam's state restarts at each local training"):
        trainer.run(start, (x, y), sampler, 2, noise=SeededNoise(0), velocity=velocity)
    with pytest.raises(ValueError, match="rescaled per coordinate"):
        ProximalDPSGD(trainer, 0.1)
    with pytest.raises(ValueError, match="optimizer 'sgd'"):
        check_strength(trainer.config, 0.0)


STUDY: dict[str, Any] = {
    "name": "adam",
    "rounds": 2,
    "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 3}},
    "algorithm": {"name": "fedavg", "optimizer": "adam", "learning_rate": 0.01},
    "privacy": {"noise_multiplier": 3.0, "delta": 1e-5},
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "mrmtl"}, "optimizer 'adam' is not for mrmtl"),
        ({"name": "ditto"}, "optimizer 'adam' is not for ditto"),
        ({"name": "fedsgd_secure"}, "optimizer 'adam' is not for fedsgd_secure"),
        ({"name": "sign"}, "optimizer 'adam' is not for sign"),
        ({"name": "aop"}, "optimizer 'adam' is not for aop"),
        ({"momentum": 0.9}, "optimizer 'adam' takes no algorithm.momentum"),
    ],
)
def test_a_study_refuses_adam_where_it_does_not_fit(
    change: dict[str, object], message: str
) -> None:
    raw = {**STUDY, "algorithm": {**STUDY["algorithm"], **change}}
    with pytest.raises(ConfigError, match=message):
        Study(raw)


def test_sgd_studies_keep_their_keys_and_adam_gets_its_own() -> None:
    def key(**algorithm: object) -> str:
        raw = {**STUDY, "algorithm": {"name": "fedavg", **algorithm}}
        return StudyConfig.model_validate(raw).key()

    assert key() == key(optimizer="sgd")
    assert key(optimizer="adam") != key()


@pytest.mark.parametrize("private", [True, False])
def test_a_fedavg_study_with_adam_runs_and_costs_what_sgd_costs(
    tmp_path: Path, private: bool
) -> None:
    privacy = STUDY["privacy"] if private else {"private": False}
    adam, sgd = run_study(
        [
            Study({**STUDY, "privacy": privacy}),
            Study(
                {
                    **STUDY,
                    "algorithm": {"name": "fedavg", "learning_rate": 0.01},
                    "privacy": privacy,
                }
            ),
        ],
        tmp_path,
    )
    assert adam.status == sgd.status == "finished", (adam.error, sgd.error)
    assert adam.config["algorithm"]["optimizer"] == "adam"
    assert adam.datasheet["silos"] == sgd.datasheet["silos"]  # the same privacy accounting


@pytest.mark.parametrize("name", ["fedavg", "local", "centralized", "cyclic", "finetune"])
@pytest.mark.parametrize("private", [True, False])
def test_the_study_hands_adam_to_the_algorithms_trainer(name: str, private: bool) -> None:
    privacy = STUDY["privacy"] if private else {"private": False}
    raw = {**STUDY, "algorithm": {**STUDY["algorithm"], "name": name}, "privacy": privacy}
    config = StudyConfig.model_validate(raw)
    algorithm = build_algorithm(config, build_silos(config.data, config.seed))
    assert isinstance(algorithm, DPSGDAlgorithm)
    assert algorithm.dpsgd.optimizer == "adam" and algorithm.dpsgd.private == private


@pytest.mark.parametrize("name", ["local", "centralized", "cyclic", "finetune"])
def test_the_other_algorithms_with_sgd_steps_run_with_adam(tmp_path: Path, name: str) -> None:
    (run,) = run_study(
        Study({**STUDY, "algorithm": {**STUDY["algorithm"], "name": name}}), tmp_path
    )
    assert run.status == "finished", run.error
