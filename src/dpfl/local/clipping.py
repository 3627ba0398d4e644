"""Sums of per-example gradients clipped to L2 norm C, computed with `torch.func`.

Each example's gradient over *all* parameters is scaled by min(1, C/‖g_i‖), so adding or
removing one example moves the sum by at most C: the sensitivity that DP-SGD's Gaussian
noise is calibrated to. Two ways to get there here, and a third in `dpfl.local.ghost`
(ghost clipping: the norms without per-example gradients, for models that are not an
`nn.Sequential`, or whose children this module would take by `vmap` whole; see
`ClippedGradientSum.ghost`):

* generic: `vmap(grad(loss ∘ functional_call))`, one gradient per example, for any
  module whose examples do not interact (see `dpfl.models.check_per_example`);
* layer by layer, for an `nn.Linear` or an `nn.Sequential` (logistic regression, MLPs,
  the small CNN): one batched forward and one batched backward give, for each layer with
  parameters, its input a and the gradient δ of the loss at its output (as gradients with
  respect to zero "probes" added to the outputs). Each layer's per-example gradient then
  follows from (a_i, δ_i) alone:

  - `nn.Linear`: the gradient of z = W a + b is the outer product δ aᵀ, so its squared
    norm is ‖δ‖²(‖a‖² + 1) and the clipped sum is (c ⊙ Δ)ᵀ A. No per-example weight
    gradient is formed: for Kerkouche's 24,428-wide input this avoids 300 × 4.9M
    gradient entries and lets the input stay a sparse COO tensor.
  - `nn.Conv2d`: the weight gradient of one convolution grouped by example.
  - `nn.GroupNorm`: Σ over positions of δ_i ⊙ â_i (weight) and of δ_i (bias), with â
    the normalised input.
  - any other layer: `vmap` over examples of the layer's own `vjp`.

  Only the layers with parameters get per-example work; activations, pooling and the
  input gradients of the backward pass run batched, as in plain SGD (a max pooling on
  the CPU channels-last, `_ChannelsLastMaxPool`: the same bits, several times faster).

A `mask` marks real examples (1) and padding (0), so batches of different sizes can be
stacked and mapped over with `vmap`; a padded row contributes exactly zero. `stacked`
computes that map: with `vmap` in general, and for a lone `nn.Linear` (logistic
regression) with the rule written out on the stacked tensors (the loss's gradient in
its logits in closed form where it has one, `losses.output_gradient`), at a fraction of
`vmap`'s per-call cost and with the same bits for a member alone or in any stack. Masking is
not removal: both rules above assume that removing an example from the batch leaves the
others' gradients unchanged, which `check_per_example` tests on the first batch of each
input shape.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vjp, vmap
from torch.nn.modules.utils import _pair

from dpfl.local.ghost import GhostClipping, Unsupported
from dpfl.local.ghost import conv_weight_gradients as _conv_weight_gradients
from dpfl.local.losses import Loss, couples_examples, output_gradient
from dpfl.models import check_per_example

Params = dict[str, Tensor]

_CONVOLUTIONS = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
)

__all__ = ["ClippedGradientSum", "Params", "column_major_copy", "column_major_weights"]


VMAP_BYTES = 1 << 30
"""Above this size of a batch's per-example gradients (1 GiB), a model whose layers
without a ghost rule hold most of its parameters still takes ghost clipping (those
layers by `vmap` alone), rather than `vmap(grad)` of the whole model."""

_CHECKED: weakref.WeakKeyDictionary[nn.Module, set[tuple[int, ...]]] = weakref.WeakKeyDictionary()
"""Per model, the input shapes `check_per_example` passed: a property of the architecture,
so checked once per process, not once per trainer (engines build one every round)."""


class ClippedGradientSum:
    """`(params, x, y, mask, clip_norm) -> (Σ_i mask_i·clip(g_i), ‖g_i‖)` for one model."""

    def __init__(self, model: nn.Module, loss: Loss) -> None:
        check_per_example(model)
        self.model = model
        self.loss = loss
        self._closed_form = output_gradient(loss)
        self._coupled = couples_examples(loss)
        self._layers: list[tuple[str, nn.Module]] | None = None
        self._layers = _layers(model)
        ghostly = self._layers is None or _mostly_vmapped(self._layers)
        self._ghost = GhostClipping(model, loss) if ghostly else None
        self._probe_shapes: dict[tuple[int, ...], list[torch.Size]] = {}

    @property
    def layer_by_layer(self) -> bool:
        """Whether gradients come from per-layer rules rather than `vmap(grad)` of the model."""
        return self._layers is not None

    def ghost(self, x: Tensor) -> bool:
        """Whether a batch like `x` takes ghost clipping (`dpfl.local.ghost`): a model that
        is not an `nn.Sequential` (nor a lone `nn.Linear`), or an `nn.Sequential` whose
        layers without a layer-by-layer rule hold most of its parameters (a ResNet as one
        of its children), on dense inputs, whose layers without a ghost rule (taken by
        `vmap` alone) hold at most half its parameters, or whose per-example gradients
        would take more than `VMAP_BYTES` under `vmap(grad)`. Not inside `vmap`."""
        if self._ghost is None or not self._ghost.applies or x.is_sparse:
            return False
        total = sum(p.numel() for p in self.model.parameters())
        if 2 * self._ghost.uncovered <= total:
            return True
        return total * x.shape[0] * x.element_size() > VMAP_BYTES

    def __call__(
        self,
        params: Params,
        x: Tensor,
        y: Tensor,
        mask: Tensor,
        clip_norm: float,
        *,
        under_vmap: bool = False,
    ) -> tuple[Params, Tensor]:
        """`under_vmap` must be set when this call is mapped over stacked members: the
        layer-by-layer backward pass then uses `torch.func.grad` instead of the lighter
        `torch.autograd.grad`, which `vmap` does not support."""
        self._check(tuple(x.shape[1:]))
        if self._coupled:
            return self._batch_gradient(params, x, y, mask, clip_norm)
        if self._layers is None and x.is_sparse:
            raise ValueError("sparse inputs need an nn.Linear first layer in an nn.Sequential")
        if not under_vmap and self.ghost(x):
            try:
                assert self._ghost is not None
                return self._ghost(
                    params, x, y, partial(_clip_factor, mask=mask, clip_norm=clip_norm)
                )
            except Unsupported:  # the model's forward pass escapes the hooks: for good
                self._ghost = None
        if self._layers is None:
            return self._generic(params, x, y, mask, clip_norm)
        return self._layer_by_layer(self._layers, params, x, y, mask, clip_norm, under_vmap)

    def grouped(
        self, params: Params, x: Tensor, y: Tensor, groups: Tensor, clip_norm: float
    ) -> tuple[Params, Tensor]:
        """`(Σ_u clip(ḡ_u), ‖ḡ_u‖)` over the units (patients) of a batch: ḡ_u is the mean
        gradient of unit u's records (the gradient of their mean loss), clipped to C as
        one, so one unit moves the sum by at most C whatever its record count. `groups`
        (int64, one per record) numbers the batch's units 0..U−1; dense inputs only."""
        self._check(tuple(x.shape[1:]))
        if self._coupled:
            raise ValueError("a loss that couples a batch's records cannot be clipped by patient")
        if x.is_sparse:
            raise ValueError("patient-level clipping needs dense inputs")
        units = int(groups.max()) + 1
        counts = torch.bincount(groups, minlength=units).to(x.dtype)

        def one(p: Params, xi: Tensor, yi: Tensor) -> Tensor:
            out = functional_call(self.model, p, (xi.unsqueeze(0),))
            return self.loss(out, yi.unsqueeze(0)).sum()

        grads: Params = vmap(grad(one), in_dims=(None, 0, 0))(params, x, y)
        means = {
            name: torch.zeros(units, *g.shape[1:], dtype=g.dtype, device=g.device)
            .index_add_(0, groups, g)
            .div_(counts.reshape(-1, *[1] * (g.dim() - 1)))
            for name, g in grads.items()
        }
        norms = torch.stack([_row_norms(g) for g in means.values()]).norm(dim=0)
        factor = _clip_factor(norms, torch.ones_like(norms), clip_norm)
        return {
            name: torch.einsum("u,u...->...", factor, _zeroed(g)) for name, g in means.items()
        }, norms

    def stacked(
        self,
        params: Params,
        x: Tensor,
        y: Tensor,
        mask: Tensor,
        clip_norm: float,
        *,
        input_norms: Tensor | None = None,
    ) -> tuple[Params, Tensor]:
        """`vmap` of this call over members stacked on axis 0 of params, x, y and mask:
        each member's clipped sum on its own batch, as one computation.

        A lone `nn.Linear` on (members, batch, features) inputs takes a direct route (the
        outer-product rule on stacked tensors, without `vmap`'s per-call set-up, most of a
        step's time for logistic regression on small batches) whose every operation is
        elementwise or reduces within one member, so that a member's sum has the same bits
        whatever else is stacked with it and wherever it sits in the stack. There
        `input_norms` (members, batch), if given, are `input_norms(params, ·)` of the
        batches' records, computed once per dataset and gathered with them."""
        if self._coupled or not self._direct_applies(params, x):
            return self._vmapped(params, x, y, mask, clip_norm)
        self._check(tuple(x.shape[2:]))
        return self._stacked_linear(params, x, y, mask, clip_norm, input_norms)

    def stacks_members(self, x: Tensor, rows: int) -> bool:
        """Whether members (silos, trials) training on inputs like `x` are best computed as
        one `stacked` call rather than one by one: yes for dense inputs to models without
        convolutions (logistic regression, MLPs), whose small steps are mostly per-call
        overhead that one call for all members shares. Not for convolutions: vmapped over
        members they become grouped ones, and a stack must pad every batch to a fixed width
        (and twin a lone member, see `dpsgd._with_twin`) for a member's bits not to depend
        on its stack, which costs more than the shared overhead saves. Nor for a model
        with a module that declares `trains_unstacked` (the scattering front of
        `dpfl.models.scattering`, which memoises its outputs by the input's bytes: under
        `vmap` it would see no bytes and transform every batch again). Nor for a model
        that ghost clipping takes whose per-example gradients for `rows` records (a batch's
        public width) would take more than `VMAP_BYTES` under `vmap`: a large model of a
        user's own without convolutions (a tabular transformer). From the width, not the
        members' count, so that a member alone (a deployed hospital) and in a stack take
        the same route and get the same bits."""
        if x.is_sparse:
            return False
        if self._ghost is not None and self._ghost.applies:
            total = sum(p.numel() for p in self.model.parameters())
            if total * rows * x.element_size() > VMAP_BYTES:
                return False
        return not any(
            isinstance(m, _CONVOLUTIONS) or getattr(m, "trains_unstacked", False) is True
            for m in self.model.modules()
        )

    def input_norms(self, params: Params, x: Tensor) -> Tensor | None:
        """Where `stacked` takes its direct route (a lone `nn.Linear` with these parameter
        names): each record's ‖(x_i, 1)‖ (‖x_i‖ without a bias) for records x (records ×
        features), the factor of a per-example gradient's norm that does not change from
        step to step (‖δ_i x̃_iᵀ‖ = ‖δ_i‖·‖x̃_i‖); None elsewhere."""
        if x.dim() != 2 or not self._direct_applies(params, x.unsqueeze(0)):
            return None
        return _input_norms(x, "bias" in params)

    def _vmapped(
        self, params: Params, x: Tensor, y: Tensor, mask: Tensor, clip_norm: float
    ) -> tuple[Params, Tensor]:
        mapped = vmap(partial(self, under_vmap=True), in_dims=(0, 0, 0, 0, None))
        result: tuple[Params, Tensor] = mapped(params, x, y, mask, clip_norm)
        return result

    def _batch_gradient(
        self, params: Params, x: Tensor, y: Tensor, mask: Tensor, clip_norm: float
    ) -> tuple[Params, Tensor]:
        """The gradient of a coupled loss (`losses.couples_examples`, Cox's) summed over
        the batch's real rows. It has no per-example gradients to clip, so it is for
        non-private runs (C = ∞) only; the norms returned are NaN: there are none."""
        if math.isfinite(clip_norm):
            raise ValueError(
                "this loss couples the examples of a batch (Cox's risk sets): per-example "
                "clipping does not bound one record's influence, so it cannot be trained "
                "with DP; use a loss that is a sum over records (logistic_hazard)"
            )
        if x.is_sparse:
            raise ValueError("a coupled loss needs dense inputs")

        def total(p: Params) -> Tensor:
            loss = cast(Callable[[Tensor, Tensor, Tensor], Tensor], self.loss)
            return loss(functional_call(self.model, p, (x,)), y, mask).sum()

        sums: Params = grad(total)(params)
        return sums, torch.full(mask.shape, math.nan, dtype=mask.dtype, device=mask.device)

    def _loss_sum(self, z: Tensor, y: Tensor) -> Tensor:
        return self.loss(z, y).sum()

    def _check(self, example_shape: tuple[int, ...]) -> None:
        checked = _CHECKED.setdefault(self.model, set())
        if example_shape not in checked:
            check_per_example(self.model, example_shape)
            checked.add(example_shape)

    def _direct_applies(self, params: Params, x: Tensor) -> bool:
        """A plain `nn.Linear` (not a subclass, whose forward may differ) on dense
        (members, batch, features) inputs, with its own parameter names."""
        return (
            type(self.model) is nn.Linear
            and not x.is_sparse
            and x.dim() == 3
            and set(params) in ({"weight"}, {"weight", "bias"})
        )

    def _stacked_linear(
        self,
        params: Params,
        x: Tensor,
        y: Tensor,
        mask: Tensor,
        clip_norm: float,
        input_norms: Tensor | None = None,
    ) -> tuple[Params, Tensor]:
        """`_layer_by_layer` for a lone `nn.Linear`, on stacked members without `vmap`:
        z = x Wᵀ + b, δ = ∂ℓ/∂z, then the outer-product rule of the module docstring,
        member by member in one batch. Every product of x with a parameter is written as
        elementwise products and a sum within one member: torch's batched matmul picks
        other kernels (other bits) by member count, position and alignment in the stack
        (for z: float32, several outputs, a batch width not a multiple of 8)."""
        weight, bias = params["weight"], params.get("bias")
        if weight.shape[1] == 1:  # one output: products with the weight row, summed
            z = (x * weight).sum(2, keepdim=True)
        else:
            z = (x.unsqueeze(2) * weight.unsqueeze(1)).sum(3)
        if bias is not None:
            z.add_(bias.unsqueeze(1))
        delta = self._output_gradients(z, y)
        if input_norms is None:
            input_norms = _input_norms(x, bias is not None)
        # ‖δ_i x̃_iᵀ‖ = ‖δ_i‖·‖x̃_i‖; one output (logistic regression): ‖δ_i‖ = |δ_i|
        out_norms = (
            delta.squeeze(2).abs()
            if delta.shape[2] == 1
            else torch.linalg.vector_norm(delta, dim=2)
        )
        norms = out_norms.mul_(input_norms)
        scaled = _zeroed(delta.mul_(_scale(norms, mask, clip_norm).unsqueeze(2)))
        # Σ_i s_i x_iᵀ as products and a sum over the batch
        if scaled.shape[2] == 1:  # the same products and sum, without the outputs axis
            sums = {"weight": (scaled * x).sum(1).unsqueeze(1)}
        else:
            sums = {"weight": (scaled.unsqueeze(3) * x.unsqueeze(2)).sum(1)}
        if bias is not None:
            sums["bias"] = scaled.sum(1)
        return {name: sums[name] for name in params}, norms

    def _output_gradients(self, z: Tensor, y: Tensor) -> Tensor:
        """∂ℓ_i/∂z_i for stacked outputs z (members, batch, outputs): written out for the
        losses that have a closed form (`losses.output_gradient`: bce, weighted_bce,
        cross-entropy, focal; each member's rows with the same bits wherever they sit),
        else `vmap(grad)` of the loss. The result may be updated in place."""
        if self._closed_form is not None:
            return self._closed_form(z, y)
        delta: Tensor = vmap(grad(self._loss_sum))(z, y)
        return delta

    def _generic(
        self, params: Params, x: Tensor, y: Tensor, mask: Tensor, clip_norm: float
    ) -> tuple[Params, Tensor]:
        def one(p: Params, xi: Tensor, yi: Tensor) -> Tensor:
            out = functional_call(self.model, p, (xi.unsqueeze(0),))
            return self.loss(out, yi.unsqueeze(0)).sum()

        grads: Params = vmap(grad(one), in_dims=(None, 0, 0))(params, x, y)
        norms = torch.stack([_row_norms(g) for g in grads.values()]).norm(dim=0)
        factor = _clip_factor(norms, mask, clip_norm)
        return {
            name: torch.einsum("b,b...->...", factor, _zeroed(g)) for name, g in grads.items()
        }, norms

    def _layer_by_layer(
        self,
        layers: list[tuple[str, nn.Module]],
        params: Params,
        x: Tensor,
        y: Tensor,
        mask: Tensor,
        clip_norm: float,
        under_vmap: bool,
    ) -> tuple[Params, Tensor]:
        owned = [(prefix, module, _own(params, prefix)) for prefix, module in layers]

        def total_loss(probes: list[Tensor] | None) -> tuple[Tensor, list[Tensor]]:
            """Σ_i ℓ_i, with zero probes added to the outputs of the layers with parameters
            when given; also returns those layers' inputs and (without probes) outputs."""
            h, saved, probe = x, [], iter(probes or [])
            for _, module, own in owned:
                if not own:
                    h = _without_parameters(module, h, under_vmap)
                    continue
                saved.append(h)
                h = _forward(module, own, h)
                if probes is None:
                    saved.append(h if h.requires_grad else h.requires_grad_())
                else:
                    h = h + next(probe)
            return self.loss(h, y).sum(), saved

        if under_vmap:
            batch = y.shape[0]
            probes = [mask.new_zeros(()).expand(batch, *s) for s in self._shapes(owned, x)]
            deltas, inputs = grad(total_loss, has_aux=True)(probes)
        else:
            with torch.enable_grad():
                value, saved = total_loss(None)
                deltas = list(torch.autograd.grad(value, saved[1::2]))
            inputs = [a.detach() for a in saved[::2]]
        with_params = [(prefix, module, own) for prefix, module, own in owned if own]
        norms_sq = torch.zeros_like(mask)
        per_example: list[Params | None] = []
        for (_, module, own), a, delta in zip(with_params, inputs, deltas, strict=True):
            if _outer_product(module, a):
                bias = 1.0 if "bias" in own else 0.0
                norms_sq = norms_sq + delta.square().sum(1) * (_row_sq(a) + bias)
                per_example.append(None)
            else:
                layer_grads = _layer_gradients(module, own, a, delta)
                for g in layer_grads.values():
                    norms_sq = norms_sq + _row_norms(g).square()
                per_example.append(layer_grads)
        norms = norms_sq.sqrt()
        factor = _scale(norms, mask, clip_norm)
        sums: Params = {}
        for i, ((prefix, _, own), a, delta, grads) in enumerate(
            zip(with_params, inputs, deltas, per_example, strict=True)
        ):
            if grads is None:
                scaled = _zeroed(delta * factor.unsqueeze(1))
                if i:  # a hidden layer's input (the first's is the records: finite)
                    a = _zeroed(a)
                sums[prefix + "weight"] = (
                    _sparse_input_sum(a, scaled) if a.is_sparse else scaled.t() @ a
                )
                if "bias" in own:
                    sums[prefix + "bias"] = scaled.sum(0)
            else:
                for name, g in grads.items():
                    # Σ_i c_i g_i as one product: einsum's parsing costs more than it
                    terms = _zeroed(g.flatten(1))
                    sums[prefix + name] = (factor.nan_to_num(0.0) @ terms).view(g.shape[1:])
        return {name: sums[name] for name in params}, norms

    def _shapes(self, owned: list[tuple[str, nn.Module, Params]], x: Tensor) -> list[torch.Size]:
        """Per-example output shapes of the layers with parameters, from a one-example
        forward pass run once per input shape."""
        key = tuple(x.shape[1:])
        if key not in self._probe_shapes:
            shapes = []
            with torch.no_grad():
                h = x.index_select(0, torch.zeros(1, dtype=torch.long, device=x.device))
                for _, module, own in owned:
                    h = _forward(module, own, h) if own else module(h)
                    if own:
                        shapes.append(h.shape[1:])
            self._probe_shapes[key] = shapes
        return self._probe_shapes[key]


def _layers(model: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """(name prefix, layer) of a lone `nn.Linear` or an `nn.Sequential`; None otherwise."""
    if isinstance(model, nn.Linear):
        return [("", model)]
    if isinstance(model, nn.Sequential):
        return [(f"{name}.", module) for name, module in model.named_children()]
    return None


def _mostly_vmapped(layers: list[tuple[str, nn.Module]]) -> bool:
    """Whether the layers that `_layer_gradients` takes by `vmap` of their `vjp` (all but
    Linear, Conv2d and GroupNorm) hold most of the parameters: a Sequential of composite
    blocks, whose per-example gradients would then be materialised block by block."""
    counts = [
        (type(m) in (nn.Linear, nn.Conv2d, nn.GroupNorm), sum(p.numel() for p in m.parameters()))
        for _, m in layers
    ]
    vmapped = sum(n for ruled, n in counts if not ruled)
    return 2 * vmapped > sum(n for _, n in counts)


def column_major_weights(model: nn.Module, x: Tensor) -> list[str]:
    """The weights best held column-major (`Tensor.t()` contiguous) for inputs like `x`:
    a first `nn.Linear` fed a sparse input. Its forward product and its clipped sum
    (`_sparse_input_sum`, which comes out column-major) then run on contiguous rows, and
    the update adds tensors of one layout, with no strided add, divide or subtract: much
    faster for a wide sparse input, and the same bits either way."""
    layers = _layers(model)
    if not x.is_sparse or layers is None:
        return []
    owning = [(p, m) for p, m in layers if list(m.parameters())]
    first = owning[0] if owning else ("", None)
    return [first[0] + "weight"] if isinstance(first[1], nn.Linear) else []


_COPY_ROWS = 256
"""Rows copied at a time by `column_major_copy`."""


def column_major_copy(value: Tensor) -> Tensor:
    """A copy of `value` held column-major in its last two axes, copied `_COPY_ROWS` rows
    at a time: a whole-matrix copy into the other layout misses the cache on every
    write."""
    out = torch.empty(
        *value.shape[:-2], value.shape[-1], value.shape[-2], dtype=value.dtype, device=value.device
    )
    out = out.transpose(-1, -2)
    for start in range(0, value.shape[-2], _COPY_ROWS):
        rows = slice(start, start + _COPY_ROWS)
        out[..., rows, :].copy_(value[..., rows, :])
    return out


def _own(params: Params, prefix: str) -> Params:
    return {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}


def _forward(module: nn.Module, own: Params, h: Tensor) -> Tensor:
    if h.is_sparse and isinstance(module, nn.Linear):
        out: Tensor = torch.sparse.mm(h, own["weight"].t())
        return out + own["bias"] if "bias" in own else out
    # the forwards of these exact types, without functional_call's parameter swap
    if type(module) is nn.Linear:
        return F.linear(h, own["weight"], own.get("bias"))
    if type(module) is nn.Conv2d:
        convolved: Tensor = module._conv_forward(h, own["weight"], own.get("bias"))
        return convolved
    if type(module) is nn.GroupNorm and module.affine:
        return F.group_norm(h, module.num_groups, own["weight"], own["bias"], module.eps)
    result: Tensor = functional_call(module, own, (h,))
    return result


def _without_parameters(module: nn.Module, h: Tensor, under_vmap: bool) -> Tensor:
    """A layer without parameters on a batch; a max pooling of a 4-D batch on the CPU by
    `_ChannelsLastMaxPool` (outside `vmap`, which it does not support)."""
    if (
        type(module) is nn.MaxPool2d
        and not module.return_indices
        and h.dim() == 4
        and h.device.type == "cpu"
        and not under_vmap
    ):
        pooled: Tensor = _ChannelsLastMaxPool.apply(h, module)  # type: ignore[no-untyped-call]
        return pooled
    result: Tensor = module(h)
    return result


class _ChannelsLastMaxPool(torch.autograd.Function):
    """`nn.MaxPool2d` on a contiguous batch, computed channels-last and handed back
    contiguous, its backward torch's own on contiguous tensors. torch's CPU kernel for a
    channels-first batch took 4 ms for the small CNN's first pooling, channels-last 0.5
    ms (benchmarks/README.md): the same maxima and the same chosen positions, so the
    same gradients. Without the hand-written backward, autograd would hand the layers
    below a channels-last gradient, whose mixed-layout kernels cost more than this saves."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, module: nn.MaxPool2d) -> Tensor:
        kernel, stride, padding, dilation = (
            list(_pair(value))
            for value in (module.kernel_size, module.stride, module.padding, module.dilation)
        )
        pooled, positions = F.max_pool2d(
            h.contiguous(memory_format=torch.channels_last),
            kernel,
            stride,
            padding,
            dilation,
            ceil_mode=module.ceil_mode,
            return_indices=True,
        )
        ctx.save_for_backward(h, positions)
        ctx.settings = (kernel, stride, padding, dilation, module.ceil_mode)
        return pooled.contiguous()

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None]:
        h, positions = ctx.saved_tensors
        grad_in: Tensor = torch.ops.aten.max_pool2d_with_indices_backward(
            grad_out.contiguous(), h, *ctx.settings, positions.contiguous()
        )
        return grad_in, None


def _outer_product(module: nn.Module, a: Tensor) -> bool:
    """Linear layers on (batch, features) inputs: per-example gradients are rank one."""
    return isinstance(module, nn.Linear) and a.dim() == 2


def _layer_gradients(module: nn.Module, own: Params, a: Tensor, delta: Tensor) -> Params:
    """Per-example gradients of one layer's parameters from its inputs and output grads."""
    if (
        isinstance(module, nn.Conv2d)
        and module.padding_mode == "zeros"
        and not isinstance(module.padding, str)
    ):
        grads = {"weight": _conv_weight_gradients(module, a, delta)}
        if "bias" in own:
            grads["bias"] = delta.flatten(2).sum(2)
        return grads
    if isinstance(module, nn.GroupNorm) and module.affine:
        normalised = F.group_norm(a, module.num_groups, eps=module.eps)
        per_channel = (*a.shape[:2], -1)  # (batch, channels, positions): none for features
        return {
            "weight": (delta * normalised).reshape(per_channel).sum(2),
            "bias": delta.reshape(per_channel).sum(2),
        }

    def one(ai: Tensor, di: Tensor) -> Params:
        pull = vjp(lambda p: functional_call(module, p, (ai.unsqueeze(0),)), own)[1]
        grads: Params = pull(di.unsqueeze(0))[0]
        return grads

    result: Params = vmap(one)(a, delta)
    return result


def _sparse_input_sum(a: Tensor, scaled: Tensor) -> Tensor:
    """(c ⊙ Δ)ᵀ A for a sparse COO input A: each stored a_ij adds a_ij·(c ⊙ Δ)_i to row j
    of a zero [features, outputs] matrix, returned transposed (so column-major; see
    `clipping.column_major_weights`). The same sums as `torch.sparse.mm(Aᵀ, c ⊙ Δ)`,
    without re-sorting the transposed COO first as it does."""
    rows, features = a._indices()
    terms = scaled.index_select(0, rows).mul_(a._values().unsqueeze(1))
    total = scaled.new_zeros(a.shape[1], scaled.shape[1]).index_add_(0, features, terms)
    return total.t()


def _input_norms(x: Tensor, bias: bool) -> Tensor:
    """‖(x_i, 1)‖ with a bias, ‖x_i‖ without, over x's last axis (one row at a time, the
    same bits for a record wherever it sits)."""
    squares = x.square().sum(-1)
    return (squares.add_(1.0) if bias else squares).sqrt_()


def _row_sq(a: Tensor) -> Tensor:
    """‖a_i‖² for each row of a dense or sparse COO matrix."""
    if a.is_sparse:
        return torch.sparse.sum(a * a, dim=1).to_dense()
    return a.square().sum(1)


def _row_norms(g: Tensor) -> Tensor:
    """‖g_i‖ for each example i, without materialising g²."""
    norms: Tensor = torch.linalg.vector_norm(g.flatten(1), dim=1)
    return norms


def _zeroed(terms: Tensor) -> Tensor:
    """Per-example `terms` of the clipped sum, their NaN and ±∞ made 0, in place. An
    example whose gradient is not finite (NaN or ∞ anywhere: its norm is NaN or ∞) has a
    clip factor of 0 (`_clip_factor`; a NaN `_scale` where its terms are scaled before
    they are zeroed), and its terms here are then exactly 0, never 0·∞ = NaN: it is
    zeroed, not clipped. Not refused: a refusal, or a skipped step, would tell whether
    such a record was in the batch (the audit's record with an exact 0 where the model
    holds ∞); a zero moves the sum by at most C, as a clipped gradient does, so the
    declared event stays true and the sum finite. An example whose norm is finite has
    finite terms, left as they were: the same bits."""
    return terms.nan_to_num_(0.0, 0.0, 0.0)


def _clip_factor(norms: Tensor, mask: Tensor, clip_norm: float) -> Tensor:
    """`_scale`, 0 where ‖g_i‖ is not finite: the factor of a product with per-example
    terms (`factor @ g`), where a NaN factor would make 0·NaN of a zeroed term."""
    return _scale(norms, mask, clip_norm).nan_to_num(0.0)  # 1/∞ is 0 already


def _scale(norms: Tensor, mask: Tensor, clip_norm: float) -> Tensor:
    """mask_i · min(1, C/‖g_i‖): the per-example scale that bounds each contribution by C
    (C = ∞, nothing clipped: the mask itself, as the product by 1 would give); NaN where
    ‖g_i‖ is, whose product with the example's terms `_zeroed` makes 0. C/t is computed
    as torch computes a number over a tensor, (1/t)·C."""
    if clip_norm == math.inf:
        return mask
    return mask * torch.clamp((norms + 1e-12).reciprocal_().mul_(clip_norm), max=1.0)
