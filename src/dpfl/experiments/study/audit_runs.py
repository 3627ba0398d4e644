"""Auditing a study's finished runs (`dpfl audit`): each run rebuilt from its stored
config (data, partition, algorithm) at the noise it ran with, per silo where it was
calibrated per silo, with the study's budgets and δ; attacked by `dpfl.audit`; the
figures (`rows`) kept in the study's results store (`audit_bounds`, `audit_membership`), which
the report shows beside each run's ledger ε.

The audits run the mechanism thousands of times on the silos' records: their figures
are measurements, not differentially private releases (docs/audit.md, "Caution"), for
which no ε can be charged. So a study whose spending goes to a shared ledger (`[privacy]
ledger`: a hospital's records, held to its budgets and caps) is refused (`auditable`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dpfl.audit.bounds import LowerBound
from dpfl.audit.canaries import Canary, dirac_canaries, outlier_canaries
from dpfl.audit.membership import MembershipAudit, membership_audit
from dpfl.audit.one_run import OneRunAudit, one_run_audit
from dpfl.audit.two_worlds import TwoWorldAudit, two_world_audit
from dpfl.errors import InternalError
from dpfl.experiments.results.store import RunRow
from dpfl.experiments.study import spending
from dpfl.experiments.study.build import build_algorithm
from dpfl.experiments.study.config import StudyConfig
from dpfl.experiments.study.datasets import build_silos
from dpfl.federation.algorithms.base import Algorithm
from dpfl.federation.silo import Silo
from dpfl.secure import default_mode, mode

__all__ = [
    "ATTACKS",
    "CANARIES",
    "AuditPlan",
    "Finding",
    "audit_run",
    "auditable",
    "rows",
    "work",
]

ATTACKS = ("two-world", "one-run", "membership")
CANARIES = ("auto", "gradient", "input")
Finding = LowerBound | MembershipAudit


@dataclass(frozen=True)
class AuditPlan:
    """What to run against each run (defaults: the two-world audit of the first silo
    against the server)."""

    attacks: tuple[str, ...] = ("two-world",)
    """Of `ATTACKS`."""
    canaries: str = "auto"
    """gradient: Dirac gradient canaries (DP-SGD algorithms); input: mislabeled outliers
    (any algorithm); auto: gradient where it applies, else input (AOP)."""
    trials: int = 100
    """two-world: trials a world (half choose the test, half bound it). 100 shows ε up to
    about 2.6 at δ = 1e-5 (`bounds.two_world_ceiling`; 1000: 4.9) in minutes: the
    time is linear in the trials."""
    one_run_canaries: int | None = None
    """one-run: canaries planted, each with probability 1/2, half of them guessed; by
    default 100, or as many as the silo has features for Dirac canaries (one each)."""
    shadows: int = 16
    folds: int = 4
    """membership: `folds` shadow runs of `shadows` stacked trials each."""
    silo: str | None = None
    observer: str | None = None
    confidence: float = 0.95

    def __post_init__(self) -> None:
        for attack in self.attacks:
            if attack not in ATTACKS:
                raise ValueError(f"no attack {attack!r}: one of {', '.join(ATTACKS)}")
        if self.canaries not in CANARIES:
            raise ValueError(f"no canaries {self.canaries!r}: one of {', '.join(CANARIES)}")


def auditable(runs: Sequence[RunRow]) -> None:
    """Refuse, before any is audited, the runs of a study whose spending goes to a shared
    ledger (`spending.uncharged`)."""
    for run in runs:
        spending.uncharged(
            StudyConfig.model_validate(run.config),
            f"an audit of run {run.id} (its figures are measurements, no DP release)",
        )


def work(plan: AuditPlan) -> int:
    """A run's audit in trials run, for a progress bar: both worlds' trials, the one-run
    audit's one run, the membership audit's shadow runs (`audit_run` reports them)."""
    per_attack = {"two-world": 2 * plan.trials, "one-run": 1, "membership": plan.folds}
    return sum(per_attack[attack] for attack in plan.attacks)


def audit_run(
    run: RunRow, plan: AuditPlan, progress: Callable[[int], None] | None = None
) -> list[Finding]:
    """Every attack of `plan` on one finished run, as configured (refused where its
    study charges a shared ledger: `auditable`); `progress` hears the trials run (`work`
    in all) as they end: the two-world audit's stacked a tenth of a world at a time."""
    auditable([run])
    told = progress or (lambda done: None)
    config = StudyConfig.model_validate(run.config)
    privacy = config.privacy
    silos = build_silos(config.data, config.seed)
    algorithm = _as_run(build_algorithm(config, silos), run, privacy.calibration == "per-silo")
    target = _silo(silos, plan.silo)
    delta = privacy.silos[target.name].delta if target.name in privacy.silos else privacy.delta
    common: dict[str, Any] = {
        "rounds": run.rounds_completed or config.rounds,
        "seed": config.seed,
        "delta": delta,
        "epsilon_budget": privacy.epsilon if privacy.private else None,
        "budgets": {name: (b.epsilon, b.delta) for name, b in privacy.silos.items()},
        "secure_sum": default_mode(mode(config.summing).hides_replies).sum(),
    }
    bounds: dict[str, Any] = {"silo": target.name, "confidence": plan.confidence, **common}
    input_only = plan.canaries == "input" or (plan.canaries == "auto" and algorithm.sets_own_noise)
    findings: list[Finding] = []
    for attack in plan.attacks:
        if attack == "two-world":
            (canary,) = _canaries(algorithm, target, 1, input_only)
            findings.append(
                two_world_audit(
                    algorithm,
                    silos,
                    canary,
                    trials=plan.trials,
                    observer=plan.observer,
                    per_run=-(-plan.trials // 10),
                    progress=told,
                    **bounds,
                )
            )
        elif attack == "one-run":
            if plan.observer is not None:
                raise ValueError("the one-run audit is against the server only: drop --observer")
            count = plan.one_run_canaries or (
                100 if input_only else min(100, int(target.x.shape[1]))
            )
            planted = _canaries(algorithm, target, count, input_only)
            findings.append(one_run_audit(algorithm, silos, planted, **bounds))
            told(1)
        else:
            findings.extend(
                membership_audit(algorithm, silos, shadows=plan.shadows, folds=plan.folds, **common)
            )
            told(plan.folds)
    return findings


def rows(findings: Sequence[Finding]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The findings as rows of the store's `audit_bounds` and `audit_membership` (each
    bound's own counts, such as the two-world audit's statistic, in `detail` as JSON)."""
    base = {f.name for f in dataclasses.fields(LowerBound)} - {"algorithm"}
    bounds, membership = [], []
    for f in findings:
        if isinstance(f, MembershipAudit):
            row: dict[str, Any] = dataclasses.asdict(f)
            rates = row.pop("tpr_at_fpr")
            membership.append(row | {"tpr_at_fpr_0_1": rates[0.001], "tpr_at_fpr_1": rates[0.01]})
            continue
        if not isinstance(f, TwoWorldAudit | OneRunAudit):
            raise InternalError(f"an audit's finding of no known kind: {type(f).__name__}")
        detail = {
            k: v
            for k, v in dataclasses.asdict(f).items()
            if k not in base | {"algorithm", "trials"}
        }
        bounds.append(
            {name: getattr(f, name) for name in sorted(base)}
            | {
                "method": "two-world" if isinstance(f, TwoWorldAudit) else "one-run",
                "trials": f.trials if isinstance(f, TwoWorldAudit) else f.canaries,
                "detail": json.dumps(detail, sort_keys=True),
            }
        )
    return bounds, membership


def _as_run(algorithm: Algorithm, run: RunRow, per_silo: bool) -> Algorithm:
    """The algorithm at the noise the run used: each silo's own where it was calibrated
    per silo (its datasheet), else the run's one σ; AOP sets its own."""
    if algorithm.sets_own_noise or run.noise_multiplier is None:
        return algorithm
    if per_silo:
        sheet = run.datasheet.get("silos") or {}
        return algorithm.with_silo_noise(
            {name: float(silo["noise_multiplier"]) for name, silo in sheet.items()}
        )
    return algorithm.with_noise(run.noise_multiplier)


def _canaries(algorithm: Algorithm, silo: Silo, count: int, input_only: bool) -> list[Canary]:
    """`count` canaries for `silo`: mislabeled copies of its outliers, or Dirac gradient
    canaries of input norm 1000·C on its least used features."""
    if input_only:
        return list(outlier_canaries(silo, count))
    clip = getattr(getattr(algorithm, "dpsgd", None), "clip_norm", math.inf)
    return list(dirac_canaries(silo, count, 1000 * (clip if math.isfinite(clip) else 1.0)))


def _silo(silos: Sequence[Silo], name: str | None) -> Silo:
    for s in silos:
        if name is None or s.name == name:
            return s
    raise ValueError(f"no silo named {name!r}; silos: {', '.join(s.name for s in silos)}")
