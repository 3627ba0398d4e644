"""`dataset = "table"`: a consortium's own CSV or Parquet table, preprocessed as its
study declares (`dpfl.data.table`), every key checked before a record is read."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from dpfl.data import Dataset, partition, preprocess
from dpfl.data.table import HONEST_RANGE, TODO, Column
from dpfl.experiments.study.datasets.base import DataSettings, Files, site_names_of
from dpfl.federation.silo import Silo, silos_from_dataset, silos_from_splits


class TableData(DataSettings):
    """The file `path`, with the keys `label` (or `time` and `event`), `classes`, `site`,
    `sites`, `features`, `[data.columns]`, `unit` and `max_records`."""

    OWN_KEYS_WERE_OPTIONS = False

    FILES: ClassVar[Files] = "file"

    dataset: Literal["table"]
    label: str | None = None
    """A table's label column: integer classes, those of `classes`."""
    classes: list[str | int] | None = None
    """The label's classes as written in the file, declared (default 0 and 1): never
    read off the records, where a class's presence is itself a fact about them."""
    time: str | None = None
    """A table's survival time column (with `event`, instead of `label`)."""
    event: str | None = None
    """A table's survival event column: 1 observed, 0 censored."""
    site: str | None = None
    """A table's site column: one silo per site (the natural partition)."""
    sites: dict[str, int] | None = None
    """Each site's declared public size (its records in the table), which shapes its
    mechanism instead of its count; a site holding fewer records is refused."""
    features: list[str] | None = None
    """A table's feature columns (default: every column but the label, survival and site
    ones); an identifier such as a patient number is not a feature unless listed."""
    columns: dict[str, Column] = Field(default_factory=dict)
    """Each feature column's public preprocessing (`dpfl.data.table.Column`)."""
    unit: str | None = None
    """A table's column naming each record's patient: the unit of privacy becomes the
    patient (all their records; patient-level DP-SGD samples patients and clips each
    one's records as one), and public sizes (`sites`, or a DP count) count patients."""
    max_records: int | None = Field(None, ge=1)
    """The declared most records one patient has: with `unit`, the most a sampled patient
    contributes (drawn from their own records); without, the group size of the
    datasheet's patient-level figure for record-level training."""

    @model_validator(mode="after")
    def _a_table(self) -> TableData:
        """A table's keys, checked before any record is read."""
        if self.path is None or not self.path.is_file():
            raise ValueError(f"data.path: a table is one CSV or Parquet file; {self.path} is not")
        if self.label is None and (self.time is None or self.event is None):
            raise ValueError("a table needs data.label (classes) or data.time and data.event")
        if self.label is not None and (self.time is not None or self.event is not None):
            raise ValueError("data.label (classes) or data.time and data.event, not both")
        if self.classes is not None and (self.label is None or TODO in self.classes):
            raise ValueError(
                "data.classes: the label's classes as written in the file, declared from the "
                "data dictionary (never read off the records)"
                if self.label is not None
                else "data.classes: survival takes no classes"
            )
        self._sites_declared()
        for name in self.features or []:
            if name not in self.columns:
                raise ValueError(
                    f"data.features: {name!r} has no [data.columns.{name}]: a number needs "
                    f"`range = [low, high]` from {HONEST_RANGE}; text needs `categories`"
                )
        extra = sorted(set(self.columns) - set(self.features or self.columns))
        if extra:
            raise ValueError(f"data.columns: {extra} are not among data.features")
        return self

    def _sites_declared(self) -> None:
        if self.site is None:
            if self.sites is not None:
                raise ValueError("data.sites: public sizes of sites, which need data.site")
        elif self.partition.kind != "natural":
            raise ValueError("data.site makes one silo per site: leave data.partition out")
        elif self.public_sizes == "declared" and self.sites is None:
            raise ValueError(
                "data.site: each silo's public size must come from the study, never its "
                "records' count: declare each site's in [data.sites] (e.g. hospital_a = 1200, "
                "at most its records) or set data.public_sizes = 'dp-count'"
            )
        elif self.public_sizes == "dp-count" and self.sites is not None:
            raise ValueError("data.sites: public sizes are declared or a DP count, not both")
        if any(size < 1 for size in (self.sites or {}).values()):
            raise ValueError("data.sites: every declared public size is a positive count")

    def load(self, seed: int) -> Dataset:
        return self.read()

    def read(self, own_site: str | None = None) -> Dataset:
        """The table, preprocessed as declared; `own_site`: the file is that site's alone
        (a deployed hospital's)."""
        from dpfl.data import table

        return table.read_table(
            self.folder,
            columns=self.columns,
            features=self.features,
            label=self.label,
            classes=(0, 1) if self.classes is None else self.classes,
            time=self.time,
            event=self.event,
            site=self.site,
            sites=self.sites,
            own_site=own_site,
            unit=self.unit,
            max_records=self.max_records,
        )

    def declared_input(self) -> tuple[int, int | None]:
        """The feature count (a range's column one, a category column one per declared
        category and one for "other", a column of `groups` one per group and one for
        "other") and the number of declared classes (None: survival labels). The features
        are `features` or, without it, every `[data.columns]` entry but the label,
        survival and site ones: the file's own columns, each of which must be declared."""
        targets = {self.label, self.time, self.event, self.site, self.unit}
        chosen = self.features or [c for c in self.columns if c not in targets]
        declared = [self.columns[name] for name in chosen]  # `_a_table` checks each is
        width = sum(_width(c) for c in declared)
        survival = self.time is not None and self.event is not None
        return width, None if survival else len(self.classes or (0, 1))

    def declared_sizes(self) -> dict[str, int]:
        """`[data.sites]`, each site's share of training records, by silo name."""
        if self.sites is None:
            return {}
        names = self.partition.names or site_names_of(list(self.sites))
        shares = [max(1, round(n * (1 - self.test_fraction))) for n in self.sites.values()]
        return dict(zip(names, shares, strict=False))

    def declared_unit(self) -> str | None:
        return self.unit

    def declared_max_records(self) -> int | None:
        return self.max_records

    def own_silo(self, seed: int, names: Sequence[str], name: str, path: Path) -> Silo:
        """One hospital's silo from its own table file at `path`, as `build_silos` makes
        the study's silo `name` from the whole table: read through the study's schema
        (nothing fitted on the records), the file holding that site's records only, split
        by `test_fraction` with the silo's own seed (the draw of `seed` at its index among
        `names`, the study's silos in the simulator's order; by patient, with `unit` and
        `max_records` on the silo, where the study names a unit), without a public size
        (the study's declared one, `declared_sizes`, the hospital's own, or a DP count)."""
        if self.split != "stratified":
            return super().own_silo(seed, names, name, path)
        if self.sites is not None:
            names = list(self.declared_sizes())
        if name not in names:
            raise ValueError(f"{name!r} is not one of the study's silos {list(names)}")
        k = list(names).index(name)
        site = list(self.sites)[k] if self.sites is not None else name
        data = self.model_copy(update={"path": path}).read(own_site=site)
        preprocess.require_finite(data)
        if data.units is not None:  # by patient, with the seed build_silos gives silo k
            (silo,) = silos_from_dataset(
                data,
                [np.arange(len(data.labels))],
                test_fraction=self.test_fraction,
                seed=seed + k,
                names=[name],
                declare_sizes=False,
            )
            return silo
        everyone = [np.arange(len(data.labels))] * (k + 1)  # the seeds of silos 0 to k
        fractions = [1 - self.test_fraction, self.test_fraction]
        splits = partition.per_silo_splits(everyone, data.strata, fractions, seed)
        (silo,) = silos_from_splits(data, splits[k:], names=[name], declare_sizes=False)
        return silo


def _width(column: Column) -> int:
    """A declared column's features: a range's one, one per category or group and one
    for "other"."""
    if column.groups is not None:
        return len(column.groups) + 1
    return 1 if column.categories is None else len(column.categories) + 1
