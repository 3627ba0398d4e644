"""The one typed dataset object every loader, generator and transform returns.

Deliberately small: features, labels, names, optional sites and official split, plus a
description that says where the data came from and every transform applied to it, so a
privacy datasheet can be written from the object alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

import numpy as np
import scipy.sparse as sp

Features: TypeAlias = np.ndarray | sp.csr_matrix

NONPRIVATE_MARK = "ε excludes preprocessing"
"""Prefix of every preprocessing note whose transform read private data without DP."""


class DataFormatError(ValueError):
    """A data file is missing or malformed; the message names the file, line and column."""

    def __init__(
        self, path: Path | str, message: str, *, line: int | None = None, column: str | None = None
    ) -> None:
        where = str(path)
        if line is not None:
            where += f", line {line}"
        if column is not None:
            where += f", column {column!r}"
        super().__init__(f"{where}: {message}")


def require_file(path: Path) -> Path:
    """Fail early, naming the file, rather than deep inside a parser."""
    if not path.is_file():
        raise DataFormatError(path, "file not found")
    return path


def require_records(path: Path | str, count: int, what: str = "records") -> None:
    """Refuse a file that held nothing to learn from: an empty dataset would otherwise
    fail far from its cause (in array indexing or partitioning)."""
    if count == 0:
        raise DataFormatError(path, f"no {what} (empty file?)")


@dataclass(frozen=True)
class Dataset:
    """Records (rows) with features, labels and optional per-record metadata.

    `labels` are integer classes (n,) or, for a survival task, float64 (n, 2) pairs
    (time, event): follow-up time and 1 if the event was observed, 0 if censored then
    (`survival_labels` builds them). Survival labels are never squeezed into classes: a
    censored patient is not known to survive.

    `features` is float32: a dense array (n, d) for tables, (n, c, h, w) for images, or a
    CSR matrix (n, d). NaN marks a value the source declares missing; call
    `preprocess.zero_impute` (public, free) before training. `site_ids` index
    `site_names`; `split` holds an official split name per record ("train", "test", ...).
    `extra` carries per-record side columns that are not features (survival time, ...).
    `preprocessing` lists every transform applied, in order; notes starting with
    `NONPRIVATE_MARK` were fitted on private data without DP.
    `appearances` is the most training records one person can influence: 1 where a
    record is one patient; S where a record is a person's neighbourhood in a contact
    graph pruned so that each person is in at most S of them (node-level privacy).
    `units` numbers each record's patient where the unit of privacy is the patient (all
    their records: patient-level privacy, `dpfl.data.sampling.PatientPoissonSampler`);
    `max_records` is the declared most records of one patient: the cap a sampled patient
    contributes, or, for record-level training, the group size of the datasheet's
    patient-level figure.
    """

    name: str
    features: Features
    labels: np.ndarray
    feature_names: tuple[str, ...]
    description: str
    class_names: tuple[str, ...] = ()
    site_ids: np.ndarray | None = None
    site_names: tuple[str, ...] = ()
    split: np.ndarray | None = None
    extra: Mapping[str, np.ndarray] = field(default_factory=dict)
    preprocessing: tuple[str, ...] = ()
    appearances: int = 1
    units: np.ndarray | None = None
    max_records: int | None = None

    def __post_init__(self) -> None:
        n = self.features.shape[0]
        if self.units is not None and (
            self.units.shape != (n,) or not np.issubdtype(self.units.dtype, np.integer)
        ):
            raise ValueError(f"{self.name}: units must be an integer vector of length {n}")
        if self.max_records is not None and not (
            isinstance(self.max_records, int) and self.max_records >= 1
        ):
            raise ValueError(f"{self.name}: max_records must be an integer ≥ 1")
        if isinstance(self.appearances, bool) or not (
            isinstance(self.appearances, int) and self.appearances >= 1
        ):
            raise ValueError(f"{self.name}: appearances must be an integer ≥ 1")
        if self.features.dtype != np.float32:
            raise ValueError(f"{self.name}: features must be float32, got {self.features.dtype}")
        if sp.issparse(self.features) and not isinstance(self.features, sp.csr_matrix):
            raise ValueError(f"{self.name}: sparse features must be CSR")
        if self.labels.ndim == 2:
            if self.labels.shape != (n, 2) or self.class_names:
                raise ValueError(
                    f"{self.name}: survival labels are (time, event) pairs of shape ({n}, 2) "
                    f"and have no class names, got {self.labels.shape}"
                )
            check_survival(self.labels, self.name)
        elif self.labels.shape != (n,) or not np.issubdtype(self.labels.dtype, np.integer):
            raise ValueError(
                f"{self.name}: labels must be an integer vector of length {n} or survival "
                f"(time, event) pairs, got {self.labels.dtype} {self.labels.shape}"
            )
        if self.features.ndim == 2 and len(self.feature_names) != self.features.shape[1]:
            raise ValueError(
                f"{self.name}: {len(self.feature_names)} feature names for "
                f"{self.features.shape[1]} feature columns"
            )
        if (
            self.class_names
            and n
            and not 0 <= self.labels.min() <= self.labels.max() < len(self.class_names)
        ):
            raise ValueError(f"{self.name}: labels outside 0..{len(self.class_names) - 1}")
        if self.site_ids is not None:
            if self.site_ids.shape != (n,):
                raise ValueError(f"{self.name}: site_ids must have length {n}")
            if n and not 0 <= self.site_ids.min() <= self.site_ids.max() < len(self.site_names):
                raise ValueError(f"{self.name}: site_ids outside 0..{len(self.site_names) - 1}")
        if self.split is not None and self.split.shape != (n,):
            raise ValueError(f"{self.name}: split must have length {n}")
        for key, column in self.extra.items():
            if column.shape[0] != n:
                raise ValueError(f"{self.name}: extra column {key!r} must have length {n}")

    def __len__(self) -> int:
        return int(self.features.shape[0])

    @property
    def n_features(self) -> int:
        return int(np.prod(self.features.shape[1:]))

    @property
    def privacy_caveats(self) -> tuple[str, ...]:
        """The transforms a privacy datasheet must declare as outside ε."""
        return tuple(p for p in self.preprocessing if p.startswith(NONPRIVATE_MARK))

    def subset(self, indices: np.ndarray) -> Dataset:
        """The records at `indices`, in that order (a silo's share, a split, ...)."""
        idx = np.asarray(indices, dtype=np.int64)
        return dataclasses.replace(
            self,
            features=self.features[idx],
            labels=self.labels[idx],
            site_ids=None if self.site_ids is None else self.site_ids[idx],
            split=None if self.split is None else self.split[idx],
            units=None if self.units is None else self.units[idx],
            extra={k: v[idx] for k, v in self.extra.items()},
        )

    def official_split(self, name: str) -> Dataset:
        """The records the source assigns to split `name` (e.g. MedMNIST's "val")."""
        if self.split is None:
            raise ValueError(f"{self.name} has no official split")
        if name not in set(self.split.tolist()):
            raise ValueError(f"{self.name} has no split {name!r}; it has {sorted(set(self.split))}")
        return self.subset(np.flatnonzero(self.split == name))

    @property
    def is_survival(self) -> bool:
        """Whether the labels are (time, event) pairs rather than classes."""
        return bool(self.labels.ndim == 2)

    @property
    def strata(self) -> np.ndarray:
        """Integer groups to stratify splits by: the classes, or for survival the event
        indicator (so every part gets its share of observed events)."""
        return self.labels[:, 1].astype(np.int64) if self.is_survival else self.labels

    def class_counts(self) -> np.ndarray:
        """Records per class (per event indicator, censored first, for survival)."""
        size = max(len(self.class_names), int(self.strata.max(initial=-1)) + 1)
        return np.bincount(self.strata, minlength=size)


def first_records(units: np.ndarray, max_records: int) -> np.ndarray:
    """The sorted indices of each patient's first `max_records` records (`units`: each
    record's patient): contribution bounding, a public per-record rule that makes a
    patient's influence at most `max_records` records' whatever the data."""
    order = np.argsort(units, kind="stable")
    ordered = units[order]
    starts = np.r_[0, np.flatnonzero(ordered[1:] != ordered[:-1]) + 1]
    rank = np.arange(len(ordered)) - np.repeat(starts, np.diff(np.r_[starts, len(ordered)]))
    return np.sort(order[rank < max_records])


def survival_labels(time: np.ndarray, event: np.ndarray, name: str = "survival") -> np.ndarray:
    """(time, event) pairs, float64 (n, 2), checked: times finite and non-negative,
    events 0 (censored) or 1 (observed)."""
    labels = np.column_stack([np.asarray(time, np.float64), np.asarray(event, np.float64)])
    check_survival(labels, name)
    return labels


def check_survival(labels: np.ndarray, name: str) -> None:
    """Refuse survival labels that are not (time ≥ 0, event ∈ {0, 1}) pairs."""
    time, event = labels[:, 0], labels[:, 1]
    if not np.all(np.isfinite(time)) or np.any(time < 0):
        raise ValueError(f"{name}: survival times must be finite and non-negative")
    if not np.all((event == 0) | (event == 1)):
        raise ValueError(f"{name}: survival events must be 0 (censored) or 1 (observed)")
