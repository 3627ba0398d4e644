"""`dpfl report DIR`: the study's HTML report, written to DIR/report/index.html."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from dpfl.experiments.store import ResultsStore, StoreError

from .common import errors, print_json, reported_errors


def report(
    directory: Annotated[Path, typer.Argument(help="The study directory (holds results.sqlite).")],
    metric: Annotated[
        str,
        typer.Option(
            help="Metric of the figures: accuracy, balanced_accuracy, auroc, auprc, precision, "
            "recall or loss."
        ),
    ] = "accuracy",
    json_output: Annotated[
        bool, typer.Option("--json", help='Print one JSON object {"report": path, "runs": n}.')
    ] = False,
) -> None:
    """Write the study's report (figures, results table, privacy datasheets); print its path."""
    # Imported here: matplotlib would add half a second to every other dpfl command.
    from dpfl.experiments.report import RESULTS_FILE, ReportError, write_report

    with reported_errors():
        try:
            index = write_report(directory, metric=metric)
            with ResultsStore(directory / RESULTS_FILE, create=False) as store:
                runs = len(store.runs(status="finished"))
        except (StoreError, ReportError) as exc:
            errors.print(f"[red]error:[/red] {escape(str(exc))}")
            raise typer.Exit(2) from exc
    if json_output:
        print_json({"report": str(index), "runs": runs})
    else:
        typer.echo(index)
