"""`dpfl audit DIR`: measure what each finished run of a study leaks against the server
(or, under Dopamine, another hospital), as an ε lower bound beside its ledger's ε
(`dpfl.audit.two_worlds`)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.table import Table

from dpfl.experiments.store import ResultsStore, RunRow

from .common import console, print_json, reported_errors

if TYPE_CHECKING:
    from dpfl.audit.two_worlds import TwoWorldAudit
    from dpfl.federation.silo import Silo

CanaryKind = Literal["auto", "gradient", "input"]


def audit(
    directory: Annotated[Path, typer.Argument(help="The study directory (holds results.sqlite).")],
    canaries: Annotated[
        CanaryKind,
        typer.Option(
            "--canaries",
            help="gradient: a Dirac gradient canary (DP-SGD algorithms); input: a mislabeled "
            "outlier record (any algorithm); auto: gradient where it applies, else input (AOP).",
        ),
    ] = "auto",
    trials: Annotated[
        int, typer.Option(help="Trials per world: half choose the test, half bound it.")
    ] = 1000,
    run: Annotated[
        list[str] | None, typer.Option(help="Audit only this run id (repeatable).")
    ] = None,
    silo: Annotated[str | None, typer.Option(help="The silo planted (default: the first).")] = None,
    observer: Annotated[
        str | None,
        typer.Option(
            help="Audit this hospital's view instead of the server's (Dopamine: it knows "
            "its own reply)."
        ),
    ] = None,
    confidence: Annotated[float, typer.Option(help="Confidence of the lower bound.")] = 0.95,
    json: Annotated[
        bool, typer.Option("--json", help="Print one JSON list: an object per run.")
    ] = False,
) -> None:
    """Run a two-world canary audit of every finished run (as configured, at its stored σ)
    and print the ε lower bound at the study's δ next to the ledger's ε."""
    with reported_errors():
        with ResultsStore(directory / "results.sqlite", create=False) as store:
            runs = [r for r in store.runs(status="finished") if not run or r.id in run]
        if not runs:
            raise ValueError(f"{directory}: no finished run to audit")
        audits = [_audit(r, canaries, trials, silo, observer, confidence) for r in runs]
    if json:
        print_json(
            [{"run": r.id, **dataclasses.asdict(a)} for r, a in zip(runs, audits, strict=True)]
        )
        return
    table = Table(title=f"{directory}: two-world audit")
    for column in ("run", "algorithm", "silo", "observer", "canary", "trials", "statistic"):
        table.add_column(column)
    for column in ("ε lower bound", "ledger ε", ""):
        table.add_column(column, justify="right")
    for r, a in zip(runs, audits, strict=True):
        table.add_row(
            r.id[:8],
            a.algorithm,
            a.silo,
            a.observer,
            a.canary,
            str(a.trials),
            a.statistic,
            f"{a.epsilon_lower:.3f}",
            "∞" if math.isinf(a.epsilon_ledger) else f"{a.epsilon_ledger:.3f}",
            "[red]EXCEEDS THE LEDGER[/red]" if a.exceeds_ledger else "ok",
        )
    console.print(table)
    console.print(f"bounds at {confidence:.0%} confidence, δ of each study")


def _audit(
    row: RunRow,
    kind: CanaryKind,
    trials: int,
    silo: str | None,
    observer: str | None,
    confidence: float,
) -> TwoWorldAudit:
    """One run's audit: its silos and algorithm rebuilt from the stored config, at the σ
    it ran with."""
    # imported here: torch, scikit-learn and the datasets would slow every other command
    from dpfl.audit.canaries import Canary, dirac_canaries, outlier_canary
    from dpfl.audit.two_worlds import two_world_audit
    from dpfl.experiments.config import StudyConfig
    from dpfl.experiments.datasets import build_silos
    from dpfl.experiments.runner import build_algorithm
    from dpfl.secure import by_name

    config = StudyConfig.model_validate(row.config)
    privacy = config.privacy
    if privacy.calibration == "per-silo":
        raise ValueError(f"run {row.id}: per-silo calibration is not audited yet")
    silos = build_silos(config.data, config.seed)
    algorithm = build_algorithm(config, silos)
    if row.noise_multiplier is not None and not algorithm.sets_own_noise:
        algorithm = algorithm.with_noise(row.noise_multiplier)
    target = _silo(silos, silo)
    delta = privacy.silos[target.name].delta if target.name in privacy.silos else privacy.delta
    input_only = kind == "input" or (kind == "auto" and algorithm.sets_own_noise)
    canary: Canary = (
        outlier_canary(target)
        if input_only
        else dirac_canaries(target, 1, 1000 * _finite(getattr(algorithm, "dpsgd", None)))[0]
    )
    return two_world_audit(
        algorithm,
        silos,
        canary,
        rounds=row.rounds_completed or config.rounds,
        trials=trials,
        silo=target.name,
        seed=config.seed,
        delta=delta,
        epsilon_budget=privacy.epsilon if privacy.private else None,
        confidence=confidence,
        secure_sum=by_name("none" if config.summing == "none" else "ideal"),
        observer=observer,
    )


def _silo(silos: list[Silo], name: str | None) -> Silo:
    for s in silos:
        if name is None or s.name == name:
            return s
    raise ValueError(f"no silo named {name!r}; silos: {', '.join(s.name for s in silos)}")


def _finite(dpsgd: object) -> float:
    """The clipping bound C where there is a finite one, else 1 (a Dirac canary's input
    norm is a multiple of it, so that its gradient is clipped to exactly C)."""
    clip = getattr(dpsgd, "clip_norm", math.inf)
    return clip if math.isfinite(clip) else 1.0
