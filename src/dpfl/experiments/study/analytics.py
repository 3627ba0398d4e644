"""`dpfl stats`: a study's `[analytics]` released in the simulator (`dpfl.analytics`)
over the same `[data]` and silos as its training, charged to each hospital's ledger
accounts (one per trial, the study's budgets) and summed by its `secure_aggregation`;
written as JSON and an HTML page in the report's style."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.analytics import (
    Continuous,
    Count,
    ExponentialQuantiles,
    Figure,
    Histogram,
    KaplanMeier,
    Mean,
    Quantiles,
    Query,
    Records,
    SurvivalComparison,
    TableOne,
    describe,
    event_of,
    is_local,
    plan_event,
)
from dpfl.data.dataset import Dataset
from dpfl.data.table import OTHER
from dpfl.engines.flower.protocol import Analytics
from dpfl.engines.streams import stats_noise
from dpfl.experiments.study import spending
from dpfl.experiments.study.config import (
    AnalyticsConfig,
    ColumnCategories,
    StudyConfig,
    TableOneConfig,
)
from dpfl.experiments.study.datasets import TableData
from dpfl.experiments.study.datasets.base import partition_of, site_names
from dpfl.files import replacing
from dpfl.privacy import Budget, Ledger, calibrate_noise, epsilon, events
from dpfl.privacy.accounts import account
from dpfl.secure import mode

LEDGER = "ledger.sqlite"
STATS_JSON = "stats.json"
STATS_HTML = "stats.html"
TABLE_ONE_CSV = "table_one.csv"


@dataclass(frozen=True)
class StatsRun:
    """What `dpfl stats` released: the figures, σ, each statistic's pooled noise std,
    the secure sum, the hospitals and the ledger charged."""

    study: str
    hospitals: list[str]
    noise_multiplier: float
    noise: dict[str, float]
    summing: str
    ledger: str
    figures: list[Figure]
    epsilon: dict[str, float] = field(default_factory=dict)
    """Each statistic's release alone, per hospital: its ε at `[privacy] delta` by the
    study's accountant (the ledger holds what each hospital spent in all)."""

    def to_json(self) -> dict[str, Any]:
        """Strict JSON: a figure's number that is not finite (a test's nan std, an
        interval unbounded above) is null."""
        return {**asdict(self), "figures": [_finite(asdict(f)) for f in self.figures]}

    @staticmethod
    def read(path: Path) -> StatsRun:
        """A run's stats.json, as `to_json` wrote it (null read back as nan)."""
        saved = json.loads(path.read_text(encoding="utf-8"))

        def number(x: float | None) -> float:
            return math.nan if x is None else x

        figures = [
            Figure(
                **{
                    **f,
                    "value": number(f["value"]),
                    "std": number(f["std"]),
                    "interval": None
                    if f["interval"] is None
                    else (number(f["interval"][0]), number(f["interval"][1])),
                    "cell": None if f.get("cell") is None else tuple(f["cell"]),
                }
            )
            for f in saved.pop("figures")
        ]
        return StatsRun(**saved, figures=figures)


def _finite(figure: dict[str, Any]) -> dict[str, Any]:
    def number(x: Any) -> Any:
        return x if not isinstance(x, float) or math.isfinite(x) else None

    interval = figure["interval"]
    return {
        **{k: number(v) for k, v in figure.items()},
        "interval": None if interval is None else [number(x) for x in interval],
    }


def queries(
    analytics: AnalyticsConfig, classes: Sequence[int], text: Mapping[str, Sequence[str]]
) -> list[Query]:
    """The statistics the section declares, in a fixed order; `text`: the study's text
    columns and their declared categories."""
    found: list[Query] = []
    if analytics.counts or analytics.categories:
        categories = {c.column: tuple(_values(c, text)) for c in analytics.categories}
        counted = tuple(classes) if analytics.counts else ()
        found.append(Count(counted, categories, consistent=analytics.consistent))
    found += [Histogram(h.column, tuple(h.bins)) for h in analytics.histograms]
    found += [Mean(m.column, m.range) for m in analytics.means]
    found += [
        Quantiles(q.column, tuple(q.bins), tuple(q.probabilities))
        if q.epsilon is None
        else ExponentialQuantiles(
            q.column, (q.bins[0], q.bins[-1]), tuple(q.probabilities), q.epsilon
        )
        for q in analytics.quantiles
    ]
    if analytics.kaplan_meier:
        found.append(KaplanMeier(tuple(analytics.kaplan_meier)))
    if analytics.table_one is not None:
        found.append(_table_one(analytics.table_one, text, analytics.consistent))
    found += [
        SurvivalComparison(
            s.column,
            tuple(_values(ColumnCategories(column=s.column, values=s.values), text)),
            tuple(s.bins),
        )
        for s in analytics.survival
    ]
    return found


def _values(counted: ColumnCategories, text: Mapping[str, Sequence[str]]) -> list[str | float]:
    """The values a category count lists: as declared (a text column's among its
    declared categories), else a text column's categories."""
    declared = text.get(counted.column)
    if counted.values is not None:
        unknown = [v for v in counted.values if declared is not None and str(v) not in declared]
        if unknown:
            raise ValueError(
                f"[analytics] {counted.column!r}: {unknown} are not among its declared "
                f"categories {declared} ([data.columns.{counted.column}])"
            )
        return counted.values
    if declared is None:
        raise ValueError(
            f"[analytics] categories of {counted.column!r}: list its `values` (only a text "
            f"column of [data.columns] has declared categories: {sorted(text) or 'none'})"
        )
    return list(declared)


def _table_one(
    table: TableOneConfig, text: Mapping[str, Sequence[str]], consistent: bool
) -> TableOne:
    """The section's Table 1, each group and category list as declared."""
    groups: tuple[str | float, ...] = ()
    if table.by is not None:
        groups = tuple(_values(ColumnCategories(column=table.by, values=table.groups), text))
    categorical = [
        c if isinstance(c, ColumnCategories) else ColumnCategories(column=c)
        for c in table.categorical
    ]
    return TableOne(
        table.by,
        groups,
        tuple((c.column, tuple(_values(c, text))) for c in categorical),
        tuple(
            Continuous(
                v.column,
                v.range,
                tuple(v.bins if v.bins is not None else np.linspace(*v.range, 51).tolist()),
            )
            for v in table.continuous
        ),
        consistent=consistent,
    )


def text_columns(config: StudyConfig) -> dict[str, list[str]]:
    """A table study's text columns and their declared categories, as written."""
    if not isinstance(config.data, TableData):
        return {}
    return {
        name: [str(c) for c in column.categories]
        for name, column in config.data.columns.items()
        if column.categories is not None
    }


def cohort(config: StudyConfig) -> tuple[dict[str, Records], tuple[int, ...]]:
    """Each hospital's records (all of its partition, train and test), in the simulator's
    silo order and names, with the classes of the labels."""
    data = config.data.load(config.seed)
    parts = partition_of(config.data, data, config.seed)
    names = config.data.partition.names or site_names(data, config.data, len(parts))
    whole = _records(config, data)
    classes = () if whole.labels is None else tuple(range(max(len(data.class_names), 2)))
    return {name: whole.take(part) for name, part in zip(names, parts, strict=True)}, classes


def own_records(config: StudyConfig, name: str, path: Path) -> Records:
    """A deployed hospital's records from its own table file (all of it, train and test):
    read through the study's schema as `TableData.own_silo` reads it, the records its
    silo holds in the simulator's `cohort`."""
    assert isinstance(config.data, TableData)  # `deployed` reads only a table's
    names = list(config.data.declared_sizes()) or sorted(config.roster)
    if name not in names:
        raise ValueError(f"{name!r} is not one of the study's silos {names}")
    sites = list(config.data.sites or names)
    own = config.data.model_copy(update={"path": path})
    return _records(config, own.read(own_site=sites[names.index(name)]))


def _records(config: StudyConfig, data: Dataset) -> Records:
    """A dataset's records as the statistics read them. A table's range column is read
    back in its own units (the declared affine scaling undone; a log column stays on
    [0, 1])."""
    declared = config.data.columns if isinstance(config.data, TableData) else {}
    columns: dict[str, np.ndarray] = {}
    for j, name in enumerate(data.feature_names):
        x = np.asarray(data.features[:, j], dtype=np.float64)
        spec = declared.get(name)
        if spec is not None and spec.range is not None and not spec.log:
            x = spec.range[0] + x * (spec.range[1] - spec.range[0])
        columns[name] = x
    for name, categories in text_columns(config).items():  # one-hot read back as text
        names = [*(f"{name}={c}" for c in categories), f"{name}={OTHER}"]
        block = np.column_stack([columns[n] for n in names]) > 0.5
        words = np.asarray([*categories, OTHER, ""], dtype=object)
        columns[name] = words[np.where(block.any(axis=1), block.argmax(axis=1), len(names))]
    survival = data.labels.ndim == 2
    return Records(
        columns,
        labels=None if survival else data.labels,
        time=data.labels[:, 0].astype(np.float64) if survival else None,
        event=data.labels[:, 1] if survival else None,
        units=data.units,
    )


def neighbouring_in(config: StudyConfig) -> events.Neighbouring:
    """The study's unit: a patient where `[data]` declares one, else a record."""
    if config.data.declared_unit() is not None:
        return events.Neighbouring.ADD_REMOVE_PATIENT
    return events.Neighbouring.ADD_REMOVE


def noise_multiplier(config: StudyConfig, chosen: Sequence[Query]) -> float:
    """σ of every Gaussian statistic: the section's, or calibrated so that every release
    (the local mechanisms' at their own ε) costs each hospital at most its `epsilon` at
    `[privacy] delta`."""
    analytics, privacy = config.analytics, config.privacy
    if analytics.noise_multiplier is not None:
        return analytics.noise_multiplier
    if analytics.epsilon is None:
        raise ValueError("[analytics]: give `epsilon` or `noise_multiplier`")
    neighbouring = neighbouring_in(config)
    if all(is_local(q) for q in chosen):  # no Gaussian release: σ shapes nothing
        spent = epsilon(plan_event(chosen, 1.0, neighbouring), privacy.delta).epsilon
        if spent > analytics.epsilon:
            raise ValueError(
                f"[analytics]: the exponential quantiles' own ε add up to {spent:g}, over the "
                f"run's epsilon {analytics.epsilon:g}"
            )
        return 1.0
    return calibrate_noise(
        analytics.epsilon,
        privacy.delta,
        lambda s: plan_event(chosen, s, neighbouring),
        accountant=privacy.accountant,
    )


def release_epsilons(
    config: StudyConfig, chosen: Sequence[Query], sigma: float
) -> dict[str, float]:
    """Each statistic's ε alone (a Gaussian release at σ, a local mechanism's own), and
    the whole run's, per hospital at `[privacy] delta` by the study's accountant."""
    neighbouring, privacy = neighbouring_in(config), config.privacy

    def cost(event: events.PrivacyEvent) -> float:
        return epsilon(event, privacy.delta, privacy.accountant).epsilon

    alone = {q.title: cost(event_of(q, sigma, neighbouring)) for q in chosen}
    return {**alone, "the whole run": cost(plan_event(chosen, sigma, neighbouring))}


def deployed(config: StudyConfig) -> Analytics | None:
    """The study's `[analytics]` as a deployment releases it (`dpfl deploy server
    --stats`): a table study's, whose hospitals each read their own file; None where the
    study sets no such section, or reads no table."""
    declared = config.data.declared_input()
    if "analytics" not in config.model_fields_set or declared is None:
        return None
    classes = () if declared[1] is None else range(max(declared[1], 2))
    chosen = queries(config.analytics, classes, text_columns(config))
    if not chosen:
        return None
    return Analytics(
        tuple(chosen),
        noise_multiplier(config, chosen),
        partial(own_records, config),
        config.data.declared_max_records() if config.data.declared_unit() is not None else None,
    )


def stats(config: StudyConfig, out: Path, ledger: Path | None = None) -> StatsRun:
    """Release the study's `[analytics]`, charged where its spending goes
    (`dpfl.experiments.study.spending`): its shared `[privacy] ledger` (or `ledger`, for a study
    that names none), its accounts under `study/stats` and its `[privacy.caps]` set, or
    `out/ledger.sqlite` (reopened: a second run spends from what the first spent). The
    whole plan is checked against the budgets and caps before anything is released."""
    config = spending.sharing(config, ledger)
    analytics = config.analytics
    records, classes = cohort(config)
    chosen = queries(analytics, classes, text_columns(config))
    if not chosen:
        raise ValueError("[analytics] declares no statistic")
    neighbouring = neighbouring_in(config)
    privacy = config.privacy
    sigma = noise_multiplier(config, chosen)
    out.mkdir(parents=True, exist_ok=True)
    accounts = {name: [account(name, t) for t in range(config.trials)] for name in records}
    hospitals = dict.fromkeys(records, neighbouring)
    path = spending.ledger_file(config, out / LEDGER)
    with spending.charged(
        config, "stats", out / LEDGER, hospitals, accountant=privacy.accountant
    ) as book:
        book.register_silos(_budgets(config, accounts, neighbouring, book))
        released = describe(
            records,
            chosen,
            sigma,
            ledger=book,
            accounts=accounts,
            summing=mode(config.summing).stats_sum(),
            rng=np.random.default_rng(config.seed),
            max_records=config.data.declared_max_records(),
            noise={
                name: stats_noise(config.research_noise, config.seed, k)
                for k, name in enumerate(records)
            },
        )
    run = StatsRun(
        config.name,
        list(records),
        sigma,
        released.noise,
        config.summing,
        str(path),
        released.figures,
        release_epsilons(config, chosen, sigma),
    )
    write(run, out)
    return run


def write(run: StatsRun, out: Path) -> None:
    """`out/stats.json`, `out/stats.html` and, with a Table 1, `out/table_one.csv`, each
    written whole (two runs at once: each file the later run's)."""
    from dpfl.experiments.study import stats_page  # matplotlib only when writing

    files = [
        (STATS_JSON, json.dumps(run.to_json(), indent=1, allow_nan=False)),
        (STATS_HTML, stats_page.render(run)),
    ]
    if any(f.cell is not None for f in run.figures):
        files.append((TABLE_ONE_CSV, stats_page.table_one_csv(run)))
    for name, text in files:
        target = out / name
        with replacing(target, target.with_name(f"{name}.{os.getpid()}.partial")) as part:
            part.write_text(text, encoding="utf-8")


def _budgets(
    config: StudyConfig,
    accounts: Mapping[str, list[str]],
    neighbouring: events.Neighbouring,
    book: Ledger,
) -> dict[str, Budget]:
    """Each hospital's accounts with its study budget (none: recorded without limit),
    spending from the ledger's cap of a dataset of the hospital's name where it has one
    (as training's accounts do, `engines.accounts.register_accounts`)."""
    privacy = config.privacy
    budgets = {}
    for name, names in accounts.items():
        own = privacy.silos.get(name)
        eps = own.epsilon if own else privacy.epsilon
        delta = own.delta if own else privacy.delta
        dataset = name if book.cap(name) is not None else None
        budget = Budget(math.inf if eps is None else eps, delta, neighbouring, None, dataset)
        budgets.update(dict.fromkeys(names, budget))
    return budgets
