"""Running studies: one config point (all its trials, stacked) or a whole grid.

Each point's run keeps, beside the study's `results.sqlite`, its own privacy ledger
(`ledgers/<id>.sqlite`, claimed with the run's id) and, while it runs, a checkpoint
(`checkpoints/<id>.pt`). A sweep that is killed and restarted skips the finished points
and resumes the others from their checkpoints with their ledgers, so it loses nothing
and pays for nothing twice. Points run in separate processes (`workers`), or as tasks
on a Ray cluster (`ray`, `dpfl.experiments.study.cluster`), trials stacked inside each.

A study directory has one owner at a time: `run_study` holds an exclusive lock on
`study.lock` in it, and a second sweep on the same directory is refused with the
holder's pid, host and start time (it never waits: two sweeps would only queue the same
points). The lock is an `flock`, which the OS drops when its holder dies, even by
`kill -9`, so a lock can never outlive its holder. Workers die with the process that
started them, so nothing writes to a directory whose lock is gone (a Ray cluster ends
the tasks of a sweep that died).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import shlex
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from multiprocessing import active_children, get_context
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar

from dpfl import secure
from dpfl.allocator import keep_freed_memory
from dpfl.data.dataset import DataFormatError
from dpfl.engines.accounts import UnaffordablePlan
from dpfl.engines.simulation import SimulationResult, simulate
from dpfl.experiments.results.datasheet import datasheet
from dpfl.experiments.results.store import ResultsStore, RunResults, RunRow, owned_ledger
from dpfl.experiments.study import spending
from dpfl.experiments.study.build import build_algorithm, decision_threshold
from dpfl.experiments.study.config import Study, StudyConfig, grid_pairs
from dpfl.experiments.study.datasets import build_silos
from dpfl.experiments.study.directory import claim
from dpfl.local.device import DeviceError
from dpfl.local.device import resolve as resolve_device
from dpfl.models.factories import ModelError
from dpfl.privacy import Accountant, Ledger
from dpfl.privacy.errors import UnsupportedAccountingError
from dpfl.sqlite_file import DamagedFileError

STORE = "results.sqlite"
LOCK = "study.lock"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

Progress = Callable[[str], None]


class StudyInUseError(OSError):
    """Another process holds the study directory."""


class RefusedPlan(ValueError):
    """A point's plan that would pass a budget or a cap, refused before round 0 with the
    remedies a study file's user has: nothing was charged (shown in one line)."""


def run_study(
    study: Study | Sequence[Study],
    out: str | Path,
    *,
    workers: int = 1,
    ray: str | None = None,
    progress: bool = False,
    report: Progress = lambda line: None,
    add: bool = False,
) -> list[RunRow]:
    """Run every point of `study` (or of several studies, sharing the workers) not yet
    finished in `out`; return all their runs, in grid order. `progress` draws a bar
    over the points and each running point's rounds (as does a `StudyBar` passed as
    `report`). Refused (`StudyInUseError`) while another process holds `out`, and
    (`StudyDirectoryError`) where `out` holds results of other data, or of points the
    study does not have unless `add` (`dpfl.experiments.study.directory`).

    `ray`: the address of a Ray cluster ("auto", "HOST:PORT", "ray://HOST:PORT") to run
    the points on, one CPU each, instead of `workers` local processes; `out` must be on a
    filesystem that every node mounts at the same path (see `dpfl.experiments.study.cluster`).

    A point that fails is marked failed with its error, and the others go on."""
    if ray is not None and workers != 1:
        raise ValueError(
            "workers counts local processes; on a Ray cluster each point takes one CPU and "
            "the cluster's free CPUs decide how many run at once: leave workers at 1"
        )
    if ray is not None:
        from dpfl.experiments.study.cluster import require_ray, run_on_ray  # Ray: only here

        require_ray()  # before the study directory is touched
    out = Path(out)
    studies = [study] if isinstance(study, Study) else list(study)
    points = [point for s in studies for point in s.points]
    bar = report if isinstance(report, StudyBar) else StudyBar(report) if progress else None
    with owning(out):
        claim(out, [c for _, c in points], [s.name for s in studies], add=add)
        with ResultsStore(out / STORE) as store:
            todo = [(g, c) for g, c in points if store.status(c.key()) != "finished"]
        names = ", ".join(s.name for s in studies)
        report(f"{names}: {len(points) - len(todo)} of {len(points)} points done")
        done: Callable[[str], None] = (lambda key: None) if bar is None else bar.finished
        with nullcontext() if bar is None else bar.showing(names, len(points), todo, out):
            if ray is not None:
                run_on_ray(todo, out, ray, report, done)
            elif workers > 1 and len(todo) > 1:
                _run_in_pool(todo, out, workers, report, done)
            else:
                for grid, config in todo:
                    report(run_point(config, grid, out))
                    done(config.key())
        with ResultsStore(out / STORE) as store:
            runs = {run.id: run for run in store.runs()}
    return [runs[c.key()] for _, c in points]


@contextmanager
def owning(out: Path) -> Iterator[None]:
    """Hold the study directory `out` (see the module docstring) or refuse, naming the
    holder; nothing in `out` is changed when refused."""
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by workers
    try:
        _lock(fd, out)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**me, "command": shlex.join(sys.argv)}).encode(), 0)
        os.fsync(fd)  # on a shared filesystem, what other machines read (a Ray task's check)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # still held: no one reads a gone holder's details
    finally:
        os.close(fd)  # releases the lock


def _lock(fd: int, out: Path) -> None:
    """Take the lock, or raise `StudyInUseError` naming its holder. A new holder writes
    its details just after locking; until it has (a second at most), the details may
    still be its dead predecessor's, so those are not shown as the holder's."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            holder = _holder(fd)
            if holder is None and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            who = holder or f"another process, which holds {out / LOCK}"
            raise StudyInUseError(
                f"{out} is in use by {who}. One process at a time runs a study directory's "
                "points: wait for it to finish (or stop it), then run this again. Nothing "
                "was changed."
            ) from None


def _holder(fd: int) -> str | None:
    """Who holds the lock, from the details it wrote, if they are a live process's."""
    try:
        info = json.loads(os.pread(fd, 65536, 0) or b"null")
        pid, host, started, command = info["pid"], info["host"], info["started"], info["command"]
    except (ValueError, TypeError, KeyError):
        return None
    if host == socket.gethostname() and not _alive(pid):
        return None
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
    return f"pid {pid} on host {host}, started {since} ({command})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _run_in_pool(
    todo: Sequence[tuple[dict[str, Any], StudyConfig]],
    out: Path,
    workers: int,
    report: Progress,
    done: Callable[[str], None],
) -> None:
    """The points in worker processes. On any interruption (Ctrl-C) the workers are
    killed at once: a point loses at most its current round, which its checkpoint and
    ledger let a rerun redo without paying twice."""
    pool = ProcessPoolExecutor(
        min(workers, len(todo)),
        mp_context=get_context("spawn"),  # torch and fork do not mix
        initializer=_die_with,
        initargs=(os.getpid(),),
    )
    try:
        futures = {
            pool.submit(_run_in_worker, c.model_dump(mode="json"), g, str(out)): c.key()
            for g, c in todo
        }
        for future in as_completed(futures):
            report(future.result())
            done(futures[future])
    except BaseException:
        for process in active_children():
            process.kill()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _die_with(parent: int) -> None:
    """Worker initializer: a worker never outlives the process that started it (an
    orphan would go on writing to a study directory whose lock is gone, and idle on its
    memory after), and leaves Ctrl-C to it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    else:
        threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(1)


def _exit_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(1)


def _run_in_worker(config: dict[str, Any], grid: dict[str, Any], out: str) -> str:
    return run_point(worker_config(config), grid, Path(out))


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
    checkpoint = _checkpoint(out, key)
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
    _checkpoint(out, key).unlink(missing_ok=True)
    finished = f"finished in {outcome.seconds:.1f} s"
    return " ".join([key, config.algorithm.name, *grid_pairs(grid), finished])


def finished_already(config: StudyConfig, grid: dict[str, Any]) -> str:
    return " ".join([config.key(), config.algorithm.name, *grid_pairs(grid), "already finished"])


class StudyBar:
    """A `Progress` reporter (its lines print above the bar) that draws a bar over a
    study's points and one per running point over its rounds. Rounds are read off the
    points' checkpoints, written after every round, so points in worker processes show
    as well as points run here."""

    def __init__(
        self, report: Progress = lambda line: None, *, console: Console | None = None
    ) -> None:
        self._report = report
        self._bar = Bar(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console or Console(stderr=True),
        )
        self._overall = TaskID(0)  # set by `showing`
        self._points: dict[str, tuple[TaskID, Path]] = {}

    def __call__(self, line: str) -> None:
        self._report(line)

    @contextmanager
    def showing(
        self,
        title: str,
        total: int,
        todo: Sequence[tuple[dict[str, Any], StudyConfig]],
        out: Path,
    ) -> Iterator[None]:
        """Show the bar while the `todo` points (grid, config) of `total` run in `out`."""
        self._overall = self._bar.add_task(
            title, total=total, completed=total - len(todo), status="points"
        )
        self._points = {
            c.key(): (
                self._bar.add_task(
                    _label(c.key(), g), total=c.rounds, visible=False, status="rounds"
                ),
                _checkpoint(out, c.key()),
            )
            for g, c in todo
        }
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(stop,), daemon=True)
        with self._bar:
            watcher.start()
            try:
                yield
            finally:
                stop.set()
                watcher.join()

    def finished(self, key: str) -> None:
        """Point `key` is done (finished, failed or skipped)."""
        task, _ = self._points.pop(key)
        self._bar.remove_task(task)
        self._bar.advance(self._overall)

    def _watch(self, stop: threading.Event) -> None:
        seen: dict[Path, int] = {}
        while not stop.wait(0.2):
            for task, path in list(self._points.values()):
                try:
                    changed = path.stat().st_mtime_ns
                    if seen.get(path) == changed:
                        continue
                    seen[path] = changed
                    saved = torch.load(path, mmap=True, weights_only=False)
                    self._bar.update(task, completed=saved["round"] + 1, visible=True)
                except Exception:  # the bar is best effort: a checkpoint not there yet,
                    continue  # or one being replaced, is read at the next tick


def _checkpoint(out: Path, key: str) -> Path:
    return out / "checkpoints" / f"{key}.pt"


def _own_ledger(key: str) -> Path:
    """A point's own ledger in the study directory, where the study names no shared one."""
    return Path("ledgers") / f"{key}.sqlite"


def _label(key: str, grid: dict[str, Any]) -> str:
    """`ab12cd34 learning_rate=0.5`: the last part of each grid key tells points apart."""
    return " ".join([key[:8], *grid_pairs(grid, last_part=True)])


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
    fixed_noise = privacy.noise_multiplier is not None or algorithm.sets_own_noise
    hospitals = {s.name: s.neighbouring for s in silos}
    with (
        spending.charged(
            config, key, out / _own_ledger(key), hospitals, accountant=privacy.accountant
        ) as book,
        _in_study_terms(),
    ):
        if book.study is None:
            book.claim(key)  # readers refuse this ledger for any other run
        return simulate(
            algorithm,
            silos,
            rounds=config.rounds,
            trials=config.trials,
            seed=config.seed,
            epsilon_budget=privacy.epsilon if privacy.private else None,
            delta=privacy.delta,
            budgets={name: (b.epsilon, b.delta) for name, b in privacy.silos.items()},
            calibrate=privacy.calibration if privacy.private and not fixed_noise else False,
            ledger=book,
            research_noise=config.research_noise,
            progress=False,
            checkpoint=checkpoint,
            eval_every=config.eval_every,
            size_noise=config.data.size_noise,
            init=config.model.init,
            cross_silo=config.cross_silo,
            secure_sum=secure.by_name(config.summing),
            threshold=decision_threshold(config.threshold),
            device=config.device,
            consortium=None
            if privacy.consortium_epsilon is None or privacy.hospitals_per_patient is None
            else (privacy.hospitals_per_patient, privacy.consortium_epsilon),
        )


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
                        privacy.append((trial, r, silo, view, own.value, delta, spent.epsilon))
                    try:  # the other accountant's figure, where it can analyse the run
                        spent = book.spent(name, accountant=other)
                    except UnsupportedAccountingError:  # node-level steps: RDP only
                        continue
                    privacy.append((trial, last, silo, view, other.value, delta, spent.epsilon))
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
