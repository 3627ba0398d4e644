"""`dpfl report DIR`: one self-contained HTML page about a study, read off its results store.

DIR/report/index.html holds a results table, four figures and a privacy datasheet per
run. Only finished runs are reported; failed runs are listed with their error. Metrics
are those of the union of the silos' test sets, and ε is the server's view (the one
budgets bind), the largest over each silo's trials. A deployed run (no ledger at the
server, no union of test sets) shows ε as its hospitals reported it, labelled so, and
each hospital's metrics on its own test set. Three layers, so that each can
change alone: the runs are read through `dpfl.experiments.results.queries` (as `best` and the
summaries read them), drawn in `figures` and written out in `page`.
"""

from __future__ import annotations

from pathlib import Path

from dpfl.experiments.results.queries import (
    RESULTS_FILE,
    epsilon_over_rounds,
    open_results,
    summarise,
)

from .page import render
from .shown import Shown, labels

__all__ = ["REPORT_FOLDER", "RESULTS_FILE", "ReportError", "write_report"]

REPORT_FOLDER = "report"


class ReportError(ValueError):
    """The report cannot be drawn as asked (e.g. no run has the requested metric)."""


def write_report(directory: Path, *, metric: str | None = None, out: Path | None = None) -> Path:
    """Write OUT/index.html (figures embedded; OUT defaults to DIR/report) from
    DIR/results.sqlite, which is only read (a read-only study is reported elsewhere with
    `out`); return it. `metric` of the figures: by default accuracy, or Harrell's C-index
    where the runs are survival models.

    Raises `StoreError` if DIR holds no results store, and `ReportError` if no finished
    run has `metric`."""
    out = directory / REPORT_FOLDER if out is None else out
    with open_results(directory) as store:
        runs = store.runs()
        finished = [r for r in runs if r.status == "finished"]
        shown = [
            Shown(summarise(store, run), label, epsilon_over_rounds(store, run))
            for run, label in zip(finished, labels(finished), strict=True)
        ]
        reported = {
            r.id: store.epsilon_by_silo(r) for r in runs if r.status == "failed" and r.reported
        }
    available = {m for s in shown for m in s.summary.metrics.names}
    if metric is None:
        metric = "c_index" if "c_index" in available and "accuracy" not in available else "accuracy"
    if shown and metric not in available:
        raise ReportError(
            f"no finished run has the metric {metric!r}; the store has "
            + ", ".join(sorted(available))
        )
    out.mkdir(parents=True, exist_ok=True)
    study = runs[0].study if runs else directory.name
    index = out / "index.html"
    index.write_text(
        render(f"dpfl report: {study}", runs, shown, metric, reported), encoding="utf-8"
    )
    return index
