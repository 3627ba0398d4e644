"""A silo: one hospital's training records (and, for evaluation, its test records).

Under add/remove neighbouring a silo's record count is private: one more patient must
not change how the mechanism works. So every quantity that shapes a mechanism (sampling
rate, steps, the normaliser of a noisy sum, a sensitivity) is computed from the silo's
*public size*: a number the hospital declares (as Kerkouche's Table 4 publishes each
hospital's size), or a DP count that the engine releases and charges before round 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from dpfl.data.dataset import Dataset, check_survival
from dpfl.data.partition import per_silo_splits
from dpfl.privacy import Neighbouring


@dataclass(frozen=True)
class SiloInfo:
    """What anyone may know of a silo: its name, public size and the most records one
    person can be in (1, or S for neighbourhoods of a pruned contact graph); never its
    records."""

    name: str
    public_size: int
    appearances: int = 1

    @property
    def neighbouring(self) -> Neighbouring:
        return unit_of_privacy(self.appearances)


def unit_of_privacy(appearances: int) -> Neighbouring:
    """Add/remove one patient's record, or, where a person is in several records, replace
    one person (node-level, `events.node_gaussian`)."""
    return Neighbouring.ADD_REMOVE if appearances == 1 else Neighbouring.REPLACE_ONE


@dataclass(frozen=True)
class Silo:
    """Training tensors x (float32, dense or sparse COO) and y (labels), optional test set.

    Class labels stay integers (binary losses cast them, cross-entropy needs them as
    classes); survival labels are float32 (n, 2) pairs (time, event).
    `public_size` is the declared public record count (None: the engine releases a DP
    count first); `size` is the true count, which only indexes the data. `appearances`:
    the most training records one person is in (`Dataset.appearances`), public.
    """

    name: str
    x: Tensor
    y: Tensor
    x_test: Tensor | None = None
    y_test: Tensor | None = None
    public_size: int | None = None
    appearances: int = 1

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a silo needs a name")
        if self.public_size is not None and not (
            isinstance(self.public_size, int) and self.public_size > 0
        ):
            raise ValueError(
                f"silo {self.name!r}: public_size must be a positive integer, got "
                f"{self.public_size!r}"
            )
        if isinstance(self.appearances, bool) or not (
            isinstance(self.appearances, int) and self.appearances >= 1
        ):
            raise ValueError(f"silo {self.name!r}: appearances must be an integer ≥ 1")
        if self.appearances > 1 and self.public_size is None:
            raise ValueError(
                f"silo {self.name!r}: a person is in up to {self.appearances} records, so its "
                "privacy is node-level (replace one person), under which the record count is "
                "public: declare it"
            )
        _check_pair(self.name, "training", self.x, self.y)
        if (self.x_test is None) != (self.y_test is None):
            raise ValueError(f"silo {self.name!r}: give both x_test and y_test, or neither")
        if self.x_test is not None and self.y_test is not None:
            _check_pair(self.name, "test", self.x_test, self.y_test)

    @property
    def neighbouring(self) -> Neighbouring:
        return unit_of_privacy(self.appearances)

    @property
    def survival(self) -> bool:
        """Whether the labels are (time, event) pairs."""
        return self.y.ndim == 2

    @property
    def size(self) -> int:
        """The true record count: private; never let it shape a mechanism."""
        return int(self.x.shape[0])

    @property
    def declared_size(self) -> int:
        """The public size every mechanism is shaped by; refuses if none is known yet."""
        if self.public_size is None:
            raise ValueError(
                f"silo {self.name!r} has no public size: declare one (public_size=...) or "
                "let the engine release a DP count of its records first"
            )
        return self.public_size

    def with_public_size(self, public_size: int) -> Silo:
        """The same silo with `public_size` declared."""
        return dataclasses.replace(self, public_size=public_size)

    @property
    def info(self) -> SiloInfo:
        """The silo's public facts (refuses if it has no public size yet)."""
        return SiloInfo(self.name, self.declared_size, self.appearances)

    @classmethod
    def from_arrays(
        cls,
        name: str,
        x: np.ndarray,
        y: np.ndarray,
        x_test: np.ndarray | None = None,
        y_test: np.ndarray | None = None,
        *,
        public_size: int | None = None,
    ) -> Silo:
        """From numpy arrays: features become float32, class labels int64, survival
        (time, event) pairs (n, 2) float32."""

        def features(a: np.ndarray) -> Tensor:
            return torch.as_tensor(np.asarray(a, dtype=np.float32))

        def labels(a: np.ndarray) -> Tensor:
            values = np.asarray(a)
            if values.ndim == 2:
                check_survival(values.astype(np.float64), f"silo {name!r}")
                return torch.as_tensor(values.astype(np.float32))
            if not np.all(np.isfinite(values)) or not np.all(values == np.round(values)):
                raise ValueError(f"silo {name!r}: labels must be integers")
            return torch.as_tensor(values.astype(np.int64))

        return cls(
            name,
            features(x),
            labels(y),
            None if x_test is None else features(x_test),
            None if y_test is None else labels(y_test),
            public_size,
        )


def silos_from_dataset(
    dataset: Dataset,
    partition: Sequence[np.ndarray],
    *,
    test_fraction: float = 0.2,
    seed: int = 0,
    names: Sequence[str] | None = None,
    declare_sizes: bool = True,
) -> list[Silo]:
    """One silo per part of `partition` (index arrays, e.g. from `dpfl.data.partition`),
    each split into stratified train/test (Kerkouche: 80/20 per hospital). Sparse CSR
    features become sparse COO tensors. Refuses NaN: impute first (publicly).

    `declare_sizes`: the partition is part of the study's public design, so each silo's
    training-set size is declared public (fixed here: records added later do not move
    it). False leaves the sizes private, to be released as DP counts by the engine."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    if dataset.appearances > 1:
        raise ValueError(
            f"{dataset.name}: a person is in up to {dataset.appearances} records, which a "
            "random split could move between training and test; use the dataset's own "
            "split (data.split = 'official')"
        )
    splits = per_silo_splits(
        list(partition), dataset.strata, [1 - test_fraction, test_fraction], seed
    )
    return silos_from_splits(dataset, splits, names=names, declare_sizes=declare_sizes)


def silos_from_splits(
    dataset: Dataset,
    splits: Sequence[Sequence[np.ndarray]],
    *,
    names: Sequence[str] | None = None,
    declare_sizes: bool = True,
) -> list[Silo]:
    """One silo per (train, test) pair of index arrays into `dataset`: a split of one's
    own (`silos_from_dataset`) or the source's official one (FLamby's per-centre split)."""
    if names is not None and len(names) != len(splits):
        raise ValueError(f"{len(names)} names for {len(splits)} silos")
    labels = (
        torch.as_tensor(dataset.labels.astype(np.float32))
        if dataset.is_survival
        else torch.as_tensor(dataset.labels.astype(np.int64))
    )
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
                len(train) if declare_sizes else None,
                dataset.appearances,
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
    survival = y.ndim == 2 and y.shape[1] == 2 and y.is_floating_point()
    if x.shape[0] != y.shape[0] or not (y.ndim == 1 or survival):
        raise ValueError(
            f"silo {name!r}: {part} features have {x.shape[0]} rows but labels have shape "
            f"{tuple(y.shape)}"
        )
    if x.shape[0] == 0:
        raise ValueError(f"silo {name!r} has no {part} records")
    if not x.is_sparse and not bool(torch.isfinite(x).all()):
        raise ValueError(f"silo {name!r}: {part} features contain NaN or infinity; impute first")
