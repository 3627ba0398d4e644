"""`dpfl report DIR`: the study's HTML report, written to DIR/report/index.html (or
`--out`, e.g. for a study directory that is read-only)."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Annotated

import typer

from .common import print_json, reported_errors

READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


def report(
    directory: Annotated[Path, typer.Argument(help="The study directory (holds results.sqlite).")],
    metric: Annotated[
        str | None,
        typer.Option(
            help="Metric of the figures: accuracy, balanced_accuracy, auroc, auprc, precision, "
            "recall, loss; survival: c_index, c_index_uno, ibs, td_auc. Default: accuracy, "
            "or c_index for survival models."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Folder for index.html (default DIR/report); the study is only read."),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help='Print one JSON object {"report": path, "runs": n}.')
    ] = False,
) -> None:
    """Write the study's report (figures, results table, privacy datasheets); print its path."""
    # Imported here: matplotlib would add half a second to every other dpfl command.
    from dpfl.experiments.results.report import REPORT_FOLDER, RESULTS_FILE, write_report
    from dpfl.experiments.results.store import ResultsStore

    with reported_errors():  # a missing store or an unknown metric: one red line, status 2
        try:
            index = write_report(directory, metric=metric, out=out)
        except OSError as exc:  # the default folder, in a study the user cannot write
            folder = directory / REPORT_FOLDER
            if out is not None or exc.errno not in READ_ONLY or not _within(exc, folder):
                raise
            raise ValueError(
                f"cannot write the report in {folder} ({exc.strerror}): the study directory "
                "is read-only to you; write the report elsewhere with --out FOLDER"
            ) from exc
        with ResultsStore(directory / RESULTS_FILE, create=False) as store:
            runs = len(store.runs(status="finished"))
    if json_output:
        print_json({"report": str(index), "runs": runs})
    else:
        typer.echo(index)


def _within(exc: OSError, folder: Path) -> bool:
    """Whether the file that `exc` names is `folder` or inside it."""
    return exc.filename is not None and Path(exc.filename).is_relative_to(folder)
