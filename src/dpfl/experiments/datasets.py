"""Datasets a study file can name, each ready to train on with public preprocessing only.

A builder reads its files (from `data.path`) or generates its records, then applies
only transforms that cost no budget: declared public ranges, zero imputation, published
gene signatures, public category lists. Anything fitted on the records would have to be
paid for in the ledger; no builder does that.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.data import Dataset, partition, preprocess
from dpfl.experiments.config import DataConfig
from dpfl.federation.silo import Silo, silos_from_dataset

Builder = Callable[[Path | None, int, dict[str, Any]], Dataset]
"""(folder of the files or None, seed, options) -> dataset."""


def _folder(path: Path | None, dataset: str) -> Path:
    if path is None:
        raise ValueError(f"data.path: {dataset} is read from files; give their folder")
    return path


def _breast_cancer(path: Path | None, seed: int, options: dict[str, Any]) -> Dataset:
    from dpfl.data import tabular

    return preprocess.scale_to_ranges(tabular.breast_cancer_wisconsin(), tabular.WDBC_RANGES)


def _heart_disease(path: Path | None, seed: int, options: dict[str, Any]) -> Dataset:
    from dpfl.data import tabular

    data = tabular.heart_disease(_folder(path, "heart_disease"))
    data = preprocess.one_hot(data, tabular.HEART_CATEGORIES)
    return preprocess.zero_impute(preprocess.scale_to_ranges(data, tabular.HEART_RANGES))


def _physionet2012(path: Path | None, seed: int, options: dict[str, Any]) -> Dataset:
    from dpfl.data import physionet

    data = physionet.physionet2012(_folder(path, "physionet2012"), **options)
    return preprocess.zero_impute(preprocess.scale_to_ranges(data, physionet.public_ranges()))


def _synthetic_ehr(path: Path | None, seed: int, options: dict[str, Any]) -> Dataset:
    from dpfl.data import synthetic

    return synthetic.synthetic_ehr(seed, **options)


def _image(loader: str) -> Builder:
    def build(path: Path | None, seed: int, options: dict[str, Any]) -> Dataset:
        from dpfl.data import images

        dataset: Dataset = getattr(images, loader)(_folder(path, loader))
        return dataset

    return build


DATASETS: dict[str, Builder] = {
    "breast_cancer": _breast_cancer,
    "heart_disease": _heart_disease,
    "physionet2012": _physionet2012,
    "synthetic_ehr": _synthetic_ehr,
    "retinamnist": _image("retinamnist"),
    "breastmnist": _image("breastmnist"),
}
"""name -> builder. `breast_cancer` (scikit-learn's embedded WDBC table, scaled by
published ranges) needs no files."""


def build_silos(config: DataConfig, seed: int) -> list[Silo]:
    """The study's silos: the dataset, split by `config.partition`, each silo with its own
    stratified train/test split (`test_fraction`)."""
    if config.dataset not in DATASETS:
        raise ValueError(
            f"data.dataset: unknown dataset {config.dataset!r}; known: {', '.join(DATASETS)}"
        )
    data = DATASETS[config.dataset](config.path, seed, dict(config.options))
    preprocess.require_finite(data)
    parts = _partition(config, data, seed)
    names = config.partition.names or _site_names(data, config, len(parts))
    if len(names) != len(parts):
        raise ValueError(f"data.partition.names: {len(names)} names for {len(parts)} silos")
    return silos_from_dataset(
        data, parts, test_fraction=config.test_fraction, seed=seed, names=names
    )


def _partition(config: DataConfig, data: Dataset, seed: int) -> list[np.ndarray]:
    spec = config.partition
    if spec.kind == "natural":
        return list(partition.natural(data.site_ids, spec.silos))
    assert spec.silos is not None  # checked by PartitionConfig
    if spec.kind == "iid":
        return list(partition.iid_stratified(data.labels, spec.silos, seed))
    if spec.kind == "dirichlet":
        return list(partition.dirichlet_label_skew(data.labels, spec.silos, spec.alpha, seed))
    return list(partition.quantity_skew(len(data.labels), spec.silos, spec.alpha, seed))


def _site_names(data: Dataset, config: DataConfig, count: int) -> list[str]:
    if config.partition.kind == "natural" and data.site_names:
        return [name.lower().replace(" ", "-") for name in data.site_names[:count]]
    return [f"hospital-{k}" for k in range(count)]
