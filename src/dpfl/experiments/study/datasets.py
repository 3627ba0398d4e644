"""Datasets a study file can name, each ready to train on with public preprocessing only.

A builder reads its files (from `data.path`) or generates its records, then applies
only transforms that cost no budget: declared public ranges, zero imputation, published
gene signatures, public category lists. Anything fitted on the records would have to be
paid for in the ledger; no builder does that.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dpfl.data import Dataset, images, partition, preprocess
from dpfl.federation.silo import Silo, silos_from_dataset, silos_from_splits

if TYPE_CHECKING:  # config validates names against this registry
    from dpfl.experiments.study.config import DataConfig

Reader = Callable[[Path, dict[str, Any]], Dataset]
"""(folder of the files, options) -> dataset: real data, read from `data.path`; an image
dataset's options are its `[data.images]` keys, and `images` takes an `.npz` file too."""
Generator = Callable[[int, dict[str, Any]], Dataset]
"""(seed, options) -> dataset: embedded or synthetic data, which need no files."""


def _breast_cancer(seed: int, options: dict[str, Any]) -> Dataset:
    from dpfl.data import public_tables

    return preprocess.scale_to_ranges(
        public_tables.breast_cancer_wisconsin(), public_tables.WDBC_RANGES
    )


def _heart_disease(path: Path, options: dict[str, Any]) -> Dataset:
    from dpfl.data import public_tables

    data = public_tables.heart_disease(path)
    data = preprocess.one_hot(data, public_tables.HEART_CATEGORIES)
    return preprocess.zero_impute(preprocess.scale_to_ranges(data, public_tables.HEART_RANGES))


def _flamby_heart_disease(path: Path, options: dict[str, Any]) -> Dataset:
    """FLamby's Fed-Heart-Disease (740 patients, FLamby's split: `data.split =
    "official"`). `scaling`: "flamby" (each centre's training mean/std, as FLamby; not
    private), "flamby-pooled" (FLamby's pooled baseline's; not private) or "public"
    (declared ranges, free: the DP runs')."""
    from dpfl.data import flamby

    if set(options) - {"scaling"}:
        raise ValueError(f"data.options: flamby_heart_disease takes only scaling, got {options}")
    return flamby.flamby_heart_disease(path, scaling=options.get("scaling", "flamby"))


_PHYSIONET_PARSED: dict[tuple[Path, str], Dataset] = {}
"""Parsed PhysioNet sets by (folder, options): the points of a sweep that run in one
process share one parse of the 8,000 stay files instead of repeating it."""


def _physionet2012(path: Path, options: dict[str, Any]) -> Dataset:
    from dpfl.data import physionet

    key = (path.resolve(), repr(sorted(options.items())))
    if key not in _PHYSIONET_PARSED:
        data = physionet.physionet2012(key[0], **options)
        ranges = physionet.public_ranges()
        _PHYSIONET_PARSED[key] = preprocess.zero_impute(preprocess.scale_to_ranges(data, ranges))
    return _PHYSIONET_PARSED[key]


_DIABETES_PARSED: dict[tuple[Path, str], Dataset] = {}


def _diabetes130(path: Path, options: dict[str, Any]) -> Dataset:
    """Diabetes 130-US hospitals (`public_tables.diabetes130`, its keyword options), numbers
    scaled by declared public ranges; read once per process and options."""
    from dpfl.data import public_tables

    key = (path.resolve(), repr(sorted(options.items())))
    if key not in _DIABETES_PARSED:
        data = public_tables.diabetes130(key[0], **options)
        _DIABETES_PARSED[key] = preprocess.scale_to_ranges(data, public_tables.DIABETES_RANGES)
    return _DIABETES_PARSED[key]


def _synthetic_ehr(seed: int, options: dict[str, Any]) -> Dataset:
    from dpfl.data import synthetic

    return synthetic.synthetic_ehr(seed, **options)


_POPULATION_OPTIONS = {
    "heterogeneity",
    "people",
    "regions",
    "transmission",
    "initial_infected",
    "asymptomatic",
    "region_spread",
}
_TABLE_OPTIONS = {"max_appearances", "window", "horizon", "train_days", "contacts"}


def _pandemic(seed: int, options: dict[str, Any]) -> Dataset:
    """The PETs-challenge-shaped population (`data.options.people`, default 20,000, ...),
    its contact graph pruned so a person is in at most `max_appearances` rows, and one
    train row (a random window) and one test row (the latest) per person, drawn from the
    study's seed. Node-level privacy: train with `data.split = "official"`, the natural
    partition (the regions) and `privacy.accountant = "rdp"`."""
    unknown = set(options) - _POPULATION_OPTIONS - _TABLE_OPTIONS
    if unknown:
        raise ValueError(f"data.options: pandemic does not take {sorted(unknown)}")
    return _pandemic_built(seed, json.dumps(options, sort_keys=True))


@functools.lru_cache(maxsize=1)
def _pandemic_built(seed: int, options_json: str) -> Dataset:
    """Kept for the next point of a sweep in the same process (most share the data);
    one only, since at a million people it holds gigabytes."""
    from dpfl.data import pandemic

    options = json.loads(options_json)
    world = {k: v for k, v in options.items() if k in _POPULATION_OPTIONS}
    population = pandemic.pandemic_population(world.pop("people", 20_000), seed=seed, **world)
    table = {k: v for k, v in options.items() if k in _TABLE_OPTIONS}
    return pandemic.pandemic_dataset(population, seed=seed, **table)


LOG2_CENTRE = 8.0
"""A declared centre of log2 expression: microarray intensities lie in 0-16 on the log2
scale and the BC-TCGA-shaped generator draws its gene means around 8. Subtracting it is
a fixed map of each value, never a statistic of the records."""


def _gse7390(path: Path, options: dict[str, Any]) -> Dataset:
    """The probesets of a published signature (`signature`, default Wang's `gene76`, which
    are the file's 76), matched by probe id; log2 values centred at a declared constant.
    The clinical columns are left out: the seeds learn from expression alone. `task`:
    "metastasis" (observed or not, the seeds' label) or "survival" (time to distant
    metastasis, censored)."""
    from dpfl.data import genomics

    task = options.pop("task", "metastasis")
    if task not in ("metastasis", "survival"):
        raise ValueError(f"data.options.task: 'metastasis' or 'survival', got {task!r}")
    data = _centre_log2(_signature(genomics.gse7390(path), path, options, probe_level=True))
    return preprocess.as_survival(data, "t.tdm", "e.tdm") if task == "survival" else data


TCGA_AGE = (20.0, 90.0)
"""Declared bounds of age at diagnosis (TCGA-BRCA reports 26-90): scaling by them is a
fixed map of each value, so it costs nothing."""


def _tcga_brca(path: Path, options: dict[str, Any]) -> Dataset:
    """FLamby's Fed-TCGA-BRCA: 39 clinical features (age scaled by declared bounds, the
    rest one-hot), 6 regional centres, FLamby's split (`data.split = "official"`).
    `task`: "survival" (time to death, censored; the benchmark's task) or
    "death_observed" (the binary label, which conflates censoring with survival)."""
    from dpfl.data import public_tables

    task = options.get("task", "survival")
    if set(options) - {"task"} or task not in ("survival", "death_observed"):
        raise ValueError(
            f"data.options: tcga_brca takes only task = 'survival' or 'death_observed', "
            f"got {options}"
        )
    data = preprocess.scale_to_ranges(
        public_tables.tcga_brca_clinical(path), {"age_at_index": TCGA_AGE}
    )
    return preprocess.as_survival(data, "T", "E") if task == "survival" else data


def _bc_tcga(path: Path, options: dict[str, Any]) -> Dataset:
    """The genes of a published signature (`signature`, default `gene76`), matched by
    symbol, missing values set to zero and nothing rescaled, as in Owkin's submission: the
    values are log ratios, so zero is the neutral value."""
    from dpfl.data import genomics

    data = _signature(genomics.bc_tcga(path), path, options, probe_level=False)
    return preprocess.zero_impute(data)


def _synthetic_bc_tcga(seed: int, options: dict[str, Any]) -> Dataset:
    """The generator's signal genes (its declared list stands in for a published
    signature; options are the generator's size and effect arguments), centred at the
    generator's declared centre, missing values imputed at the centre (zero)."""
    from dpfl.data import synthetic

    data = synthetic.synthetic_bc_tcga(seed, **options)
    signal = options.get("signal_genes") or [n for n in data.feature_names if n.startswith("SIG")]
    data = preprocess.select_features(data, signal, "the generator's declared signal genes")
    return preprocess.zero_impute(_centre_log2(data))


def _signature(
    data: Dataset, folder: Path, options: dict[str, Any], *, probe_level: bool
) -> Dataset:
    """`data` restricted to the signature named in `options` (lists read from the option
    `signatures`, default the `gene_signatures` folder beside the data's)."""
    from dpfl.data import signatures

    known = {"signature", "signatures"}
    if set(options) - known:
        raise ValueError(f"data.options: {data.name} takes only {sorted(known)}, got {options}")
    lists = Path(options.get("signatures", folder.parent / "gene_signatures"))
    signature = signatures.load_signature(
        lists, options.get("signature", "gene76"), probe_level=probe_level
    )
    selected, _ = signatures.select_signature(data, signature)
    return selected


def _centre_log2(data: Dataset) -> Dataset:
    features = np.asarray(data.features) - LOG2_CENTRE  # NaN stays NaN
    note = f"log2 values centred at the declared {LOG2_CENTRE:g}"
    return dataclasses.replace(data, features=features, preprocessing=(*data.preprocessing, note))


def _images(preset: str | None) -> Reader:
    """The one image reader (`dpfl.data.images`): `images` reads the folder (labels.csv
    and its images) or `.npz` at `data.path`, a preset its own file in the folder `data.path`;
    `options` are `[data.images]`'s declared keys."""

    def read(path: Path, options: dict[str, Any]) -> Dataset:
        declared: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in options.items()
        }
        if preset is None:
            return images.read_images(path, images.ImageFormat(**declared))
        return images.read_preset(preset, path, **declared)

    return read


IMAGE_READERS: dict[str, Reader] = {
    "images": _images(None),
    **{name: _images(name) for name in images.PRESETS},
}
"""`images`, a consortium's own image files in the format its study declares, and the
MedMNIST sets (`retinamnist`, `breastmnist`, `pneumoniamnist`) as presets of it."""


READERS: dict[str, Reader] = {
    "heart_disease": _heart_disease,
    "flamby_heart_disease": _flamby_heart_disease,
    "physionet2012": _physionet2012,
    **IMAGE_READERS,
    "gse7390": _gse7390,
    "bc_tcga": _bc_tcga,
    "tcga_brca": _tcga_brca,
    "diabetes130": _diabetes130,
}
"""Real data: name -> reader of the folder `data.path`."""
GENERATORS: dict[str, Generator] = {
    "breast_cancer": _breast_cancer,
    "synthetic_ehr": _synthetic_ehr,
    "synthetic_bc_tcga": _synthetic_bc_tcga,
    "pandemic": _pandemic,
}
"""Data that need no files: `breast_cancer` (scikit-learn's embedded WDBC table, scaled
by published ranges) and the synthetic generators (`pandemic`: a contact graph, node-level
privacy)."""


def _table(config: DataConfig, own_site: str | None = None) -> Dataset:
    """A consortium's own CSV or Parquet table, preprocessed as its study declares
    (`dpfl.data.table`): the file `data.path`, with the keys `label` (or `time` and
    `event`), `classes`, `site`, `sites`, `features` and `[data.columns]`; `own_site`:
    the file is that site's alone (a deployed hospital's)."""
    from dpfl.data import table

    assert config.path is not None  # checked by DataConfig
    return table.read_table(
        config.path,
        columns=config.columns,
        features=config.features,
        label=config.label,
        classes=(0, 1) if config.classes is None else config.classes,
        time=config.time,
        event=config.event,
        site=config.site,
        sites=config.sites,
        own_site=own_site,
        unit=config.unit,
        max_records=config.max_records,
    )


TABLES: dict[str, Callable[[DataConfig], Dataset]] = {"table": _table}
"""A table of the study's own: name -> reader of the file `data.path` by the study's
declarations."""
DATASETS = (*GENERATORS, *READERS, *TABLES)
"""Every name a study's `data.dataset` can take."""


def declared_input(config: DataConfig) -> tuple[int, int | None] | None:
    """A table study's model input from its declarations alone: the feature count (a
    range's column one, a category column one per declared category and one for "other")
    and the number of declared classes (None: survival labels). The features are `features`
    or, without it, every `[data.columns]` entry but the label, survival and site ones:
    the file's own columns, each of which must be declared. None for another dataset."""
    if config.dataset not in TABLES:
        return None
    targets = {config.label, config.time, config.event, config.site, config.unit}
    chosen = config.features or [c for c in config.columns if c not in targets]
    declared = [config.columns[name] for name in chosen]  # DataConfig checks each is
    width = sum(1 if c.categories is None else len(c.categories) + 1 for c in declared)
    survival = config.time is not None and config.event is not None
    return width, None if survival else len(config.classes or (0, 1))


def own_silo(config: DataConfig, seed: int, names: Sequence[str], name: str, path: Path) -> Silo:
    """One hospital's silo from its own table file at `path`, as `build_silos` makes the
    study's silo `name` from the whole table: read through the study's schema
    (`dpfl.data.table`, nothing fitted on the records), the file holding that site's
    records only, split by `test_fraction` with the silo's own seed (the draw of `seed`
    at its index among `names`, the study's silos in the simulator's order; by patient,
    with `unit` and `max_records` on the silo, where the study names a unit), without a
    public size (the study's declared one, `declared_sizes`, the hospital's own, or a DP
    count)."""
    if config.dataset not in TABLES or config.split != "stratified":
        raise ValueError(
            f"a hospital reads its own file only in a table study (data.dataset = 'table', "
            f"data.split = 'stratified'); this one reads {config.dataset!r}: give a folder "
            "holding train.npz"
        )
    if config.sites is not None:
        names = list(declared_sizes(config))
    if name not in names:
        raise ValueError(f"{name!r} is not one of the study's silos {list(names)}")
    k = list(names).index(name)
    site = list(config.sites)[k] if config.sites is not None else name
    data = _table(config.model_copy(update={"path": path}), own_site=site)
    preprocess.require_finite(data)
    if data.units is not None:  # by patient, with the seed build_silos gives silo k
        (silo,) = silos_from_dataset(
            data,
            [np.arange(len(data.labels))],
            test_fraction=config.test_fraction,
            seed=seed + k,
            names=[name],
            declare_sizes=False,
        )
        return silo
    everyone = [np.arange(len(data.labels))] * (k + 1)  # the seeds of silos 0 to k
    fractions = [1 - config.test_fraction, config.test_fraction]
    splits = partition.per_silo_splits(everyone, data.strata, fractions, seed)
    (silo,) = silos_from_splits(data, splits[k:], names=[name], declare_sizes=False)
    return silo


def load_dataset(config: DataConfig, seed: int) -> Dataset:
    """The configured dataset, read from `data.path` or generated from `seed`."""
    options = dict(config.options)
    if config.dataset in IMAGE_READERS:  # their options are [data.images]
        options = config.images.model_dump(exclude_none=True)
    if config.dataset in GENERATORS:
        return GENERATORS[config.dataset](seed, options)
    if config.dataset in TABLES:
        return TABLES[config.dataset](config)
    assert config.path is not None  # checked by DataConfig
    return READERS[config.dataset](config.path, options)


def build_silos(config: DataConfig, seed: int, *, tested: str = "test") -> list[Silo]:
    """The study's silos: the dataset, split by `config.partition`, each silo with its own
    stratified train/test split (`test_fraction`). `tested`: the official split that is
    each silo's test set under `split = "official"` ("val": `dpfl tune`'s validation)."""
    data = load_dataset(config, seed)
    preprocess.require_finite(data)
    parts = _partition(config, data, seed)
    names = config.partition.names or _site_names(data, config, len(parts))
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
    sizes = declared_sizes(config)
    if not sizes:
        return silos
    return [s.with_public_size(n) for s, n in zip(silos, sizes.values(), strict=False)]


def declared_sizes(config: DataConfig) -> dict[str, int]:
    """By silo name, each site's declared public size (`[data.sites]`), never its count:
    its training share. Empty where the study declares none."""
    if config.sites is None:
        return {}
    names = config.partition.names or _site_names_of(list(config.sites))
    shares = [max(1, round(n * (1 - config.test_fraction))) for n in config.sites.values()]
    return dict(zip(names, shares, strict=False))


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


def _partition(config: DataConfig, data: Dataset, seed: int) -> list[np.ndarray]:
    spec = config.partition
    if spec.kind == "natural":
        return list(partition.natural(data.site_ids, spec.silos))
    assert spec.silos is not None  # checked by PartitionConfig
    if spec.kind == "iid":
        return list(partition.iid_stratified(data.strata, spec.silos, seed))
    if spec.kind == "dirichlet":
        return list(partition.dirichlet_label_skew(data.strata, spec.silos, spec.alpha, seed))
    return list(partition.quantity_skew(len(data.labels), spec.silos, spec.alpha, seed))


def _site_names(data: Dataset, config: DataConfig, count: int) -> list[str]:
    if config.partition.kind == "natural" and data.site_names:
        return _site_names_of(list(data.site_names[:count]))
    return [f"hospital-{k}" for k in range(count)]


def _site_names_of(sites: Sequence[str]) -> list[str]:
    """The silos' names for the sites'."""
    return [name.lower().replace(" ", "-") for name in sites]
