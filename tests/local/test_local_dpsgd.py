"""DP-SGD: the update it makes, the noise it adds, the event it declares, stacking."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats
from torch import Tensor, nn

from dpfl.data.sampling import BalancedPoissonSampler, PoissonSampler, ShuffledSampler
from dpfl.errors import InternalError
from dpfl.local import dpsgd as dpsgd_module
from dpfl.local.clipping import ClippedGradientSum, column_major_copy
from dpfl.local.dpsgd import DPSGD, DPSGDConfig, parameters_of, stack
from dpfl.local.losses import bce, cross_entropy
from dpfl.local.noise import NoiseSource, SecureNoise, SeededNoise
from dpfl.local.regularised import ProximalDPSGD
from dpfl.models import MixesExamplesError, logistic_regression, mlp, small_cnn
from dpfl.privacy import Ledger, events
from dpfl.privacy.errors import UnsupportedAccountingError


def _data(n: int, d: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    return x, (x[:, 0] + 0.5 * torch.randn(n, generator=g, dtype=torch.float64) > 0).double()


class CountingNoise(NoiseSource):
    """Counts noise draws: one per step actually run (all parameter tensors at once)."""

    def __init__(self, seed: int) -> None:
        self.inner = SeededNoise(seed)
        self.draws = 0

    def normal(self, shape: tuple[int, ...], std: float, dtype: torch.dtype) -> Tensor:
        self.draws += 1
        return self.inner.normal(shape, std, dtype)

    def metadata(self) -> dict[str, Any]:
        return self.inner.metadata()


class CountingSampler(PoissonSampler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.draws = 0

    def sample(self) -> np.ndarray:
        self.draws += 1
        return super().sample()


def test_declared_event_equals_what_was_run() -> None:
    x, y = _data(200, 5, 0)
    model = mlp(5, (4,)).double()  # 4 parameter tensors
    q, sigma, steps = 0.05, 1.3, 17
    sampler = CountingSampler(200, q, np.random.default_rng(0), public_size=200)
    noise = CountingNoise(0)
    result = DPSGD(model, bce, DPSGDConfig(1.0, sigma, 0.1)).run(
        parameters_of(model), (x, y), sampler, steps, noise=noise
    )
    assert sampler.draws == steps
    assert noise.draws == steps  # one draw of all 4 tensors' noise per step
    assert result.event == events.poisson_gaussian(q, sigma, steps=steps)
    assert result.metadata["noise_multiplier"] == sigma
    assert result.metadata["steps"] == steps


def test_balanced_sampler_declares_half_the_noise_multiplier() -> None:
    x, y = _data(200, 5, 1)
    model = logistic_regression(5).double()
    sampler = BalancedPoissonSampler(
        y.numpy(), 0.1, np.random.default_rng(0), public_size=len(y.numpy())
    )
    result = DPSGD(model, bce, DPSGDConfig(1.0, 1.08, 0.1)).run(
        parameters_of(model), (x, y), sampler, 4, noise=SeededNoise(0)
    )
    assert result.event == events.poisson_gaussian(0.1, 0.54, steps=4)


def test_runs_are_recorded_in_the_silo_ledger_with_their_true_cost(tmp_path: Path) -> None:
    """The ledger charges what the sampler declared: balanced downsampling (σ/2 against
    its 2C sensitivity) costs more ε than Poisson batches at the same σ."""
    x, y = _data(200, 5, 1)
    model = logistic_regression(5).double()
    dpsgd = DPSGD(model, bce, DPSGDConfig(1.0, 2.0, 0.1))
    ledger = Ledger(tmp_path / "ledger.sqlite")
    rng = np.random.default_rng(0)
    samplers = {
        "poisson": PoissonSampler(200, 0.05, rng, public_size=200),
        "balanced": BalancedPoissonSampler(y.numpy(), 0.05, rng, public_size=len(y.numpy())),
    }
    for silo, sampler in samplers.items():
        ledger.register_silo(silo, epsilon=50.0, delta=1e-5, size=200)
        result = dpsgd.run(parameters_of(model), (x, y), sampler, 20, noise=SeededNoise(0))
        assert ledger.can_afford(silo, result.event)
        ledger.record(silo, result.event, label="local training")
        [entry] = ledger.entries(silo)
        assert entry.event == result.event
    assert ledger.spent("balanced").epsilon > ledger.spent("poisson").epsilon


def test_shuffled_batches_are_refused_before_any_step() -> None:
    x, y = _data(50, 3, 2)
    model = logistic_regression(3).double()
    noise = CountingNoise(0)
    with pytest.raises(UnsupportedAccountingError):
        DPSGD(model, bce, DPSGDConfig(1.0, 1.0, 0.1)).run(
            parameters_of(model),
            (x, y),
            ShuffledSampler(50, 10, np.random.default_rng(0)),
            3,
            noise=noise,
        )
    assert noise.draws == 0


def test_batchnorm_models_are_refused() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    with pytest.raises(MixesExamplesError, match="GroupNorm"):
        DPSGD(model, bce, DPSGDConfig(1.0, 1.0, 0.1))


def _recovered_noise(
    model: nn.Module, d: int, seed: int, sparse: bool = False
) -> dict[str, np.ndarray]:
    """With an (almost surely) empty batch the update is −η·noise/(q·n): each tensor's
    noise over 5 steps, standardised (the mean of `steps` independent N(0, (σC)²) has
    std σC/√steps), so that N(0, 1) is expected. `sparse`: the input as a COO tensor."""
    sigma, clip, q, lr, steps = 1.7, 0.3, 1e-12, 0.5, 5
    x, y = _data(1, d, 3)
    x = x.to_sparse() if sparse else x
    params = parameters_of(model)
    result = DPSGD(model, bce, DPSGDConfig(clip, sigma, lr)).run(
        params,
        (x, y),
        PoissonSampler(1, q, np.random.default_rng(0), public_size=1),
        steps,
        noise=SeededNoise(seed),
    )
    return {
        name: ((start - result.params[name]) * q / lr / steps).flatten().numpy()
        * np.sqrt(steps)
        / (sigma * clip)
        for name, start in params.items()
    }


def test_noise_std_is_sigma_times_c_and_gaussian() -> None:
    sample = _recovered_noise(logistic_regression(2000).double(), 2000, 7)["weight"]
    assert stats.kstest(sample, "norm").pvalue > 0.01
    # Variance: (N-1)s² ~ χ²(N-1); a two-sided 99% interval.
    var_stat = (len(sample) - 1) * sample.var(ddof=1)
    lo, hi = stats.chi2.ppf([0.005, 0.995], len(sample) - 1)
    assert lo < var_stat < hi


@pytest.mark.parametrize("sparse", [False, True])
def test_every_parameter_tensor_gets_noise_of_std_sigma_times_c(sparse: bool) -> None:
    """Each step draws one member's noise for all its tensors at once: recovered as above,
    every tensor's share is N(0, (σC)²), from the largest matrix to a single bias (on a
    sparse input too, whose first weight trains column-major)."""
    samples = []
    # 30 × 40, 30, 1 × 30 and 1 parameters
    for name, sample in _recovered_noise(mlp(40, (30,)).double(), 40, 0, sparse).items():
        lo, hi = stats.chi2.ppf([0.0005, 0.9995], len(sample))
        assert lo < (sample**2).sum() < hi, name
        samples.append(sample)
    assert stats.kstest(np.concatenate(samples), "norm").pvalue > 0.01


@pytest.mark.parametrize("sparse", [False, True])
def test_update_is_clipped_sum_over_expected_batch_size_with_momentum(sparse: bool) -> None:
    """σ→0 and a huge C: two steps must equal autograd's Σ grads / (q·n) with momentum;
    also for an MLP on a sparse input (its first weight trained column-major, handed back
    row-major, the caller's parameters untouched)."""
    n, q, lr, beta = 40, 0.25, 0.2, 0.9
    x, y = _data(n, 4, 4)
    model = (mlp(4, (3,)) if sparse else logistic_regression(4)).double()
    start = parameters_of(model)
    before = {k: v.clone() for k, v in start.items()}
    result = DPSGD(model, bce, DPSGDConfig(1e9, 1e-300, lr, beta)).run(
        start,
        (x.to_sparse() if sparse else x, y),
        PoissonSampler(n, q, np.random.default_rng(5), public_size=n),
        2,
        noise=SeededNoise(0),
    )
    replay = PoissonSampler(n, q, np.random.default_rng(5), public_size=n)
    params = {k: v.clone().requires_grad_() for k, v in start.items()}
    velocity = {k: torch.zeros_like(v) for k, v in start.items()}
    for _ in range(2):
        idx = torch.from_numpy(replay.sample())
        out = torch.func.functional_call(model, params, (x[idx],))
        grads = torch.autograd.grad(bce(out, y[idx]).sum(), list(params.values()))
        with torch.no_grad():
            for (k, p), g in zip(params.items(), grads, strict=True):
                velocity[k] = beta * velocity[k] + g / (q * n)
                p -= lr * velocity[k]
    for k in start:
        torch.testing.assert_close(result.params[k], params[k].detach(), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(result.velocity[k], velocity[k], rtol=1e-10, atol=1e-12)
        assert result.params[k].is_contiguous()
        assert torch.equal(start[k], before[k])


@pytest.mark.parametrize("members", [1, 3])
def test_pool_batches_are_the_chunks_of_the_batches_drawn_step_by_step(
    members: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_Pool.batches` draws a block of steps' batches ahead and gathers them at once: the
    same batches, in the same draw order (samplers sharing one generator), and the same
    chunks as `_Pool.chunks` step by step, for blocks of several steps and for steps
    whose batches overflow one chunk."""
    monkeypatch.setattr(dpsgd_module, "GATHER_ELEMENTS", 7 * 2 * members * 4 * 6)  # 7 steps
    model = logistic_regression(6).double()
    datasets = [_data(20 + 5 * m, 6, m) for m in range(members)]
    clipped = ClippedGradientSum(model, bce)
    pool = dpsgd_module._Pool(
        datasets, 4, torch.float64, clipped, stack([parameters_of(model)] * members)
    )

    def samplers() -> list[PoissonSampler]:
        rng = np.random.default_rng(3)  # shared: the order of the draws matters
        return [PoissonSampler(len(y), 0.2, rng, public_size=len(y)) for _, y in datasets]

    steps = 20
    ahead = list(pool.batches(samplers(), steps))
    replay = samplers()
    assert len(ahead) == steps
    overflowing = 0
    for indices, chunks in ahead:
        drawn = [s.sample() for s in replay]
        assert all(np.array_equal(a, b) for a, b in zip(indices, drawn, strict=True))
        expected = pool.chunks(drawn)
        overflowing += len(expected) > 1
        assert len(chunks) == len(expected)
        for got, want in zip(chunks, expected, strict=True):
            assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert 0 < overflowing < steps  # both kinds of step were drawn


@pytest.mark.parametrize("kind", ["logistic", "mlp_momentum", "mlp_adam", "cnn"])
def test_stacked_trials_equal_the_same_trials_run_one_by_one(kind: str) -> None:
    trials = 4
    torch.manual_seed(0)
    if kind == "cnn":
        model: nn.Module = small_cnn(3, 8, 2, widths=(4,), groups=2).double()
        g = torch.Generator().manual_seed(1)
        data = (torch.randn(30, 3, 8, 8, generator=g, dtype=torch.float64), torch.arange(30) % 2)
        loss, config = cross_entropy, DPSGDConfig(1.0, 1.0, 0.05)
    else:
        model = (mlp(6, (5,)) if kind.startswith("mlp") else logistic_regression(6)).double()
        data, loss = _data(30, 6, 1), bce
        config = DPSGDConfig(
            0.5,
            1.1,
            0.1,
            0.9 if kind == "mlp_momentum" else 0.0,
            optimizer="adam" if kind == "mlp_adam" else "sgd",
        )
    # Silos of different sizes (so different q·n normalisers and batch lengths).
    datasets = [
        (data[0][: 30 - 4 * t], data[1][: 30 - 4 * t]) if kind == "logistic" else data
        for t in range(trials)
    ]
    inits = []
    for t in range(trials):
        torch.manual_seed(100 + t)
        for p in model.parameters():
            nn.init.normal_(p, std=0.3)
        inits.append(parameters_of(model))
    dpsgd = DPSGD(model, loss, config)

    def sampler(t: int) -> PoissonSampler:
        return PoissonSampler(
            len(datasets[t][1]), 0.2, np.random.default_rng(t), public_size=len(datasets[t][1])
        )

    one_by_one = [
        dpsgd.run(inits[t], datasets[t], sampler(t), 6, noise=SeededNoise(t)) for t in range(trials)
    ]
    stacked = dpsgd.run_stacked(
        stack(inits),
        datasets,
        [sampler(t) for t in range(trials)],
        [SeededNoise(t) for t in range(trials)],
        6,
    )
    for t in range(trials):
        assert stacked.events[t] == one_by_one[t].event
        for k in inits[0]:
            assert torch.equal(stacked.params[k][t], one_by_one[t].params[k])  # the same bits
    # The trials really differ, so equality is not trivially shared state.
    assert not torch.allclose(stacked.params[k][0], stacked.params[k][1])


def test_a_stack_dpfl_assembled_wrongly_is_an_internal_error() -> None:
    """Only `DPSGDAlgorithm.train` stacks members: one without its own dataset, sampler
    and noise, sparse members stacked, or a proximal run of no step is a bug in dpfl,
    not bad input (the CLI says so, with exit status 70 instead of 2)."""
    x, y = _data(20, 3, 0)
    model = logistic_regression(3).double()
    dpsgd = DPSGD(model, bce, DPSGDConfig(1.0, 1.0, 0.1))
    params = stack([parameters_of(model)] * 2)
    samplers = [PoissonSampler(20, 0.5, np.random.default_rng(t), public_size=20) for t in (0, 1)]
    noises = [SeededNoise(0), SeededNoise(1)]
    with pytest.raises(InternalError, match="per stacked member"):
        dpsgd.run_stacked(params, [(x, y)], samplers, noises, 1)
    with pytest.raises(InternalError, match="dense inputs"):
        dpsgd.run_stacked(params, [(x.to_sparse(), y)] * 2, samplers, noises, 1)
    with pytest.raises(InternalError, match="at least one step"):
        ProximalDPSGD(dpsgd, 0.1).run_stacked(params, params, [(x, y)] * 2, samplers, noises, 0)
    assert not issubclass(InternalError, ValueError)  # never reported as the user's mistake


def test_secure_and_seeded_noise_are_recorded_in_metadata() -> None:
    x, y = _data(20, 3, 6)
    model = logistic_regression(3).double()
    dpsgd = DPSGD(model, bce, DPSGDConfig(1.0, 1.0, 0.1))

    def run(noise: NoiseSource) -> dict[str, Any]:
        sampler = PoissonSampler(20, 0.5, np.random.default_rng(0), public_size=20)
        return dpsgd.run(parameters_of(model), (x, y), sampler, 1, noise=noise).metadata

    default = dpsgd.run(
        parameters_of(model),
        (x, y),
        PoissonSampler(20, 0.5, np.random.default_rng(0), public_size=20),
        1,
    ).metadata
    assert default["noise"] == "secure"
    secure = run(SecureNoise())
    assert secure["noise"] == "secure" and secure["secure"] is True and "seed" not in secure
    seeded = run(SeededNoise(42))
    assert seeded["noise"] == "seeded" and seeded["secure"] is False and seeded["seed"] == 42


class ThreadsSeen(NoiseSource):
    """Records torch's intra-op thread count at each noise draw (inside the step loop)."""

    def __init__(self) -> None:
        self.inner = SeededNoise(0)
        self.threads: list[int] = []

    def normal(self, shape: tuple[int, ...], std: float, dtype: torch.dtype) -> Tensor:
        self.threads.append(torch.get_num_threads())
        return self.inner.normal(shape, std, dtype)

    def metadata(self) -> dict[str, Any]:
        return self.inner.metadata()


@pytest.mark.parametrize(("features", "one_thread"), [(6, True), (5000, False)])
def test_small_steps_run_on_one_thread_and_torch_setting_is_restored(
    features: int, one_thread: bool
) -> None:
    """Issue 12: tiny steps lose milliseconds to every parallel region on a loaded machine;
    steps with enough work (here 20 × 5001 parameters) keep torch's setting."""
    x, y = _data(200, features, 0)
    model = logistic_regression(features).double()
    noise = ThreadsSeen()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        DPSGD(model, bce, DPSGDConfig(1.0, 1.0, 0.1)).run(
            parameters_of(model),
            (x, y),
            PoissonSampler(200, 0.1, np.random.default_rng(0), public_size=200),
            3,
            noise=noise,
        )
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert noise.threads == [1 if one_thread else 2] * 3  # one draw a step, three steps


def test_a_run_on_one_thread_gives_the_models_of_a_run_on_several() -> None:
    """For small steps the thread count no longer changes any bit (it did for this float32
    MLP: some kernel rounds differently on two threads)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(242, 22, generator=g) * 2, torch.randint(0, 2, (242,), generator=g)
    torch.manual_seed(0)
    model = mlp(22, (5,))

    def run(threads: int) -> dict[str, Tensor]:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            sampler = PoissonSampler(242, 16 / 242, np.random.default_rng(0), public_size=242)
            trainer = DPSGD(model, bce, DPSGDConfig(1.0, 1.0, 0.5))
            start = parameters_of(model)
            return trainer.run(start, (x, y), sampler, 12, noise=SeededNoise(0)).params
        finally:
            torch.set_num_threads(before)

    one, two = run(1), run(2)
    assert all(torch.equal(one[k], two[k]) for k in one)


@pytest.mark.parametrize("shape", [(600, 7), (2, 513, 3), (1, 5, 256)])
def test_column_major_copy_holds_the_same_values_in_the_other_layout(
    shape: tuple[int, ...],
) -> None:
    """Copied by blocks of 256 rows, a last block shorter, stacked members or not."""
    value = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    copy = column_major_copy(value)
    assert torch.equal(copy, value)
    assert copy.mT.is_contiguous() and copy.data_ptr() != value.data_ptr()


def test_a_record_whose_gradient_overflows_adds_nothing_and_the_update_stays_finite() -> None:
    """A finite model can overflow on a record (issue 46): weights ±3e38 on two features
    make 2·3e38 − 2·3e38 = ∞ − ∞ = NaN for a record holding 2 in both. Its gradient is
    zeroed before the noise, so the trained model is finite (it used to be NaN)."""
    model = logistic_regression(4)
    start = parameters_of(model)
    start["weight"] = torch.tensor([[3e38, -3e38, 0.5, -0.5]])
    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(1))
    x[:5, :2] = 2.0  # five records whose logit is NaN
    y = (x[:, 2] > 0).float()
    config = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=0.1)
    sampler = PoissonSampler(40, 0.5, np.random.default_rng(0), public_size=40)
    trained = DPSGD(model, bce, config).run(start, (x, y), sampler, 3, noise=SeededNoise(0))
    assert all(torch.isfinite(v).all() for v in trained.params.values())
    assert torch.isfinite(trained.params["weight"] - start["weight"]).all()
