"""A study's points as tasks on a Ray cluster: `run_study(..., ray=ADDRESS)`, `dpfl sweep
--ray ADDRESS`.

The driver (the sweep's own process) holds the study directory (`runner.owning`) and is
the only writer of its results store: it marks a point started, ships the point's
config to a Ray task, and writes what the task returns, the point's results or its
failure, itself. The task runs what a local worker runs (`point.point_results`), and
writes the point's ledger and checkpoint into the study directory as a local worker
does: every node must therefore mount the study directory at the same path. A task that
finds no study there, or another sweep's, fails its point and writes nothing (a fresh
ledger elsewhere would pay twice, or hide what was paid).

A worker that dies in a point (killed, out of memory, its node lost) is run again by
Ray, up to `RETRIES` times, anywhere in the cluster; the retry resumes from the point's
checkpoint with its ledger, as the same run instance, so the round that was paid for but
not checkpointed is not paid for again and the ε charged is that of an uninterrupted
run. An error in the point itself is not retried: the point is marked failed, as
locally. Ctrl-C at the driver cancels the tasks (their workers are killed), and Ray ends
the tasks of a driver that dies.

Ray is imported here only, so that it stays an optional dependency (`pip install
'dpfl[ray]'`, or Flower's `flwr[simulation]`, which brings it).
"""

from __future__ import annotations

import logging
import socket
import sys
import warnings
from collections.abc import Callable, Sequence
from contextlib import redirect_stdout
from pathlib import Path
from types import ModuleType
from typing import Any

from dpfl.experiments.results.store import ResultsStore, RunResults
from dpfl.experiments.study.config import StudyConfig
from dpfl.experiments.study.point import (
    LOCK,
    STORE,
    PointFailure,
    Progress,
    finished_already,
    point_results,
    record_point,
    start_point,
    worker_config,
)

RETRIES = 3
"""How many times Ray runs a point again whose worker died (each run resumes it)."""
INSTALL = "pip install 'dpfl[ray]' (or pip install ray, or pip install 'flwr[simulation]')"


def run_on_ray(
    todo: Sequence[tuple[dict[str, Any], StudyConfig]],
    out: Path,
    address: str,
    report: Progress,
    done: Callable[[str], None],
) -> None:
    """Run the `todo` points (grid, config) of the study in `out`, which the caller owns,
    on the Ray cluster at `address` (or the one this process is connected to already),
    one CPU each; report each as it ends."""
    ray = require_ray()
    out = out.resolve()  # a Ray worker's working directory is not ours
    holder = (out / LOCK).read_text(encoding="utf-8")
    # Ray prints its workers' output and its own messages (a worker died, the task is
    # retried) to stdout: they go to stderr, with the sweep's progress, and stdout stays
    # the command's (`--json` prints one object).
    connected = ray.is_initialized()  # a caller's own connection is used, and kept
    with redirect_stdout(sys.stderr):
        if not connected:
            with warnings.catch_warnings():  # a tip about GPUs, which points do not use
                warnings.filterwarnings("ignore", "Tip: In future versions of Ray", FutureWarning)
                ray.init(address=address, logging_level=logging.WARNING)
        try:
            _dispatch(ray, todo, out, holder, report, done)
        finally:
            if not connected:
                ray.shutdown()


def _dispatch(
    ray: ModuleType,
    todo: Sequence[tuple[dict[str, Any], StudyConfig]],
    out: Path,
    holder: str,
    report: Progress,
    done: Callable[[str], None],
) -> None:
    """Start each point, run it as a task, record what each returns as it ends."""
    task = ray.remote(num_cpus=1, max_retries=RETRIES, retry_exceptions=False)(_point_task)
    pending: dict[Any, tuple[dict[str, Any], StudyConfig]] = {}
    with ResultsStore(out / STORE) as store:
        try:
            for grid, config in todo:
                if not start_point(store, config, grid):
                    report(finished_already(config, grid))
                    done(config.key())
                    continue
                ref = task.remote(config.model_dump(mode="json"), str(out), holder)
                pending[ref] = (grid, config)
            while pending:
                [ref], _ = ray.wait(list(pending), num_returns=1)
                grid, config = pending.pop(ref)
                report(record_point(store, config, grid, out, _outcome(ray, ref)))
                done(config.key())
        except BaseException:  # Ctrl-C: the points left running resume on a rerun
            for ref in pending:
                ray.cancel(ref, force=True)
            raise


def require_ray() -> ModuleType:
    """Ray, or a `ValueError` that names how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ValueError(f"--ray: Ray is not installed here; {INSTALL}") from exc
    return ray


def _outcome(ray: ModuleType, ref: Any) -> RunResults | PointFailure:
    """What a task returned, or how Ray failed to run it (its workers died more often than
    it retries, its node was lost, Ray could not start a worker)."""
    try:
        outcome: RunResults | PointFailure = ray.get(ref)
    except ray.exceptions.RayError as exc:
        return PointFailure(
            f"on the Ray cluster: {type(exc).__name__}: {exc} (rerun the sweep: the point "
            "resumes from its checkpoint)"
        )
    return outcome


def _point_task(config: dict[str, Any], out: str, holder: str) -> RunResults | PointFailure:
    """On a Ray worker: the point, in the study directory `out` if this node sees the
    very directory the sweep holds (its lock file reads `holder`)."""
    problem = _not_the_study(Path(out), holder)
    if problem is not None:
        return PointFailure(problem)
    return point_results(worker_config(config), Path(out))


def _not_the_study(out: Path, holder: str) -> str | None:
    """Why `out` on this node is not the study directory the sweep holds, or None."""
    where = f"{out} on Ray node {socket.gethostname()}"
    mount = (
        "--out must be on a filesystem that every Ray node mounts at the same path; "
        "nothing was written there"
    )
    if not (out / STORE).is_file():
        return f"{where} holds no study (no {STORE}): {mount}"
    try:
        here = (out / LOCK).read_text(encoding="utf-8")
    except OSError:
        here = ""
    if here != holder:
        return f"{where} is not the study directory this sweep holds ({LOCK} differs): {mount}"
    return None
