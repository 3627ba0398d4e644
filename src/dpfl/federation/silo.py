"""A silo: one hospital's training records (and, for evaluation, its test records)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from dpfl.data.dataset import Dataset
from dpfl.data.partition import per_silo_splits


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


def silos_from_dataset(
    dataset: Dataset,
    partition: Sequence[np.ndarray],
    *,
    test_fraction: float = 0.2,
    seed: int = 0,
    names: Sequence[str] | None = None,
) -> list[Silo]:
    """One silo per part of `partition` (index arrays, e.g. from `dpfl.data.partition`),
    each split into stratified train/test (Kerkouche: 80/20 per hospital). Sparse CSR
    features become sparse COO tensors. Refuses NaN: impute first (publicly)."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    if names is not None and len(names) != len(partition):
        raise ValueError(f"{len(names)} names for {len(partition)} silos")
    splits = per_silo_splits(
        list(partition), dataset.labels, [1 - test_fraction, test_fraction], seed
    )
    labels = torch.as_tensor(dataset.labels.astype(np.int64))
    silos = []
    for k, (train, test) in enumerate(splits):
        name = names[k] if names is not None else f"silo-{k}"
        silos.append(
            Silo(
                name,
                _features(dataset, train),
                labels[train],
                _features(dataset, test),
                labels[test],
            )
        )
    return silos


def _features(dataset: Dataset, rows: np.ndarray) -> Tensor:
    chosen = dataset.features[rows]
    if sp.issparse(chosen):
        coo = sp.coo_matrix(chosen)
        indices = torch.as_tensor(np.vstack([coo.row, coo.col]).astype(np.int64))
        return torch.sparse_coo_tensor(
            indices, coo.data, coo.shape, dtype=torch.float32, check_invariants=True
        )
    return torch.as_tensor(np.asarray(chosen, dtype=np.float32))


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
