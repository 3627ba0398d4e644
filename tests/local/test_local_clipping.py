"""Per-example gradients and clipping: against autograd, and the sensitivity bound."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.func import vmap

from dpfl.local.clipping import VMAP_BYTES, ClippedGradientSum
from dpfl.local.dpsgd import parameters_of, stack
from dpfl.local.losses import Loss, bce, cross_entropy, focal, output_gradient, weighted_bce
from dpfl.models import MixesExamplesError, logistic_regression, mlp, small_cnn

Case = tuple[nn.Module, Loss, Tensor, Tensor]


def _binary(n: int, d: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    return torch.randn(n, d, generator=g, dtype=torch.float64), (
        torch.rand(n, generator=g, dtype=torch.float64) < 0.5
    ).double()


def _cases() -> dict[str, Callable[[], Case]]:
    g = torch.Generator().manual_seed(0)

    def logistic() -> Case:
        torch.manual_seed(1)
        return (logistic_regression(7).double(), bce, *_binary(5, 7, g))

    def multinomial() -> Case:
        torch.manual_seed(2)
        x = torch.randn(5, 7, generator=g, dtype=torch.float64)
        return logistic_regression(7, 4).double(), cross_entropy, x, torch.tensor([0, 3, 1, 2, 3])

    def mlp_focal() -> Case:
        torch.manual_seed(3)
        return mlp(7, (6, 5)).double(), focal(0.75, 2.0), *_binary(5, 7, g)

    def mlp_sparse_weighted() -> Case:
        torch.manual_seed(4)
        x, y = _binary(5, 40, g)
        x = x * (torch.rand(5, 40, generator=g, dtype=torch.float64) < 0.1)
        return mlp(40, (6,)).double(), weighted_bce(10.0), x.to_sparse(), y

    def layernorm_mlp() -> Case:
        torch.manual_seed(6)
        return _layernorm_mlp().double(), bce, *_binary(5, 7, g)

    def residual() -> Case:
        torch.manual_seed(7)
        return _Residual().double(), bce, *_binary(5, 7, g)

    def cnn() -> Case:
        torch.manual_seed(5)
        x = torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64)
        model = small_cnn(3, 8, 3, widths=(4, 8), groups=2).double()
        return model, cross_entropy, x, torch.tensor([0, 2, 1, 2])

    def conv_variants() -> Case:
        """Stride, dilation and groups (the grouped rule), reflect padding (the fallback)."""
        torch.manual_seed(8)
        model = nn.Sequential(
            nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2),
            nn.ReLU(),
            nn.Conv2d(6, 4, 3, padding=1, padding_mode="reflect"),
            nn.Flatten(),
            nn.Linear(100, 3),
        ).double()
        x = torch.randn(4, 4, 9, 9, generator=g, dtype=torch.float64)
        return model, cross_entropy, x, torch.tensor([0, 2, 1, 2])

    return {
        "logistic": logistic,
        "multinomial": multinomial,
        "mlp_focal": mlp_focal,
        "mlp_sparse_weighted": mlp_sparse_weighted,
        "layernorm_mlp": layernorm_mlp,
        "residual": residual,
        "cnn": cnn,
        "conv_variants": conv_variants,
    }


def _autograd(model: nn.Module, loss: Loss, x: Tensor, y: Tensor, i: int) -> dict[str, Tensor]:
    """The gradient of example i alone, by ordinary backpropagation."""
    xi = (x.to_dense() if x.is_sparse else x)[i : i + 1]
    model.zero_grad()
    loss(model(xi), y[i : i + 1]).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("name", list(_cases()))
def test_per_example_gradients_equal_autograd_on_single_examples(name: str) -> None:
    model, loss, x, y = _cases()[name]()
    clipped = ClippedGradientSum(model, loss)
    params = parameters_of(model)
    n = y.shape[0]
    _, norms = clipped(params, x, y, torch.ones(n, dtype=torch.float64), 1e9)
    for i in range(n):
        expected = _autograd(model, loss, x, y, i)
        one_hot = (torch.arange(n) == i).double()
        sums, _ = clipped(params, x, y, one_hot, 1e9)  # C so large nothing is clipped
        for key, value in expected.items():
            torch.testing.assert_close(sums[key], value, rtol=1e-10, atol=1e-12)
        flat = torch.cat([v.flatten() for v in expected.values()])
        torch.testing.assert_close(norms[i], flat.norm(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(_cases()))
def test_clipping_scales_each_gradient_to_norm_c(name: str) -> None:
    model, loss, x, y = _cases()[name]()
    clipped = ClippedGradientSum(model, loss)
    params = parameters_of(model)
    n = y.shape[0]
    _, norms = clipped(params, x, y, torch.ones(n, dtype=torch.float64), 1e9)
    c = float(norms.min()) / 2  # every example is clipped
    for i in range(n):
        one_hot = (torch.arange(n) == i).double()
        sums, _ = clipped(params, x, y, one_hot, c)
        total = torch.cat([v.flatten() for v in sums.values()]).norm()
        assert float(total) == pytest.approx(c, rel=1e-9)


def test_sequential_models_go_layer_by_layer_and_others_through_vmap() -> None:
    for model in (logistic_regression(3), mlp(3), small_cnn(), _layernorm_mlp()):
        assert ClippedGradientSum(model, bce).layer_by_layer
    assert not ClippedGradientSum(_Residual(), bce).layer_by_layer


def _layernorm_mlp() -> nn.Module:
    """A Sequential with a layer (LayerNorm) that has no dedicated rule: vjp fallback."""
    return nn.Sequential(nn.Linear(7, 6), nn.LayerNorm(6), nn.Tanh(), nn.Linear(6, 1))


class _Residual(nn.Module):
    """A user's own module, not a Sequential: the generic vmap(grad) path."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(7, 7)
        self.head = nn.Linear(7, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(x + torch.tanh(self.inner(x)))


def _distance(a: dict[str, Tensor], b: dict[str, Tensor]) -> Tensor:
    return torch.cat([(a[k] - b[k]).flatten() for k in a]).norm()


def _moves_by_removal(
    clipped: ClippedGradientSum, x: Tensor, y: Tensor, clip: float
) -> tuple[Tensor, Tensor, Tensor]:
    """How far the clipped sum moves when each example in turn is removed from the batch,
    how far when it is only masked, and the raw norms. Removal is the neighbouring
    relation; a masked example still takes part in the forward pass, so masking alone
    cannot see a model that mixes the examples of a batch."""
    params = parameters_of(clipped.model)
    full = torch.ones(len(x), dtype=torch.float64)
    total, norms = clipped(params, x, y, full, clip)
    removed, masked = [], []
    for i in range(len(x)):
        kept = torch.arange(len(x)) != i
        if kept.any():
            without, _ = clipped(params, x[kept], y[kept], full[kept], clip)
        else:  # the empty batch
            without = {k: torch.zeros_like(v) for k, v in total.items()}
        hidden, _ = clipped(params, x, y, kept.double(), clip)
        removed.append(_distance(total, without))
        masked.append(_distance(total, hidden))
    return torch.stack(removed), torch.stack(masked), norms


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 12),
    scale=st.floats(1e-3, 1e3),
    clip=st.floats(1e-3, 1e2),
    kind=st.sampled_from(["logistic", "mlp", "layernorm_mlp", "residual"]),
)
def test_removing_any_example_moves_the_clipped_sum_by_at_most_c(
    seed: int, batch: int, scale: float, clip: float, kind: str
) -> None:
    """The DP-SGD sensitivity: each example's contribution has norm ≤ C, whatever the
    data scale, batch, clipping bound or model."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = {
        "logistic": logistic_regression(7),
        "mlp": mlp(7, (5,)),
        "layernorm_mlp": _layernorm_mlp(),
        "residual": _Residual(),
    }
    model = model[kind].double()
    x = scale * torch.randn(batch, 7, generator=g, dtype=torch.float64)
    y = (torch.rand(batch, generator=g, dtype=torch.float64) < 0.5).double()
    removed, masked, _ = _moves_by_removal(ClippedGradientSum(model, bce), x, y, clip)
    assert bool((removed <= clip * (1 + 1e-9)).all())
    assert bool((masked <= clip * (1 + 1e-9)).all())


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 6),
    scale=st.floats(1e-2, 1e2),
    clip=st.floats(1e-3, 1e2),
)
def test_cnn_clipping_bounds_each_example_contribution(
    seed: int, batch: int, scale: float, clip: float
) -> None:
    """The same sensitivity property through the Conv2d and GroupNorm rules."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = small_cnn(3, 8, 2, widths=(4,), groups=2).double()
    x = scale * torch.randn(batch, 3, 8, 8, generator=g, dtype=torch.float64)
    y = torch.randint(0, 2, (batch,), generator=g)
    clipped = ClippedGradientSum(model, cross_entropy)
    removed, masked, norms = _moves_by_removal(clipped, x, y, clip)
    for moved in (removed, masked):
        assert bool((moved <= clip * (1 + 1e-9)).all())
        assert moved.tolist() == pytest.approx(norms.clamp(max=clip).tolist(), rel=1e-6, abs=1e-12)


class _CentreOverBatch(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x - x.mean(0)


def _centred_mlp() -> nn.Module:
    """Passes the type check (no BatchNorm) but every output depends on the batch mean."""
    return nn.Sequential(nn.Linear(4, 4), _CentreOverBatch(), nn.Tanh(), nn.Linear(4, 1)).double()


def _outlier_batch() -> tuple[Tensor, Tensor]:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x[0] = 50.0
    return x, torch.ones(8, dtype=torch.float64)


def test_masking_hides_what_removing_a_record_does_to_a_model_that_mixes_examples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Why the clipping tests remove records and why mixing models are refused: without
    the check, removing one outlier moves the clipped sum by several C, and masking it
    shows exactly C."""
    monkeypatch.setattr("dpfl.local.clipping.check_per_example", lambda *_: None)
    torch.manual_seed(0)
    x, y = _outlier_batch()
    clip = 1e-3
    removed, masked, _ = _moves_by_removal(ClippedGradientSum(_centred_mlp(), bce), x, y, clip)
    assert float(removed[0]) > 5 * clip
    assert float(masked[0]) == pytest.approx(clip, rel=1e-9)


@pytest.mark.parametrize("stacked", [False, True])
def test_a_model_that_mixes_examples_is_refused_on_its_first_batch(stacked: bool) -> None:
    torch.manual_seed(0)
    model = _centred_mlp()
    clipped = ClippedGradientSum(model, bce)  # the types alone give nothing away
    x, y = _outlier_batch()
    params, mask = parameters_of(model), torch.ones(8, dtype=torch.float64)
    with pytest.raises(MixesExamplesError, match="mixes the examples"):
        if stacked:
            members = 2
            vmap(partial(clipped, under_vmap=True), in_dims=(0, 0, 0, 0, None))(
                stack([params] * members),
                *(t.expand(members, *t.shape) for t in (x, y, mask)),
                1.0,
            )
        else:
            clipped(params, x, y, mask, 1.0)


def _stacked_batch(
    dtype: torch.dtype, features: int, classes: int, members: int = 3, width: int = 11
) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(members * width + classes)
    x = torch.randn(members, width, features, generator=g, dtype=dtype) * 2
    y = torch.randint(0, classes, (members, width), generator=g)
    mask = (torch.rand(members, width, generator=g) < 0.8).to(dtype)
    return x, y, mask


def _vmap_route(
    clipped: ClippedGradientSum, params: dict[str, Tensor], *batch: Tensor, clip: float
) -> tuple[dict[str, Tensor], Tensor]:
    mapped = vmap(partial(clipped, under_vmap=True), in_dims=(0, 0, 0, 0, None))
    result: tuple[dict[str, Tensor], Tensor] = mapped(params, *batch, clip)
    return result


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "kind", ["bce", "bce_no_bias", "cross_entropy", "focal", "weighted_bce", "bce_huge_c"]
)
def test_stacked_logistic_regression_is_vmaps_sum_with_each_members_own_bits(
    kind: str, dtype: torch.dtype
) -> None:
    """The direct route for a lone nn.Linear: every member's sum and norms are those of
    `vmap` over the per-member call (to rounding), and bit for bit the same whether the
    member is stacked with others, at any position, or computed beside a masked twin (a
    hospital alone gets the simulator's bits)."""
    torch.manual_seed(0)
    classes = 4 if kind == "cross_entropy" else 2
    loss = {"cross_entropy": cross_entropy, "focal": focal(), "weighted_bce": weighted_bce(3.0)}
    clip = 1e9 if kind == "bce_huge_c" else 0.5
    # (7, 22) and (7, 30): float32 shapes whose batched matmul depends on the position
    for width, features in ((1, 9), (7, 9), (40, 9), (7, 22), (7, 30)):
        model = (
            nn.Linear(features, 1, bias=False)
            if kind == "bce_no_bias"
            else logistic_regression(features, classes)
        ).to(dtype)
        clipped = ClippedGradientSum(model, loss.get(kind, bce))
        params = {k: v + torch.randn_like(v) for k, v in stack([parameters_of(model)] * 3).items()}
        batch = _stacked_batch(dtype, features, classes, width=width)
        sums, norms = clipped.stacked(params, *batch, clip)
        expected, expected_norms = _vmap_route(clipped, params, *batch, clip=clip)
        torch.testing.assert_close(norms, expected_norms)
        assert sums.keys() == expected.keys()
        for name in sums:
            torch.testing.assert_close(sums[name], expected[name])
        for j in range(3):
            order = [j, *(i for i in range(3) if i != j)]  # member j first, then the others
            moved, _ = clipped.stacked(
                {k: v[order] for k, v in params.items()}, *(t[order] for t in batch), clip
            )
            twin = [j, j]
            alone, _ = clipped.stacked(
                {k: v[twin] for k, v in params.items()},
                batch[0][twin],
                batch[1][twin],
                batch[2][twin] * torch.tensor([[1.0], [0.0]], dtype=dtype),
                clip,
            )
            for name in sums:
                assert torch.equal(moved[name][0], sums[name][j]), name
                assert torch.equal(alone[name][0], sums[name][j]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["bce", "bce_no_bias", "cross_entropy"])
def test_input_norms_computed_once_per_dataset_give_the_bits_of_the_batch(
    kind: str, dtype: torch.dtype
) -> None:
    """DP-SGD computes ‖(x_i, 1)‖ once per run for every record and gathers it with the
    batches: the same bits as from the batch itself."""
    torch.manual_seed(0)
    classes = 4 if kind == "cross_entropy" else 2
    model = (
        nn.Linear(9, 1, bias=False) if kind == "bce_no_bias" else logistic_regression(9, classes)
    ).to(dtype)
    clipped = ClippedGradientSum(model, cross_entropy if kind == "cross_entropy" else bce)
    params = {k: v + torch.randn_like(v) for k, v in stack([parameters_of(model)] * 3).items()}
    g = torch.Generator().manual_seed(1)
    records = torch.randn(200, 9, generator=g, dtype=dtype) * 3
    labels = torch.randint(0, classes, (200,), generator=g)
    rows = torch.randint(0, 200, (3, 24), generator=g)
    mask = (torch.rand(3, 24, generator=g) < 0.7).to(dtype)
    norms = clipped.input_norms(params, records)
    assert norms is not None and norms.shape == (200,)
    gathered = clipped.stacked(
        params, records[rows], labels[rows], mask, 0.5, input_norms=norms[rows]
    )
    direct = clipped.stacked(params, records[rows], labels[rows], mask, 0.5)
    assert torch.equal(gathered[1], direct[1])
    assert all(torch.equal(gathered[0][k], direct[0][k]) for k in direct[0])
    other = mlp(9, (3,)).to(dtype)
    assert ClippedGradientSum(other, bce).input_norms(parameters_of(other), records) is None


def test_the_direct_route_is_taken_only_for_a_plain_linear_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    direct = []
    original = ClippedGradientSum._stacked_linear

    def counting(self: ClippedGradientSum, *args: object) -> object:
        direct.append(type(self.model))
        return original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ClippedGradientSum, "_stacked_linear", counting)

    class Doubled(nn.Linear):  # a subclass may compute something else
        def forward(self, x: Tensor) -> Tensor:
            return 2 * super().forward(x)

    batch = _stacked_batch(torch.float64, 5, 2)
    for model in (logistic_regression(5), Doubled(5, 1), mlp(5, (3,))):
        model = model.double()
        clipped = ClippedGradientSum(model, bce)
        clipped.stacked(stack([parameters_of(model)] * 3), *batch, 1.0)
    assert direct == [nn.Linear]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "kind", ["bce", "weighted_bce", "cross_entropy", "focal", "focal_gamma_0", "focal_gamma_1.5"]
)
def test_closed_form_output_gradients_are_autograds(kind: str, dtype: torch.dtype) -> None:
    """`losses.output_gradient` against autograd of the loss, including logits far in
    both tails (where σ saturates), and with each example's bits wherever it sits."""
    loss = {
        "bce": bce,
        "weighted_bce": weighted_bce(3.0, 0.5),
        "cross_entropy": cross_entropy,
        "focal": focal(0.75, 2.0),
        "focal_gamma_0": focal(0.25, 0.0),
        "focal_gamma_1.5": focal(0.6, 1.5),
    }[kind]
    closed_form = output_gradient(loss)
    assert closed_form is not None
    classes = 4 if kind == "cross_entropy" else 1
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 37, classes, generator=g, dtype=torch.float64) * 6
    z[0, :4] = torch.tensor([-800.0, -60.0, 60.0, 800.0]).unsqueeze(1)
    y = torch.randint(0, max(classes, 2), (3, 37), generator=g)
    leaf = z.detach().requires_grad_()
    (expected,) = torch.autograd.grad(loss(leaf.reshape(-1, classes), y.reshape(-1)).sum(), leaf)
    got = closed_form(z.to(dtype), y)
    assert got.shape == z.shape and got.dtype == dtype
    torch.testing.assert_close(got, expected.to(dtype), rtol=1e-5, atol=1e-6)
    if dtype == torch.float64:
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)
    for member in range(3):  # alone, and every example by itself (the scalar kernels)
        alone = closed_form(z[member : member + 1].to(dtype), y[member : member + 1])
        assert torch.equal(alone[0], got[member])
        for i in range(0, 37, 5):
            one = closed_form(
                z[member : member + 1, i : i + 1].to(dtype), y[member : member + 1, i : i + 1]
            )
            assert torch.equal(one.reshape(-1), got[member, i].reshape(-1))


def test_losses_without_a_closed_form_have_none() -> None:
    assert output_gradient(lambda z, t: bce(z, t) ** 2) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["bce", "bce_no_bias", "cross_entropy", "focal"])
def test_one_member_of_logistic_regression_gives_the_bits_of_the_layer_rules(
    kind: str, dtype: torch.dtype
) -> None:
    """A lone nn.Linear skips the layer-by-layer bookkeeping, not its operations."""
    torch.manual_seed(0)
    classes = 4 if kind == "cross_entropy" else 2
    model = (
        nn.Linear(9, 1, bias=False) if kind == "bce_no_bias" else logistic_regression(9, classes)
    ).to(dtype)
    loss = {"cross_entropy": cross_entropy, "focal": focal()}.get(kind, bce)
    clipped = ClippedGradientSum(model, loss)
    assert clipped._layers is not None
    params = {k: v + torch.randn_like(v) for k, v in parameters_of(model).items()}
    x, y, mask = (t[0] for t in _stacked_batch(dtype, 9, classes, members=1, width=23))
    for clip in (0.5, 1e9):
        sums, norms = clipped(params, x, y, mask, clip)
        expected, expected_norms = clipped._layer_by_layer(
            clipped._layers, params, x, y, mask, clip, False
        )
        assert torch.equal(norms, expected_norms)
        assert all(torch.equal(sums[k], expected[k]) for k in expected)


def test_only_dense_inputs_to_models_without_convolutions_are_stacked() -> None:
    """Members of a CNN run one by one (vmap would make its convolutions grouped and its
    batches padded); MLPs and logistic regression share one stacked call."""
    dense, sparse = torch.zeros(2, 7), torch.zeros(2, 7).to_sparse()
    assert ClippedGradientSum(mlp(7, (5,)), bce).stacks_members(dense, 16)
    assert ClippedGradientSum(logistic_regression(7), bce).stacks_members(dense, 16)
    assert ClippedGradientSum(_layernorm_mlp(), bce).stacks_members(dense, 16)
    assert not ClippedGradientSum(mlp(7, (5,)), bce).stacks_members(sparse, 16)
    cnn = small_cnn(3, 8, 2, widths=(4,), groups=2)
    assert not ClippedGradientSum(cnn, cross_entropy).stacks_members(torch.zeros(2, 3, 8, 8), 16)


def test_a_model_for_ghost_clipping_is_stacked_only_while_its_batch_fits_vmap() -> None:
    """A model that is no nn.Sequential stacks its members under `vmap(grad)` while one
    batch's per-example gradients (its public width × parameters) fit `VMAP_BYTES`, and
    trains them one by one by ghost clipping above it; an nn.Sequential MLP always stacks."""
    wrapped, dense = ClippedGradientSum(_Wrapped(), bce), torch.zeros(2, 7)
    fits = VMAP_BYTES // (8 * dense.element_size())  # rows whose gradients fit
    assert wrapped.stacks_members(dense, fits)
    assert not wrapped.stacks_members(dense, fits + 1)
    assert ClippedGradientSum(mlp(7, (5,)), bce).stacks_members(dense, 10**9)


class _Wrapped(nn.Module):
    """Logistic regression that is neither an `nn.Linear` nor an `nn.Sequential`: the
    generic `vmap(grad)` route."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = logistic_regression(7)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.inner(x)
        return out


@pytest.mark.parametrize("route", ["direct", "layers", "mlp", "generic", "grouped"])
def test_a_non_finite_per_example_gradient_is_zeroed_not_summed(route: str) -> None:
    """The audit's record: ∞ in one input weight and a record with an exact 0 in that
    feature, whose gradient is NaN (0·∞). Its contribution is zeroed: the clipped sum is
    the other records' alone and finite (it used to be NaN, whatever the noise)."""
    torch.manual_seed(0)
    model = {"mlp": mlp(7, (5,)), "generic": _Wrapped()}.get(route, logistic_regression(7))
    model = model.double()
    params = parameters_of(model)
    first = next(iter(params))  # the first layer's weight
    params[first][..., 2] = torch.inf
    g = torch.Generator().manual_seed(3)
    x, y = _binary(6, 7, g)
    x[0, 2] = 0.0  # the audit's record
    clipped, mask = ClippedGradientSum(model, bce), torch.ones(6, dtype=torch.float64)
    if route == "direct":
        sums, norms = clipped.stacked(stack([params]), x[None], y[None], mask[None], 1.0)
        sums, norms = {k: v[0] for k, v in sums.items()}, norms[0]
    elif route == "grouped":
        sums, norms = clipped.grouped(params, x, y, torch.arange(6), 1.0)
    else:
        sums, norms = clipped(params, x, y, mask, 1.0)
    assert not torch.isfinite(norms[0])  # the record's gradient is not finite
    kept = torch.isfinite(norms)
    if route == "grouped":
        alone, _ = clipped.grouped(params, x[kept], y[kept], torch.arange(int(kept.sum())), 1.0)
    else:
        alone, _ = clipped(params, x[kept], y[kept], mask[kept], 1.0)
    for name, value in sums.items():
        assert torch.isfinite(value).all(), name
        assert torch.allclose(value, alone[name], rtol=0, atol=1e-12), name


def test_a_convolutions_non_finite_per_example_gradient_is_zeroed() -> None:
    torch.manual_seed(0)
    model = small_cnn(3, 8, 3, widths=(4,), groups=2).double()
    params = parameters_of(model)
    params[next(iter(params))][0, 0, 0, 0] = torch.inf
    x = torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    x[0] = 0.0  # 0·∞ at every position of its first channel
    sums, norms = ClippedGradientSum(model, cross_entropy)(
        params, x, torch.tensor([0, 1, 2]), torch.ones(3, dtype=torch.float64), 1.0
    )
    assert not torch.isfinite(norms[0])
    assert all(torch.isfinite(v).all() for v in sums.values())
