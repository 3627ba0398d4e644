"""`dpfl report DIR`: one self-contained HTML page about a study, read off its results store.

DIR/report/index.html holds a results table, four figures (PNGs drawn on matplotlib
`Figure`s, which need no GUI backend, embedded as data URIs so that the page is one
file to send) and a privacy datasheet per run. Only finished runs are reported; failed
runs are listed with their error. Metrics are those of the union of the silos' test
sets, and ε is the server's view (the one budgets bind), the largest over each silo's
trials, from `ResultsStore.epsilon_by_silo`.
"""

from __future__ import annotations

import base64
import html
import io
import math
import statistics
import textwrap
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from dpfl.experiments.config import study_terms
from dpfl.experiments.datasheet import RESEARCH_MARK, RESEARCH_NOISE, research_noise, span
from dpfl.experiments.store import ResultsStore, RunRow, SiloEpsilons, enforcing_accountant

RESULTS_FILE = "results.sqlite"
REPORT_FOLDER = "report"
TABLE_METRICS = ("accuracy", "auroc", "balanced_accuracy")
MAX_EPSILON_PANELS = 12
ACCOUNTANTS = ("pld", "rdp")
_METRIC_NAMES = {"auroc": "AUROC", "auprc": "AUPRC"}
_DPI = 110
_LINE_STYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v")
EPSILON_AXES = ("privacy.epsilon", "privacy.noise_multiplier")
"""Grid axes that move a run along a privacy–utility curve; every other axis (e.g.
MR-MTL's strength λ) gives each of its values a curve of its own."""

Row = dict[str, Any]


class ReportError(ValueError):
    """The report cannot be drawn as asked (e.g. no run has the requested metric)."""


class _Html(str):
    """Markup built here from escaped parts: table cells of this type are not escaped again."""


@dataclass(frozen=True)
class Stat:
    """Mean and sample std over trials of the finite values (NaN where undefined), so a
    metric that is undefined in one trial does not blank the others."""

    mean: float
    std: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Stat:
        finite = [v for v in values if math.isfinite(v)]
        return cls(
            statistics.fmean(finite) if finite else math.nan,
            statistics.stdev(finite) if len(finite) > 1 else math.nan,
        )

    def text(self) -> str:
        if math.isnan(self.mean):
            return "—"
        return f"{self.mean:.3f}" + ("" if math.isnan(self.std) else f"\u00a0±\u00a0{self.std:.3f}")


@dataclass(frozen=True)
class RunSummary:
    """What the page shows of one finished run, computed once from its rows."""

    run: RunRow
    label: str
    final: dict[str, Stat]
    """metric -> each trial's last union value, over trials"""
    curve: dict[int, Stat]
    """round -> the report's metric on the union, over trials"""
    private: bool
    """whether the run has any server-view privacy rows (a non-private run has none)"""
    epsilon: dict[str, SiloEpsilons]
    """accountant -> final ε per silo, each the largest over trials"""
    views: dict[str, SiloEpsilons]
    """observer other than the server -> its final ε per silo (never enforced)"""
    epsilon_rounds: dict[str, list[tuple[int, float]]]
    """silo -> (round, ε, the largest over trials) at the run's own accountant"""
    bytes_up: list[int]
    """total bytes sent up per (trial, silo)"""
    bytes_down: list[int]

    @property
    def accountant(self) -> str:
        return enforcing_accountant(self.run)

    @property
    def other_accountant(self) -> str:
        return next(a for a in ACCOUNTANTS if a != self.accountant)

    def score(self, metric: str) -> Stat:
        """The final value of `metric`, undefined (NaN) if the run did not report it."""
        return self.final.get(metric, Stat(math.nan, math.nan))

    @property
    def own_epsilon(self) -> float | None:
        """The largest final ε over silos and trials by the enforcing accountant; None if
        it accounted none (non-private, or no figure at the last round)."""
        spent = self.epsilon[self.accountant]
        return spent.max if spent.by_silo else None


def write_report(directory: Path, *, metric: str = "accuracy", out: Path | None = None) -> Path:
    """Write OUT/index.html (figures embedded; OUT defaults to DIR/report) from
    DIR/results.sqlite, which is only read (a read-only study is reported elsewhere with
    `out`); return it.

    Raises `StoreError` if DIR holds no results store, and `ReportError` if no finished
    run has `metric`."""
    out = directory / REPORT_FOLDER if out is None else out
    with ResultsStore(directory / RESULTS_FILE, create=False) as store:
        runs = store.runs()
        finished = [r for r in runs if r.status == "finished"]
        summaries = [
            _summarise(store, run, label, metric)
            for run, label in zip(finished, _labels(finished), strict=True)
        ]
    available = {m for s in summaries for m in s.final}
    if summaries and metric not in available:
        raise ReportError(
            f"no finished run has the metric {metric!r}; the store has "
            + ", ".join(sorted(available))
        )
    out.mkdir(parents=True, exist_ok=True)
    study = runs[0].study if runs else directory.name
    body = [_overview(runs, summaries)]
    if summaries:
        body += [
            _results_table(summaries, metric),
            _figures(summaries, metric),
            "<h2 id='datasheets'>Privacy datasheets</h2>",
            *(_datasheet(s) for s in summaries),
        ]
    body.append(_failed_runs([r for r in runs if r.status == "failed"]))
    index = out / "index.html"
    index.write_text(_page(f"dpfl report: {study}", "\n".join(body)), encoding="utf-8")
    return index


# -- reading the store ----------------------------------------------------------------------


def _summarise(store: ResultsStore, run: RunRow, label: str, metric: str) -> RunSummary:
    union = [r for r in store.rows("metrics", run.id) if r["silo"] is None]
    privacy = store.rows("privacy", run.id)
    server = [r for r in privacy if r["view"] is None]
    own = [r for r in server if r["accountant"] == enforcing_accountant(run)]
    communication = store.rows("communication", run.id)
    return RunSummary(
        run=run,
        label=label,
        final={m: Stat.of(_final_values(rows)) for m, rows in _group(union, "metric").items()},
        curve={
            round_: Stat.of(_value(r) for r in rows)
            for round_, rows in sorted(_group(_of_metric(union, metric), "round").items())
        },
        private=bool(server),
        epsilon={a: store.epsilon_by_silo(run, accountant=a) for a in ACCOUNTANTS},
        views={
            view: store.epsilon_by_silo(run, view)
            for view in sorted({r["view"] for r in privacy} - {None})
        },
        epsilon_rounds=_epsilon_rounds(store, run, sorted({int(r["round"]) for r in own})),
        bytes_up=_totals(communication, "bytes_up"),
        bytes_down=_totals(communication, "bytes_down"),
    )


def _group(rows: Iterable[Row], key: str) -> dict[Any, list[Row]]:
    groups: dict[Any, list[Row]] = defaultdict(list)
    for row in rows:
        groups[row[key]].append(row)
    return groups


def _of_metric(rows: Iterable[Row], metric: str) -> list[Row]:
    return [r for r in rows if r["metric"] == metric]


def _value(row: Row) -> float:
    """A metric's value; NULL (undefined, e.g. AUROC of a one-class test set) reads as NaN."""
    return math.nan if row["value"] is None else float(row["value"])


def _final_values(rows: list[Row]) -> list[float]:
    """Each trial's last evaluation: a run stopped by its budget ends early."""
    return [
        _value(max(trial, key=lambda r: int(r["round"])))
        for trial in _group(rows, "trial").values()
    ]


def _epsilon_rounds(
    store: ResultsStore, run: RunRow, rounds: list[int]
) -> dict[str, list[tuple[int, float]]]:
    """ε per silo after each accounted round, the largest over trials."""
    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for round_ in rounds:
        for silo, spent in store.epsilon_by_silo(run, through_round=round_).by_silo.items():
            curves[silo].append((round_, spent))
    return dict(curves)


def _totals(rows: list[Row], column: str) -> list[int]:
    """The column summed over rounds, one total per (trial, silo)."""
    totals: Counter[tuple[int, str]] = Counter()
    for row in rows:
        totals[row["trial"], row["silo"]] += int(row[column])
    return list(totals.values())


def _labels(runs: Sequence[RunRow]) -> list[str]:
    """Algorithm and grid point; a short run id is added where two runs would read alike."""
    labels = [f"{r.algorithm} ({_point(r)})" if _point(r) else r.algorithm for r in runs]
    counts = Counter(labels)
    return [
        label if counts[label] == 1 else f"{label} [{run.id[:8]}]"
        for label, run in zip(labels, runs, strict=True)
    ]


def _point(run: RunRow, leave_out: Sequence[str] = ()) -> str:
    """The grid point for legends and tables: the last part of each dotted key (unless two
    would then read alike), without `algorithm.name` (shown on its own) or `leave_out`."""
    grid = {k: v for k, v in run.grid.items() if k not in ("algorithm.name", *leave_out)}
    keys = sorted(grid)
    names = [key.rsplit(".", 1)[-1] for key in keys]
    if len(set(names)) < len(names):
        names = keys
    return ", ".join(f"{name}={grid[key]}" for name, key in zip(names, keys, strict=True))


def _grid_text(grid: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(grid.items()))


def _by_algorithm(summaries: Iterable[RunSummary]) -> dict[str, list[RunSummary]]:
    groups: dict[str, list[RunSummary]] = defaultdict(list)
    for s in summaries:
        groups[s.run.algorithm].append(s)
    return groups


# -- figures ----------------------------------------------------------------------------


def _figures(summaries: list[RunSummary], metric: str) -> str:
    """The four figures, embedded in the page, with their headings and captions."""
    name = _metric_name(metric)
    accounted = [s for s in summaries if s.epsilon_rounds]
    shown = accounted[:MAX_EPSILON_PANELS]
    capped = (
        f" Showing the first {len(shown)} of {len(accounted)} private runs."
        if len(accounted) > len(shown)
        else ""
    )
    algorithms = sorted({s.run.algorithm for s in summaries})
    colors = dict(zip(algorithms, _colors(len(algorithms)), strict=True))
    return "\n".join(
        [
            "<h2 id='privacy-utility'>Privacy–utility</h2>",
            _figure_html(
                _privacy_utility_figure(summaries, metric, colors),
                f"Final {name} on the union of the silos' test sets (mean ± sample std over "
                "trials) against ε: the largest final ε over silos and trials in the "
                "server's view, at each run's own accountant and the silo's δ. One line per "
                "algorithm and value of the grid's other axes. Non-private runs (ε = ∞) are "
                "dashed horizontal lines.",
                "No private run: there is no privacy–utility trade-off to plot.",
            ),
            "<h2 id='learning-curves'>Learning curves</h2>",
            _figure_html(
                _learning_curves_figure(summaries, metric, colors),
                f"{name.capitalize()} on the union of the silos' test sets at each evaluated "
                "round: mean over trials, band ± 1 sample std (no band with a single trial).",
            ),
            "<h2 id='epsilon-rounds'>Privacy spent over rounds</h2>",
            _figure_html(
                _epsilon_figure(shown),
                "ε per silo after each round in the server's view (the largest over trials, "
                f"each run's own accountant); dotted lines are the silos' budgets.{capped}",
                "No private run: no privacy was accounted.",
            ),
            "<h2 id='communication'>Communication</h2>",
            _figure_html(
                _communication_figure(summaries),
                "Bytes sent per client over all rounds, mean over silos, trials and the "
                "algorithm's runs.",
                "No communication was recorded.",
            ),
        ]
    )


def _figure_html(figure: Figure | None, caption: str, absent: str = "") -> str:
    """The figure as a PNG data URI in a <figure>, or a sentence saying why there is none."""
    if figure is None:
        return f"<p>{_e(absent)}</p>"
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=_DPI)
    source = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode("ascii")
    return (
        f'<figure><img src="{source}" alt="{_e(caption)}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _privacy_utility_figure(
    summaries: list[RunSummary], metric: str, colors: dict[str, Any]
) -> Figure | None:
    """One line per algorithm and value of the other grid axes, along ε."""
    points: dict[tuple[str, str], list[tuple[float, Stat]]] = defaultdict(list)
    for s in summaries:
        if s.own_epsilon is not None:
            curve = (s.run.algorithm, _point(s.run, EPSILON_AXES))
            points[curve].append((s.own_epsilon, s.score(metric)))
    if not points:
        return None
    figure, ax = _new_figure(
        "Privacy–utility", "ε (server's view, largest over silos and trials)", _metric_name(metric)
    )
    drawn: Counter[str] = Counter()
    for (algorithm, point), pairs in sorted(points.items()):
        pairs.sort(key=lambda pair: pair[0])
        ax.errorbar(
            [epsilon for epsilon, _ in pairs],
            [stat.mean for _, stat in pairs],
            yerr=[stat.std for _, stat in pairs],
            capsize=4,
            color=colors[algorithm],
            label=f"{algorithm} ({point})" if point else algorithm,
            **_style(drawn[algorithm]),
        )
        drawn[algorithm] += 1
    for s in summaries:
        if not s.private and not math.isnan(s.score(metric).mean):
            color = colors[s.run.algorithm]
            ax.axhline(s.score(metric).mean, ls="--", color=color, label=f"{s.label}, ε = ∞")
    if _spans_decade(epsilon for pairs in points.values() for epsilon, _ in pairs):
        ax.set_xscale("log")
        _log_ticks(ax.xaxis)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    figure.legend(loc="outside right upper", fontsize="small")
    return figure


def _learning_curves_figure(
    summaries: list[RunSummary], metric: str, colors: dict[str, Any]
) -> Figure:
    """A line per run in its algorithm's colour (as in the privacy–utility figure); the
    runs of one algorithm differ by line style and marker (distinct for up to 20)."""
    figure, ax = _new_figure("Learning curves", "round", _metric_name(metric))
    for algorithm, runs in _by_algorithm(summaries).items():
        color = colors[algorithm]
        for i, s in enumerate(r for r in runs if r.curve):
            rounds = list(s.curve)
            mean = [s.curve[r].mean for r in rounds]
            std = [s.curve[r].std for r in rounds]
            ax.plot(rounds, mean, color=color, markersize=4, label=s.label, **_style(i))
            if any(math.isfinite(d) for d in std):
                low = [m - d for m, d in zip(mean, std, strict=True)]
                high = [m + d for m, d in zip(mean, std, strict=True)]
                ax.fill_between(rounds, low, high, color=color, alpha=0.15, linewidth=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    figure.legend(loc="outside right upper", fontsize="small")
    return figure


def _epsilon_figure(summaries: list[RunSummary]) -> Figure | None:
    """One panel per accounted run: ε of each silo against its budget."""
    if not summaries:
        return None
    columns = min(3, len(summaries))
    rows = math.ceil(len(summaries) / columns)
    figure = Figure(figsize=(4.4 * columns, 3.4 * rows), layout="constrained")
    axes = list(figure.subplots(rows, columns, squeeze=False).flat)
    for ax, s in zip(axes, summaries, strict=False):
        silos = s.run.datasheet.get("silos", {})
        highest = 0.0
        for silo, points in sorted(s.epsilon_rounds.items()):
            rounds, spent = zip(*points, strict=True)
            (line,) = ax.plot(rounds, spent, marker=".", label=silo)
            budget = silos.get(silo, {}).get("budget_epsilon")
            if budget is not None:
                ax.axhline(budget, ls=":", color=line.get_color())
            highest = max(highest, *spent, budget or 0.0)
        ylabel = f"ε ({s.accountant.upper()}), largest over trials"
        _label_axes(ax, textwrap.fill(s.label, 45), "round", ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, 1.1 * highest or 1.0)  # room above a budget spent in full
        ax.legend(fontsize="x-small", loc="upper left")
    for ax in axes[len(summaries) :]:
        ax.remove()
    return figure


def _communication_figure(summaries: list[RunSummary]) -> Figure | None:
    """Grouped bars: mean bytes up and down per client, one group per algorithm."""
    groups = _by_algorithm(summaries)
    algorithms = sorted(groups)
    directions = {
        "up (client → server)": [
            _mean(t for s in groups[a] for t in s.bytes_up) for a in algorithms
        ],
        "down (server → client)": [
            _mean(t for s in groups[a] for t in s.bytes_down) for a in algorithms
        ],
    }
    totals = [v for values in directions.values() for v in values]
    if not any(totals):
        return None
    figure, ax = _new_figure("Communication per client", "", "bytes over all rounds")
    width = 0.4
    for offset, (direction, values) in zip(
        (-width / 2, width / 2), directions.items(), strict=True
    ):
        positions = [i + offset for i in range(len(algorithms))]
        bars = ax.bar(positions, values, width, label=direction)
        ax.bar_label(bars, labels=[_bytes(v) for v in values], fontsize="x-small")
    ax.set_xticks(range(len(algorithms)), algorithms)
    if _spans_decade(totals):
        ax.set_yscale("log")
        _log_ticks(ax.yaxis)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _bytes(v)))
    ax.margins(y=0.1)
    figure.legend(loc="outside right upper", fontsize="small")
    return figure


def _style(i: int) -> dict[str, Any]:
    """The i-th line of one colour: distinct line style and marker for up to 20."""
    return {"ls": _LINE_STYLES[i % len(_LINE_STYLES)], "marker": _MARKERS[i % len(_MARKERS)]}


def _new_figure(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Axes]:
    figure = Figure(figsize=(10, 4.8), layout="constrained")
    ax = figure.add_subplot()
    _label_axes(ax, title, xlabel, ylabel)
    return figure, ax


def _label_axes(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize="medium")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def _colors(n: int) -> list[Any]:
    """Distinguishable colours for n lines: tab10, or tab20 beyond ten (cycling past 20)."""
    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _log_ticks(axis: Axis) -> None:
    """Ticks at 1, 2 and 5 × 10^k, minor ones unlabelled: matplotlib labels the minor
    ticks of a log axis shorter than a few decades, and the labels overlap."""
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_minor_formatter(NullFormatter())


def _spans_decade(values: Iterable[float]) -> bool:
    """Whether a log axis is needed: the positive values differ by more than 10×."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    return bool(positive) and max(positive) > 10 * min(positive)


def _mean(values: Iterable[float]) -> float:
    """The mean, or 0 for no values: a run that recorded no messages sent no bytes."""
    listed = list(values)
    return statistics.fmean(listed) if listed else 0.0


# -- HTML -------------------------------------------------------------------------------


def _overview(runs: list[RunRow], summaries: list[RunSummary]) -> str:
    counts = Counter(r.status for r in runs)
    if not summaries:
        lead = f"No finished runs in {RESULTS_FILE}: nothing to report yet."
    else:
        lead = (
            f"{len(summaries)} finished run(s) from {RESULTS_FILE}. Metrics are on the union "
            "of the silos' test sets at each trial's last evaluated round (mean ± sample std "
            "over trials); ε is the server's view, the one budgets bind, and for each silo "
            "the largest over its trials."
        )
    others = f" Failed: {counts['failed']}. Still running (not shown): {counts['running']}."
    return f"<p>{_e(lead + others)}</p>"


def _results_table(summaries: list[RunSummary], metric: str) -> str:
    metrics = list(dict.fromkeys([metric, *TABLE_METRICS]))
    header = [
        "run",
        "algorithm",
        "grid point",
        "trials",
        "rounds",
        "σ",
        "max ε (enforced)",
        "max ε (other accountant)",
        *(_metric_name(m) for m in metrics),
        "bytes up per client",
    ]
    rows = [
        [
            _Html(f'<a href="#run-{_e(s.run.id)}">{_e(s.run.id[:8])}</a>'),
            s.run.algorithm,
            _point(s.run) or "—",
            s.run.trials,
            _rounds_text(s.run),
            _number(s.run.noise_multiplier) if s.private else "—",
            _epsilon_text(s, s.accountant, mark=True),
            _epsilon_text(s, s.other_accountant),
            *(s.score(m).text() for m in metrics),
            _bytes(_mean(s.bytes_up)),
        ]
        for s in summaries
    ]
    caption = (
        "<p>ε: the largest over silos and trials, by the accountant that enforced the "
        "budgets; the other accountant's figure is shown for comparison only.</p>"
    )
    if any(research_noise(s.run) for s in summaries):
        caption += f"<p>{RESEARCH_MARK} {_e(RESEARCH_NOISE)}.</p>"
    return "<h2 id='results'>Results</h2>\n" + _table(header, rows) + caption


def _rounds_text(run: RunRow) -> str:
    text = f"{run.rounds_completed}/{run.rounds}"
    return text + " (budget spent)" if run.stopped_by_budget else text


def _epsilon_text(s: RunSummary, accountant: str, *, mark: bool = False) -> str:
    """The run's largest ε by `accountant`, labelled with it; marked if `mark` and the
    noise was seeded."""
    if not s.private:
        return "∞ (non-private)"
    spent = s.epsilon[accountant]
    if not spent.by_silo:
        return "—"
    seeded = f" {RESEARCH_MARK}" if mark and research_noise(s.run) else ""
    return f"{spent.max:.3g} ({accountant.upper()}){seeded}"


def _datasheet(s: RunSummary) -> str:
    """Who is protected, by what mechanism, at what ε per silo, against whom."""
    sheet = s.run.datasheet
    facts = {
        "run": s.run.id,
        "grid point": _grid_text(s.run.grid) or None,
        "unit of privacy": sheet.get("unit"),
        "mechanism": sheet.get("mechanism"),
        "accountant (enforces budgets)": s.accountant.upper() if s.private else None,
        "noise multiplier σ": sheet.get("noise_multiplier"),
        "clip norm C": sheet.get("clip_norm"),
        "noise": _noise_text(s),
        "threat model (who sees what)": sheet.get("threat_model"),
        "released outside ε": sheet.get("evaluation"),
    }
    listed = "".join(f"<dt>{_e(k)}</dt><dd>{_e(_number(v))}</dd>" for k, v in facts.items())
    assumptions = sheet.get("assumptions") or ["none stated"]
    silos = sheet.get("silos") or {}
    header = [
        "silo",
        "public size",
        "δ",
        "q",
        "rounds charged",
        f"ε ({s.accountant.upper()}, enforced)",
        f"ε ({s.other_accountant.upper()}, not enforced)",
        "ε, other observers",
        "budget ε",
        "events",
    ]
    rows = [
        [
            name,
            _public_size(silo),
            _number(silo.get("delta"), ".2g"),
            ", ".join(format(q, ".4g") for q in silo.get("sample_rates") or []) or "—",
            span(silo["participations"]),
            _number(s.epsilon[s.accountant].by_silo.get(name)),
            _number(s.epsilon[s.other_accountant].by_silo.get(name)),
            _bullets(
                f"{view}: {spent.by_silo[name]:.3g}"
                for view, spent in s.views.items()
                if name in spent.by_silo
            ),
            _number(silo.get("budget_epsilon"), absent="none"),
            _bullets(silo.get("events") or []),
        ]
        for name, silo in sorted(silos.items())
    ]
    seeded = f"<p>{RESEARCH_MARK} {_e(RESEARCH_NOISE)}.</p>" if research_noise(s.run) else ""
    spent = (
        f"<p>ε per silo at its δ after the run: the largest over the run's {s.run.trials} "
        "trial(s), each a separate account (under client sampling they spend differently); "
        "by the accountant that enforced the budgets and, for comparison only, by the "
        "other; and against observers other than the server (at the run's accountant; "
        "recorded, never enforced). q: Poisson sampling rate; rounds charged: per trial "
        f"where trials differ; the events give the steps per round.</p>{seeded}"
        f"{_table(header, rows)}"
        if rows
        else "<p>ε = ∞ (non-private): no record is protected by differential privacy.</p>"
    )
    return (
        f"<section class='datasheet' id='run-{_e(s.run.id)}'><h3>{_e(s.label)}</h3>"
        f"<dl>{listed}<dt>assumptions</dt><dd>{_bullets(assumptions)}</dd></dl>{spent}</section>"
    )


def _noise_text(s: RunSummary) -> str | None:
    """Whether the noise may be released: seeded (research) or from the CSPRNG."""
    if research_noise(s.run):
        return f"{RESEARCH_MARK} {RESEARCH_NOISE}"
    if s.private and s.run.datasheet.get("research_noise") is False:
        return "drawn from the operating system's CSPRNG"
    return None  # non-private, or a datasheet that predates the field


def _failed_runs(runs: list[RunRow]) -> str:
    if not runs:
        return ""
    rows = [
        [
            r.id[:8],
            r.algorithm,
            _point(r) or "—",
            _Html(f"<pre>{_e(study_terms(r.error or ''))}</pre>"),
        ]
        for r in runs
    ]
    return "<h2 id='failed'>Failed runs</h2>\n" + _table(
        ["run", "algorithm", "grid point", "error"], rows
    )


def _table(header: list[str], rows: list[list[Any]]) -> str:
    """An HTML table; cells are escaped unless they are `_Html`."""

    def cell(value: Any) -> str:
        return value if isinstance(value, _Html) else _e(value)

    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return (
        f"<div class='scroll'><table><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table></div>"
    )


def _public_size(silo: dict[str, Any]) -> str:
    """The size that shaped the mechanism, and where it came from (a datasheet written
    before public sizes has only `size`)."""
    size = silo.get("public_size", silo.get("size"))
    source = silo.get("public_size_source")
    return "—" if size is None else f"{size} ({source})" if source else str(size)


def _bullets(items: Iterable[Any]) -> _Html:
    """A list, or a dash for none."""
    listed = "".join(f"<li>{_e(item)}</li>" for item in items)
    return _Html(f"<ul>{listed}</ul>" if listed else "—")


def _page(title: str, body: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<link rel="icon" href="data:,">
<style>{_CSS}</style>
</head>
<body>
<h1>{_e(title)}</h1>
{body}
</body>
</html>
"""


_CSS = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto;
       padding: 0 1rem; color: #222; line-height: 1.4; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.5rem; text-align: left;
         vertical-align: top; }
th { background: #f2f2f2; }
td:first-child { white-space: nowrap; }
.scroll { overflow-x: auto; }
td ul, dd ul { margin: 0; padding-left: 1.1rem; }
pre { margin: 0; white-space: pre-wrap; }
figure { margin: 0 0 1.5rem; }
img { max-width: 100%; height: auto; }
figcaption { font-size: 0.9rem; color: #555; }
.datasheet { border-top: 1px solid #ddd; padding-top: 0.5rem; }
dl { display: grid; grid-template-columns: max-content auto; gap: 0.2rem 1rem; }
dt { font-weight: 600; }
dd { margin: 0; }
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _metric_name(metric: str) -> str:
    return _METRIC_NAMES.get(metric, metric.replace("_", " "))


def _number(value: Any, spec: str = ".3g", absent: str = "—") -> str:
    """A float in `spec`; other values (counts, text) as they are; None as `absent`."""
    if value is None:
        return absent
    return format(value, spec) if isinstance(value, float) else str(value)


def _bytes(n: float) -> str:
    """A byte count in decimal units (1 kB = 1000 B)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.3g}\u00a0{unit}"
        n /= 1000
    return f"{n:.3g}\u00a0TB"
