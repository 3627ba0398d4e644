"""Clinical tables: the embedded breast cancer set and the public hospital datasets read
from their folders, each scaled by declared public ranges."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from dpfl.data import Dataset, preprocess
from dpfl.data.table import Column
from dpfl.experiments.study.datasets.base import DataSettings, Files, Real


class BreastCancer(DataSettings):
    """scikit-learn's embedded WDBC table, scaled by published ranges."""

    FILES: ClassVar[Files] = "nothing"

    dataset: Literal["breast_cancer"]

    def load(self, seed: int) -> Dataset:
        from dpfl.data import public_tables

        return preprocess.scale_to_ranges(
            public_tables.breast_cancer_wisconsin(), public_tables.WDBC_RANGES
        )


class HeartDisease(DataSettings):
    """UCI heart disease (four hospitals): categories one-hot, numbers scaled by declared
    ranges, missing values zero."""

    dataset: Literal["heart_disease"]

    def load(self, seed: int) -> Dataset:
        from dpfl.data import public_tables

        data = public_tables.heart_disease(self.folder)
        data = preprocess.one_hot(data, public_tables.HEART_CATEGORIES)
        ranges = public_tables.HEART_RANGES
        return preprocess.zero_impute(preprocess.scale_to_ranges(data, ranges))


class FlambyHeartDisease(DataSettings):
    """FLamby's Fed-Heart-Disease (740 patients, FLamby's split: `data.split =
    "official"`)."""

    dataset: Literal["flamby_heart_disease"]
    scaling: Literal["flamby", "flamby-pooled", "public"] = "flamby"
    """"flamby": each centre's training mean/std, as FLamby (not private);
    "flamby-pooled": FLamby's pooled baseline's (not private); "public": declared ranges,
    free (the DP runs')."""

    def load(self, seed: int) -> Dataset:
        from dpfl.data import flamby

        return flamby.flamby_heart_disease(self.folder, scaling=self.scaling)


class PhysioNet2012(DataSettings):
    """The PhysioNet/CinC 2012 challenge (in-hospital death), numbers scaled by declared
    public ranges, missing values zero; parsed once per process, folder and options."""

    dataset: Literal["physionet2012"]
    sets: tuple[Literal["a", "b"], ...] = Field(("a", "b"), min_length=1)
    """The challenge's sets read (their stays; `split` says which set each is from)."""
    cache_dir: str | None = None
    """A folder for the parsed stays, reused by later runs."""

    def load(self, seed: int) -> Dataset:
        return _physionet2012(self.folder.resolve(), self.sets, self.cache_dir)


@functools.cache
def _physionet2012(folder: Path, sets: tuple[str, ...], cache_dir: str | None) -> Dataset:
    """Kept for the points of a sweep that run in one process, which share one parse of
    the 8,000 stay files instead of repeating it."""
    from dpfl.data import physionet

    data = physionet.physionet2012(folder, sets=sets, cache_dir=cache_dir)
    ranges = physionet.public_ranges()
    return preprocess.zero_impute(preprocess.scale_to_ranges(data, ranges))


class Diabetes130(DataSettings):
    """Diabetes 130-US hospitals (`public_tables.diabetes130`), numbers scaled by declared
    public ranges, text columns one-hot over the built-in categories or those declared in
    `[data.columns]`; read once per process, folder and options."""

    dataset: Literal["diabetes130"]
    one_encounter_per_patient: bool = True
    """Each patient's first encounter only (the usual benchmark), or all of them."""
    proxy_site_column: str | None = None
    """A column whose values stand in for hospitals (the file names none)."""
    max_records: int | None = Field(None, ge=1)
    """The declared most encounters one patient contributes (the first ones)."""
    patient_unit: bool = False
    """The patient is the unit of privacy (all their encounters)."""
    patients_fraction: Real = Field(1.0, gt=0, le=1)
    """The share of patients kept (a public, seeded draw): smaller runs."""
    patients_from: Real = Field(0.0, ge=0, lt=1)
    """Patients below it by the same draw are left out: [from, fraction) is a share of
    patients disjoint from [0, from), e.g. to choose settings on other patients."""
    columns: dict[str, Column] | None = None
    """The text columns' public preprocessing, as a table's `[data.columns]`
    (`dpfl.data.table.Column`: `categories`, or `groups` of codes such as a diagnosis's
    ICD-9 chapters), in place of the built-in categories; none: the built-in ones
    (`public_tables.DIABETES_CATEGORIES`). Age and the counts keep their declared ranges."""

    def load(self, seed: int) -> Dataset:
        options = {
            **self.keywords(),
            "columns": {
                name: column.model_dump(exclude_defaults=True)
                for name, column in (self.columns or {}).items()
            },
        }
        return _diabetes130(self.folder.resolve(), json.dumps(options))  # columns in order


@functools.cache
def _diabetes130(folder: Path, options: str) -> Dataset:
    from dpfl.data import public_tables

    keywords = json.loads(options)
    columns = {name: Column(**spec) for name, spec in keywords.pop("columns").items()}
    data = public_tables.diabetes130(folder, **keywords, columns=columns or None)
    return preprocess.scale_to_ranges(data, public_tables.DIABETES_RANGES)


TCGA_AGE = (20.0, 90.0)
"""Declared bounds of age at diagnosis (TCGA-BRCA reports 26-90): scaling by them is a
fixed map of each value, so it costs nothing."""


class TcgaBrca(DataSettings):
    """FLamby's Fed-TCGA-BRCA: 39 clinical features (age scaled by declared bounds, the
    rest one-hot), 6 regional centres, FLamby's split (`data.split = "official"`)."""

    dataset: Literal["tcga_brca"]
    task: Literal["survival", "death_observed"] = "survival"
    """"survival": time to death, censored (the benchmark's task); "death_observed": the
    binary label, which conflates censoring with survival."""

    def load(self, seed: int) -> Dataset:
        from dpfl.data import public_tables

        data = preprocess.scale_to_ranges(
            public_tables.tcga_brca_clinical(self.folder), {"age_at_index": TCGA_AGE}
        )
        return preprocess.as_survival(data, "T", "E") if self.task == "survival" else data
