"""A silo: one hospital's training records (and, for evaluation, its test records)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class Silo:
    """Training tensors x (float32, dense or sparse COO) and y (labels), optional test set.

    Labels stay integers: binary losses cast them, cross-entropy needs them as classes.
    """

    name: str
    x: Tensor
    y: Tensor
    x_test: Tensor | None = None
    y_test: Tensor | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a silo needs a name")
        _check_pair(self.name, "training", self.x, self.y)
        if (self.x_test is None) != (self.y_test is None):
            raise ValueError(f"silo {self.name!r}: give both x_test and y_test, or neither")
        if self.x_test is not None and self.y_test is not None:
            _check_pair(self.name, "test", self.x_test, self.y_test)

    @property
    def size(self) -> int:
        return int(self.x.shape[0])

    @classmethod
    def from_arrays(
        cls,
        name: str,
        x: np.ndarray,
        y: np.ndarray,
        x_test: np.ndarray | None = None,
        y_test: np.ndarray | None = None,
    ) -> Silo:
        """From numpy arrays: features become float32, labels int64."""

        def features(a: np.ndarray) -> Tensor:
            return torch.as_tensor(np.asarray(a, dtype=np.float32))

        def labels(a: np.ndarray) -> Tensor:
            values = np.asarray(a)
            if not np.all(np.isfinite(values)) or not np.all(values == np.round(values)):
                raise ValueError(f"silo {name!r}: labels must be integers")
            return torch.as_tensor(values.astype(np.int64))

        return cls(
            name,
            features(x),
            labels(y),
            None if x_test is None else features(x_test),
            None if y_test is None else labels(y_test),
        )


def _check_pair(name: str, part: str, x: Tensor, y: Tensor) -> None:
    if x.shape[0] != y.shape[0] or y.ndim != 1:
        raise ValueError(
            f"silo {name!r}: {part} features have {x.shape[0]} rows but labels have shape "
            f"{tuple(y.shape)}"
        )
    if x.shape[0] == 0:
        raise ValueError(f"silo {name!r} has no {part} records")
    if not x.is_sparse and not bool(torch.isfinite(x).all()):
        raise ValueError(f"silo {name!r}: {part} features contain NaN or infinity; impute first")
