"""`dpfl sweep --ray ADDRESS`: a study's points as tasks on a Ray cluster.

A local cluster of two worker CPUs is started here (`ray start --head --block`, on
loopback, free ports, its own temporary folder) and stopped by the module's finaliser.
Sweeps run as `python -m dpfl.cli` subprocesses, as a user runs them, and are compared
with one plain local sweep of the same study: a worker SIGKILLed in the middle of a point
is retried by Ray and resumes from the point's checkpoint with its ledger, paying for no
round twice; Ctrl-C at the driver cancels the tasks and prints the command that resumes.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.experiments.results.store import ResultsStore
from dpfl.experiments.study import cluster
from dpfl.experiments.study.config import Study, load
from dpfl.experiments.study.point import LOCK, STORE, PointFailure
from dpfl.experiments.study.runner import run_study

from .test_study_directory import (
    DPFL,
    WAIT,
    _alive,
    _as_from_a_terminal,
    _children,
    _contents,
    _survivors,
    _wait_for,
)

ROUNDS = 30  # long enough (~30 ms a round) to kill a worker between its first and last
STUDY = f"""
name = "on-ray"
rounds = {ROUNDS}
trials = 1
eval_every = "end"
[data]
dataset = "breast_cancer"
partition = {{ kind = "iid", silos = 3 }}
[algorithm]
name = "fedavg"
learning_rate = [0.5, 2.0]
[privacy]
noise_multiplier = 1.0
epsilon = 50
accountant = "rdp"  # cheaper than PLD, and these tests are not about ε's accountant
"""
ENV = {
    **os.environ,
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # Ray's one-machine mode: loopback only
    "RAY_USAGE_STATS_ENABLED": "0",
}
RAY = Path(sys.executable).with_name("ray")


@dataclass
class Cluster:
    """A local Ray cluster being started: `ready()` waits for it."""

    head: subprocess.Popen[bytes]
    address: str
    log: Path

    def ready(self) -> str:
        deadline = time.monotonic() + WAIT
        while "Ray runtime started" not in self.log.read_text(errors="replace"):
            if self.head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Ray cluster did not start:\n{self.log.read_text()}")
            time.sleep(0.1)
        return self.address

    @functools.cached_property
    def raylet(self) -> int:
        (raylet,) = [
            pid
            for pid in _children(self.head.pid)
            if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet"
        ]
        return raylet

    def processes(self) -> set[int]:
        """The processes the cluster's raylet started: its workers (and agents). Read off
        the raylet's threads' lists of children, far cheaper than a scan of /proc."""
        found = set()
        for children in Path(f"/proc/{self.raylet}/task").glob("*/children"):
            try:
                found |= {int(pid) for pid in children.read_text().split()}
            except OSError:  # a thread ended meanwhile
                continue
        return found


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    """Two worker CPUs on loopback; started here, waited for by `ready()`, so that the
    reference sweep runs while it boots."""
    if not RAY.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but Ray is not installed ({RAY} is missing)")
        pytest.skip("Ray is not installed: pip install 'dpfl[ray]'")
    temp = Path(tempfile.mkdtemp(prefix="dpfl-ray-", dir="/tmp"))  # Ray's socket paths are short
    port, client = _free_ports(2)
    log = temp / "head.log"
    with log.open("wb") as sink:
        head = subprocess.Popen(
            [
                *[str(RAY), "start", "--head", "--block", "--num-cpus", "2"],
                *["--port", str(port), "--ray-client-server-port", str(client)],
                *["--node-ip-address", "127.0.0.1", "--temp-dir", str(temp)],
                *["--include-dashboard=false", "--disable-usage-stats"],
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=ENV,
            start_new_session=True,  # its own process group: the last-resort kill below
        )
    try:
        yield Cluster(head, f"127.0.0.1:{port}", log)
    finally:
        head.terminate()  # `ray start --block` stops what it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("config") / "on-ray.toml"
    path.write_text(STUDY, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def reference(
    ray_cluster: Cluster, config: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """What one plain local sweep of the study leaves (run while the cluster boots)."""
    out = tmp_path_factory.mktemp("reference")
    runs = run_study(load(config), out)
    assert [r.status for r in runs] == ["finished", "finished"]
    return _contents(out)


def _ray_sweep(config: Path, out: Path, address: str) -> list[str]:
    return [*DPFL, "sweep", str(config), "--out", str(out), "--ray", address, "--json"]


def _in_points(out: Path, pids: set[int]) -> dict[str, int]:
    """Which of `pids` runs which point of `out`: the point's ledger is open in it."""
    running = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = Path(os.readlink(fd))
                if target.parent == out / "ledgers" and target.suffix == ".sqlite":
                    running[target.stem] = pid
        except OSError:  # gone meanwhile
            continue
    return running


def _round(out: Path, key: str) -> int | None:
    """The last round the point's checkpoint holds (-1 before round 0), if any."""
    try:
        return int(torch.load(out / "checkpoints" / f"{key}.pt", weights_only=False)["round"])
    except Exception:  # not written yet, or being replaced
        return None


def _released(out: Path, key: str) -> int:
    """The last round the point's ledger notes released (`accounts.note_release`; -1:
    none yet), read without writing; a ledger locked by a writer counts as every round."""
    ledger = out / "ledgers" / f"{key}.sqlite"
    if not ledger.exists():
        return -1
    db = sqlite3.connect(f"{ledger.as_uri()}?mode=ro", uri=True)
    try:
        notes = [note for (note,) in db.execute("SELECT key FROM facts")]
    except sqlite3.OperationalError as error:  # no facts yet, or a writer holds it
        if "locked" in str(error) or "busy" in str(error):
            return sys.maxsize
        notes = []
    finally:
        db.close()
    return max((int(n.rsplit(" ", 1)[1]) for n in notes if " released round " in n), default=-1)


def _paid_again(ledger: Path) -> dict[int, bool]:
    """Each round a ledger charged more than once, and whether it was noted released
    before it was charged again: the stale-checkpoint rule pays again for a round, and
    only for one, that a kill caught between its release note and its checkpoint's
    rename (at most one a kill); any other round charged twice is a bug."""
    db = sqlite3.connect(f"{ledger.as_uri()}?mode=ro", uri=True)
    charges = db.execute("SELECT round, recorded_at FROM events ORDER BY id").fetchall()
    notes = dict(db.execute("SELECT key, recorded_at FROM facts").fetchall())
    db.close()
    times: dict[int, list[float]] = {}
    for round_, at in charges:
        if at not in times.setdefault(round_, []):  # one charge: the silos' rows share it
            times[round_].append(at)
    noted = {int(k.rsplit(" ", 1)[1]): at for k, at in notes.items() if " released round " in k}
    return {
        r: len(at) == 2 and noted.get(r, math.inf) < at[1] for r, at in times.items() if len(at) > 1
    }


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP is delivered asynchronously): its state
    in /proc, after the parenthesised name (True if it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "tT"
    except OSError:
        return True


def _outside_a_release(out: Path, key: str) -> bool:
    """Not between a round's release note and its checkpoint's rename, where a kill
    rightly makes the resumed point pay that round again (the stale-checkpoint rule)."""
    held = _round(out, key)
    return _released(out, key) <= (-1 if held is None else held)


def _freeze_mid_point(
    ray: Cluster, out: Path, sweep: subprocess.Popen[str], rounds: Callable[[str], range]
) -> tuple[str, int]:
    """Stop (SIGSTOP) a worker that is inside a point whose checkpoint holds a round in
    `rounds(point)`: some rounds paid for, some still to pay. Checked again once it is
    stopped, so what the caller does next happens at exactly that state, outside a
    release (`_outside_a_release`)."""

    def within(key: str) -> bool:
        return _round(out, key) in rounds(key) and _outside_a_release(out, key)

    def midway() -> tuple[str, int] | None:
        for key, pid in _in_points(out, ray.processes()).items():
            if not within(key):
                continue
            try:
                os.kill(pid, signal.SIGSTOP)
                _wait_for(partial(_stopped, pid), "a worker stopped", sweep)  # not just told
                if _in_points(out, {pid}).get(key) == pid and within(key):
                    return key, pid
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:  # it ended meanwhile
                continue
        return None

    return _wait_for(midway, "a point was midway", sweep)


def _others_finished(out: Path, key: str) -> bool:
    with ResultsStore(out / STORE, create=False) as store:
        return all(run.status == "finished" for run in store.runs() if run.id != key)


def _instances(ledger: Path) -> set[str]:
    """The run instances that wrote a ledger's entries (one: it never started afresh)."""
    db = sqlite3.connect(f"{ledger.as_uri()}?mode=ro", uri=True)
    labels = [label for (label,) in db.execute("SELECT label FROM events")]
    db.close()
    return {label.split(" instance ")[1].split()[0] for label in labels}


@dataclass(frozen=True)
class Interrupted:
    """What a Ray sweep stopped by Ctrl-C left, as seen when it ended (the test that
    resumes it changes the directory)."""

    out: Path
    address: str
    returncode: int
    stderr: str
    frozen: str
    """the point whose worker was stopped in it when Ctrl-C came"""
    survivors: set[int]
    """the sweep's workers still alive 10 s after it ended (none: cancelled)"""
    status: dict[str, str]
    rounds: dict[str, int]
    """each point's checkpointed round when the sweep ended (-1: none)"""


@pytest.fixture(scope="module")
def interrupted(
    ray_cluster: Cluster,
    reference: dict[str, Any],
    config: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Interrupted]:
    """A sweep on the cluster, Ctrl-C'd while a point runs (as soon as its checkpoint
    exists, to keep the test short): that point's worker is stopped first (SIGSTOP), so
    the point is still running when the sweep is told, and only a kill (the cancelled
    task's) can end its worker."""
    out = tmp_path_factory.mktemp("interrupted") / "out"
    address = ray_cluster.ready()
    sweep = subprocess.Popen(
        _ray_sweep(config, out, address),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        preexec_fn=_as_from_a_terminal,
    )
    workers: set[int] = set()
    try:
        key, pid = _freeze_mid_point(ray_cluster, out, sweep, lambda _: range(-1, ROUNDS // 2))
        workers = {pid, *_in_points(out, ray_cluster.processes()).values()}
        sweep.send_signal(signal.SIGINT)  # to the sweep alone, as a terminal's Ctrl-C would
        _, stderr = sweep.communicate(timeout=60)
        survivors = _survivors(workers)
    finally:
        sweep.kill()
        for left in workers:
            if _alive(left):
                os.kill(left, signal.SIGKILL)
    with ResultsStore(out / STORE, create=False) as store:
        status = {run.id: run.status for run in store.runs()}
    rounds = {k: -1 if (r := _round(out, k)) is None else r for k in status}
    yield Interrupted(out, address, sweep.returncode, stderr, key, survivors, status, rounds)


@pytest.mark.loopback
def test_ctrl_c_cancels_the_ray_tasks_and_prints_the_command_that_resumes(
    interrupted: Interrupted, config: Path
) -> None:
    assert interrupted.returncode == 130, interrupted.stderr
    assert interrupted.survivors == set()  # the stopped worker too: its task was cancelled
    assert interrupted.status[interrupted.frozen] == "running"  # to resume
    assert interrupted.rounds[interrupted.frozen] in range(-1, ROUNDS // 2)
    said = " ".join(interrupted.stderr.split())
    assert f"Resume with: {_resume(interrupted, config)}" in said


def _resume(interrupted: Interrupted, config: Path) -> str:
    """The command that resumes the interrupted sweep."""
    out, address = shlex.quote(str(interrupted.out)), interrupted.address
    return f"dpfl sweep {shlex.quote(str(config))} --out {out} --ray {address} --json"


@pytest.mark.loopback
def test_the_printed_command_resumes_through_a_killed_worker_paying_nothing_twice(
    interrupted: Interrupted, ray_cluster: Cluster, reference: dict[str, Any], config: Path
) -> None:
    """The interrupted sweep, resumed by its printed command; a worker is SIGKILLed in a
    point (after it paid for a round of its own): Ray retries the point, which resumes
    from its checkpoint with its ledger, in the same sweep; the study ends as one plain
    local sweep of it, ledgers and all. (The worker is killed once the other point has
    finished, so that Ray retries on that point's idle worker: no new worker to boot.)"""
    out = interrupted.out
    sweep = subprocess.Popen(
        [*DPFL, *shlex.split(_resume(interrupted, config))[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    pid = 0
    try:
        key, pid = _freeze_mid_point(
            ray_cluster, out, sweep, lambda k: range(interrupted.rounds[k] + 1, ROUNDS - 2)
        )
        _wait_for(lambda: _others_finished(out, key), "the other points finished", sweep)
        os.kill(pid, signal.SIGKILL)
        stdout, stderr = sweep.communicate(timeout=WAIT)
    finally:
        sweep.kill()
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert sweep.returncode == 0, stderr
    assert _survivors({pid}) == set()
    summary = json.loads(stdout)  # Ray's own messages went to stderr
    assert summary["failed"] == 0
    finished = sorted(run["id"] for run in summary["runs"])
    assert key in finished and finished == sorted(interrupted.status)  # the retry's, here
    contents, expected = _contents(out), dict(reference)
    for point in interrupted.status:
        ledger = f"{point}.sqlite"
        again = _paid_again(out / "ledgers" / ledger)
        assert len(again) <= 2 and all(again.values()), f"{point}: a round was paid twice"
        due = Counter(entry[1:] for entry in reference[ledger][2])
        due += Counter(entry[1:] for entry in reference[ledger][2] if entry[2] in again)
        assert Counter(entry[1:] for entry in contents[ledger][2]) == due, point
        assert len(_instances(out / "ledgers" / ledger)) == 1  # resumed, never afresh
        if again:  # its ε is larger by those rounds: the rest is the plain sweep's
            for part in (point, ledger):
                contents[part] = expected[part] = None
    assert contents == expected  # the same metrics, ε per silo and ledger events
    assert not any((out / "checkpoints").iterdir())


def test_a_task_that_does_not_see_the_study_directory_writes_nothing(tmp_path: Path) -> None:
    config = Study(
        {
            "name": "elsewhere",
            "rounds": 1,
            "algorithm": {"name": "fedavg"},
            "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 3}},
            "privacy": {"noise_multiplier": 1.0, "delta": 1e-5},
        }
    ).points[0][1]
    missing = tmp_path / "not-mounted"
    failed = cluster._point_task(config.model_dump(mode="json"), str(missing), "{}")
    assert isinstance(failed, PointFailure)
    assert "every Ray node mounts at the same path" in failed.error
    assert not missing.exists()  # no fresh ledger, no checkpoint
    other = tmp_path / "another-copy"
    other.mkdir()
    (other / STORE).write_bytes(b"")
    (other / LOCK).write_text('{"pid": 1}', encoding="utf-8")  # another sweep's
    failed = cluster._point_task(config.model_dump(mode="json"), str(other), '{"pid": 2}')
    assert isinstance(failed, PointFailure)
    assert f"{LOCK} differs" in failed.error
    assert sorted(p.name for p in other.iterdir()) == [STORE, LOCK]


def test_ray_missing_is_named_with_its_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    config = tmp_path / "s.toml"
    config.write_text(STUDY, encoding="utf-8")
    result = CliRunner().invoke(
        app, ["sweep", str(config), "--out", str(tmp_path / "out"), "--ray", "auto"]
    )
    said = " ".join(result.stderr.split())
    assert result.exit_code == 2, result.output
    assert "Ray is not installed here; pip install 'dpfl[ray]'" in said


def test_workers_with_ray_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    config.write_text(STUDY, encoding="utf-8")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["sweep", str(config), "--out", str(out), "--ray", "auto", "-j", "2"]
    )
    assert result.exit_code == 2, result.output
    assert "leave -j out" in " ".join(result.stderr.split())
    assert not out.exists()
