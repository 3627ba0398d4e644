"""`dpfl audit DIR`: measure what each finished run of a study leaks, as ε lower bounds
beside its ledger's ε (two-world and one-run canary audits, against the server or under
Dopamine another hospital) and membership inference on its final models; kept in the
study's results store for the report (`dpfl.experiments.study.audit_runs`)."""

from __future__ import annotations

import json as json_module
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from .common import console, errors, print_json, reported_errors

if TYPE_CHECKING:
    from dpfl.experiments.results.store import ResultsStore, RunRow
    from dpfl.experiments.study.audit_runs import AuditPlan

AUDIT_TRIALS = 100
"""two-world trials a world by default: a bound up to about 2.6 in minutes (`AuditPlan`)"""
Rows = tuple[list[dict[str, Any]], list[dict[str, Any]]]
"""An audit's rows of the store's `audit_bounds` and `audit_membership`."""


def audit(
    directory: Annotated[Path, typer.Argument(help="The study directory (holds results.sqlite).")],
    attack: Annotated[
        list[str] | None,
        typer.Option(
            help="two-world (default): many trials with and without a canary; one-run: many "
            "canaries in one run (Steinke et al. 2023); membership: loss and LiRA attacks "
            "on the final models. Repeatable.",
        ),
    ] = None,
    canaries: Annotated[
        str,
        typer.Option(
            "--canaries",
            help="gradient: Dirac gradient canaries (DP-SGD algorithms); input: mislabeled "
            "outlier records (any algorithm); auto: gradient where it applies, else input (AOP).",
        ),
    ] = "auto",
    trials: Annotated[
        int,
        typer.Option(
            help="two-world: trials per world (half choose, half bound). The time grows with "
            "them, and so does the largest ε they can show (100: about 2.6; 1000: 4.9).",
        ),
    ] = AUDIT_TRIALS,
    one_run_canaries: Annotated[
        int | None,
        typer.Option(help="one-run: canaries planted (default 100, at most one a feature)."),
    ] = None,
    shadows: Annotated[int, typer.Option(help="membership: shadow trials per fold.")] = 16,
    folds: Annotated[int, typer.Option(help="membership: shadow runs, one fold out each.")] = 4,
    run: Annotated[
        list[str] | None, typer.Option(help="Audit only this run id (repeatable).")
    ] = None,
    silo: Annotated[
        str | None,
        typer.Option(
            help="The silo planted (default: each run's silo of the largest ε, the one its "
            "headline ε is)."
        ),
    ] = None,
    observer: Annotated[
        str | None,
        typer.Option(
            help="Audit this hospital's view instead of the server's (Dopamine: it knows "
            "its own reply)."
        ),
    ] = None,
    confidence: Annotated[float, typer.Option(help="Confidence of the lower bounds.")] = 0.95,
    keep: Annotated[
        bool,
        typer.Option(
            "--record/--no-record",
            help="Keep the figures in the study's results store (the report shows them).",
        ),
    ] = True,
    json: Annotated[
        bool, typer.Option("--json", help="Print one JSON list: an object per finding.")
    ] = False,
) -> None:
    """Audit every finished run (as configured, at the noise it ran with) and print each ε
    lower bound at the study's δ next to the ledger's ε, and the membership attacks'
    AUC and TPR at low FPR."""
    with reported_errors():
        # imported here: torch, scikit-learn and the datasets would slow every other command
        from dpfl.experiments.study.audit_runs import AuditPlan

        plan = AuditPlan(
            attacks=tuple(attack or ["two-world"]),
            canaries=canaries,
            trials=trials,
            one_run_canaries=one_run_canaries,
            shadows=shadows,
            folds=folds,
            silo=silo,
            observer=observer,
            confidence=confidence,
        )
        found = _audit_finished(directory, plan, only=run, silo=silo, keep=keep)
    if json:
        print_json(_findings_json(found))
        return
    _print(directory, found, confidence)
    if silo is None:
        console.print(
            "silo planted: each run's silo of the largest ε (its headline ε, the worst case "
            "over silos); --silo NAME plants another"
        )


def _audit_finished(
    directory: Path, plan: AuditPlan, *, only: list[str] | None, silo: str | None, keep: bool
) -> list[tuple[RunRow, Rows]]:
    """Audit each finished run (or those in `only`) at its planted silo, each run's figures
    kept in the store (with `keep`) as soon as they are measured, so a stop loses none."""
    from dpfl.experiments.results.store import ResultsStore
    from dpfl.experiments.study.audit_runs import audit_run, auditable, rows

    path = directory / "results.sqlite"
    with ResultsStore(path, create=False) as store:
        runs = [r for r in store.runs(status="finished") if not only or r.id in only]
        planted = {r.id: silo or _headline_silo(store, r) for r in runs}
    if not runs:
        raise ValueError(f"{directory}: no finished run to audit")
    auditable(runs)
    if keep and not (os.access(path, os.W_OK) and os.access(directory, os.W_OK)):
        raise ValueError(f"{path} is read-only: --no-record audits without keeping the figures")
    found = []
    with ResultsStore(path) if keep else nullcontext() as writer, _bar(plan, len(runs)) as told:
        for r in runs:  # each run's figures kept as soon as they are measured
            found.append((r, rows(audit_run(r, replace(plan, silo=planted[r.id]), told))))
            if writer is not None:
                writer.record_audit(r.id, *found[-1][1])
    return found


@contextmanager
def _bar(plan: AuditPlan, runs: int) -> Iterator[Callable[[int], None]]:
    """Say what the audit will run, then show its progress with the time left (on
    stderr), and after its first tenth of a run the time it will take in all."""
    from dpfl.experiments.study.audit_runs import work

    total = work(plan) * runs
    attacks = ", ".join(plan.attacks)
    errors.print(
        f"auditing {runs} run{'s' * (runs != 1)} ({attacks}): {total:,} trials, each a "
        "training run of the study; the time they take follows the first of them",
        soft_wrap=True,
    )
    columns = (TextColumn("audit"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    start, done = time.monotonic(), 0
    with Progress(*columns, console=errors, transient=True) as progress:
        task = progress.add_task("audit", total=total)

        def told(trials: int) -> None:
            nonlocal done
            if done == 0:
                spent = time.monotonic() - start
                progress.console.print(
                    f"expected time: about {_duration(spent * total / trials)} in all "
                    f"({trials} trials took {_duration(spent)})"
                )
            done += trials
            progress.advance(task, trials)

        yield told


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _findings_json(found: list[tuple[RunRow, Rows]]) -> list[dict[str, Any]]:
    """`audit --json`'s list: one object per stored row, tagged with its run and algorithm."""
    return [
        {"run": r.id, "algorithm": r.algorithm, **_plain(row)}
        for r, tables in found
        for table in tables
        for row in table
    ]


def _print(directory: Path, found: list[tuple[RunRow, Rows]], confidence: float) -> None:
    from dpfl.experiments.results.queries import bound_text, exceeds_ledger

    bounds = Table(title=f"{directory}: ε lower bounds (δ of each study)")
    for column in ("run", "algorithm", "method", "silo", "observer", "canary", "trials"):
        bounds.add_column(column)
    bounds.add_column("measured", justify="right")
    bounds.add_column("most it could show", justify="right")
    bounds.add_column("")
    attacks = Table(title=f"{directory}: membership inference on the final models")
    for column in ("run", "algorithm", "silo", "model", "attack"):
        attacks.add_column(column)
    for column in ("AUC", "TPR at FPR 0.1 %", "TPR at FPR 1 %", "members / non"):
        attacks.add_column(column, justify="right")
    for r, (lower, membership) in found:
        for b in lower:
            bounds.add_row(
                r.id[:8],
                r.algorithm,
                *(str(b[k]) for k in ("method", "silo", "observer", "canary", "trials")),
                bound_text(b["epsilon_ledger"], b["epsilon_lower"], b["confidence"]),
                f"{_ceiling(b):.2f}",
                "[red]EXCEEDS THE LEDGER[/red]" if exceeds_ledger(b) else "ok",
            )
        for m in membership:
            attacks.add_row(
                r.id[:8],
                r.algorithm,
                *(m[k] for k in ("silo", "model", "attack")),
                *(f"{m[k]:.3f}" for k in ("auc", "tpr_at_fpr_0_1", "tpr_at_fpr_1")),
                f"{m['members']} / {m['non_members']}",
            )
    for table in (bounds, attacks):
        if table.row_count:
            console.print(table)
    if bounds.row_count:
        console.print(BOUND_MEANS.format(confidence=f"{confidence:.0%}"))
    console.print(
        f"bounds at {confidence:.0%} confidence; audits train on the silos' records: "
        "their figures are not DP releases"
    )


BOUND_MEANS = (
    "A lower bound L means: at {confidence} confidence, no mechanism that is (ε, δ)-DP "
    "with ε below L could have let the attack tell the runs with the canary from those "
    "without it as well as it did. L above the ledger's ε shows a leak the ledger does "
    "not account for; L below it is consistent with the ledger but never shows it tight "
    '(0: the attack found nothing). An audit cannot show more than its "most it could '
    "show\", the bound of an attack right every time: above the ledger's ε it can catch a "
    "leak; to audit a larger ε, raise --trials (two-world) or --one-run-canaries."
)


def _ceiling(bound: dict[str, Any]) -> float:
    """The largest bound the audit could have shown: every guess of its attack right."""
    from dpfl.audit.bounds import one_run_epsilon, two_world_ceiling  # scipy: slow to import

    delta, confidence = bound["delta"], bound["confidence"]
    if bound["method"] == "two-world":
        return two_world_ceiling(bound["trials"], delta, confidence)
    guesses = json_module.loads(bound["detail"])["guesses"]
    return one_run_epsilon(bound["trials"], guesses, guesses, delta, confidence)


def _headline_silo(store: ResultsStore, run: RunRow) -> str | None:
    """The silo whose ε is the run's headline ε, the largest over silos (None: a run that
    accounted none, whose first silo is audited)."""
    by_silo = store.epsilon_by_silo(run).by_silo
    return max(by_silo, key=by_silo.__getitem__, default=None)


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row as JSON values: `detail` spread out, ∞ as null (JSON has none)."""
    fields = {k: v for k, v in row.items() if k != "detail"}
    fields |= json_module.loads(row.get("detail", "{}"))
    return {k: None if isinstance(v, float) and math.isinf(v) else v for k, v in fields.items()}
