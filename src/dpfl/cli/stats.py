"""`dpfl stats STUDY.toml`: the study's `[analytics]`, released under DP in the
simulator, charged to each hospital's ledger (`dpfl.experiments.study.analytics`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from .common import console, print_json, reported_errors

if TYPE_CHECKING:
    from dpfl.experiments.study.analytics import StatsRun


def stats(
    config: Annotated[Path, typer.Argument(help="The study file (with an \\[analytics] section).")],
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="Folder for ledger.sqlite, stats.json and stats.html."),
    ] = Path("stats"),
    ledger: Annotated[
        Path | None,
        typer.Option(
            help="For a study that names no \\[privacy] ledger: charge this one (shared by "
            "the hospitals' studies, with their caps) as if it did, instead of "
            "OUT/ledger.sqlite."
        ),
    ] = None,
    json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Release the study's DP statistics: each charged to every hospital's ledger first
    (refused past a budget), summed by its secure aggregation, each figure with its noise."""
    from dpfl.experiments.study.analytics import stats as release
    from dpfl.experiments.study.config import load

    with reported_errors():
        study = load(config)
        if len(study.points) > 1:
            raise ValueError(f"{config} is a grid of {len(study.points)} points: stats take one")
        run = release(study.points[0][1], out, ledger)
    if json:
        print_json(run.to_json())
        return
    show(run, out)


def show(run: StatsRun, out: Path) -> None:
    """The figures as a table, each with its noise, its 95% interval and what that
    covers (Table 1's cells: in its CSV and the HTML page), then the HTML page's path."""
    from dpfl.experiments.study.analytics import STATS_HTML, TABLE_ONE_CSV
    from dpfl.experiments.study.stats_page import interval_text, std_text

    table = Table(
        title=f"{escape(run.study)}: DP statistics (σ = {run.noise_multiplier:.4g}, "
        f"summed by {run.summing})"
    )
    for column in ("statistic", "figure", "value", "noise std", "95% interval", "covers"):
        table.add_column(column)
    for f in run.figures:
        if f.cell is None:
            covers = "—" if f.band is None else f.covers + ("" if f.raw else ", post-processed")
            table.add_row(
                escape(f.statistic),
                escape(f.name),
                f"{f.value:.4g}",
                std_text(f),
                interval_text(f),
                covers,
            )
    console.print(table)
    if any(f.cell is not None for f in run.figures):
        typer.echo(out / TABLE_ONE_CSV)
    typer.echo(out / STATS_HTML)
