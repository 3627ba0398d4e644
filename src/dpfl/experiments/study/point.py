"""One study point's run: simulated with its own ledger and checkpoint in the study
directory, its results stored; what a sweep's worker runs, locally
(`dpfl.experiments.study.runner`) or on a Ray node (`dpfl.experiments.study.cluster`).

The run is set up from the point's config once (`dpfl.experiments.study.plan.plan_of`);
a point killed in a round resumes from its checkpoint with its ledger, so it loses at
most that round and pays for nothing twice.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dpfl.allocator import keep_freed_memory
from dpfl.data.dataset import DataFormatError
from dpfl.engines.accounts import UnaffordablePlan
from dpfl.engines.simulation import SimulationResult, simulate
from dpfl.experiments.results.datasheet import datasheet
from dpfl.experiments.results.store import ResultsStore, RunResults, owned_ledger
from dpfl.experiments.study import spending
from dpfl.experiments.study.build import build_algorithm
from dpfl.experiments.study.config import StudyConfig, grid_pairs
from dpfl.experiments.study.datasets import build_silos
from dpfl.experiments.study.plan import plan_of
from dpfl.local.device import DeviceError
from dpfl.local.device import resolve as resolve_device
from dpfl.models.factories import ModelError
from dpfl.privacy import Accountant, Ledger
from dpfl.privacy.errors import UnsupportedAccountingError
from dpfl.sqlite_file import DamagedFileError

STORE = "results.sqlite"
LOCK = "study.lock"
"""A study directory's results store and the lock its owner holds (`runner.owning`)."""

Progress = Callable[[str], None]
"""Where a sweep reports its one-line summaries."""


class RefusedPlan(ValueError):
    """A point's plan that would pass a budget or a cap, refused before round 0 with the
    remedies a study file's user has: nothing was charged (shown in one line)."""


def worker_config(config: dict[str, Any]) -> StudyConfig:
    """In a worker process (local or on a Ray node): the point's config, shipped as JSON,
    one thread, since the workers take a core each, and freed memory kept for reuse
    (`dpfl.allocator`), as in the `dpfl` command's own process."""
    torch.set_num_threads(1)
    keep_freed_memory()
    return StudyConfig.model_validate(config)


def run_point(config: StudyConfig, grid: dict[str, Any], out: Path) -> str:
    """Run one point (or resume it) and store its results; a one-line summary. The
    caller owns `out` (`owning`)."""
    with ResultsStore(out / STORE) as store:
        if not start_point(store, config, grid):
            return finished_already(config, grid)
        return record_point(store, config, grid, out, point_results(config, out))


@dataclass(frozen=True)
class PointFailure:
    """Why a point failed: what the store keeps (`error`) and the traceback shown."""

    error: str
    trace: str = ""


def point_results(config: StudyConfig, out: Path) -> RunResults | PointFailure:
    """Simulate one point, resuming from its checkpoint with its ledger (both in `out`),
    and build its results; what any worker runs. An error is returned as the point's
    failure; Ctrl-C and a damaged ledger are raised, leaving the point to resume."""
    key = config.key()
    ledger_file = spending.ledger_file(config, _own_ledger(key))
    checkpoint = checkpoint_of(out, key)
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        result = _simulate(config, key, out, checkpoint)
        if result.interrupted:
            raise KeyboardInterrupt
        return _results(config, key, result, ledger_file, time.perf_counter() - started)
    except (KeyboardInterrupt, SystemExit, DamagedFileError):
        raise  # left 'running': a restart resumes it from its checkpoint
    except (DataFormatError, ModelError, DeviceError, RefusedPlan) as exc:  # one line says why
        return PointFailure(f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        return PointFailure(f"{type(exc).__name__}: {exc}", traceback.format_exc())


def start_point(store: ResultsStore, config: StudyConfig, grid: dict[str, Any]) -> bool:
    """Mark the point running in the store; False if it has finished."""
    return store.start(
        config.key(),
        study=config.name,
        algorithm=config.algorithm.name,
        config=config.model_dump(mode="json"),
        grid=grid,
        trials=config.trials,
        rounds=config.rounds,
    )


def record_point(
    store: ResultsStore,
    config: StudyConfig,
    grid: dict[str, Any],
    out: Path,
    outcome: RunResults | PointFailure,
) -> str:
    """Store a started point's results, or its failure (its checkpoint is kept, so a rerun
    resumes it); a one-line summary."""
    key = config.key()
    if isinstance(outcome, PointFailure):
        store.fail(key, outcome.error)
        return f"{key} {config.algorithm.name} FAILED: {outcome.error}\n{outcome.trace}".rstrip()
    store.finish(key, outcome)
    checkpoint_of(out, key).unlink(missing_ok=True)
    finished = f"finished in {outcome.seconds:.1f} s"
    return " ".join([key, config.algorithm.name, *grid_pairs(grid), finished])


def finished_already(config: StudyConfig, grid: dict[str, Any]) -> str:
    return " ".join([config.key(), config.algorithm.name, *grid_pairs(grid), "already finished"])


def checkpoint_of(out: Path, key: str) -> Path:
    """Where a point's checkpoint is kept while it runs."""
    return out / "checkpoints" / f"{key}.pt"


def _own_ledger(key: str) -> Path:
    """A point's own ledger in the study directory, where the study names no shared one."""
    return Path("ledgers") / f"{key}.sqlite"


def _simulate(config: StudyConfig, key: str, out: Path, checkpoint: Path) -> SimulationResult:
    resolve_device(config.device)  # no CUDA for "cuda": refused before any record is read
    silos = build_silos(config.data, config.seed)
    algorithm = build_algorithm(config, silos)
    privacy = config.privacy
    if privacy.private and privacy.accountant == "pld" and any(s.appearances > 1 for s in silos):
        raise ValueError(
            f"privacy.accountant: in {config.data.dataset} a person is in up to "
            f"{max(s.appearances for s in silos)} records, and such node-level steps are "
            "accounted by RDP only: set privacy.accountant = 'rdp'"
        )
    hospitals = {s.name: s.neighbouring for s in silos}
    with (
        spending.charged(
            config, key, out / _own_ledger(key), hospitals, accountant=privacy.accountant
        ) as book,
        _in_study_terms(),
    ):
        if book.study is None:
            book.claim(key)  # readers refuse this ledger for any other run
        return simulate(algorithm, silos, plan_of(config, algorithm, checkpoint), ledger=book)


@contextmanager
def _in_study_terms() -> Iterator[None]:
    """A plan the budget refuses, with the remedies a study file's user has."""
    try:
        yield
    except UnaffordablePlan as exc:
        raise RefusedPlan(
            f"{exc.why}; raise privacy.noise_multiplier, lower rounds, or leave "
            "privacy.noise_multiplier out of the study file (σ is then calibrated to "
            "privacy.epsilon)"
        ) from None


def _results(
    config: StudyConfig, key: str, result: SimulationResult, ledger: Path, seconds: float
) -> RunResults:
    metrics = [
        (row["trial"], row["round"], silo, name, value)
        for row in result.history
        for silo, values in [(None, row["metrics"]), *row["silos"].items()]
        for name, value in values.items()
    ]
    communication = [
        (row["trial"], row["round"], row["silo"], row["down"], row["up"], messages)
        for row in result.messages
        for messages in [(row["down"] > 0) + (row["up"] > 0)]
    ]
    cross_silo = [
        (row["trial"], row["round"], row["model"], row["test"], name, value)
        for row in result.cross_silo
        for name, value in row["metrics"].items()
    ]
    last = result.rounds_completed - 1
    rounds = sorted({row["round"] for row in result.history} | {last})
    own = Accountant(config.privacy.accountant)
    other = Accountant.RDP if own is Accountant.PLD else Accountant.PLD
    privacy = []
    study = spending.book(config.name, key, config.privacy.ledger)
    opened = (
        owned_ledger(result.ledger_path, key)
        if study is None
        else Ledger(result.ledger_path, create=False, study=study)
    )
    with opened as book:
        for trial, accounts in enumerate(result.accounts):
            for silo, views in accounts.items():
                for view, name in views.items():
                    delta = book.budget(name).delta
                    for r in rounds:
                        spent = book.spent(name, accountant=own, through_round=r)
                        row = (trial, r, silo, view, own.value, delta, spent.epsilon, name)
                        privacy.append(row)
                    try:  # the other accountant's figure, where it can analyse the run
                        spent = book.spent(name, accountant=other)
                    except UnsupportedAccountingError:  # node-level steps: RDP only
                        continue
                    row = (trial, last, silo, view, other.value, delta, spent.epsilon, name)
                    privacy.append(row)
        sheet = datasheet(config, config.algorithm.algorithm, result, book)
    return RunResults(
        rounds_completed=result.rounds_completed,
        noise_multiplier=result.noise_multiplier if config.privacy.private else None,
        stopped_by_budget=result.stopped_by_budget,
        seconds=seconds,
        ledger=ledger,
        datasheet=sheet,
        metrics=metrics,
        privacy=privacy,
        communication=communication,
        cross_silo=cross_silo,
    )
