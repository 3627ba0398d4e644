"""A study's model from a factory, and the checks it passes before any record is touched.

A factory is a function `build(n_features, n_outputs)` for tables (records are feature
vectors) or `build(input_shape, n_outputs)` for images (`input_shape` = (channels,
height, width)) that returns a `torch.nn.Module`. The study names it as `"file.py:build"`
(a Python file, read relative to the study file) or `"package.module:build"`; the
built-in kinds are factories that ship with dpfl (`KINDS`). The source file's SHA-256
is part of the run's identity (`source_digest`): an edited model is a new run.

`check_model` refuses, each with one line naming the factory and the layer, a model
DP-SGD cannot train with a per-record guarantee: one that mixes the examples of a batch
(BatchNorm, or anything `check_per_example` sees), one whose per-example gradients
`torch.func` cannot compute, one with non-finite parameters, or one whose output is not
one row of `n_outputs` per example.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dpfl import models
from dpfl.models import large

__all__ = [
    "KINDS",
    "Factory",
    "ModelError",
    "check_model",
    "in_folder",
    "logistic_regression",
    "mlp",
    "resnet18_gn",
    "resolve",
    "scatternet_cnn",
    "scatternet_linear",
    "small_cnn",
    "source_digest",
    "source_file",
    "vit",
]

Factory = Callable[[Any, int], nn.Module]
"""`build(n_features or input_shape, n_outputs) -> nn.Module`."""


class ModelError(ValueError):
    """A model (or its factory) that a study cannot train with DP-SGD."""


def logistic_regression(n_features: int, n_outputs: int) -> nn.Module:
    """One linear layer: logistic regression's logits (or a linear hazard / risk)."""
    return nn.Linear(_features(n_features, "logistic_regression"), n_outputs)


def mlp(n_features: int, n_outputs: int, hidden: Sequence[int] = (200, 200)) -> nn.Module:
    """`dpfl.models.mlp`: ReLU layers of widths `hidden` (the study's `model.hidden`)."""
    return models.mlp(_features(n_features, "mlp"), hidden, n_outputs=n_outputs)


def small_cnn(input_shape: Sequence[int], n_outputs: int) -> nn.Module:
    """`dpfl.models.small_cnn` for (channels, side, side) images."""
    if isinstance(input_shape, int) or len(input_shape) != 3:
        raise ModelError(f"model.kind: small_cnn classifies images, got {_shape(input_shape)}")
    return models.small_cnn(input_shape[0], input_shape[1], n_classes=n_outputs)


def resnet18_gn(input_shape: Sequence[int], n_outputs: int) -> nn.Module:
    """`dpfl.models.large.resnet18_gn` for (channels, height, width) images: the CIFAR
    stem up to 32 pixels a side, ImageNet's above."""
    channels, height, width = _image(input_shape, "resnet18_gn")
    return large.resnet18_gn(channels, n_outputs, small_inputs=max(height, width) <= 32)


def vit(input_shape: Sequence[int], n_outputs: int) -> nn.Module:
    """`dpfl.models.large.vit` for (channels, side, side) images."""
    channels, height, width = _image(input_shape, "vit")
    if height != width:
        raise ModelError(f"model.kind: vit needs square images, got {height}×{width}")
    return large.vit(channels, height, n_outputs)


def scatternet_linear(input_shape: Sequence[int], n_outputs: int) -> nn.Module:
    """`dpfl.models.scattering.scatternet_linear`: a fixed scattering transform (J = 2,
    L = 8), a GroupNorm without parameters and one linear layer, for (channels, side,
    side) images."""
    from dpfl.models import scattering

    return scattering.scatternet_linear(_image(input_shape, "scatternet_linear"), n_outputs)


def scatternet_cnn(input_shape: Sequence[int], n_outputs: int) -> nn.Module:
    """`dpfl.models.scattering.scatternet_cnn`: the same front, then one small
    conv-GroupNorm-ReLU-pool block and a linear head."""
    from dpfl.models import scattering

    return scattering.scatternet_cnn(_image(input_shape, "scatternet_cnn"), n_outputs)


def _image(input_shape: Any, kind: str) -> tuple[int, int, int]:
    """(channels, height, width) of an image study's records, or a `ModelError`."""
    if isinstance(input_shape, int) or len(input_shape) != 3:
        raise ModelError(
            f"model.kind: {kind} classifies (channels, height, width) images (a "
            f"dataset = 'images' study or a MedMNIST preset), got {_shape(input_shape)}"
        )
    channels, height, width = (int(s) for s in input_shape)
    if min(height, width) < 8:
        raise ModelError(f"model.kind: {kind} needs images of at least 8×8, got {height}×{width}")
    return channels, height, width


KINDS: dict[str, str] = {
    "logistic_regression": "dpfl.models.factories:logistic_regression",
    "mlp": "dpfl.models.factories:mlp",
    "small_cnn": "dpfl.models.factories:small_cnn",
    "scatternet_linear": "dpfl.models.factories:scatternet_linear",
    "scatternet_cnn": "dpfl.models.factories:scatternet_cnn",
    "resnet18_gn": "dpfl.models.factories:resnet18_gn",
    "vit": "dpfl.models.factories:vit",
}
"""The built-in `model.kind`s, as the factories they name."""


def _features(n_features: Any, kind: str) -> int:
    if not isinstance(n_features, int):
        raise ModelError(f"model.kind: {kind} needs a feature vector, got {_shape(n_features)}")
    return n_features


def _shape(shape: Any) -> str:
    return f"{tuple(shape) if not isinstance(shape, int) else (shape,)} records"


def _split(spec: str) -> tuple[str, str]:
    """(file or module, function) of a factory string."""
    where, colon, name = spec.rpartition(":")
    if not colon or not where or not name.isidentifier():
        raise ModelError(f"{spec!r} is neither 'file.py:function' nor 'package.module:function'")
    return where, name


def _is_file(where: str) -> bool:
    return where.endswith(".py") or "/" in where or "\\" in where


def in_folder(spec: str, folder: Path) -> str:
    """`spec` with a relative file read from `folder` (a study file's); a module's
    factory, or a spec that is neither, as it is."""
    where, colon, name = spec.rpartition(":")
    if not (colon and where and _is_file(where)):
        return spec
    return f"{(folder / Path(where).expanduser()).resolve()}:{name}"


def source_file(spec: str) -> Path:
    """The Python file that defines the factory `spec`: the file itself, or the module's
    source, found without running it."""
    where, _ = _split(spec)
    if _is_file(where):
        path = Path(where).expanduser()
        if not path.is_file():
            raise ModelError(f"no such file {path}")
        return path
    try:
        found = importlib.util.find_spec(where)
    except (ImportError, ValueError) as exc:
        raise ModelError(f"cannot import {where!r}: {exc}") from exc
    origin = None if found is None else found.origin
    if origin is None or not Path(origin).is_file():
        raise ModelError(f"no Python module {where!r} to import")
    return Path(origin)


def source_digest(spec: str) -> str:
    """SHA-256 of the factory's source file: what the model is, for the run's key."""
    return hashlib.sha256(source_file(spec).read_bytes()).hexdigest()


def resolve(spec: str) -> Factory:
    """The factory function `spec` names; a file is run as a module of its own, named
    after its content, so an edited file is never confused with the one run before."""
    where, name = _split(spec)
    path = source_file(spec)
    try:
        module = _file_module(path) if _is_file(where) else importlib.import_module(where)
    except Exception as exc:  # the user's code: whatever it raises is its own
        raise ModelError(f"{spec} failed to load: {exc!r}") from exc
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ModelError(f"{path} defines no function {name!r}")
    return factory  # type: ignore[no-any-return]


def _file_module(path: Path) -> ModuleType:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    name = f"dpfl_model_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, "a .py file has a loader"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickling and dataclasses look classes up there
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def build(spec: str, shape: Sequence[int], n_outputs: int, **options: Any) -> nn.Module:
    """The model `spec` builds for records of `shape` (an int for feature vectors),
    checked (`check_model`); `options` are keyword arguments of a shipped factory."""
    factory = functools.partial(resolve(spec), **options)
    size: Any = shape[0] if len(shape) == 1 else tuple(shape)
    try:
        model = factory(size, n_outputs)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"{spec}: build({size}, {n_outputs}) failed: {exc!r}") from exc
    if not isinstance(model, nn.Module):
        raise ModelError(f"{spec}: build returned a {type(model).__name__}, not a torch.nn.Module")
    check_model(model, tuple(shape), n_outputs, spec)
    return model


_PROBE = 2
"""Examples in the zero batch of the per-example gradient check."""


def check_model(
    model: nn.Module, example_shape: tuple[int, ...], n_outputs: int, where: str
) -> None:
    """Refuse, with one line naming `where` (the factory) and the layer, a model whose
    parameters are not finite, whose output for one example is not `n_outputs` values,
    that mixes the examples of a batch (so clipping one record's gradient would not bound
    its influence: `models.check_per_example`), or whose per-example gradients
    `vmap(grad)` cannot compute. Reads no record: its inputs are zeros and public noise;
    draws nothing from torch's generator."""
    for name, p in model.named_parameters():
        if not p.is_floating_point() or not bool(torch.isfinite(p).all()):
            raise ModelError(f"{where}: parameter {name!r} is not finite (or not floating point)")
    params = {k: p.detach() for k, p in model.named_parameters()}
    if not params:
        raise ModelError(f"{where}: the model has no parameters to train")
    dtype = next(iter(params.values())).dtype
    device = next(iter(params.values())).device
    zeros = torch.zeros(_PROBE, *example_shape, dtype=dtype, device=device)
    with torch.random.fork_rng(devices=[]), models.dropout_off(model):
        with _refusing(where, f"one example of shape {example_shape} fails"):
            models.check_per_example(model)  # by type first: names the layer
            with torch.no_grad():
                out = model(zeros[:1])
        if tuple(out.shape) != (1, n_outputs):
            raise ModelError(
                f"{where}: one example's output has shape {tuple(out.shape)[1:]}, expected "
                f"({n_outputs},) (the outputs of this study's labels)"
            )
        with _refusing(where, "a batch of examples fails"):
            models.check_per_example(model, example_shape)

        def one(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = functional_call(model, p, (x.unsqueeze(0),))
            return out.sum()

        with _refusing(where, "per-example gradients (torch.func's vmap of grad) fail"):
            vmap(grad(one), in_dims=(None, 0))(params, zeros)


@contextlib.contextmanager
def _refusing(where: str, what: str) -> Iterator[None]:
    """Whatever the user's model raises in the block, as one line naming the factory."""
    try:
        yield
    except models.MixesExamplesError as exc:
        raise ModelError(f"{where}: {exc}") from exc
    except Exception as exc:
        raise ModelError(f"{where}: {what}: {exc!r}") from exc
