"""What every dataset kind of a study's `[data]` shares: the common keys (where the
files are, how records become silos, how each silo is split and sized), the kind's own
keys (`DataSettings.OPTIONS`, once a study's `[data.options]`, still accepted so), and
the silos built from whatever the kind loads.

A kind loads its records with public preprocessing only: declared public ranges, zero
imputation, published gene signatures, public category lists. Anything fitted on the
records would have to be paid for in the ledger; no kind does that.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_serializer,
    model_validator,
)

from dpfl.data import Dataset, partition, preprocess
from dpfl.federation.silo import Silo, silos_from_dataset, silos_from_splits


class Strict(BaseModel):
    """Unknown keys and non-finite numbers are errors: TOML's `inf` and `nan` are no
    budget, noise or rate (a run without a limit leaves `epsilon` out)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _as_written(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    checked = handler(value)
    return value if type(value) is int else checked


Real = Annotated[float, WrapValidator(_as_written), PlainSerializer(lambda value: value)]
"""A number kept as the study wrote it: an integer stays one, so that a run key, which
hashes the study's values as JSON (where 1 and 1.0 differ), stays as it was."""

Files = Literal["nothing", "folder", "file", "folder-or-npz"]
"""What a kind reads at `data.path`: nothing (embedded or generated records), a folder,
one file (a table), or a folder or an `.npz` file (a consortium's images)."""

STORED_EMPTY: dict[str, Any] = {
    **dict.fromkeys(
        ("label", "classes", "time", "event", "site", "sites", "features", "unit", "max_records")
    ),
    "columns": {},
    "images": {
        "classes": None,
        "mode": None,
        "size": None,
        "mean": None,
        "std": None,
        "min_site_records": 2,
    },
}
"""The table and image keys as a stored config of every dataset held them when `[data]`
was one section for all kinds (`dpfl report` reads such configs back): dropped where
the kind has no such key (or has it among its `OPTIONS`, which were under `options`)
and the value is this one, the key's default then."""


class PartitionConfig(Strict):
    """How records are split into silos: `iid` (stratified), `dirichlet` label skew
    (concentration `alpha`), `quantity` skew (`alpha`), or `natural` (the dataset's own
    sites, e.g. hospitals; `silos` then keeps only the first sites)."""

    kind: Literal["iid", "dirichlet", "quantity", "natural"] = "iid"
    silos: int | None = Field(None, ge=1)
    alpha: float = Field(0.5, gt=0)
    names: list[str] | None = None

    @model_validator(mode="after")
    def _needs_a_count(self) -> PartitionConfig:
        if self.kind != "natural" and self.silos is None:
            raise ValueError(f"a {self.kind} partition needs `silos` (how many hospitals)")
        return self


class DataSettings(Strict, ABC):
    """A study's `[data]`: the keys every kind has; each kind (a subclass, named by its
    `dataset` values) adds its own and says how its records are loaded."""

    FILES: ClassVar[Files] = "folder"
    OWN_KEYS_WERE_OPTIONS: ClassVar[bool] = True
    """The kind's own keys are its loader's keyword arguments, once written in
    `[data.options]` (not a table's or images' keys, always `[data]`'s own)."""
    OPTIONS: ClassVar[tuple[str, ...]] = ()
    """Those keys, each kind's own fields (set when the kind is declared): a dump (a stored
    config) and a run key hold those the study gave under `options` still, so that no
    run's key moves."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        own = tuple(name for name in cls.model_fields if name not in DataSettings.model_fields)
        cls.OPTIONS = own if cls.OWN_KEYS_WERE_OPTIONS else ()

    dataset: str
    path: Path | None = None
    """Folder of the dataset's files (real data); embedded and synthetic data take none.
    In a study file, relative to the file's folder."""
    partition: PartitionConfig = PartitionConfig(kind="natural")
    test_fraction: float = Field(0.2, gt=0, lt=1)
    split: Literal["stratified", "official"] = "stratified"
    """Each silo's train/test split: "stratified" (by class, or by event for survival),
    `test_fraction` of its records held out; "official", the dataset's own assignment
    (FLamby's per-centre splits), `test_fraction` unused."""
    public_sizes: Literal["declared", "dp-count"] = "declared"
    """What shapes each silo's mechanism (q, steps, normaliser): "declared", the sizes of
    the study's own partition, published with the study; "dp-count", a DP count of each
    silo's training records released before round 0 and charged to its ledger."""
    size_noise: float = Field(20.0, gt=0, allow_inf_nan=False)
    """Std, in records, of the Gaussian noise of a "dp-count" release."""

    @model_validator(mode="before")
    @classmethod
    def _lift_options(cls, raw: Any) -> Any:
        """`[data.options]`, the older spelling of the kind's own keys, lifted beside the
        common ones; a stored config's empty keys of other kinds dropped."""
        if not isinstance(raw, dict):
            return raw
        lifted = {
            key: value
            for key, value in raw.items()
            if STORED_EMPTY.get(key, ...) != value
            or (key in cls.model_fields and key not in cls.OPTIONS)
        }
        options = lifted.pop("options", {})
        if not isinstance(options, dict):
            raise ValueError(f"data.options must be a table of {raw.get('dataset')}'s own keys")
        twice = sorted(set(options) & set(lifted))
        if twice:
            raise ValueError(f"{', '.join(twice)} given both in [data] and in [data.options]")
        return {**lifted, **options}

    @model_serializer(mode="wrap")
    def _options_apart(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The kind's `OPTIONS` under `options`, those the study gave only, as `[data]`
        was dumped when they were its `[data.options]`."""
        dumped: dict[str, Any] = handler(self)
        given = {name: dumped.pop(name, None) for name in self.OPTIONS}
        return {**dumped, "options": {k: v for k, v in given.items() if k in self.model_fields_set}}

    @field_validator("path")
    @classmethod
    def _a_folder(cls, path: Path | None) -> Path | None:
        if path is None or path.is_dir() or cls.FILES == "file":
            return path  # a table's file: checked with the table's keys
        if cls.FILES != "folder-or-npz":
            raise ValueError(f"{path} is not a folder")
        if not path.is_file():
            raise ValueError(f"{path} is neither a folder (with a labels.csv) nor an .npz file")
        return path

    @model_validator(mode="after")
    def _files_where_needed(self) -> DataSettings:
        if self.FILES == "nothing" and self.path is not None:
            raise ValueError(f"{self.dataset} reads no files: leave data.path out")
        if self.FILES in ("folder", "folder-or-npz") and self.path is None:
            raise ValueError(
                f"{self.dataset} is read from files: give data.path, the folder that holds them"
            )
        return self

    @abstractmethod
    def load(self, seed: int) -> Dataset:
        """The records, read from `path` or generated from `seed`."""

    def keywords(self) -> dict[str, Any]:
        """The kind's `OPTIONS`, each at its value (given or default): its loader's
        keyword arguments."""
        return {name: getattr(self, name) for name in self.OPTIONS}

    @property
    def folder(self) -> Path:
        """`path`, which a kind that reads files has (checked on validation)."""
        assert self.path is not None
        return self.path

    def declared_input(self) -> tuple[int, int | None] | None:
        """The model's input (features, classes or None for survival) from the study's
        declarations alone, without reading a record; None where the records say it."""
        return None

    def declared_sizes(self) -> dict[str, int]:
        """By silo name, each one's declared public size (its training share), never its
        count; empty where the study declares none."""
        return {}

    def declared_unit(self) -> str | None:
        """The column naming each record's patient (the unit of privacy); None: records."""
        return None

    def declared_max_records(self) -> int | None:
        """The declared most records one patient has; None: undeclared."""
        return None

    def own_silo(self, seed: int, names: Sequence[str], name: str, path: Path) -> Silo:
        """One hospital's silo from its own file at `path` (only a table's)."""
        raise ValueError(
            f"a hospital reads its own file only in a table study (data.dataset = 'table', "
            f"data.split = 'stratified'); this one reads {self.dataset!r}: give a folder "
            "holding train.npz"
        )


def build_silos(config: DataSettings, seed: int, *, tested: str = "test") -> list[Silo]:
    """The study's silos: the dataset, split by `config.partition`, each silo with its own
    stratified train/test split (`test_fraction`). `tested`: the official split that is
    each silo's test set under `split = "official"` ("val": `dpfl tune`'s validation)."""
    data = config.load(seed)
    preprocess.require_finite(data)
    parts = partition_of(config, data, seed)
    names = config.partition.names or site_names(data, config, len(parts))
    if len(names) != len(parts):
        raise ValueError(f"data.partition.names: {len(names)} names for {len(parts)} silos")
    declare_sizes = config.public_sizes == "declared"
    if config.split == "official":
        return silos_from_splits(
            data,
            official_splits(data, parts, names, tested),
            names=names,
            declare_sizes=declare_sizes,
        )
    silos = silos_from_dataset(
        data,
        parts,
        test_fraction=config.test_fraction,
        seed=seed,
        names=names,
        declare_sizes=declare_sizes,
    )
    sizes = config.declared_sizes()
    if not sizes:
        return silos
    return [s.with_public_size(n) for s, n in zip(silos, sizes.values(), strict=False)]


def official_splits(
    data: Dataset, parts: list[np.ndarray], names: list[str], tested: str = "test"
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each silo's records split by the source's own assignment: its "train" records and
    those of split `tested`."""
    if data.split is None:
        raise ValueError(f"data.split: {data.name} has no official split; use 'stratified'")
    splits = []
    for name, part in zip(names, parts, strict=True):
        train, test = (part[data.split[part] == which] for which in ("train", tested))
        if not len(train) or not len(test):
            raise ValueError(f"data.split: silo {name!r} has no official train or {tested} records")
        splits.append((train, test))
    return splits


def partition_of(config: DataSettings, data: Dataset, seed: int) -> list[np.ndarray]:
    """The records of each silo, by `config.partition`."""
    spec = config.partition
    if spec.kind == "natural":
        return list(partition.natural(data.site_ids, spec.silos))
    assert spec.silos is not None  # checked by PartitionConfig
    if spec.kind == "iid":
        return list(partition.iid_stratified(data.strata, spec.silos, seed))
    if spec.kind == "dirichlet":
        return list(partition.dirichlet_label_skew(data.strata, spec.silos, spec.alpha, seed))
    return list(partition.quantity_skew(len(data.labels), spec.silos, spec.alpha, seed))


def site_names(data: Dataset, config: DataSettings, count: int) -> list[str]:
    """The silos' names: the dataset's sites' (natural partition) or numbered."""
    if config.partition.kind == "natural" and data.site_names:
        return site_names_of(list(data.site_names[:count]))
    return [f"hospital-{k}" for k in range(count)]


def site_names_of(sites: Sequence[str]) -> list[str]:
    """The silos' names for the sites'."""
    return [name.lower().replace(" ", "-") for name in sites]
