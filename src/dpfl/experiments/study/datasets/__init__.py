"""Datasets a study file can name, one settings model per kind (a module per family:
its `[data]` keys, checked on validation, and how its records are loaded), and their
registry: `DataConfig` below names each kind once, and the study schema, the runner and
the tests find the datasets here. Adding a kind is its model in a module and a line in
`DataConfig`."""

from collections.abc import Mapping
from typing import Annotated, Any, get_args

from pydantic import Field, TypeAdapter

from dpfl.experiments.study.datasets.base import (
    DataSettings,
    PartitionConfig,
    build_silos,
    official_splits,
)
from dpfl.experiments.study.datasets.clinical import (
    BreastCancer,
    Diabetes130,
    FlambyHeartDisease,
    HeartDisease,
    PhysioNet2012,
    TcgaBrca,
)
from dpfl.experiments.study.datasets.genomics import GSE7390, BcTcga, SyntheticBcTcga
from dpfl.experiments.study.datasets.images import ImagePreset, ImagesConfig, OwnImages
from dpfl.experiments.study.datasets.synthetic import Pandemic, SyntheticEhr
from dpfl.experiments.study.datasets.tables import TableData

DataConfig = Annotated[
    BreastCancer
    | SyntheticEhr
    | SyntheticBcTcga
    | Pandemic
    | HeartDisease
    | FlambyHeartDisease
    | PhysioNet2012
    | OwnImages
    | ImagePreset
    | GSE7390
    | BcTcga
    | TcgaBrca
    | Diabetes130
    | TableData,
    Field(discriminator="dataset"),
]
"""A study's `[data]`: the settings of the dataset kind it names. The registry: adding a
kind adds its settings here."""

KINDS: dict[str, type[DataSettings]] = {
    name: kind
    for kind in get_args(get_args(DataConfig)[0])
    for name in get_args(kind.model_fields["dataset"].annotation)
}
"""Every kind's settings by the name a study file gives its dataset."""
DATASETS = tuple(KINDS)
"""Every name a study's `data.dataset` can take."""

_DATA: TypeAdapter[DataSettings] = TypeAdapter(DataConfig)


def data_config(raw: Mapping[str, Any]) -> DataSettings:
    """A `[data]` section (as a study file or a stored config holds it), validated."""
    return _DATA.validate_python(raw)


def own_keys(dataset: str) -> str:
    """What a kind takes beside the common keys, for a message about a key it lacks."""
    kind = KINDS[dataset]
    own = [name for name in kind.model_fields if name not in DataSettings.model_fields]
    return f"{dataset}'s own keys: {', '.join(own)}" if own else f"{dataset} has none of its own"


__all__ = [
    "DATASETS",
    "KINDS",
    "DataConfig",
    "DataSettings",
    "ImagesConfig",
    "PartitionConfig",
    "TableData",
    "build_silos",
    "data_config",
    "official_splits",
    "own_keys",
]
