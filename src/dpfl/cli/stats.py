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
    """The figures as a table, each with its noise, then the HTML page's path."""
    from dpfl.experiments.study.analytics import STATS_HTML

    table = Table(
        title=f"{escape(run.study)}: DP statistics (σ = {run.noise_multiplier:.4g}, "
        f"summed by {run.summing})"
    )
    for column in ("statistic", "figure", "value", "noise std", "95% interval"):
        table.add_column(column)
    for f in run.figures:
        interval = "—" if f.interval is None else f"[{f.interval[0]:.4g}, {f.interval[1]:.4g}]"
        table.add_row(
            escape(f.statistic), escape(f.name), f"{f.value:.4g}", f"{f.std:.3g}", interval
        )
    console.print(table)
    typer.echo(out / STATS_HTML)
