"""`dpfl stats`: a study's `[analytics]` released in the simulator (`dpfl.analytics`)
over the same `[data]` and silos as its training, charged to each hospital's ledger
accounts (one per trial, the study's budgets) and summed by its `secure_aggregation`;
written as JSON and an HTML page in the report's style."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.analytics import (
    Count,
    Figure,
    Histogram,
    KaplanMeier,
    Mean,
    Quantiles,
    Query,
    Records,
    SurvivalComparison,
    describe,
)
from dpfl.data.dataset import Dataset
from dpfl.engines.flower.protocol import Analytics
from dpfl.engines.streams import stats_noise
from dpfl.experiments.study import spending
from dpfl.experiments.study.config import AnalyticsConfig, StudyConfig
from dpfl.experiments.study.datasets import TableData
from dpfl.experiments.study.datasets.base import partition_of, site_names
from dpfl.files import replacing
from dpfl.privacy import Budget, Ledger, calibrate_noise, events
from dpfl.privacy.accounts import account
from dpfl.secure import mode

LEDGER = "ledger.sqlite"
STATS_JSON = "stats.json"
STATS_HTML = "stats.html"


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

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "figures": [asdict(f) for f in self.figures]}

    @staticmethod
    def read(path: Path) -> StatsRun:
        """A run's stats.json, as `to_json` wrote it."""
        saved = json.loads(path.read_text(encoding="utf-8"))
        figures = [
            Figure(**{**f, "interval": None if f["interval"] is None else tuple(f["interval"])})
            for f in saved.pop("figures")
        ]
        return StatsRun(**saved, figures=figures)


def queries(analytics: AnalyticsConfig, classes: Sequence[int]) -> list[Query]:
    """The statistics the section declares, in a fixed order."""
    found: list[Query] = []
    if analytics.counts or analytics.categories:
        categories = {c.column: tuple(c.values) for c in analytics.categories}
        found.append(Count(tuple(classes) if analytics.counts else (), categories))
    found += [Histogram(h.column, tuple(h.bins)) for h in analytics.histograms]
    found += [Mean(m.column, m.range) for m in analytics.means]
    found += [
        Quantiles(q.column, tuple(q.bins), tuple(q.probabilities)) for q in analytics.quantiles
    ]
    if analytics.kaplan_meier:
        found.append(KaplanMeier(tuple(analytics.kaplan_meier)))
    found += [
        SurvivalComparison(s.column, tuple(s.values), tuple(s.bins)) for s in analytics.survival
    ]
    return found


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
    columns = {}
    for j, name in enumerate(data.feature_names):
        x = np.asarray(data.features[:, j], dtype=np.float64)
        spec = declared.get(name)
        if spec is not None and spec.range is not None and not spec.log:
            x = spec.range[0] + x * (spec.range[1] - spec.range[0])
        columns[name] = x
    survival = data.labels.ndim == 2
    return Records(
        columns,
        labels=None if survival else data.labels,
        time=data.labels[:, 0].astype(np.float64) if survival else None,
        event=data.labels[:, 1] if survival else None,
        units=data.units,
    )


def noise_multiplier(config: StudyConfig, count: int) -> float:
    """σ of every statistic: the section's, or calibrated so that its `count` releases
    cost each hospital at most its `epsilon` at `[privacy] delta`."""
    analytics, privacy = config.analytics, config.privacy
    if analytics.noise_multiplier is not None:
        return analytics.noise_multiplier
    if analytics.epsilon is None:
        raise ValueError("[analytics]: give `epsilon` or `noise_multiplier`")
    neighbouring = (
        events.Neighbouring.ADD_REMOVE_PATIENT
        if config.data.declared_unit() is not None
        else events.Neighbouring.ADD_REMOVE
    )
    return calibrate_noise(
        analytics.epsilon,
        privacy.delta,
        lambda s: events.gaussian(s, count=count, neighbouring=neighbouring),
        accountant=privacy.accountant,
    )


def deployed(config: StudyConfig) -> Analytics | None:
    """The study's `[analytics]` as a deployment releases it (`dpfl deploy server
    --stats`): a table study's, whose hospitals each read their own file; None where the
    study sets no such section, or reads no table."""
    declared = config.data.declared_input()
    if "analytics" not in config.model_fields_set or declared is None:
        return None
    classes = declared[1]
    chosen = queries(config.analytics, () if classes is None else range(max(classes, 2)))
    if not chosen:
        return None
    return Analytics(
        tuple(chosen),
        noise_multiplier(config, len(chosen)),
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
    chosen = queries(analytics, classes)
    if not chosen:
        raise ValueError("[analytics] declares no statistic")
    patients = config.data.declared_unit() is not None
    neighbouring = (
        events.Neighbouring.ADD_REMOVE_PATIENT if patients else events.Neighbouring.ADD_REMOVE
    )
    privacy = config.privacy
    sigma = noise_multiplier(config, len(chosen))
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
    )
    write(run, out)
    return run


def write(run: StatsRun, out: Path) -> None:
    """`out/stats.json` and `out/stats.html`, each written whole (two runs at once: each
    file the later run's)."""
    for name, text in (
        (STATS_JSON, json.dumps(run.to_json(), indent=1)),
        (STATS_HTML, render(run)),
    ):
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


def render(run: StatsRun) -> str:
    """The HTML page in the report's style: a table per statistic (each figure with its
    noise std and interval), the histograms as bars with ±1 std whiskers, and the
    Kaplan–Meier curve with its band."""
    from matplotlib.figure import Figure as Plot  # matplotlib only when writing

    from dpfl.experiments.results.report.page import figure_html, html_page, html_table

    body = [
        f"<p>Hospitals: {escape(', '.join(run.hospitals))}; noise multiplier σ = "
        f"{run.noise_multiplier:.4g}; summed by {escape(run.summing)}; charged to "
        f"{escape(run.ledger)}. Each figure's noise std is beside it.</p>"
    ]
    for title in dict.fromkeys(f.statistic for f in run.figures):
        shown = [f for f in run.figures if f.statistic == title]
        body.append(f"<h2>{escape(title)}</h2>")
        body.append(
            html_table(
                ["figure", "value", "noise std", "95% interval"],
                [[f.name, f"{f.value:.4g}", f"{f.std:.3g}", _interval(f)] for f in shown],
            )
        )
        if title.startswith("histogram") or title == "Kaplan–Meier":
            plot = Plot(figsize=(8, 3.6), layout="constrained")
            ax = plot.add_subplot()
            ax.set_title(title, fontsize="medium")
            ax.grid(alpha=0.3)
            x = np.arange(len(shown))
            values = np.array([f.value for f in shown])
            if title == "Kaplan–Meier":
                times = [0.0] + [f.at or 0.0 for f in shown]
                low, high = zip(*(f.interval or (f.value, f.value) for f in shown), strict=True)
                ax.step(times, [1.0, *values], where="post", label="DP Kaplan–Meier")
                ax.fill_between(
                    times, [1.0, *low], [1.0, *high], step="post", alpha=0.3, label="95% band"
                )
                ax.set_ylim(0, 1.02)
                ax.set_xlabel("time")
                ax.legend()
            else:
                ax.bar(x, values, yerr=[f.std for f in shown], capsize=3)
                ax.set_xticks(x, [f.name for f in shown], rotation=45, fontsize="small")
            body.append(figure_html(plot, f"{title}: DP figures with their noise"))
    return html_page(f"{run.study}: DP statistics", "\n".join(body))


def _interval(figure: Figure) -> str:
    if figure.interval is None:
        return "—"
    return f"[{figure.interval[0]:.4g}, {figure.interval[1]:.4g}]"
