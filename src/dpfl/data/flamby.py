"""FLamby's Fed-Heart-Disease exactly as FLamby builds it, and FLamby's published results.

`flamby_heart_disease` rebuilds the dataset of `flamby/datasets/fed_heart_disease/
dataset.py` (owkin/FLamby, commit edacf54) from the four UCI files: slope, ca and thal
dropped, then every record with a missing value among the rest (920 -> 740 patients),
cp and restecg one-hot with the first category dropped (`pd.get_dummies(...,
drop_first=True)`, 13 features in FLamby's column order), label num > 0, and each
centre's own 66/34 train/test split (`train_test_split(..., random_state=43)`,
stratified by label where both classes have more than two records) in `Dataset.split`.

Scaling: "flamby" standardises every record with its centre's training mean and std
(FLamby's `normalize=True`), "flamby-pooled" the training records with the pooled
training mean and std and the test records with their centre's (what FLamby's "Pooled
Training" baseline sees: `FedHeartDisease(pooled=True)` to train, the per-centre test
sets to score); both read private records without DP and are for the non-private
references only. "public" scales by declared clinical ranges and costs nothing.

`published_results` reads FLamby's benchmark CSVs and averages them as FLamby's figure
does: per seed, the metric averaged over the client test sets ("clientavg").
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from dpfl.data import preprocess, public_tables
from dpfl.data.dataset import (
    NONPRIVATE_MARK,
    DataFormatError,
    Dataset,
    require_file,
    require_records,
)

Scaling = Literal["flamby", "flamby-pooled", "public"]
SCALINGS: tuple[str, ...] = ("flamby", "flamby-pooled", "public")

FLAMBY_DROPPED = ("slope", "ca", "thal")
"""Columns 10-12 of the UCI files, dropped by FLamby before dropping incomplete records."""
FLAMBY_NUMERIC = ("age", "sex", "trestbps", "chol", "fbs", "thalach", "exang", "oldpeak")
FLAMBY_DUMMIES: dict[str, tuple[float, ...]] = {"cp": (2, 3, 4), "restecg": (1, 2)}
"""The indicators FLamby keeps: cp's 1..4 and restecg's 0..2 (declared in
heart-disease.names) without the first category, as `get_dummies(drop_first=True)`
leaves them (every category occurs in the 740 records)."""
FLAMBY_FEATURES = (
    *FLAMBY_NUMERIC,
    *(f"{name}={value:g}" for name, values in FLAMBY_DUMMIES.items() for value in values),
)
"""FLamby's 13 input columns, in its order (the dummies come last)."""
FLAMBY_TRAIN_FRACTION = 0.66
FLAMBY_SPLIT_SEED = 43
FLAMBY_STD_EPSILON = 1e-9
"""FLamby divides by (std + 1e-9)."""
FLAMBY_MD5 = {
    "processed.cleveland.data": "2d91a8ff69cfd9616aa47b59d6f843db",
    "processed.hungarian.data": "22e96bee155b5973568101c93b3705f6",
    "processed.switzerland.data": "9a87f7577310b3917730d06ba9349e20",
    "processed.va.data": "4249d03ca7711e84f4444768c9426170",
}
"""The MD5 sums FLamby's download script checks (dataset_creation_scripts/download.py)."""


def flamby_heart_disease(directory: Path | str, *, scaling: Scaling = "flamby") -> Dataset:
    """FLamby's Fed-Heart-Disease (740 patients, 4 centres, 13 features, FLamby's split),
    scaled as `scaling` says (see the module's docstring)."""
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    raw = public_tables.heart_disease(directory)
    assert raw.site_ids is not None  # the loader always gives the four hospitals
    columns = {name: raw.features[:, j] for j, name in enumerate(raw.feature_names)}
    kept = [name for name in raw.feature_names if name not in FLAMBY_DROPPED]
    complete = ~np.isnan(np.stack([columns[name] for name in kept], axis=1)).any(axis=1)
    blocks = [columns[name][complete] for name in FLAMBY_NUMERIC]
    for name, values in FLAMBY_DUMMIES.items():
        column = columns[name][complete]
        declared = public_tables.HEART_CATEGORIES[name]
        bad = np.flatnonzero(~np.isin(column, declared))
        if bad.size:  # get_dummies would have made a column of it: refuse, never drop it
            raise DataFormatError(
                directory,
                f"{name} = {column[bad[0]]:g} in a kept record, not a declared category "
                f"{list(declared)}",
                column=name,
            )
        blocks += [(column == v).astype(np.float32) for v in values]
    features = np.stack(blocks, axis=1).astype(np.float32)
    labels = raw.labels[complete]
    sites = raw.site_ids[complete]
    split = _flamby_split(labels, sites, len(raw.site_names))
    dropped = len(raw) - int(complete.sum())
    data = Dataset(
        name="flamby_heart_disease",
        features=features,
        labels=labels,
        feature_names=FLAMBY_FEATURES,
        class_names=raw.class_names,
        site_ids=sites,
        site_names=raw.site_names,
        split=split,
        extra={"num": raw.extra["num"][complete]},
        description=(
            "FLamby Fed-Heart-Disease (UCI Heart Disease, 4 hospitals) rebuilt as FLamby's "
            "dataset.py does: slope, ca, thal dropped, then the "
            f"{dropped} records with any other value missing ({len(raw)} -> "
            f"{len(labels)} patients); cp, restecg one-hot without their first category; "
            "label num > 0; FLamby's fixed per-centre 66/34 train/test split "
            f"(train_test_split, random_state={FLAMBY_SPLIT_SEED}, stratified by label), "
            "taken as the source's official split."
        ),
        preprocessing=(
            f"dropped columns {', '.join(FLAMBY_DROPPED)} and the {dropped} records with a "
            "missing value in another column (each record judged on its own values)",
            "one-hot with declared categories, first dropped (cp: 2, 3, 4; restecg: 1, 2)",
        ),
    )
    if scaling == "public":
        return preprocess.scale_to_ranges(
            data, {name: public_tables.HEART_RANGES[name] for name in FLAMBY_NUMERIC}
        )
    return _standardised(data, pooled_training=scaling == "flamby-pooled")


def _flamby_split(labels: np.ndarray, sites: np.ndarray, centres: int) -> np.ndarray:
    """FLamby's per-centre split: `train_test_split(np.arange(n), test_size=1 - 0.66,
    train_size=0.66, random_state=43, shuffle=True, stratify=...)` over each centre's
    records in file order, stratified by label only when both classes have more than two
    records."""
    from sklearn.model_selection import train_test_split

    split = np.empty(len(labels), dtype=object)
    for centre in range(centres):
        rows = np.flatnonzero(sites == centre)
        own = labels[rows]
        counts = np.bincount(own, minlength=2)
        stratify = own if len(np.unique(own)) > 1 and all(counts[np.unique(own)] > 2) else None
        _, test = train_test_split(
            np.arange(len(rows)),
            test_size=1.0 - FLAMBY_TRAIN_FRACTION,
            train_size=FLAMBY_TRAIN_FRACTION,
            random_state=FLAMBY_SPLIT_SEED,
            shuffle=True,
            stratify=stratify,
        )
        is_test = np.isin(np.arange(len(rows)), test)
        split[rows] = np.where(is_test, "test", "train")
    return split.astype(str)


def _standardised(data: Dataset, *, pooled_training: bool) -> Dataset:
    """(x - mean) / (std + 1e-9) with each centre's training mean and unbiased std (the
    training records with the pooled training ones when `pooled_training`)."""
    assert data.site_ids is not None and data.split is not None
    x = np.asarray(data.features, dtype=np.float64)
    out = np.empty_like(x)
    train = data.split == "train"

    def scale(rows: np.ndarray, fitted_on: np.ndarray) -> None:
        mean = x[fitted_on].mean(axis=0)
        std = x[fitted_on].std(axis=0, ddof=1)
        out[rows] = (x[rows] - mean) / (std + FLAMBY_STD_EPSILON)

    for centre in range(len(data.site_names)):
        own = data.site_ids == centre
        scale(own, own & train)
    if pooled_training:
        scale(train, train)
        note = (
            f"{NONPRIVATE_MARK}: FLamby's pooled standardisation, training records with the "
            f"mean/std of all {int(train.sum())} private training records, test records "
            "with their centre's training mean/std"
        )
    else:
        note = (
            f"{NONPRIVATE_MARK}: FLamby's standardisation, every record with its centre's "
            "training mean/std (fitted on private training records)"
        )
    return dataclasses.replace(
        data,
        features=out.astype(np.float32),
        preprocessing=(*data.preprocessing, note),
    )


# -- FLamby's published benchmark results -----------------------------------------------

BENCHMARKS = ("heart", "tcga")
_COLUMNS = ("Method", "Test", "Metric", "seed")
_CLIENT_TEST = re.compile(r"client_test_(\d+)")
_UPDATES = re.compile(r"([A-Za-z]+?)(\d+)")
"""A strategy's name with its number of local updates (FedAvg100): FLamby's figure
drops the number."""


@dataclass(frozen=True)
class Published:
    """One FLamby method over the seeds of its benchmark files."""

    method: str
    """FLamby's method as its figure names it: "Pooled Training", "Local 0", "FedAvg"."""
    label: str
    """The method as the files name it ("FedAvg100": with its number of local updates)."""
    seeds: tuple[int, ...]
    clientavg: tuple[float, ...]
    """Per seed, the metric averaged over the client test sets (FLamby's figure)."""
    pooled_test: tuple[float, ...]
    """Per seed, the metric on the pooled test set (where the file has it)."""

    @property
    def mean(self) -> float:
        return statistics.fmean(self.clientavg)

    @property
    def std(self) -> float:
        """Sample standard deviation over seeds (0 for one seed)."""
        return statistics.stdev(self.clientavg) if len(self.clientavg) > 1 else 0.0

    @property
    def pooled_test_mean(self) -> float:
        return statistics.fmean(self.pooled_test) if self.pooled_test else math.nan


def published_results(folder: Path | str, benchmark: str) -> dict[str, Published]:
    """FLamby's published results of `benchmark` ("heart": Fed-Heart-Disease accuracy,
    "tcga": Fed-TCGA-BRCA C-index) from `folder/{benchmark}_seed<N>.csv`, by method.

    Columns are read by header name (their order differs between files). A file whose
    header lacks Method, Test, Metric or seed, whose seed column disagrees with its name,
    or whose rows are not numbers for known tests is refused, naming the file and line."""
    if benchmark not in BENCHMARKS:
        raise ValueError(f"benchmark must be one of {BENCHMARKS}, got {benchmark!r}")
    folder = Path(folder)
    files = sorted(
        (int(m.group(1)), path)
        for path in folder.glob(f"{benchmark}_seed*.csv")
        if (m := re.fullmatch(rf"{benchmark}_seed(\d+)\.csv", path.name))
    )
    if not files:
        raise DataFormatError(folder / f"{benchmark}_seed*.csv", "no such files")
    clients: dict[str, dict[int, float]] = {}
    pooled: dict[str, dict[int, float]] = {}
    for seed, path in files:
        per_client: dict[str, list[float]] = {}
        for label, test, value in _read_results(path, seed):
            if test is None:
                pooled.setdefault(label, {})[seed] = value
            else:
                per_client.setdefault(label, []).append(value)
        for label, values in per_client.items():
            clients.setdefault(label, {})[seed] = statistics.fmean(values)
    results: dict[str, Published] = {}
    for label, by_seed in clients.items():
        seeds = tuple(sorted(by_seed))
        match = _UPDATES.fullmatch(label)
        method = match.group(1) if match else label
        results[method] = Published(
            method=method,
            label=label,
            seeds=seeds,
            clientavg=tuple(by_seed[s] for s in seeds),
            pooled_test=tuple(v for _, v in sorted(pooled.get(label, {}).items())),
        )
    return results


def _read_results(path: Path, seed: int) -> list[tuple[str, int | None, float]]:
    """(method label, client test index or None for the pooled test, metric) per row."""
    with require_file(path).open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    if not rows:
        raise DataFormatError(path, "empty file")
    header = rows[0]
    absent = [c for c in _COLUMNS if c not in header]
    if absent:
        raise DataFormatError(path, f"header lacks column(s) {absent}", line=1)
    at = {name: header.index(name) for name in _COLUMNS}
    require_records(path, len(rows) - 1, "result rows after the header")
    out: list[tuple[str, int | None, float]] = []
    seen: set[tuple[str, str]] = set()
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise DataFormatError(
                path, f"expected {len(header)} columns, got {len(row)}", line=line
            )
        label, test = row[at["Method"]], row[at["Test"]]
        if not label:
            raise DataFormatError(path, "empty method", line=line, column="Method")
        if row[at["seed"]] != str(seed):
            raise DataFormatError(
                path,
                f"seed {row[at['seed']]!r} in a file named for seed {seed}",
                line=line,
                column="seed",
            )
        client = _CLIENT_TEST.fullmatch(test)
        if client is None and test != "Pooled Test":
            raise DataFormatError(
                path, f"test {test!r} is neither client_test_<k> nor Pooled Test", line=line
            )
        if (label, test) in seen:
            raise DataFormatError(path, f"a second row for {label!r} on {test!r}", line=line)
        seen.add((label, test))
        value = public_tables.parse_float(row[at["Metric"]], path, line, "Metric")
        out.append((label, None if client is None else int(client.group(1)), value))
    return out
