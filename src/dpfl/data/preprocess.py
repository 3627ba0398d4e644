"""Privacy-safe preprocessing (Owkin §II-D): safe by default, explicit when not.

The default transforms read no statistic of the private records: each record is
transformed on its own, with constants declared in advance (zero for missing values,
published ranges, declared categories, a published gene list). They cost no budget.
A transform fitted on private data without DP must be asked for with
`allow_nonprivate=True`, and it writes `NONPRIVATE_MARK` ("ε excludes preprocessing")
into the dataset's `preprocessing`, from where the run's privacy datasheet reports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from dpfl.data.dataset import NONPRIVATE_MARK, Dataset, survival_labels


def _with(dataset: Dataset, note: str, **changes: Any) -> Dataset:
    return dataclasses.replace(dataset, preprocessing=(*dataset.preprocessing, note), **changes)


def _dense(dataset: Dataset, step: str) -> np.ndarray:
    if sp.issparse(dataset.features) or dataset.features.ndim != 2:
        raise ValueError(f"{step} needs a dense 2-D feature table; {dataset.name} has none")
    return np.asarray(dataset.features)


def _columns(dataset: Dataset, names: Sequence[str], step: str) -> list[int]:
    unknown = [n for n in names if n not in dataset.feature_names]
    if unknown:
        raise ValueError(f"{step}: {dataset.name} has no feature(s) {unknown}")
    return [dataset.feature_names.index(n) for n in names]


def zero_impute(dataset: Dataset) -> Dataset:
    """Missing (NaN) -> 0: a public constant, so it costs no budget (Owkin §II-D b)."""
    features = dataset.features.copy()
    if isinstance(features, sp.csr_matrix):
        features.data[np.isnan(features.data)] = 0
        features.eliminate_zeros()
    else:
        features[np.isnan(features)] = 0
    return _with(dataset, "zero imputation of missing values (public)", features=features)


def scale_to_ranges(dataset: Dataset, ranges: Mapping[str, tuple[float, float]]) -> Dataset:
    """Min-max scale the named columns by declared public bounds, clipping to [0, 1].

    The bounds are part of the configuration (e.g. age 15-89, MRCI 2-60 in Kerkouche),
    never read from the records; clipping makes the bounds hold for every record, which
    is also what keeps a downstream sensitivity honest. NaN stays NaN.
    """
    features = _dense(dataset, "scale_to_ranges").copy()
    for name, column in zip(
        ranges, _columns(dataset, list(ranges), "scale_to_ranges"), strict=True
    ):
        low, high = ranges[name]
        if not (np.isfinite(low) and np.isfinite(high) and low < high):
            raise ValueError(f"scale_to_ranges: bad range {ranges[name]!r} for {name!r}")
        features[:, column] = np.clip((features[:, column] - low) / (high - low), 0, 1)
    shown = [f"{n} {lo:g}-{hi:g}" for n, (lo, hi) in list(ranges.items())[:5]]
    more = f", ... {len(ranges)} features in all" if len(ranges) > 5 else ""
    note = f"scaled by declared public ranges ({', '.join(shown)}{more})"
    return _with(dataset, note, features=features)


def one_hot(dataset: Dataset, categories: Mapping[str, Sequence[float]]) -> Dataset:
    """Replace each named column by indicators of its declared categories.

    Missing (NaN) encodes as all zeros; a value outside the declared categories is an
    error naming the record and column (never silently dropped or invented).
    """
    features = _dense(dataset, "one_hot")
    columns = _columns(dataset, list(categories), "one_hot")
    blocks: list[np.ndarray] = []
    names: list[str] = []
    for j, name in enumerate(dataset.feature_names):
        if j not in columns:
            blocks.append(features[:, j : j + 1])
            names.append(name)
            continue
        values = features[:, j]
        declared = np.asarray(categories[name], dtype=np.float32)
        bad = np.flatnonzero(~np.isnan(values) & ~np.isin(values, declared))
        if bad.size:
            raise ValueError(
                f"one_hot: {dataset.name} record {bad[0]}, column {name!r}: value "
                f"{values[bad[0]]:g} not in declared categories {list(categories[name])}"
            )
        blocks.append((values[:, None] == declared[None, :]).astype(np.float32))
        names += [f"{name}={v:g}" for v in categories[name]]
    return _with(
        dataset,
        f"one-hot with declared categories ({', '.join(categories)})",
        features=np.concatenate(blocks, axis=1),
        feature_names=tuple(names),
    )


def select_features(dataset: Dataset, names: Sequence[str], reason: str) -> Dataset:
    """Keep the named columns, chosen without looking at the records (e.g. a published
    gene signature); `reason` says where the list comes from."""
    columns = _columns(dataset, names, "select_features")
    return _with(
        dataset,
        f"selected {len(columns)} features by public list ({reason})",
        features=dataset.features[:, columns],
        feature_names=tuple(names),
    )


def as_survival(dataset: Dataset, time: str, event: str) -> Dataset:
    """The survival task: labels become the (time, event) pairs of the `extra` columns
    `time` and `event` (each record's own values: free). The class labels they replace
    stay in `extra` as "class"."""
    for column in (time, event):
        if column not in dataset.extra:
            raise ValueError(f"as_survival: {dataset.name} has no column {column!r} in extra")
    labels = survival_labels(dataset.extra[time], dataset.extra[event], dataset.name)
    return _with(
        dataset,
        f"survival task: labels = ({time}, {event})",
        labels=labels,
        class_names=(),
        extra={**dataset.extra, "class": dataset.labels},
    )


def require_finite(dataset: Dataset) -> Dataset:
    """Refuse NaN or infinity before training, naming the first bad record and column."""
    values = dataset.features.data if sp.issparse(dataset.features) else dataset.features
    if np.all(np.isfinite(values)):
        return dataset
    if isinstance(dataset.features, sp.csr_matrix):
        coo = dataset.features.tocoo()
        bad = np.flatnonzero(~np.isfinite(coo.data))[0]
        row, column = int(coo.row[bad]), int(coo.col[bad])
    else:
        flat = dataset.features.reshape(len(dataset), -1)
        row, column = (int(i) for i in np.argwhere(~np.isfinite(flat))[0])
    name = dataset.feature_names[column] if dataset.feature_names else str(column)
    raise ValueError(
        f"{dataset.name}: non-finite value at record {row}, feature {name!r}; "
        "impute missing values (preprocess.zero_impute) before training"
    )


def _refuse(step: str, allow_nonprivate: bool) -> None:
    if not allow_nonprivate:
        raise PermissionError(
            f"{step} is fitted on private records without differential privacy; pass "
            "allow_nonprivate=True to accept that ε excludes this preprocessing, or use "
            "public bounds (scale_to_ranges) or DP estimates (dp_stats)"
        )


def fit_standardize(dataset: Dataset, *, allow_nonprivate: bool = False) -> Dataset:
    """Standardise with the records' own mean/std: NOT private, refused unless asked."""
    _refuse("fit_standardize", allow_nonprivate)
    features = _dense(dataset, "fit_standardize")
    mean = np.nanmean(features, axis=0)
    std = np.nanstd(features, axis=0)
    scaled = ((features - mean) / np.where(std > 0, std, 1)).astype(np.float32)
    return _with(
        dataset,
        f"{NONPRIVATE_MARK}: standardised with mean/std fitted on {len(dataset)} private records",
        features=scaled,
    )


def nonprivate_select_kbest(
    dataset: Dataset, k: int, *, seed: int, allow_nonprivate: bool = False
) -> Dataset:
    """Keep the k features of highest mutual information with the label (scikit-learn):
    the A*STAR seed's kind of supervised filter selection. NOT private, refused unless
    asked; the chosen names are recorded in the datasheet note."""
    _refuse("nonprivate_select_kbest", allow_nonprivate)
    from sklearn.feature_selection import mutual_info_classif

    features = np.nan_to_num(_dense(dataset, "nonprivate_select_kbest"))
    if not 1 <= k <= features.shape[1]:
        raise ValueError(f"k must be in 1..{features.shape[1]}, got {k}")
    scores = mutual_info_classif(features, dataset.labels, random_state=seed)
    columns = np.sort(np.argsort(-scores, kind="stable")[:k])
    return _with(
        dataset,
        f"{NONPRIVATE_MARK}: {k} features selected by mutual information on "
        f"{len(dataset)} private records",
        features=dataset.features[:, columns],
        feature_names=tuple(dataset.feature_names[j] for j in columns),
    )
