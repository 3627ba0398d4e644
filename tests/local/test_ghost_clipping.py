"""Ghost clipping (`dpfl.local.ghost`) against the reference: `torch.func` per-example
gradients of the whole model, clipped and summed, on every layer type with a rule (each
branch of the mixed choice), a layer without one, and small ResNet-GN and ViT models."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call

from dpfl.data.sampling import PoissonSampler
from dpfl.local import clipping
from dpfl.local import ghost as ghost_module
from dpfl.local.clipping import ClippedGradientSum
from dpfl.local.dpsgd import DPSGD, DPSGDConfig, parameters_of
from dpfl.local.ghost import GhostClipping, has_rule
from dpfl.local.losses import cross_entropy
from dpfl.local.noise import SeededNoise
from dpfl.models.large import resnet18_gn, vit
from per_example import clipped_by_vmap


class _Images(nn.Module):
    """Every image layer with a rule, both branches of each mixed choice, and a layer
    without a rule (PReLU: `vmap` of its own `vjp`), not as an nn.Sequential."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Conv2d(3, 4, 3, padding=1)  # 8×8 positions: direct
        self.norm = nn.GroupNorm(2, 4)
        self.relu = nn.ReLU(inplace=True)  # modifies the GroupNorm's output in place
        self.grouped = nn.Conv2d(4, 4, (3, 2), (2, 1), dilation=(1, 2), groups=2, bias=False)
        self.narrow = nn.Conv2d(4, 32, 2, stride=2)  # 1×3 positions: ghost
        self.prelu = nn.PReLU(32)
        self.tokens = nn.Linear(3, 6)  # 32 tokens of 3: direct (T² > d·p)
        self.layer = nn.LayerNorm(6)
        self.few = nn.Linear(6, 40)  # 32 tokens, 6·40 > 32²: ghost
        self.plain = nn.LayerNorm(40, bias=False)
        self.head = nn.Linear(40, 3)  # one row per example

    def forward(self, x: Tensor) -> Tensor:
        h = self.relu(self.norm(self.wide(x)))
        h = self.prelu(self.narrow(self.grouped(h)))  # [B, 32, 1, 3]
        t = self.layer(self.tokens(h.flatten(2)))  # [B, 32, 6]
        t = self.plain(self.few(t)).mean(1)
        return self.head(torch.tanh(t))


class _Text(nn.Module):
    """Embeddings: ghost by token equality (with a padding row), and direct."""

    def __init__(self) -> None:
        super().__init__()
        self.words = nn.Embedding(50, 8, padding_idx=0)
        self.small = nn.Embedding(3, 2)  # 6 tokens: 36 > 3·2, direct
        self.head = nn.Linear(10, 3)

    def forward(self, x: Tensor) -> Tensor:
        words = self.words(x).mean(1)
        return self.head(torch.cat([words, self.small(x % 3).mean(1)], 1))


def _data(model: nn.Module, x: Tensor, outputs: int = 3) -> tuple[nn.Module, Tensor, Tensor]:
    g = torch.Generator().manual_seed(7)
    return model, x, torch.randint(0, outputs, (x.shape[0],), generator=g)


def _images(dtype: torch.dtype) -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(0)
    x = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(1), dtype=dtype)
    return _data(_Images().to(dtype), x)


def _text(dtype: torch.dtype) -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(2)
    x = torch.randint(0, 50, (6, 6), generator=torch.Generator().manual_seed(3))
    x[0, :2] = 0  # padding tokens
    x[1, :] = 5  # one token repeated
    return _data(_Text().to(dtype), x)


def _resnet(dtype: torch.dtype) -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(4)
    model = resnet18_gn(1, 3, widths=(4, 8, 8, 8), groups=2, small_inputs=False)
    x = torch.randn(6, 1, 32, 32, generator=torch.Generator().manual_seed(5), dtype=dtype)
    return _data(model.to(dtype), x)


def _cifar_resnet(dtype: torch.dtype) -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(6)
    model = resnet18_gn(3, 3, widths=(4, 4, 8, 8), groups=2)
    x = torch.randn(6, 3, 12, 12, generator=torch.Generator().manual_seed(7), dtype=dtype)
    return _data(model.to(dtype), x)


def _vit(dtype: torch.dtype) -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(8)
    model = vit(3, 12, 3, patch=4, dim=8, depth=2, heads=2)
    x = torch.randn(6, 3, 12, 12, generator=torch.Generator().manual_seed(9), dtype=dtype)
    return _data(model.to(dtype), x)


def _wrapped(dtype: torch.dtype) -> tuple[nn.Module, Tensor, Tensor]:
    """A ResNet as one child of an nn.Sequential: the layer-by-layer path would take it
    by `vmap` as one block, so the Sequential goes ghost."""
    model, x, y = _resnet(dtype)
    head = nn.Linear(3, 3).to(dtype)
    return nn.Sequential(model, nn.Tanh(), head), x, y


MODELS = {
    "images": _images,
    "wrapped": _wrapped,
    "text": _text,
    "resnet": _resnet,
    "cifar_resnet": _cifar_resnet,
    "vit": _vit,
}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ghost_clipped_sums_are_the_references(
    name: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By book-keeping and by a second backward pass; every model here (but the token
    model, which dpfl's per-example check cannot probe) takes the ghost path (the
    threshold lowered for the PReLU, which has no rule); a masked row adds nothing."""
    monkeypatch.setattr(clipping, "VMAP_BYTES", 0)
    model, x, y = MODELS[name](dtype)
    mask = torch.ones(len(x), dtype=dtype)
    mask[-1] = 0.0
    _, raw = clipped_by_vmap(model, cross_entropy, x, y, mask, 1.0)
    clip = float(raw.median())  # about half the examples are clipped
    if name != "text":  # token inputs: `check_per_example` probes with floats
        assert ClippedGradientSum(model, cross_entropy).ghost(x)
    factor = partial(clipping._clip_factor, mask=mask, clip_norm=clip)
    expected, expected_norms = clipped_by_vmap(model, cross_entropy, x, y, mask, clip)
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    for book_keeping in (True, False):
        ghost = GhostClipping(model, cross_entropy, book_keeping=book_keeping)
        sums, norms = ghost(parameters_of(model), x, y, factor)
        assert torch.allclose(norms, expected_norms, rtol=tol, atol=tol)
        assert sums.keys() == expected.keys()
        for key, value in sums.items():
            assert torch.allclose(value, expected[key], rtol=tol, atol=tol * clip), key


def test_each_layer_type_has_a_rule_or_is_mapped_alone() -> None:
    model = _Images()
    ruled = {n for n, m in model.named_modules() if has_rule(m)}
    assert ruled == {"wide", "norm", "grouped", "narrow", "tokens", "layer", "few", "plain", "head"}
    assert not has_rule(model.prelu)
    assert not has_rule(nn.Conv2d(2, 2, 3, padding="same"))
    assert not has_rule(nn.Embedding(5, 2, max_norm=1.0))


def test_a_lone_example_and_no_clipping() -> None:
    model, x, y = _resnet(torch.float64)
    one = torch.ones(1, dtype=torch.float64)
    sums, _ = ClippedGradientSum(model, cross_entropy)(
        parameters_of(model), x[:1], y[:1], one, math.inf
    )
    expected, _ = clipped_by_vmap(model, cross_entropy, x[:1], y[:1], one, math.inf)
    for key, value in sums.items():
        assert torch.allclose(value, expected[key], rtol=1e-10, atol=1e-12), key


@pytest.mark.parametrize("book_keeping", [True, False])
def test_a_non_finite_example_is_zeroed_not_summed(book_keeping: bool) -> None:
    """An example with an infinite input has a non-finite gradient: it adds exactly zero,
    and the others' sum is the one without it (not NaN)."""
    model, x, y = _resnet(torch.float64)
    x = x.clone()
    x[2, 0, 0, 0] = math.inf
    mask = torch.ones(len(x), dtype=torch.float64)
    ghost = GhostClipping(model, cross_entropy, book_keeping=book_keeping)
    factor = partial(clipping._clip_factor, mask=mask, clip_norm=0.5)
    sums, norms = ghost(parameters_of(model), x, y, factor)
    assert not torch.isfinite(norms[2])
    kept = torch.arange(len(x)) != 2
    without, _ = ClippedGradientSum(model, cross_entropy)(
        parameters_of(model), x[kept], y[kept], mask[kept], 0.5
    )
    for key, value in sums.items():
        assert torch.allclose(value, without[key], rtol=1e-10, atol=1e-12), key
    one = partial(clipping._clip_factor, mask=mask[:1], clip_norm=0.5)
    alone, _ = ghost(parameters_of(model), x[2:3], y[2:3], one)  # no finite row left
    assert all(bool((value == 0).all()) for value in alone.values())


class _Twice(nn.Module):
    """A layer called twice: its gradient's norm is not a sum over calls, so the hooks
    give up and `vmap(grad)` of the whole model computes it."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(5, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.inner(torch.tanh(self.inner(x))))


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(5, 5)
        self.b = nn.Linear(5, 5)
        self.b.weight = self.a.weight

    def forward(self, x: Tensor) -> Tensor:
        return self.b(torch.tanh(self.a(x)))


def test_models_the_hooks_cannot_follow_take_vmap() -> None:
    torch.manual_seed(10)
    x = torch.randn(4, 5, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 1])
    mask = torch.ones(4, dtype=torch.float64)
    for model in (_Twice().double(), _Tied().double()):
        clipped = ClippedGradientSum(model, cross_entropy)
        sums, _ = clipped(parameters_of(model), x, y, mask, 0.1)
        expected, _ = clipped_by_vmap(model, cross_entropy, x, y, mask, 0.1)
        for key, value in sums.items():
            assert torch.allclose(value, expected[key], rtol=1e-10, atol=1e-12), key
        assert not clipped.ghost(x)
    assert not GhostClipping(_Tied(), cross_entropy).applies


class _Bilinear(nn.Module):
    """Most parameters in a layer without a rule."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Bilinear(432, 432, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.flatten(1)
        return self.head(self.first(flat, flat))


def test_the_path_is_chosen_by_model_and_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sequential models keep the layer-by-layer path; others go ghost, unless the layers
    without a rule hold most parameters: then only above `VMAP_BYTES`."""
    x = torch.zeros(4, 3, 12, 12)
    sequential = nn.Sequential(nn.Flatten(), nn.Linear(432, 2))
    assert not ClippedGradientSum(sequential, cross_entropy).ghost(x)
    wrapped = ClippedGradientSum(_wrapped(torch.float32)[0], cross_entropy)
    assert wrapped.ghost(torch.zeros(4, 1, 32, 32))
    assert ClippedGradientSum(_resnet(torch.float32)[0], cross_entropy).ghost(x)
    assert ClippedGradientSum(_vit(torch.float32)[0], cross_entropy).ghost(x)
    model = _Bilinear()
    assert not ClippedGradientSum(model, cross_entropy).ghost(x)
    size = 4 * 4 * sum(p.numel() for p in model.parameters())
    monkeypatch.setattr(clipping, "VMAP_BYTES", size - 1)
    assert ClippedGradientSum(model, cross_entropy).ghost(x)


def test_dp_sgd_of_a_resnet_by_ghost_clipping_is_its_run_by_vmap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`DPSGD.run` (Poisson batches with padding rows, seeded noise) trains the same model
    by ghost clipping as by `vmap(grad)`, to float rounding; the same privacy event."""
    model, x, y = _resnet(torch.float64)
    config = DPSGDConfig(clip_norm=0.3, noise_multiplier=1.0, learning_rate=0.5)

    def run() -> tuple[dict[str, Tensor], object]:
        sampler = PoissonSampler(len(y), 0.5, np.random.default_rng(0), public_size=len(y))
        result = DPSGD(model, cross_entropy, config).run(
            parameters_of(model), (x, y), sampler, 3, noise=SeededNoise(0)
        )
        return result.params, result.event

    ghost, event = run()
    monkeypatch.setattr(ClippedGradientSum, "ghost", lambda self, x: False)
    vmapped, vmapped_event = run()
    assert event == vmapped_event
    for key, value in ghost.items():
        assert torch.allclose(value, vmapped[key], rtol=1e-9, atol=1e-12), key
    start = parameters_of(model)
    assert any(not torch.equal(value, start[key]) for key, value in ghost.items())


def test_the_first_pass_asks_only_for_the_first_layers_gradients() -> None:
    """The layers whose inputs are the records: every other weight gradient the first
    backward pass would compute is wasted (the sums come by book-keeping)."""
    model, x, _ = _vit(torch.float64)
    leaves = {k: v.requires_grad_() for k, v in parameters_of(model).items()}
    tape = ghost_module._Tape(GhostClipping(model, cross_entropy).owners, leaves, len(x), True)
    with tape.hooks():
        functional_call(model, leaves, (x,))
    assert tape.first_parameters() == ["embed.weight", "embed.bias"]
