"""Model builders for the seed systems, and the check that a module is safe for DP-SGD.

Any `torch.nn.Module` may be trained by `dpfl.local`, provided its output for one example
does not depend on the other examples of the batch: per-example gradients (and so the
clipping that bounds each record's influence) are only defined for such modules.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from torch import nn

__all__ = [
    "MixesExamplesError",
    "check_per_example",
    "logistic_regression",
    "mlp",
    "small_cnn",
]


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


def check_per_example(model: nn.Module) -> None:
    """Refuse modules whose output for one example depends on the rest of the batch.

    BatchNorm normalises with batch statistics (and keeps running statistics of the
    private data), so one record moves every other record's gradient and the clipping
    bound no longer bounds its influence. Replace it with GroupNorm or LayerNorm.
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise MixesExamplesError(
                f"module {name or type(model).__name__!r} ({type(module).__name__}) mixes the "
                "examples of a batch, so per-example gradients and DP-SGD clipping are "
                "undefined for it; use nn.GroupNorm or nn.LayerNorm instead"
            )
