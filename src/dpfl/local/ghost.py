"""Per-example gradient norms without per-example gradients (ghost clipping), for any
module: ResNets, vision transformers, a user's own model that is not an `nn.Sequential`.

`vmap(grad)` holds batch × parameters numbers; for a ResNet-18 at batch 256 that is 2.9
G floats. Ghost clipping needs only what one backward pass sees: with forward hooks on
the layers that own parameters, each layer's input a, and (tensor hooks on its output)
the gradient δ of Σ_i ℓ_i at its output. Each example's squared gradient norm is a sum
over those layers of a term that follows from (a_i, δ_i) alone:

* `nn.Linear` on [B, d] or [B, T, d] inputs: the weight gradient is δ_iᵀ a_i, whose
  squared norm is the Frobenius inner product ⟨a_i a_iᵀ, δ_i δ_iᵀ⟩ (Li et al. 2022,
  "ghost norm", B·T² numbers) or the per-example gradient itself (B·d·p numbers),
  whichever is smaller: Bu et al. 2022's mixed ghost clipping, chosen per layer by shape;
* `nn.Conv2d`: the same on the unfolded input (T the output positions, d the patch size),
  or the per-example weight gradients from one grouped convolution;
* `nn.GroupNorm`, `nn.LayerNorm`: the per-example gradients directly (δ ⊙ â summed over
  positions: one number per channel);
* `nn.Embedding`: ghost by token equality, Σ_{t,s} [id_t = id_s] δ_t·δ_s;
* any other layer with parameters of its own: `vmap` over examples of that layer's `vjp`.

The clipped sum Σ_i c_i g_i, with c_i = min(1, C/‖g_i‖), then follows by book-keeping
(Bu et al. 2023): from the same (a_i, δ_i), as one batched weight gradient with each
δ_i scaled by c_i ((c ⊙ Δ)ᵀ A for a Linear layer, torch's convolution weight gradient for
a Conv2d), or c · (the per-example gradients) where they were formed; no second backward
pass, at the cost of holding each layer's δ until the norms are known. With
`book_keeping=False`, the standard two-pass ghost clipping: a second backward pass
through the same graph, of Σ_i c_i·ℓ_i with the c_i held constant. The first pass asks
only for the gradients of the first layers' parameters, so autograd computes no other
weight gradient in it. Either way the sum the other paths compute, to float rounding;
nothing about the privacy changes: the same per-example norms, the same sensitivity C.
An example whose gradient is not finite gets c_i = 0 and the sum is recomputed without
it (a backward pass over the finite rows alone), since 0·∞ would be NaN in the sum.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap
from torch.nn.grad import conv2d_weight

from dpfl.local.threads import torch_threads

Params = dict[str, Tensor]
Summer = Callable[[Tensor], Params]
"""A layer's clipped sum Σ_i c_i g_i of its own parameters, given the factors c."""

__all__ = ["GhostClipping", "Unsupported", "conv_weight_gradients", "has_rule"]


class Unsupported(Exception):
    """The model's forward pass does something the hooks cannot follow (a layer called
    twice, keyword or non-tensor inputs to a layer without a rule): use `vmap(grad)`."""


def has_rule(module: nn.Module) -> bool:
    """Whether a layer's per-example norm has a rule here (not `vmap` of its `vjp`)."""
    kind = type(module)
    if kind is nn.Linear:
        return True
    if kind is nn.Conv2d:
        conv = cast(nn.Conv2d, module)
        return conv.padding_mode == "zeros" and not isinstance(conv.padding, str)
    if kind is nn.GroupNorm:
        return cast(nn.GroupNorm, module).affine
    if kind is nn.LayerNorm:
        return cast(nn.LayerNorm, module).elementwise_affine
    if kind is nn.Embedding:
        emb = cast(nn.Embedding, module)
        return emb.max_norm is None and not emb.scale_grad_by_freq and not emb.sparse
    return False


def _owners(model: nn.Module) -> list[tuple[str, nn.Module, list[str]]]:
    """(name prefix, module, names of its own parameters) of the modules that own some."""
    found = []
    for name, module in model.named_modules():
        own = [k for k, p in module.named_parameters(recurse=False) if p is not None]
        if own:
            found.append((f"{name}." if name else "", module, own))
    return found


class GhostClipping:
    """Per-example norms and clipped sums of one model by ghost clipping."""

    def __init__(
        self,
        model: nn.Module,
        loss: Callable[[Tensor, Tensor], Tensor],
        book_keeping: bool = True,
    ) -> None:
        """`book_keeping` (Bu et al. 2023): the clipped sum from the layer inputs and
        output gradients the norms were computed from, without a second backward pass
        (faster; holds each layer's δ until the sums are made); otherwise the second pass."""
        self.model = model
        self.loss = loss
        self.book_keeping = book_keeping
        self.owners = _owners(model)
        # a parameter shared by two modules has one per-example gradient, the sum of two
        # terms whose cross term no per-layer rule sees
        shared = len(list(model.named_parameters(remove_duplicate=False)))
        self.applies = bool(self.owners) and shared == len(list(model.named_parameters()))

    @property
    def uncovered(self) -> int:
        """The parameters of the layers without a rule, which `vmap` takes one by one."""
        return sum(
            p.numel()
            for _, module, _ in self.owners
            if not has_rule(module)
            for p in module.parameters(recurse=False)
        )

    def __call__(
        self, params: Params, x: Tensor, y: Tensor, factor: Callable[[Tensor], Tensor]
    ) -> tuple[Params, Tensor]:
        """(Σ_i c_i g_i, ‖g_i‖) with c = `factor`(‖g‖): finite, 0 for an example to
        leave out (padding, or a gradient that is not finite). Raises `Unsupported`."""
        leaves = {k: v.detach().requires_grad_() for k, v in params.items()}
        tape = _Tape(self.owners, leaves, x.shape[0], self.book_keeping)
        with torch.enable_grad():
            with tape.hooks():
                losses = self.loss(functional_call(self.model, leaves, (x,)), y)
            tape.check()
            starts = [leaves[n] for n in tape.first_parameters()]
            keep = not self.book_keeping
            torch.autograd.grad(losses.sum(), starts, retain_graph=keep, allow_unused=True)
            norms = tape.norms()
            c = factor(norms).detach()
            finite = bool(torch.isfinite(norms).all())
            if self.book_keeping and finite:
                sums = tape.sums(c)
                return {n: sums.get(n, torch.zeros_like(v)) for n, v in params.items()}, norms
            tape.close()
            if not finite or self.book_keeping:
                # 0·∞ would be NaN in the others' sums: recompute on the finite rows alone
                rows = torch.nonzero(c).squeeze(1)
                x, y, c = x.index_select(0, rows), y.index_select(0, rows), c[rows]
                losses = self.loss(functional_call(self.model, leaves, (x,)), y)
            names = list(leaves)
            grads = torch.autograd.grad(
                (c * losses).sum(), [leaves[n] for n in names], allow_unused=True
            )
        second = {
            n: torch.zeros_like(leaves[n]) if g is None else g
            for n, g in zip(names, grads, strict=True)
        }
        return {n: second[n] for n in params}, norms


class _Tape:
    """What one ghost pass records: each owner's inputs, the squared norms that its
    output gradients give, summed as they arrive, and (book-keeping) what each layer's
    clipped sum needs: its (a, δ), or its per-example gradients where they were formed."""

    def __init__(
        self,
        owners: list[tuple[str, nn.Module, list[str]]],
        leaves: Params,
        batch: int,
        book_keeping: bool,
    ) -> None:
        self.book_keeping = book_keeping
        self.summers: list[tuple[str, Summer]] = []
        self.owners = owners
        self.leaves = leaves
        self.batch = batch
        self.inputs: dict[int, tuple[Tensor, ...]] = {}
        self.seen: set[int] = set()
        self.first: list[int] = []  # the owners whose inputs need no gradient
        self.problem: str | None = None
        self.measuring = True
        self.squares: Tensor | None = None

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        handles = [
            module.register_forward_hook(self._forward_hook(i, module), with_kwargs=True)
            for i, (_, module, _) in enumerate(self.owners)
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _forward_hook(self, i: int, module: nn.Module) -> Callable[..., None]:
        def hook(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            if i in self.inputs:
                self.problem = f"{type(module).__name__} is called twice in one forward pass"
            elif kwargs or not args or not all(isinstance(a, Tensor) for a in args):
                self.problem = f"{type(module).__name__} takes keyword or non-tensor inputs"
            elif not isinstance(out, Tensor) or out.shape[:1] != (self.batch,):
                self.problem = f"{type(module).__name__} does not return one row per example"
            prefix, _, own = self.owners[i]
            if self.problem is not None or not any(prefix + n in self.leaves for n in own):
                return
            self.inputs[i] = tuple(a.detach() for a in args)
            if not any(a.requires_grad for a in args):
                self.first.append(i)
            if out.requires_grad:
                out.register_hook(self._backward_hook(i))

        return hook

    def _backward_hook(self, i: int) -> Callable[[Tensor], None]:
        def hook(delta: Tensor) -> None:
            if not self.measuring or i in self.seen:
                return
            self.seen.add(i)
            prefix, module, own = self.owners[i]
            named = {n: self.leaves[prefix + n] for n in own if prefix + n in self.leaves}
            if named:
                term, summer = _layer(module, prefix, named, self.leaves, self.inputs[i], delta)
                self.squares = term if self.squares is None else self.squares + term
                if self.book_keeping:
                    self.summers.append((prefix, summer))
            del self.inputs[i]  # autograd keeps what it needs; this copy is no longer used

        return hook

    def check(self) -> None:
        if self.problem is not None:
            raise Unsupported(self.problem)

    def first_parameters(self) -> list[str]:
        """The parameters of the layers fed by no other parameter: the gradients the first
        pass asks for, so that it reaches every layer and computes nothing else."""
        names = []
        for i in self.first:
            prefix, _, own = self.owners[i]
            names += [prefix + n for n in own if prefix + n in self.leaves]
        return names

    def norms(self) -> Tensor:
        missing = [self.owners[i][0] or "the model" for i in self.inputs]
        if missing:
            raise Unsupported(f"no output gradient reached {', '.join(missing)}")
        if self.squares is None:
            raise Unsupported("no layer with parameters was called")
        return self.squares.sqrt()

    def sums(self, c: Tensor) -> Params:
        """Σ_i c_i g_i of every layer's parameters (book-keeping)."""
        out: Params = {}
        for prefix, summer in self.summers:
            out.update({prefix + k: v for k, v in summer(c).items()})
        self.summers.clear()
        return out

    def close(self) -> None:
        self.measuring = False
        self.inputs.clear()
        self.summers.clear()


def _layer(
    module: nn.Module,
    prefix: str,
    own: Params,
    leaves: Params,
    args: tuple[Tensor, ...],
    delta: Tensor,
) -> tuple[Tensor, Summer]:
    """‖g_i‖² of one layer's own parameters for each example i, and its clipped sum."""
    if has_rule(module) and len(args) == 1:
        a = args[0]
        if isinstance(module, nn.Linear):
            return _linear(a, delta, own)
        if isinstance(module, nn.Conv2d):
            return _conv(module, a, delta, own)
        if isinstance(module, nn.GroupNorm):
            hat = F.group_norm(a, module.num_groups, eps=module.eps)
            return _per_example(_affine(hat, delta, own, None))
        if isinstance(module, nn.LayerNorm):
            hat = F.layer_norm(a, module.normalized_shape, eps=module.eps)
            return _per_example(_affine(hat, delta, own, tuple(module.normalized_shape)))
        if isinstance(module, nn.Embedding):
            return _embedding(module, a, delta), partial(_embedding_sum, module, a, delta)
    return _per_example(_vmapped(module, prefix, own, leaves, args, delta))


def _per_example(grads: Params) -> tuple[Tensor, Summer]:
    """Squared norms and clipped sum of per-example gradients [B, *shape]."""
    squares = _squares(grads)

    def summer(c: Tensor) -> Params:
        return {k: (c @ g.flatten(1)).view(g.shape[1:]) for k, g in grads.items()}

    return squares, summer


def _linear(a: Tensor, delta: Tensor, own: Params) -> tuple[Tensor, Summer]:
    """z = a Wᵀ + b over T positions per example: ghost or direct, whichever is smaller;
    direct, the per-example gradients are kept for the sum (c · g), else (c ⊙ Δ)ᵀ A."""
    batch = a.shape[0]
    a3 = a.reshape(batch, -1, a.shape[-1])
    d3 = delta.reshape(batch, -1, delta.shape[-1])
    grads = {"bias": d3.sum(1)} if "bias" in own else {}
    if _ghost(a3.shape[1], a3.shape[2], d3.shape[2]):
        squares = _ghost_norms(a3, d3) + (_squares(grads) if grads else 0.0)
        return squares, partial(_linear_sum, a, delta, own)
    grads["weight"] = d3.mT @ a3
    return _per_example(grads)


def _squares(grads: Params) -> Tensor:
    terms = [g.flatten(1).square().sum(1) for g in grads.values()]
    assert terms, "a layer with parameters has gradients"
    return torch.stack(terms).sum(0)


def _ghost(positions: int, width: int, outputs: int) -> bool:
    """Bu et al.'s choice: the ghost norm's B·T² numbers against the gradients' B·d·p."""
    return positions * positions < width * outputs


def _ghost_norms(a: Tensor, d: Tensor) -> Tensor:
    """‖Σ_t d_t a_tᵀ‖² per example, for a [B, T, d_in] and d [B, T, d_out]."""
    if a.shape[1] == 1:
        return a.square().sum((1, 2)) * d.square().sum((1, 2))
    return ((a @ a.mT) * (d @ d.mT)).sum((1, 2))


def _scaled(c: Tensor, delta: Tensor) -> Tensor:
    return delta * c.view(-1, *[1] * (delta.dim() - 1))


def _linear_sum(a: Tensor, delta: Tensor, own: Params, c: Tensor) -> Params:
    scaled = _scaled(c, delta).reshape(-1, delta.shape[-1])
    sums = {"weight": scaled.t() @ a.reshape(-1, a.shape[-1])}
    if "bias" in own:
        sums["bias"] = scaled.sum(0)
    return sums


def _conv(module: nn.Conv2d, a: Tensor, delta: Tensor, own: Params) -> tuple[Tensor, Summer]:
    """The Linear rule on the unfolded input (ghost), or the per-example weight gradients
    of one grouped convolution (direct), kept for the sum."""
    batch, outputs = a.shape[0], delta.shape[1]
    positions = delta.shape[2] * delta.shape[3]
    width = module.weight.shape[1] * module.weight.shape[2] * module.weight.shape[3]
    grads = {"bias": delta.flatten(2).sum(2)} if "bias" in own else {}
    if module.groups == 1 and _ghost(positions, width, outputs):
        patches = F.unfold(
            a,
            module.kernel_size,
            module.dilation,
            cast(tuple[int, int], module.padding),
            module.stride,
        )
        squares = _ghost_norms(patches.mT, delta.reshape(batch, outputs, -1).mT)
        if grads:
            squares = squares + _squares(grads)
        return squares, partial(_conv_sum, module, a, delta, own)
    grads["weight"] = conv_weight_gradients(module, a, delta)
    return _per_example(grads)


def _conv_sum(module: nn.Conv2d, a: Tensor, delta: Tensor, own: Params, c: Tensor) -> Params:
    """The weight gradient of the batch with each example's δ scaled by its c_i."""
    scaled = _scaled(c, delta)
    weight: Tensor = conv2d_weight(  # type: ignore[no-untyped-call]
        a,
        module.weight.shape,
        scaled,
        module.stride,
        cast(tuple[int, int], module.padding),
        module.dilation,
        module.groups,
    )
    sums = {"weight": weight}
    if "bias" in own:
        sums["bias"] = scaled.sum((0, 2, 3))
    return sums


def _affine(hat: Tensor, delta: Tensor, own: Params, shape: tuple[int, ...] | None) -> Params:
    """Per-example gradients of an elementwise affine map of the normalised input `hat`,
    summed over every other position: one number per parameter. GroupNorm's parameters
    are per channel (axis 1: `shape` None), LayerNorm's cover the trailing `shape`."""
    batch = hat.shape[0]
    if shape is None:
        per: tuple[int, ...] = (batch, hat.shape[1], -1)
        weight, bias = (delta * hat).reshape(per).sum(2), delta.reshape(per).sum(2)
    else:
        per = (batch, -1, *shape)
        weight, bias = (delta * hat).reshape(per).sum(1), delta.reshape(per).sum(1)
    grads = {"weight": weight, "bias": bias}
    return {k: g for k, g in grads.items() if k in own}


def _embedding(module: nn.Embedding, ids: Tensor, delta: Tensor) -> Tensor:
    """Rows of the table picked by the tokens: ghost by token equality, or direct."""
    batch, dim = ids.shape[0], delta.shape[-1]
    ids = ids.reshape(batch, -1)
    d = _unpadded(module, ids, delta.reshape(batch, -1, dim))
    tokens = ids.shape[1]
    if tokens * tokens < module.num_embeddings * dim:
        same = (ids.unsqueeze(2) == ids.unsqueeze(1)).to(d.dtype)
        return (same * (d @ d.mT)).sum((1, 2))
    rows = d.new_zeros(batch, module.num_embeddings, dim)
    rows.scatter_add_(1, ids.unsqueeze(2).expand(-1, -1, dim), d)
    return rows.square().sum((1, 2))


def _unpadded(module: nn.Embedding, ids: Tensor, d: Tensor) -> Tensor:
    """δ with the padding tokens' rows zero: the padding row gets no gradient."""
    if module.padding_idx is None:
        return d
    return d * (ids != module.padding_idx).unsqueeze(-1).to(d.dtype)


def _embedding_sum(module: nn.Embedding, ids: Tensor, delta: Tensor, c: Tensor) -> Params:
    dim = delta.shape[-1]
    scaled = _unpadded(module, ids, _scaled(c, delta)).reshape(-1, dim)
    table = scaled.new_zeros(module.num_embeddings, dim)
    return {"weight": table.index_add_(0, ids.reshape(-1), scaled)}


def _vmapped(
    module: nn.Module,
    prefix: str,
    own: Params,
    leaves: Params,
    args: tuple[Tensor, ...],
    delta: Tensor,
) -> Params:
    """A layer without a rule: `vmap` over examples of its `vjp` in its own parameters
    (its children's, which have hooks of their own, held fixed): B × its parameters."""
    inner = {k[len(prefix) :]: v.detach() for k, v in leaves.items() if k.startswith(prefix)}
    fixed = {k: v for k, v in inner.items() if k not in own}
    inner_own = {k: v.detach() for k, v in own.items()}

    def one(delta_i: Tensor, *args_i: Tensor) -> Params:
        batch = tuple(a.unsqueeze(0) for a in args_i)
        pull = vjp(lambda p: functional_call(module, {**fixed, **p}, batch), inner_own)[1]
        grads: Params = pull(delta_i.unsqueeze(0))[0]
        return grads

    result: Params = vmap(one)(delta, *args)
    return result


def conv_weight_gradients(module: nn.Conv2d, a: Tensor, delta: Tensor) -> Tensor:
    """Per-example Conv2d weight gradients [B, *weight.shape] from inputs a and output
    gradients δ: the weight gradient of one convolution whose groups are the examples
    (a_i meets only δ_i), in one call of torch's backward kernel: faster than a batched
    product per kernel offset, and for any stride, dilation or grouping. On one thread:
    torch's CPU kernel for so many groups ran 240× slower on two (2.3 ms against 559 ms
    for the small CNN's first convolution), with the same bits."""
    batch, (out_channels, *per_group) = a.shape[0], module.weight.shape
    with torch_threads(1 if a.device.type == "cpu" else None):
        grads: Tensor = conv2d_weight(  # type: ignore[no-untyped-call]
            a.reshape(1, -1, *a.shape[2:]),
            (batch * out_channels, *per_group),
            delta.reshape(1, -1, *delta.shape[2:]),
            module.stride,
            cast(tuple[int, int], module.padding),  # the caller excludes "same" and "valid"
            module.dilation,
            batch * module.groups,
        )
    return grads.reshape(batch, *module.weight.shape)
