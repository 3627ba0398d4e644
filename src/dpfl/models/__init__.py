"""Model builders for the seed systems, and the check that a module is safe for DP-SGD.

Any `torch.nn.Module` may be trained by `dpfl.local`, provided its output for one example
does not depend on the other examples of the batch: per-example gradients (and so the
clipping that bounds each record's influence) are only defined for such modules.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import nn

__all__ = [
    "MixesExamplesError",
    "check_per_example",
    "dropout_off",
    "logistic_regression",
    "mlp",
    "scatternet_cnn",
    "scatternet_linear",
    "small_cnn",
]


def scatternet_linear(input_shape: Sequence[int], n_outputs: int) -> nn.Sequential:
    """Tramèr & Boneh's ScatterNet + linear for (channels, height, width) images: a fixed
    scattering front, a GroupNorm without parameters and one linear layer
    (`dpfl.models.scattering`)."""
    from dpfl.models import scattering

    return scattering.scatternet_linear(input_shape, n_outputs)


def scatternet_cnn(input_shape: Sequence[int], n_outputs: int) -> nn.Sequential:
    """ScatterNet + CNN: the same front, one conv-GroupNorm-ReLU-pool block and a linear
    head (`dpfl.models.scattering`)."""
    from dpfl.models import scattering

    return scattering.scatternet_cnn(input_shape, n_outputs)


class MixesExamplesError(ValueError):
    """The module couples the examples of a batch, so per-example gradients do not exist."""


def logistic_regression(n_features: int, n_classes: int = 2) -> nn.Linear:
    """Binary (one logit) or multinomial (one logit per class) logistic regression."""
    if n_classes < 2:
        raise ValueError(f"a classifier needs at least 2 classes, got {n_classes}")
    return nn.Linear(n_features, 1 if n_classes == 2 else n_classes)


def mlp(n_features: int, hidden: Sequence[int] = (200, 200), n_outputs: int = 1) -> nn.Sequential:
    """Fully connected ReLU network; the defaults are Kerkouche's 24,428→200→200→1 shape.

    The first layer is an `nn.Linear` at index 0, which lets `dpfl.local` compute its
    per-example gradient norms as ‖x‖·‖δ‖ and accept sparse inputs.
    """
    widths = [n_features, *hidden]
    layers: list[nn.Module] = []
    for fan_in, fan_out in itertools.pairwise(widths):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    layers.append(nn.Linear(widths[-1], n_outputs))
    return nn.Sequential(*layers)


def small_cnn(
    in_channels: int = 3,
    image_size: int = 28,
    n_classes: int = 2,
    widths: Sequence[int] = (16, 32),
    groups: int = 4,
) -> nn.Sequential:
    """Conv-GroupNorm-ReLU-pool blocks and a linear head, for 28×28 or 64×64 images.

    GroupNorm normalises within one example, so it is compatible with per-example
    gradients; BatchNorm is not (see `check_per_example`).
    """
    if image_size % (2 ** len(widths)):
        raise ValueError(f"image_size {image_size} must be divisible by 2**{len(widths)}")
    layers: list[nn.Module] = []
    channels = in_channels
    for width in widths:
        layers += [
            nn.Conv2d(channels, width, kernel_size=3, padding=1),
            nn.GroupNorm(min(groups, width), width),
            nn.ReLU(),
            nn.MaxPool2d(2),
        ]
        channels = width
    side = image_size // 2 ** len(widths)
    layers += [nn.Flatten(), nn.Linear(channels * side * side, n_classes)]
    return nn.Sequential(*layers)


def check_per_example(model: nn.Module, example_shape: Sequence[int] | None = None) -> None:
    """Refuse modules whose output for one example depends on the rest of the batch.

    Clipping bounds one record's influence on the sum of gradients by C only if removing
    the record from the batch leaves every other example's gradient where it was.
    BatchNorm is refused by type: it normalises with batch statistics (and keeps running
    statistics of the private data). Given `example_shape`, the shape of one input
    example, the property itself is tested on random public inputs, which catches any
    other mixing, e.g. attention across the batch (`nn.TransformerEncoderLayer` with
    `batch_first=False` on batch-first inputs) or centring over the batch.
    """
    label = type(model).__name__
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise MixesExamplesError(
                f"module {name or label!r} ({type(module).__name__}) mixes the "
                "examples of a batch, so per-example gradients and DP-SGD clipping are "
                "undefined for it; use nn.GroupNorm or nn.LayerNorm instead"
            )
    if example_shape is None:
        return
    mixing = _mixing_seen(model, tuple(example_shape))
    if mixing is not None:
        raise MixesExamplesError(
            f"model {label} mixes the examples of a batch: on {_PROBE_BATCH} random inputs of "
            f"shape {tuple(example_shape)}, {mixing}, so per-example gradients and DP-SGD "
            "clipping are undefined for it. Normalise within each example (nn.GroupNorm, "
            "nn.LayerNorm, not batch statistics) and keep the batch dimension first "
            "(batch_first=True for attention layers)"
        )


_PROBE_BATCH = 4


def _mixing_seen(model: nn.Module, example_shape: tuple[int, ...]) -> str | None:
    """How removing each record in turn from a random batch changed the outputs of the
    others, or None if they stayed put up to float32 rounding. Records are removed, not
    masked: a masked record still takes part in the forward pass."""
    reference = next((p for p in model.parameters() if p.is_floating_point()), None)
    dtype = torch.get_default_dtype() if reference is None else reference.dtype
    device = None if reference is None else reference.device
    # numpy, not torch: torch's random operations are refused inside `vmap`
    draws = np.random.default_rng(0).standard_normal((_PROBE_BATCH, *example_shape))
    x = torch.from_numpy(draws).to(device=device, dtype=dtype)
    with torch.no_grad(), dropout_off(model):
        full = model(x)
        if full.shape[:1] != (_PROBE_BATCH,):
            return f"it gave outputs of shape {tuple(full.shape)}, not one row per example"
        scale = float(full.abs().max())
        for removed in range(_PROBE_BATCH):
            kept = torch.arange(_PROBE_BATCH, device=x.device) != removed
            rest = model(x[kept])
            if rest.shape != full[kept].shape:
                return f"removing one record changed the others' outputs to {tuple(rest.shape)}"
            change = float((rest - full[kept]).abs().max())
            if not change <= 1e-4 * (1 + scale):
                return f"removing one record moved another's output by {change:.3g} of {scale:.3g}"
    return None


@contextlib.contextmanager
def dropout_off(model: nn.Module) -> Iterator[None]:
    """Dropout draws new masks for every batch, which the removal test would mistake for
    mixing; it is switched off for the test (only the dropout modules themselves)."""
    dropping = [
        m
        for m in model.modules()
        if m.training and isinstance(m, nn.modules.dropout._DropoutNd | nn.MultiheadAttention)
    ]
    for module in dropping:
        module.training = False
    try:
        yield
    finally:
        for module in dropping:
            module.training = True
