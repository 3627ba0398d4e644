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
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager, nullcontext
from multiprocessing import active_children, get_context
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar

from dpfl.experiments.results.store import ResultsStore, RunRow
from dpfl.experiments.study.config import Study, StudyConfig, grid_pairs
from dpfl.experiments.study.directory import claim
from dpfl.experiments.study.point import (
    LOCK,
    STORE,
    Progress,
    checkpoint_of,
    run_point,
    worker_config,
)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class StudyInUseError(OSError):
    """Another process holds the study directory."""


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
        initializer=die_with,
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


def die_with(parent: int) -> None:
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
                checkpoint_of(out, c.key()),
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


def _label(key: str, grid: dict[str, Any]) -> str:
    """`ab12cd34 learning_rate=0.5`: the last part of each grid key tells points apart."""
    return " ".join([key[:8], *grid_pairs(grid, last_part=True)])
