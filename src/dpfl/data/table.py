"""A consortium's own cohort table (CSV or Parquet) read as a `Dataset`, with only the
preprocessing its study declares.

Each feature column is declared public in advance (`Column`): a number by its range
(scaled to [0, 1] and clipped outside, optionally on the log scale), text by its
categories (one-hot, a value not listed is "other", an empty cell is missing) or by
groups of codes (`dpfl.data.codes`: a diagnosis code's ICD-9 chapter, say; one-hot over
the groups, the same "other" and missing). Every
record is transformed on its own with those constants: nothing is computed from the
records (no minimum, mean or quantile), so the preprocessing costs no budget. A column
without a declaration is refused, and so is every cell that breaks a declaration, before
any record is used: the error names the file, the line (CSV; the header is line 1) or row
(Parquet) and the column.

The label is integer classes declared by the study (`classes`, default 0 and 1: a label
is never read off the records), or survival (`time`, `event`). A `site` column makes one
silo per site; each site's public size is the study's (`sites`), never its count, and a
site holding fewer records than that is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

from dpfl.data import codes
from dpfl.data.dataset import DataFormatError, Dataset, require_file, survival_labels

TODO = "?"
"""What `dpfl init` writes where a public value is the user's to fill in."""
OTHER = "other"
"""The indicator of a category value the study does not list: `race=other`."""
CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.bz2")
PARQUET_SUFFIXES = (".parquet", ".pq")
HONEST_RANGE = (
    "a public source: a published reference range, the data dictionary or the "
    "instrument's limits (a DP quantile release charged to the ledger is not offered yet)"
)
"""How to get a range without reading the records."""


class Column(BaseModel):
    """A feature column's public preprocessing: `range` (a number; with `log`, on the log
    scale), `categories` (text, compared as written in the file) or `groups` (text codes,
    each group's exact values and code ranges, `dpfl.data.codes`); `missing`, what an
    empty cell of a number becomes: a value in the column's units (before the log and the
    range) or "zero" (the feature 0). Without `missing` an empty number is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    range: tuple[float, float] | None = None
    log: bool = False
    categories: list[str | int] | None = None
    groups: dict[str, list[str]] | None = None
    """Group name → its members: exact values as written (`"?"`) and code ranges
    (`"001-139"`, `"V01-V91"`), checked by `dpfl.data.codes.grouping`."""
    missing: float | Literal["zero"] | None = None

    @field_validator("range", "categories", mode="before")
    @classmethod
    def _filled(cls, value: Any, info: ValidationInfo) -> Any:
        """`dpfl init`'s placeholders are refused, each with how to fill it honestly."""
        if isinstance(value, list) and TODO in value:
            how = (
                f"declare the range from {HONEST_RANGE}"
                if info.field_name == "range"
                else "list the categories from the data dictionary, never from the records "
                "(reading them would release them)"
            )
            raise ValueError(f"still {TODO!r}: {how}")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> Column:
        if [self.range, self.categories, self.groups].count(None) != 2:
            raise ValueError(
                "give a number's `range`, a text's `categories` or a code's `groups` (one of them)"
            )
        if self.groups is not None:
            codes.grouping(self.groups, OTHER)  # a clear error for a bad declaration
        if self.range is not None:
            low, high = self.range
            if not low < high:
                raise ValueError(f"range {list(self.range)}: low must be below high")
        elif self.log or self.missing is not None:
            raise ValueError(
                "categories and groups take no `log` or `missing`: an empty cell is missing "
                "(all zero)"
            )
        if self.categories is not None and len(set(map(str, self.categories))) < len(
            self.categories
        ):
            raise ValueError(f"categories {self.categories} repeat a value")
        return self


def read_table(
    path: Path,
    *,
    columns: Mapping[str, Column],
    features: Sequence[str] | None = None,
    label: str | None = None,
    classes: Sequence[str | int] = (0, 1),
    time: str | None = None,
    event: str | None = None,
    site: str | None = None,
    sites: Mapping[str, int] | None = None,
    own_site: str | None = None,
    unit: str | None = None,
    max_records: int | None = None,
) -> Dataset:
    """The table at `path` as a Dataset: `features` (default: every column but the label,
    survival, site ones) preprocessed as `columns` declares; labels the index of each
    label in `classes`, or (time, event) pairs; sites by `site`, in the order of `sites`
    (the declared public sizes) where given, else sorted. `own_site`: the file is one
    site's own (a deployed hospital's), one silo: its `site` column, if it has one, must
    hold only that name. `unit`: the column naming each record's patient, the unit of
    privacy (an identifier, never a feature); `max_records`, the declared most records of
    one patient. Refuses bad input naming the file, line or row, and column."""
    path = require_file(Path(path))
    cells, where = _cells(path)
    targets = [c for c in (label, time, event, site, unit) if c is not None]
    chosen = list(features) if features is not None else [c for c in cells if c not in targets]
    if own_site is not None and site is not None:
        other = np.flatnonzero(cells.get(site, np.asarray([])) != own_site)
        if len(other):
            raise where.error(
                int(other[0]),
                site,
                f"site {cells[site][other[0]]!r} in {own_site!r}'s own file: a hospital's "
                "file holds only its own records",
            )
        targets.remove(site)
        site = None
    for name in [*targets, *chosen]:
        if name not in cells:
            raise DataFormatError(
                path, f"no such column (the header has {', '.join(cells)})", column=name
            )
    for name in chosen:
        if name not in columns:
            raise DataFormatError(
                path,
                "no public preprocessing declared: a number needs `range = [low, high]` in "
                f"[data.columns.{name}] from {HONEST_RANGE}; text needs `categories = [...]`",
                column=name,
            )
    blocks: list[np.ndarray] = []
    names: list[str] = []
    for name in chosen:
        block, block_names = _feature(cells[name], name, columns[name], where)
        blocks.append(block)
        names += block_names
    n = len(next(iter(cells.values()))) if cells else 0
    if n == 0:
        raise DataFormatError(path, "no records (empty file?)")
    features_array = np.concatenate(blocks, axis=1) if blocks else np.zeros((n, 0), np.float32)
    if time is not None and event is not None:
        labels = survival_labels(
            _numbers(cells[time], time, where), _events(cells[event], event, where), path.name
        )
        class_names: tuple[str, ...] = ()
        task = f"survival ({time}, {event})"
    else:
        assert label is not None  # a study names a label or survival columns
        labels = _classes(cells[label], label, [str(c) for c in classes], where)
        class_names = tuple(str(c) for c in classes)
        task = f"label {label} over the declared classes {list(classes)}"
    units = None if unit is None else _units(cells[unit], unit, where)
    site_ids, site_names = (
        (None, ()) if site is None else _sites(cells[site], site, sites, where, units)
    )
    return Dataset(
        name=path.stem,
        features=features_array,
        labels=labels,
        feature_names=tuple(names),
        class_names=class_names,
        site_ids=site_ids,
        site_names=site_names,
        description=(
            f"{path.name}: {n} records, {task}"
            + (f", one silo per {site}" if site is not None else "")
            + (f", the privacy unit the patient ({unit})" if unit is not None else "")
            + f"; {len(chosen)} columns as {len(names)} features"
        ),
        preprocessing=_notes(chosen, columns),
        units=units,
        max_records=max_records,
    )


class _Where:
    """Names a cell: the file, the CSV line (header line 1) or Parquet row, the column."""

    def __init__(self, path: Path, csv: bool) -> None:
        self.path, self.csv = path, csv

    def error(self, index: int, column: str, message: str) -> DataFormatError:
        if self.csv:
            return DataFormatError(self.path, message, line=index + 2, column=column)
        return DataFormatError(f"{self.path}, row {index + 1}", message, column=column)


def _cells(path: Path) -> tuple[dict[str, np.ndarray], _Where]:
    """Every column as text ("" for an empty cell or a null), read by pyarrow: a CSV's
    cells as written, a Parquet column's values cast to text (an integer-valued float as
    an integer), so both formats read to the same cells."""
    import pyarrow as pa
    import pyarrow.compute as pc

    name = path.name.lower()
    try:
        if name.endswith(PARQUET_SUFFIXES):
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            csv = False
        elif name.endswith(CSV_SUFFIXES):
            from pyarrow import csv as pcsv

            header = pcsv.open_csv(path).schema.names
            table = pcsv.read_csv(
                path,
                convert_options=pcsv.ConvertOptions(
                    column_types=dict.fromkeys(header, pa.string()), strings_can_be_null=False
                ),
            )
            csv = True
        else:
            raise DataFormatError(path, "not a table: name a .csv or .parquet file")
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataFormatError(path, f"cannot be read as a table: {exc}") from exc
    repeated = sorted({c for c in table.column_names if table.column_names.count(c) > 1})
    if repeated:
        raise DataFormatError(path, f"the header repeats {repeated}", line=1)
    cells = {
        column: np.asarray(
            pc.fill_null(
                pc.utf8_trim_whitespace(pc.cast(table[column], pa.string())), ""
            ).to_pylist(),
            dtype=object,
        )
        for column in table.column_names
    }
    return cells, _Where(path, csv)


def _numbers(cells: np.ndarray, column: str, where: _Where) -> np.ndarray:
    """The cells as finite float64, "" as NaN; any other cell that is not one is refused."""
    values = np.full(len(cells), np.nan)
    for i, text in enumerate(cells):
        if text == "":
            continue
        try:
            value = float(text)
        except ValueError:
            raise where.error(i, column, f"cannot parse {text!r} as a number") from None
        if not math.isfinite(value):
            raise where.error(i, column, f"non-finite value {text!r}")
        values[i] = value
    return values


def _feature(
    cells: np.ndarray, name: str, column: Column, where: _Where
) -> tuple[np.ndarray, list[str]]:
    """One declared column's features, each record's from its own cell alone."""
    if column.groups is not None:
        grouped = codes.grouping(column.groups, OTHER)
        return grouped.one_hot(cells), [f"{name}={g}" for g in (*grouped.names, OTHER)]
    if column.categories is not None:
        declared = [str(c) for c in column.categories]
        text = np.asarray(cells, dtype=object)[:, None]
        listed = (text == np.asarray(declared, dtype=object)[None, :]).astype(bool)
        other = (cells != "") & ~listed.any(axis=1)
        block = np.column_stack([listed, other]).astype(np.float32)
        return block.reshape(len(cells), -1), [f"{name}={c}" for c in declared] + [
            f"{name}={OTHER}"
        ]
    assert column.range is not None  # Column holds one of them
    values = _numbers(cells, name, where)
    empty = np.isnan(values)
    if empty.any() and column.missing is None:
        raise where.error(
            int(np.flatnonzero(empty)[0]),
            name,
            "empty cell: declare what it stands for (`missing = <value>` or `missing = "
            f'"zero"` in [data.columns.{name}])',
        )
    if isinstance(column.missing, float):
        values[empty] = column.missing
    if column.log:  # the range is on the log scale
        bad = np.flatnonzero(values <= 0)  # an empty cell left NaN is not compared
        if bad.size:
            raise where.error(int(bad[0]), name, f"log of {values[bad[0]]:g}, not above 0")
        values = np.log(values)
    low, high = column.range
    scaled = np.clip((values - low) / (high - low), 0, 1)
    scaled[empty & (column.missing == "zero")] = 0.0
    return scaled.astype(np.float32)[:, None], [name]


def declared_feature(
    cells: np.ndarray, name: str, column: Column, path: Path
) -> tuple[np.ndarray, list[str]]:
    """A text column's features (`column`'s categories or groups, one-hot with "other"),
    read from its cells as a table's are; for loaders of public datasets."""
    if column.range is not None:
        raise ValueError(f"{name}: declared_feature reads text columns (categories, groups)")
    return _feature(np.asarray(cells, dtype=object), name, column, _Where(path, True))


def _classes(cells: np.ndarray, column: str, classes: list[str], where: _Where) -> np.ndarray:
    index = {c: k for k, c in enumerate(classes)}
    bad = np.flatnonzero(~np.isin(cells, classes))
    if bad.size:
        raise where.error(
            int(bad[0]),
            column,
            f"label {cells[bad[0]]!r} is not one of the declared classes {classes} "
            "(declare them in data.classes, as written in the file)",
        )
    return np.asarray([index[c] for c in cells], dtype=np.int64)


def _events(cells: np.ndarray, column: str, where: _Where) -> np.ndarray:
    bad = np.flatnonzero(~np.isin(cells, ["0", "1"]))
    if bad.size:
        raise where.error(int(bad[0]), column, f"event {cells[bad[0]]!r} is not 0 or 1")
    return np.asarray(cells == "1", dtype=np.float64)


def _units(cells: np.ndarray, column: str, where: _Where) -> np.ndarray:
    """Each record's patient, numbered in the order of their identifiers (int64)."""
    empty = np.flatnonzero(cells == "")
    if len(empty):
        raise where.error(int(empty[0]), column, "empty patient identifier")
    return np.unique(cells, return_inverse=True)[1].astype(np.int64)


def _sites(
    cells: np.ndarray,
    column: str,
    sites: Mapping[str, int] | None,
    where: _Where,
    units: np.ndarray | None = None,
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Site ids in the declared order (sorted where none is declared), each declared
    site holding at least its public size: records, or patients where `units` names
    each record's patient (a patient-level site's public size counts patients)."""
    empty = np.flatnonzero(cells == "")
    if empty.size:
        raise where.error(int(empty[0]), column, "empty site")
    names = list(sites) if sites is not None else sorted(set(cells.tolist()))
    bad = np.flatnonzero(~np.isin(cells, names))
    if bad.size:
        raise where.error(
            int(bad[0]), column, f"site {cells[bad[0]]!r} is not declared in [data.sites]"
        )
    ids = np.asarray([names.index(c) for c in cells], dtype=np.int64)
    for k, name in enumerate(names):
        here = ids == k
        count = int(here.sum()) if units is None else len(np.unique(units[here]))
        if sites is not None and count < sites[name]:
            raise DataFormatError(
                where.path,
                f"site {name!r} holds {count} {'records' if units is None else 'patients'}, "
                f"fewer than its declared public size "
                f"{sites[name]} (data.sites): a public size may understate a site, never "
                "overstate it",
                column=column,
            )
    return ids, tuple(names)


def _notes(chosen: Sequence[str], columns: Mapping[str, Column]) -> tuple[str, ...]:
    """What the datasheet says of the preprocessing: each kind, with its columns."""
    ranged = [n for n in chosen if columns[n].range is not None]
    notes = []
    if ranged:
        shown = [
            f"{n}{' (log)' if columns[n].log else ''} {columns[n].range[0]:g}-"  # type: ignore[index]
            f"{columns[n].range[1]:g}"  # type: ignore[index]
            for n in ranged
        ]
        notes.append(f"scaled by declared public ranges, clipped ({', '.join(shown)})")
    listed = [n for n in chosen if columns[n].categories is not None]
    if listed:
        notes.append(f"one-hot with declared categories, others as '{OTHER}' ({', '.join(listed)})")
    grouped = [n for n in chosen if columns[n].groups is not None]
    if grouped:
        notes.append(
            f"one-hot over declared groups of codes, others as '{OTHER}' ({', '.join(grouped)})"
        )
    imputed = [f"{n}={columns[n].missing}" for n in chosen if columns[n].missing is not None]
    if imputed:
        notes.append(f"empty cells imputed with declared values ({', '.join(imputed)})")
    return tuple(notes)
