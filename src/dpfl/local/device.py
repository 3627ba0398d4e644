"""Where local training runs: the device of its models, batches and noise.

`RunPlan(device=...)` (a study's `device`) sets it for the run with `training_device`;
`DPSGD` reads it (or takes its own). On the CPU nothing moves and nothing changes: the
bits are today's. On another device a training call copies its starting parameters
there, keeps each silo's records and a copy of the model there for the rest of the run
(`Placement.put`), and hands the trained parameters back on the CPU, where the server
half, the secure sums, the evaluation and the checkpoints stay. The noise is drawn where
the run's noise source draws it (`dpfl.local.noise`: seeded and AES-CTR streams run on
the CPU, so a run's noise is the same values on every device) and copied to the device.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Iterator
from typing import Any, Literal, TypeVar

import torch

__all__ = ["DeviceError", "DeviceName", "Placement", "current", "resolve", "training_device"]

DeviceName = Literal["cpu", "cuda", "auto"]
T = TypeVar("T")


class DeviceError(ValueError):
    """A device this machine does not have."""


def resolve(name: str | torch.device) -> torch.device:
    """The device `name` asks for: "cuda" only where CUDA is available (refused with one
    line otherwise), "auto" CUDA where it is and the CPU elsewhere."""
    if isinstance(name, torch.device):
        name = str(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError(
            f"device {name!r}: this machine has no CUDA device torch can use "
            "(torch.cuda.is_available() is False); use 'cpu', or 'auto' to fall back to it"
        )
    if name != "cpu" and not name.startswith("cuda"):
        raise DeviceError(f"device must be 'cpu', 'cuda' or 'auto', got {name!r}")
    return torch.device(name)


class Placement:
    """One device and what has been copied to it: each tensor or module once per
    placement (by identity, the original kept alive so that its id is not reused)."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = resolve(device)
        self._held: dict[int, tuple[Any, Any]] = {}

    @property
    def on_cpu(self) -> bool:
        return self.device.type == "cpu"

    def put(self, value: T) -> T:
        """`value` (a tensor or module) on the device: itself on the CPU, else a copy made
        once (modules are deep-copied, never moved: the caller's stays where it is)."""
        if self.on_cpu:
            return value
        held = self._held.get(id(value))
        if held is None or held[0] is not value:
            moved = (
                copy.deepcopy(value).to(self.device)
                if isinstance(value, torch.nn.Module)
                else value.to(self.device)  # type: ignore[attr-defined]
            )
            held = self._held[id(value)] = (value, moved)
        return held[1]  # type: ignore[no-any-return]


_CURRENT: contextvars.ContextVar[Placement | None] = contextvars.ContextVar(
    "dpfl_training_device", default=None
)
_CPU = Placement()


def current() -> Placement:
    """The placement of the enclosing `training_device` block; the CPU outside any."""
    return _CURRENT.get() or _CPU


@contextlib.contextmanager
def training_device(device: str | torch.device) -> Iterator[Placement]:
    """Local training inside the block runs on `device` (resolved: `resolve`); what was
    copied there is released when the block ends."""
    placement = Placement(device)
    token = _CURRENT.set(placement)
    try:
        yield placement
    finally:
        _CURRENT.reset(token)
