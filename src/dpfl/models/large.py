"""Larger image models for DP training: a ResNet-18 with GroupNorm and a small vision
transformer. Neither mixes the examples of a batch (no BatchNorm: its batch statistics
couple the records, `check_per_example` refuses it), and both are built from layers that
ghost clipping (`dpfl.local.ghost`) has a rule for: Conv2d, Linear, GroupNorm, LayerNorm,
and one small module holding the ViT's class token and position embedding."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["resnet18_gn", "vit"]


class _Block(nn.Module):
    """ResNet's basic block: two 3×3 convolutions, GroupNorm, a shortcut."""

    def __init__(self, fan_in: int, width: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(fan_in, width, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(min(groups, width), width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(min(groups, width), width)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or fan_in != width:
            self.shortcut = nn.Sequential(
                nn.Conv2d(fan_in, width, 1, stride, bias=False),
                nn.GroupNorm(min(groups, width), width),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        result: Tensor = self.relu(out + self.shortcut(x))
        return result


class ResNetGN(nn.Module):
    """ResNet-18's layout (He et al. 2016) with GroupNorm in place of BatchNorm."""

    def __init__(
        self,
        in_channels: int,
        n_classes: int,
        widths: tuple[int, ...] = (64, 128, 256, 512),
        blocks: tuple[int, ...] = (2, 2, 2, 2),
        groups: int = 32,
        small_inputs: bool = True,
    ) -> None:
        super().__init__()
        # small images (≤ 64 pixels) keep their resolution: a 3×3 stem and no pooling
        stem = (3, 1, 1) if small_inputs else (7, 2, 3)
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, widths[0], stem[0], stem[1], stem[2], bias=False),
            nn.GroupNorm(min(groups, widths[0]), widths[0]),
            nn.ReLU(),
        ]
        if not small_inputs:
            layers.append(nn.MaxPool2d(3, 2, 1))
        fan_in = widths[0]
        for stage, (width, count) in enumerate(zip(widths, blocks, strict=True)):
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                layers.append(_Block(fan_in, width, stride, groups))
                fan_in = width
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(fan_in, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        logits: Tensor = self.head(torch.flatten(self.pool(self.features(x)), 1))
        return logits


def resnet18_gn(
    in_channels: int = 3,
    n_classes: int = 2,
    widths: tuple[int, ...] = (64, 128, 256, 512),
    groups: int = 32,
    small_inputs: bool = True,
) -> ResNetGN:
    """ResNet-18 with GroupNorm (11.2 M parameters at the default widths, 3 channels).
    `small_inputs` (28×28, 32×32): a 3×3 stride-1 stem without max pooling, as the
    CIFAR ResNets; otherwise (64×64 and up) ImageNet's 7×7 stride-2 stem and pooling."""
    return ResNetGN(in_channels, n_classes, widths, (2, 2, 2, 2), groups, small_inputs)


class _Tokens(nn.Module):
    """Prepends the class token and adds the position embedding: the ViT's own parameters
    in a module of their own, whose per-example gradients are δ itself (ghost clipping
    takes them by `vmap` of this small module alone)."""

    def __init__(self, count: int, dim: int) -> None:
        super().__init__()
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.position = nn.Parameter(torch.randn(1, count + 1, dim) * 0.02)

    def forward(self, patches: Tensor) -> Tensor:
        cls = self.cls.expand(patches.shape[0], -1, -1)
        return torch.cat([cls, patches], 1) + self.position


class _Attention(nn.Module):
    """Multi-head self-attention within each example, from two nn.Linear layers."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        # written out: torch.func's vmap (the model checks) has no rule for the fused kernel
        weights = (q @ k.transpose(-2, -1)).mul(q.shape[-1] ** -0.5).softmax(-1)
        mixed = weights @ v
        result: Tensor = self.out(mixed.transpose(1, 2).reshape(batch, tokens, dim))
        return result


class _Encoder(nn.Module):
    """Pre-norm transformer layer: attention and an MLP, each with a residual."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = _Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.norm1(x))
        result: Tensor = x + self.mlp(self.norm2(x))
        return result


class ViT(nn.Module):
    """A vision transformer (Dosovitskiy et al. 2021): patches, class token, encoders."""

    def __init__(
        self,
        in_channels: int,
        image_size: int,
        n_classes: int,
        patch: int,
        dim: int,
        depth: int,
        heads: int,
    ) -> None:
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image_size {image_size} must be divisible by patch {patch}")
        if dim % heads:
            raise ValueError(f"dim {dim} must be divisible by heads {heads}")
        self.embed = nn.Conv2d(in_channels, dim, patch, patch)
        self.tokens = _Tokens((image_size // patch) ** 2, dim)
        self.encoders = nn.Sequential(*(_Encoder(dim, heads, 4 * dim) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        patches = self.embed(x).flatten(2).transpose(1, 2)
        encoded = self.encoders(self.tokens(patches))
        logits: Tensor = self.head(self.norm(encoded[:, 0]))
        return logits


def vit(
    in_channels: int = 3,
    image_size: int = 64,
    n_classes: int = 2,
    patch: int | None = None,
    dim: int = 192,
    depth: int = 6,
    heads: int = 3,
) -> ViT:
    """A small ViT (2.7 M parameters at the defaults; ViT-Tiny's width, half its depth).
    `patch` defaults to image_size / 8 (64 tokens and a class token); 28×28: patch 4,
    49 tokens."""
    if patch is None:
        patch = 4 if image_size == 28 else max(1, image_size // 8)
    return ViT(in_channels, image_size, n_classes, patch, dim, depth, heads)
