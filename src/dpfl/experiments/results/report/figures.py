"""The report's four figures, drawn on matplotlib `Figure`s (no GUI backend, no global
pyplot state, so reports can be written from worker processes). Each returns None when
there is nothing to draw; the page says why."""

from __future__ import annotations

import math
import statistics
import textwrap
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from dpfl.experiments.results.queries import Direction, Spread

from .shown import Shown, byte_text, metric_name, point

EPSILON_AXES = ("privacy.epsilon", "privacy.noise_multiplier")
"""Grid axes that move a run along a privacy–utility curve; every other axis (e.g.
MR-MTL's strength λ) gives each of its values a curve of its own."""
_LINE_STYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v")


def algorithm_colors(shown: Iterable[Shown]) -> dict[str, Any]:
    """One colour per algorithm, the same in every figure."""
    algorithms = sorted({s.run.algorithm for s in shown})
    return dict(zip(algorithms, _colors(len(algorithms)), strict=True))


def privacy_utility(shown: list[Shown], metric: str, colors: dict[str, Any]) -> Figure | None:
    """One line per algorithm and value of the other grid axes, along ε, of the runs with
    the metric on the union of the test sets (a deployment's hospitals score their own)."""
    points: dict[tuple[str, str], list[tuple[float, Spread]]] = defaultdict(list)
    for s in shown:
        if s.summary.own_epsilon is not None and s.summary.metrics.score(metric).defined:
            curve = (s.run.algorithm, point(s.run, EPSILON_AXES))
            points[curve].append((s.summary.own_epsilon, s.summary.metrics.score(metric)))
    if not points:
        return None
    figure, ax = _new_figure(
        "Privacy–utility", "ε (server's view, largest over silos and trials)", metric_name(metric)
    )
    drawn: Counter[str] = Counter()
    for (algorithm, grid_point), pairs in sorted(points.items()):
        pairs.sort(key=lambda pair: pair[0])
        ax.errorbar(
            [epsilon for epsilon, _ in pairs],
            [spread.mean for _, spread in pairs],
            yerr=[spread.std for _, spread in pairs],
            capsize=4,
            color=colors[algorithm],
            label=f"{algorithm} ({grid_point})" if grid_point else algorithm,
            **_style(drawn[algorithm]),
        )
        drawn[algorithm] += 1
    for s in shown:
        score = s.summary.metrics.score(metric)
        if not s.summary.private and score.defined:
            color = colors[s.run.algorithm]
            ax.axhline(score.mean, ls="--", color=color, label=f"{s.label}, ε = ∞")
    if _spans_decade(epsilon for pairs in points.values() for epsilon, _ in pairs):
        ax.set_xscale("log")
        _log_ticks(ax.xaxis)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    figure.legend(loc="outside right upper", fontsize="small")
    return figure


def learning_curves(shown: list[Shown], metric: str) -> Figure | None:
    """A line per run, each in its own colour (a qualitative colormap) and named in the
    legend: runs of one algorithm (a sweep over ε) would otherwise look alike. None if no
    run has a curve on the union of the test sets (a deployment has none)."""
    curves = [(s, c) for s in shown if (c := s.summary.metrics.curves.get(metric))]
    if not curves:
        return None
    figure, ax = _new_figure("Learning curves", "round", metric_name(metric))
    for (s, curve), color in zip(curves, _colors(len(curves)), strict=True):
        rounds = list(curve)
        mean = [curve[r].mean for r in rounds]
        std = [curve[r].std for r in rounds]
        ax.plot(rounds, mean, color=color, marker=".", label=s.label)
        if any(math.isfinite(d) for d in std):
            low = [m - d for m, d in zip(mean, std, strict=True)]
            high = [m + d for m, d in zip(mean, std, strict=True)]
            ax.fill_between(rounds, low, high, color=color, alpha=0.15, linewidth=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    figure.legend(loc="outside right upper", fontsize="small")
    return figure


def epsilon_over_rounds(shown: list[Shown]) -> Figure | None:
    """One panel per accounted run: ε of each silo against its budget."""
    if not shown:
        return None
    columns = min(3, len(shown))
    rows = math.ceil(len(shown) / columns)
    figure = Figure(figsize=(4.4 * columns, 3.4 * rows), layout="constrained")
    axes = list(figure.subplots(rows, columns, squeeze=False).flat)
    for ax, s in zip(axes, shown, strict=False):
        silos = s.run.datasheet.get("silos", {})
        highest = 0.0
        for silo, points in sorted(s.epsilon_rounds.items()):
            rounds, spent = zip(*points, strict=True)
            (line,) = ax.plot(rounds, spent, marker=".", label=silo)
            budget = silos.get(silo, {}).get("budget_epsilon")
            if budget is not None:
                ax.axhline(budget, ls=":", color=line.get_color())
            highest = max(highest, *spent, budget or 0.0)
        ylabel = f"ε ({s.summary.accountant.upper()}), largest over trials"
        _label_axes(ax, textwrap.fill(s.label, 45), "round", ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, 1.1 * highest or 1.0)  # room above a budget spent in full
        ax.legend(fontsize="x-small", loc="upper left")
    for ax in axes[len(shown) :]:
        ax.remove()
    return figure


def communication(shown: list[Shown]) -> Figure | None:
    """Grouped bars: mean bytes up and down per client, one group per algorithm, of the
    runs that counted their bytes (a deployment's server does not yet)."""
    groups = _by_algorithm(s for s in shown if not s.run.reported)
    algorithms = sorted(groups)
    directions = {
        "up (client → server)": [_per_client(groups[a], "up") for a in algorithms],
        "down (server → client)": [_per_client(groups[a], "down") for a in algorithms],
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
        ax.bar_label(bars, labels=[byte_text(v) for v in values], fontsize="x-small")
    ax.set_xticks(range(len(algorithms)), algorithms)
    if _spans_decade(totals):
        ax.set_yscale("log")
        _log_ticks(ax.yaxis)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: byte_text(v)))
    ax.margins(y=0.1)
    figure.legend(loc="outside right upper", fontsize="small")
    return figure


def _per_client(runs: list[Shown], direction: Direction) -> float:
    """Bytes per client over all rounds, mean over the runs' silos and trials (0 for
    runs that recorded no messages)."""
    totals = [n for s in runs for n in s.summary.traffic.totals(direction)]
    return statistics.fmean(totals) if totals else 0.0


def _by_algorithm(shown: Iterable[Shown]) -> dict[str, list[Shown]]:
    groups: dict[str, list[Shown]] = defaultdict(list)
    for s in shown:
        groups[s.run.algorithm].append(s)
    return groups


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
