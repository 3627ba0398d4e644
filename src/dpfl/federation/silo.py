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

from dpfl.data.dataset import Dataset, check_survival, first_records
from dpfl.data.partition import patient_sides, per_silo_splits
from dpfl.privacy import Neighbouring


@dataclass(frozen=True)
class SiloInfo:
    """What anyone may know of a silo: its name, public size and the most records one
    person can be in (1, or S for neighbourhoods of a pruned contact graph); whether its
    unit of privacy is the patient (then the public size counts patients) and the
    declared cap on the records a sampled patient contributes; never its records."""

    name: str
    public_size: int
    appearances: int = 1
    patient_level: bool = False
    max_records: int | None = None

    @property
    def neighbouring(self) -> Neighbouring:
        return unit_of_privacy(self.appearances, self.patient_level)


def unit_of_privacy(appearances: int, patient_level: bool = False) -> Neighbouring:
    """Add/remove one record; add/remove one patient with all their records (their
    records clipped as one); or, where a person is in several records of a contact
    graph, replace one person (node-level, `events.node_gaussian`)."""
    if patient_level:
        return Neighbouring.ADD_REMOVE_PATIENT
    return Neighbouring.ADD_REMOVE if appearances == 1 else Neighbouring.REPLACE_ONE


@dataclass(frozen=True)
class Silo:
    """Training tensors x (float32, dense or sparse COO) and y (labels), optional test set.

    Class labels stay integers (binary losses cast them, cross-entropy needs them as
    classes); survival labels are float32 (n, 2) pairs (time, event).
    `public_size` is the declared public record count (None: the engine releases a DP
    count first); `size` is the true count, which only indexes the data. `appearances`:
    the most training records one person is in (`Dataset.appearances`), public.
    `units`: each training record's patient (int64), for patient-level privacy: batches
    sample patients and clip each one's records as one, and `public_size` counts
    patients; `max_records` caps the records a sampled patient contributes (declared).
    """

    name: str
    x: Tensor
    y: Tensor
    x_test: Tensor | None = None
    y_test: Tensor | None = None
    public_size: int | None = None
    appearances: int = 1
    units: np.ndarray | None = None
    max_records: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a silo needs a name")
        if self.units is not None:
            units = np.asarray(self.units)
            if units.shape != (self.x.shape[0],) or not np.issubdtype(units.dtype, np.integer):
                raise ValueError(
                    f"silo {self.name!r}: units must give each of its {self.x.shape[0]} "
                    f"training records an integer patient, got {units.dtype} {units.shape}"
                )
            if self.appearances > 1:
                raise ValueError(f"silo {self.name!r}: patient-level or node-level, not both")
        if self.max_records is not None and not (
            isinstance(self.max_records, int) and self.max_records >= 1
        ):
            raise ValueError(f"silo {self.name!r}: max_records must be an integer ≥ 1")
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
    def patient_level(self) -> bool:
        """Whether the unit of privacy is the patient (all their records), not the record."""
        return self.units is not None

    @property
    def neighbouring(self) -> Neighbouring:
        return unit_of_privacy(self.appearances, self.patient_level)

    @property
    def unit_count(self) -> int:
        """The true number of units of privacy (patients, or records): private; only a
        DP count of it may become the public size."""
        return self.size if self.units is None else len(np.unique(self.units))

    @property
    def capped(self) -> Silo:
        """The training records a release whose sensitivity counts records may read: each
        patient's first `max_records` (`first_records`, a public rule blind to every other
        patient) where the unit is the patient, so a patient moves it by at most that many
        records' worth whatever their record count; all of them otherwise. A patient-level
        silo without a cap has no such view (its records as they are): every such release
        refuses it (its sensitivity needs the cap). DP-SGD reads every record, as it
        clips each sampled patient's records as one (C whatever their count)."""
        if self.units is None or self.max_records is None:
            return self
        keep = first_records(self.units, self.max_records)
        if len(keep) == self.size:
            return self
        rows = torch.as_tensor(keep)
        return dataclasses.replace(
            self, x=self.x.index_select(0, rows), y=self.y[rows], units=self.units[keep]
        )

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
        return SiloInfo(
            self.name, self.declared_size, self.appearances, self.patient_level, self.max_records
        )

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
        units: np.ndarray | None = None,
    ) -> Silo:
        """From numpy arrays: features become float32, class labels int64, survival
        (time, event) pairs (n, 2) float32; `units`, each training record's patient, makes
        the silo patient-level (`public_size` then counts patients)."""

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
            units=None if units is None else np.asarray(units, dtype=np.int64),
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
    fractions = [1 - test_fraction, test_fraction]
    if dataset.units is None:
        splits = per_silo_splits(list(partition), dataset.strata, fractions, seed)
    else:
        splits = [
            _patient_split(dataset, part, fractions, seed + k) for k, part in enumerate(partition)
        ]
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
        units = None if dataset.units is None else dataset.units[train]
        size = len(train) if units is None else len(np.unique(units))
        silos.append(
            Silo(
                name,
                _features(dataset, train),
                labels[train],
                _features(dataset, test),
                labels[test],
                size if declare_sizes else None,
                dataset.appearances,
                units,
                dataset.max_records,
            )
        )
    return silos


def _patient_split(
    dataset: Dataset, part: np.ndarray, fractions: Sequence[float], seed: int
) -> list[np.ndarray]:
    """One silo's train/test split by patient (`patient_sides`)."""
    assert dataset.units is not None
    part = np.asarray(part, dtype=np.int64)
    sides = patient_sides(dataset.units[part], dataset.strata[part], fractions, seed)
    return [np.sort(part[side]) for side in sides]


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
