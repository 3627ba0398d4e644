"""The pages of a stats run (`dpfl stats`, `dpfl deploy server --stats`): the HTML page
in the report's style, and Table 1 as a CSV. Every figure is shown with its noise std,
its 95% interval and what that interval covers."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from html import escape

import numpy as np

from dpfl.analytics import COHORT, Figure
from dpfl.experiments.results.report.page import Html, figure_html, html_page, html_table
from dpfl.experiments.study.analytics import StatsRun

COVERS = {
    COHORT: "the exact figure of these records, over the DP noise",
    "population": "the population's figure, over sampling and the DP noise",
}


def _covers(figure: Figure) -> str:
    if figure.band is None:
        return "—"
    kind = "raw noisy value" if figure.raw else "post-processed"
    return f"{figure.covers} ({kind})"


def render(run: StatsRun) -> str:
    """A table per statistic (each figure with its noise std, interval and what the
    interval covers), Table 1 as one cross-table, the histograms as bars with ±1 std
    whiskers, and the Kaplan–Meier curves with their bands."""
    epsilon = ", ".join(f"{t}: ε {e:.3g}" for t, e in run.epsilon.items())
    body = [
        f"<p>Hospitals: {escape(', '.join(run.hospitals))}; noise multiplier σ = "
        f"{run.noise_multiplier:.4g}; summed by {escape(run.summing)}; charged to "
        f"{escape(run.ledger)}. Each release alone, per hospital: {escape(epsilon)}.</p>",
        "<p>Each figure's noise std is beside it. A 95% interval covers, 95% of the time: "
        + "; ".join(f"<b>{k}</b>: {escape(v)}" for k, v in COVERS.items())
        + ". A raw noisy value is unbiased; a post-processed one (clamped, made "
        "consistent, a ratio) may not be.</p>",
    ]
    for title in dict.fromkeys(f.statistic for f in run.figures):
        shown = [f for f in run.figures if f.statistic == title]
        body.append(f"<h2>{escape(title)}</h2>")
        if shown[0].cell is not None:
            body.append(table_one_html(shown, run.epsilon.get(title)))
            continue
        rows = [
            [f.name, f"{f.value:.4g}", std_text(f), interval_text(f), _covers(f)] for f in shown
        ]
        body.append(html_table(["figure", "value", "noise std", "95% interval", "covers"], rows))
        if title.startswith("histogram") or shown[0].at is not None:
            body.append(_plot(title, shown))
    return html_page(f"{run.study}: DP statistics", "\n".join(body))


def std_text(figure: Figure) -> str:
    """A figure's noise std as printed, or a dash where it has none of its own."""
    return f"{figure.std:.3g}" if math.isfinite(figure.std) else "—"


def interval_text(figure: Figure) -> str:
    """A figure's 95% interval as printed, or a dash where it has none."""
    if figure.band is None:
        return "—"
    low, high = figure.band
    return f"[{low:.4g}, {high:.4g}]"


def _plot(title: str, shown: Sequence[Figure]) -> str:
    from matplotlib.figure import Figure as Plot  # matplotlib only when writing

    plot = Plot(figsize=(8, 3.6), layout="constrained")
    ax = plot.add_subplot()
    ax.set_title(title, fontsize="medium")
    ax.grid(alpha=0.3)
    if shown[0].at is not None:  # survival curves, one per group; a test's figures: none
        curves: dict[str, list[Figure]] = {}
        for f in shown:
            if f.at is not None:  # "S(730) sex = F": the curve of sex = F
                curves.setdefault(f.name.partition(" ")[2], []).append(f)
        for curve, points in curves.items():
            times = [0.0] + [f.at or 0.0 for f in points]
            low, high = zip(*(f.band or (f.value, f.value) for f in points), strict=True)
            values = [1.0] + [f.value for f in points]
            ax.step(times, values, where="post", label=curve or "DP Kaplan–Meier")
            ax.fill_between(times, [1.0, *low], [1.0, *high], step="post", alpha=0.25)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("time")
        ax.legend()
    else:
        x = np.arange(len(shown))
        ax.bar(x, [f.value for f in shown], yerr=[f.std for f in shown], capsize=3)
        ax.set_xticks(x, [f.name for f in shown], rotation=45, fontsize="small")
    return figure_html(plot, f"{title}: DP figures with their noise")


def _table_one_rows(figures: Sequence[Figure]) -> dict[str, list[tuple[str, ...]]]:
    """Table 1's rows: each row's label and the figure names its cells combine."""
    rows: dict[str, list[tuple[str, ...]]] = {}
    for name in dict.fromkeys(f.name for f in figures):
        if name == "n":
            rows["n"] = [("n",)]
        elif name.endswith(" (%)"):
            rows[f"{name[:-4]}, n (%)"] = [(name[:-4], name)]
        elif name.endswith(": mean"):
            column = name[: -len(": mean")]
            rows[f"{column}, mean ± sd"] = [(name, f"{column}: standard deviation")]
        elif name.endswith(": quantile 0.5"):
            column = name[: -len(": quantile 0.5")]
            quartiles = tuple(f"{column}: quantile {p}" for p in ("0.5", "0.25", "0.75"))
            rows[f"{column}, median [IQR]"] = [quartiles]
    return rows


def table_one_html(figures: Sequence[Figure], epsilon: float | None) -> str:
    """Table 1: a row per variable line, a column per (site, group), each cell's
    figures with their noise stds under them."""
    at = {(f.name, f.cell): f for f in figures}
    cells = list(dict.fromkeys(f.cell for f in figures))
    header = ["", *(f"{site}: {group}" for site, group in cells)]  # type: ignore[misc]
    body = []
    for label, (names,) in _table_one_rows(figures).items():
        row: list[object] = [label]
        for cell in cells:
            shown = [at[(n, cell)] for n in names]
            row.append(Html(_cell_text(label, shown)))
        body.append(row)
    cost = "" if epsilon is None else f" The whole table costs each hospital ε {epsilon:.3g}."
    note = (
        "<p>Each cell's noise std is under it (n (%): the count's; median [IQR]: the "
        "half-width of each quantile's interval over 1.96)." + escape(cost) + "</p>"
    )
    return note + html_table(header, body)


def _cell_text(label: str, shown: Sequence[Figure]) -> str:
    stds = " / ".join(f"{f.std:.2g}" for f in shown)
    if label.endswith("n (%)"):
        text = f"{shown[0].value:.0f} ({shown[1].value:.1f}%)"
    elif label.endswith("mean ± sd"):
        text = f"{shown[0].value:.3g} ± {shown[1].value:.3g}"
    elif label.endswith("median [IQR]"):
        text = f"{shown[0].value:.3g} [{shown[1].value:.3g}, {shown[2].value:.3g}]"
    else:
        text = f"{shown[0].value:.0f}"
    return f"{escape(text)}<br><small>noise std {escape(stds)}</small>"


def table_one_csv(run: StatsRun) -> str:
    """Every Table 1 figure, one per line, with its noise, interval and coverage."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        ["site", "group", "figure", "value", "noise_std", "low", "high", "covers", "raw"]
    )
    for f in run.figures:
        if f.cell is not None:
            low, high = f.band or (None, None)
            writer.writerow([*f.cell, f.name, f.value, f.std, low, high, f.covers, f.raw])
    return out.getvalue()
