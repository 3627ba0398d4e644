"""One study directory in many hands: a second sweep is refused and names the holder,
workers die with their sweep, Ctrl-C prints the command that resumes, a finished run's
rows are never reset, a ledger proves which run it belongs to, read commands never
write (even in a read-only directory), and the sweep shows a bar over points and rounds.

The sweeps here run as `python -m dpfl.cli` subprocesses, as a user would run them,
each compared with one uninterrupted sweep of the same study."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from rich.console import Console
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.experiments.results.store import ResultsStore, StoreError
from dpfl.experiments.results.summary import run_summaries
from dpfl.experiments.study.config import Study
from dpfl.experiments.study.directory import IDENTITY
from dpfl.experiments.study.point import LOCK, STORE
from dpfl.experiments.study.runner import StudyBar, run_study
from studies import breast_cancer_study

# RDP: cheaper than PLD, and these tests are not about ε
SWEEP = breast_cancer_study(
    "shared",
    rounds=3,
    trials=1,
    algorithm={"learning_rate": [0.5, 2.0]},
    privacy={"noise_multiplier": 1.0, "epsilon": 50, "accountant": "rdp"},
)
TINY = {
    "name": "tiny",
    "rounds": 2,
    "trials": 1,
    "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 3}},
    "algorithm": {"name": "fedavg", "learning_rate": 1.0},
    "privacy": {"noise_multiplier": [1.0, 3.0], "delta": 1e-5},
}
DPFL = [sys.executable, "-m", "dpfl.cli"]
WAIT = 300.0  # seconds: generous bounds for a loaded machine; the runs take a few
T = TypeVar("T")


def _sweep_command(config: Path, out: Path) -> list[str]:
    return [*DPFL, "sweep", str(config), "--out", str(out), "-j", "2"]


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("config") / "shared.toml"
    path.write_text(SWEEP, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def reference(config: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What one uninterrupted sweep of `SWEEP` leaves (with workers, as the tests run)."""
    out = tmp_path_factory.mktemp("reference")
    done = subprocess.run(_sweep_command(config, out), capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0, done.stderr
    return _contents(out)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-point study (σ = 1 and σ = 3), run here."""
    out = tmp_path_factory.mktemp("finished")
    runs = run_study(Study(TINY), out)
    assert [r.status for r in runs] == ["finished", "finished"]
    return out


def _contents(out: Path) -> dict[str, Any]:
    """Everything a study directory holds that does not depend on when it ran: each
    run's status and result rows, and each ledger's owner, budgets, released values and
    events (the run instance in an event's label is random, and left out)."""
    contents: dict[str, Any] = {}
    store = sqlite3.connect(f"{(out / STORE).as_uri()}?mode=ro", uri=True)
    for run_id, status, rounds, sigma in store.execute(
        "SELECT id, status, rounds_completed, noise_multiplier FROM runs ORDER BY id"
    ):
        contents[run_id] = [status, rounds, sigma] + [
            store.execute(
                f"SELECT * FROM {table} WHERE run_id = ? ORDER BY rowid", (run_id,)
            ).fetchall()
            for table in ("metrics", "privacy", "communication")
        ]
    store.close()
    for path in sorted((out / "ledgers").glob("*.sqlite")):
        ledger = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
        contents[path.name] = [
            ledger.execute("SELECT key, value FROM facts ORDER BY key").fetchall(),
            ledger.execute("SELECT silo, epsilon, delta, size, neighbouring FROM silos").fetchall(),
            [
                (i, silo, round_, re.sub(r" instance \w+", "", label), event)
                for i, silo, round_, label, event in ledger.execute(
                    "SELECT id, silo, round, label, event FROM events ORDER BY id"
                )
            ],
        ]
        ledger.close()
    return contents


def _wait_for(condition: Callable[[], T], what: str, *processes: subprocess.Popen[str]) -> T:
    """What `condition` returns once it is true (a sweep in `processes` must not end
    before)."""
    deadline = time.monotonic() + WAIT
    while not (found := condition()):
        if any(p.poll() is not None for p in processes):
            pytest.fail(f"the sweep ended before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.05)
    return found


def _children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (its workers and multiprocessing helpers)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _assert_gone(pids: set[int]) -> None:
    """Every process in `pids` ends within seconds (multiprocessing's helper ends when
    the last of the others has)."""
    assert not _survivors(pids), "workers outlived their sweep"


def _survivors(pids: set[int], seconds: float = 10.0) -> set[int]:
    """Those of `pids` still alive after `seconds` (waiting no longer than they live)."""
    deadline = time.monotonic() + seconds
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {pid for pid in pids if _alive(pid)}


@pytest.fixture
def survivors() -> Iterator[set[int]]:
    """Processes a test saw; any still alive at its end are killed (a failed test must
    not leave workers behind)."""
    seen: set[int] = set()
    yield seen
    for pid in seen:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _as_from_a_terminal() -> None:
    """In the child before exec: Ctrl-C deliverable and at its default action, as a
    terminal starts dpfl. A signal mask and an ignored disposition survive exec, and
    code run earlier in a test worker's process (the full suite) left SIGINT undelivered
    to children: the sweep then finished as if never interrupted."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _point_running(out: Path) -> bool:
    """A worker is inside a point (its checkpoint is written before round 0 and after
    every round) and at least one point is not finished."""
    if not any(out.glob("checkpoints/*.pt")):
        return False
    with ResultsStore(out / STORE, create=False) as store:
        return any(r.status != "finished" for r in store.runs())


def test_a_second_sweep_on_the_same_directory_is_refused_and_names_the_holder(
    config: Path, reference: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    command = [*_sweep_command(config, out), "--json"]
    both = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    both.append(
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    )
    try:
        ends = [p.communicate(timeout=WAIT) for p in both]
    finally:
        for p in both:
            p.kill()
    (winner,) = [p for p in both if p.returncode == 0]
    (loser,) = [p for p in both if p is not winner]
    stderr = " ".join(ends[both.index(loser)][1].split())
    assert loser.returncode == 2, stderr
    assert f"{out} is in use by pid {winner.pid} on host" in stderr
    assert "Nothing was changed" in stderr
    assert json.loads(ends[both.index(winner)][0])["failed"] == 0
    assert _contents(out) == reference  # as if one sweep had run alone
    assert (out / LOCK).read_bytes() == b""  # released


def test_kill_9_of_a_sweep_takes_its_workers_and_a_rerun_matches_one_sweep(
    config: Path, reference: dict[str, Any], tmp_path: Path, survivors: set[int]
) -> None:
    out = tmp_path / "out"
    command = _sweep_command(config, out)
    sweep = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
    )
    try:
        _wait_for(lambda: _point_running(out), "a point runs", sweep)
        survivors |= _children(sweep.pid)
        assert len(survivors) >= 2  # two workers (and multiprocessing's helper)
    finally:
        sweep.kill()
        sweep.wait()
    _assert_gone(survivors)
    with ResultsStore(out / STORE, create=False) as store:
        assert any(r.status == "running" for r in store.runs())  # killed mid-run
    again = subprocess.run(command, capture_output=True, text=True, timeout=WAIT)
    assert again.returncode == 0, again.stderr
    assert _contents(out) == reference  # same events, same results: nothing paid twice


def test_ctrl_c_stops_the_workers_and_prints_the_command_that_resumes(
    config: Path, reference: dict[str, Any], tmp_path: Path, survivors: set[int]
) -> None:
    out = tmp_path / "out"
    sweep = subprocess.Popen(
        _sweep_command(config, out),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_from_a_terminal,
    )
    try:
        _wait_for(lambda: _point_running(out), "a point runs", sweep)
        survivors |= _children(sweep.pid)
        sweep.send_signal(signal.SIGINT)  # to the sweep alone: its workers are its business
        _, stderr = sweep.communicate(timeout=60)
    finally:
        sweep.kill()
    assert sweep.returncode == 130, stderr
    _assert_gone(survivors)
    said = " ".join(stderr.split())
    resume = f"dpfl sweep {shlex.quote(str(config))} --out {shlex.quote(str(out))} -j 2"
    assert f"Resume with: {resume}" in said
    again = subprocess.run(
        [*DPFL, *shlex.split(resume)[1:]], capture_output=True, text=True, timeout=WAIT
    )
    assert again.returncode == 0, again.stderr
    assert _contents(out) == reference


def test_a_finished_run_is_never_restarted_or_failed(finished: Path, tmp_path: Path) -> None:
    out = shutil.copytree(finished, tmp_path / "study")
    before = _contents(out)
    with ResultsStore(out / STORE) as store:
        run = store.runs()[0]
        assert not store.start(
            run.id,
            study=run.study,
            algorithm=run.algorithm,
            config=run.config,
            grid=run.grid,
            trials=run.trials,
            rounds=run.rounds,
        )
        with pytest.raises(StoreError, match="is finished, not running"):
            store.fail(run.id, "a second sweep's error")
    assert _contents(out) == before


def test_a_ledger_copied_from_another_run_is_refused_by_every_reader(
    finished: Path, tmp_path: Path
) -> None:
    out = shutil.copytree(finished, tmp_path / "study")
    with ResultsStore(out / STORE, create=False) as store:
        noisy, quiet = sorted(store.runs(), key=lambda r: r.noise_multiplier or 0.0)
    quiet_ledger = out / "ledgers" / f"{quiet.id}.sqlite"
    shutil.copyfile(out / "ledgers" / f"{noisy.id}.sqlite", quiet_ledger)
    chosen = CliRunner().invoke(app, ["best", str(out), "-e", "100", "-d", "1e-5"])
    said = " ".join(chosen.stderr.split())
    assert chosen.exit_code == 2, chosen.output
    assert f"{quiet_ledger} is the ledger of run {noisy.id}, not of run {quiet.id}" in said
    with pytest.raises(StoreError, match="is the ledger of run"):
        run_summaries(out)
    with ResultsStore(out / STORE, create=False) as store, pytest.raises(StoreError):
        store.ledger_of(quiet)
    shown = CliRunner().invoke(app, ["privacy", "ledger", str(quiet_ledger)])
    assert f"of run {noisy.id}" in " ".join(shown.stdout.split())


def _fingerprints(out: Path) -> dict[str, tuple[str, int]]:
    return {
        str(path.relative_to(out)): (
            hashlib.sha256(path.read_bytes()).hexdigest(),
            path.stat().st_mtime_ns,
        )
        for path in sorted(out.rglob("*"))
        if path.is_file()
    }


def _as_reader() -> list[str]:
    """A prefix that runs a command so that `chmod a-w` binds it. Root ignores write
    permissions through CAP_DAC_OVERRIDE: dropped, the command is still root (it reads
    the checkout and its .venv wherever they are, a 0700 home included) but writes only
    where the permission bits let it."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    drop = [f"--{which}=-dac_override" for which in ("inh-caps", "bounding-set")]
    if setpriv is None or subprocess.run([setpriv, *drop, "true"]).returncode != 0:
        pytest.skip(
            "running as root, and CAP_DAC_OVERRIDE cannot be dropped (setpriv): a "
            "read-only directory cannot be made"
        )
    return [setpriv, *drop]


def test_read_commands_work_in_a_read_only_study_and_write_nothing(finished: Path) -> None:
    reader = _as_reader()
    with tempfile.TemporaryDirectory() as place:
        Path(place).chmod(0o755)  # the reader may enter
        out = shutil.copytree(finished, Path(place) / "study")
        for index in out.rglob("*.sqlite-*"):  # as a study is left by the last writer
            assert not index.name.endswith("-wal") or index.stat().st_size == 0
            index.unlink()
        subprocess.run(["chmod", "-R", "a+rX,a-w", str(out)], check=True)
        before = _fingerprints(out)
        try:
            env = {**os.environ, "HOME": place}
            best = subprocess.run(
                [*reader, *DPFL, "best", str(out), "-e", "100", "-d", "1e-5", "--json"],
                capture_output=True,
                text=True,
                timeout=WAIT,
                env=env,
            )
            assert best.returncode == 0, best.stderr
            assert json.loads(best.stdout)["finished"] == 2
            for ledger in sorted((out / "ledgers").glob("*.sqlite")):
                shown = subprocess.run(
                    [*reader, *DPFL, "privacy", "ledger", str(ledger), "--json"],
                    capture_output=True,
                    text=True,
                    timeout=WAIT,
                    env=env,
                )
                assert shown.returncode == 0, shown.stderr
                assert len(json.loads(shown.stdout)) == 3  # one account per hospital
            here = subprocess.run(
                [*reader, *DPFL, "report", str(out)],
                capture_output=True,
                text=True,
                timeout=WAIT,
                env=env,
            )
            assert here.returncode == 2 and "Traceback" not in here.stderr
            said = " ".join(here.stderr.split())
            assert f"cannot write the report in {out / 'report'}" in said
            assert "the study directory is read-only to you" in said and "--out" in said
            elsewhere = Path(place) / "report"
            elsewhere.mkdir()
            elsewhere.chmod(0o777)
            report = subprocess.run(
                [*reader, *DPFL, "report", str(out), "--out", str(elsewhere), "--json"],
                capture_output=True,
                text=True,
                timeout=WAIT,
                env=env,
            )
            assert report.returncode == 0, report.stderr
            assert (elsewhere / "index.html").is_file()
            audit = [*reader, *DPFL, "audit", str(out), "--trials", "8"]
            kept = subprocess.run(audit, capture_output=True, text=True, timeout=WAIT, env=env)
            assert kept.returncode == 2 and "--no-record" in kept.stderr  # before any work
            measured = subprocess.run(
                [*audit, "--no-record", "--json"],
                capture_output=True,
                text=True,
                timeout=WAIT,
                env=env,
            )
            assert measured.returncode == 0, measured.stderr
            assert len(json.loads(measured.stdout)) == 2  # one bound a finished run
            assert _fingerprints(out) == before  # no byte, no mtime, no new file
        finally:
            subprocess.run(["chmod", "-R", "u+w", str(out)], check=True)


def test_the_bar_shows_points_and_each_running_points_rounds(
    tmp_path: Path, study_text: Callable[[dict[str, Any]], str]
) -> None:
    screen = io.StringIO()
    lines: list[str] = []
    screen_console = Console(file=screen, force_terminal=True, color_system=None, width=100)
    bar = StudyBar(lines.append, console=screen_console)
    study = Study({**TINY, "rounds": 12, "privacy": {"noise_multiplier": 1.0, "delta": 1e-5}})
    run_study(study, tmp_path, report=bar)
    shown = screen.getvalue()
    assert re.search(r"tiny .* 1/1 points", shown)
    assert re.search(r"[0-9a-f]{8} .* \d+/12 rounds", shown)  # the point, mid-run
    assert lines[0] == "tiny: 0 of 1 points done" and "finished in" in lines[1]
    tiny = tmp_path / "tiny.toml"
    tiny.write_text(study_text(TINY), encoding="utf-8")
    result = CliRunner().invoke(app, ["sweep", str(tiny), "--out", str(tmp_path / "s"), "-j", "1"])
    assert result.exit_code == 0, result.output
    assert re.search(r"tiny .* 2/2 points", result.stderr)


HEART = """
name = "heart"
rounds = 1
trials = 1
[data]
dataset = "heart_disease"
path = "data"
[algorithm]
name = "fedavg"
[privacy]
noise_multiplier = 1.0
accountant = "rdp"
"""
HEART_ROWS = (
    "63.0,1.0,1.0,145.0,233.0,1.0,2.0,150.0,0.0,2.3,3.0,0.0,6.0,0",
    "67.0,1.0,4.0,160.0,286.0,0.0,2.0,108.0,1.0,1.5,2.0,3.0,3.0,2",
    "67.0,1.0,4.0,120.0,229.0,0.0,2.0,129.0,1.0,2.6,2.0,2.0,7.0,1",
    "41.0,0.0,2.0,130.0,204.0,0.0,2.0,172.0,0.0,1.4,1.0,0.0,3.0,0",
)


def _heart_files(folder: Path, cleveland: int) -> Path:
    """UCI-format heart disease files: `cleveland` rows in Cleveland's, 40 elsewhere."""
    folder.mkdir(exist_ok=True)
    for site, rows in (("cleveland", cleveland), ("hungarian", 40), ("switzerland", 40)):
        lines = [HEART_ROWS[i % len(HEART_ROWS)] for i in range(rows)]
        (folder / f"processed.{site}.data").write_text("\n".join(lines) + "\n", encoding="ascii")
    (folder / "processed.va.data").write_text("\n".join(HEART_ROWS * 10) + "\n", encoding="ascii")
    return folder / "processed.cleveland.data"


def _everything_but_the_lock(out: Path) -> dict[str, tuple[str, int]]:
    """The directory's files (the lock's holder details change with every command)."""
    return {name: seen for name, seen in _fingerprints(out).items() if name != LOCK}


def test_a_rerun_after_the_data_changed_is_refused_naming_the_file(tmp_path: Path) -> None:
    cleveland = _heart_files(tmp_path / "data", cleveland=303)
    config = tmp_path / "heart.toml"
    config.write_text(HEART, encoding="utf-8")
    out = tmp_path / "out"
    command = ["run", str(config), "--out", str(out)]
    first = CliRunner().invoke(app, command)
    assert first.exit_code == 0, first.output
    assert CliRunner().invoke(app, command).exit_code == 0  # the same data: it is finished
    before = {"size": cleveland.stat().st_size, "sha256": _sha256(cleveland)}
    _heart_files(tmp_path / "data", cleveland=100)
    kept = _everything_but_the_lock(out)
    refused = CliRunner().invoke(app, command)
    said = " ".join(refused.stderr.split())
    assert refused.exit_code == 2, refused.output
    assert (
        f"{out} holds results computed from other data: in {tmp_path / 'data'}, "
        f"processed.cleveland.data: {before['size']:,} → {cleveland.stat().st_size:,} bytes, "
        f"sha256 {before['sha256'][:12]}… → {_sha256(cleveland)[:12]}…. "
    ) in said
    assert "run the study into a new --out" in said and "hungarian" not in said
    assert _everything_but_the_lock(out) == kept
    added = CliRunner().invoke(app, [*command, "--add"])  # adding points is not the cure
    assert added.exit_code == 2 and "other data" in added.stderr


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


ONE_TRIAL = """
name = "other"
rounds = 2
[data]
dataset = "breast_cancer"
partition = { kind = "iid", silos = 3 }
[algorithm]
name = "fedavg"
learning_rate = 0.5
[privacy]
noise_multiplier = 1.0
"""


def _refused_run(config: Path, out: Path) -> str:
    """What `dpfl run CONFIG --out OUT` says when it refuses (exit 2), on one line."""
    refused = CliRunner().invoke(app, ["run", str(config), "--out", str(out)])
    assert refused.exit_code == 2, refused.output
    return " ".join(refused.stderr.split())


@pytest.mark.parametrize("record", ["study.json", "none: a directory from before it"])
def test_another_study_is_refused_unless_added_and_one_trial_shows_n_1(
    finished: Path, tmp_path: Path, record: str
) -> None:
    out = shutil.copytree(finished, tmp_path / "study")
    if record != IDENTITY:
        (out / IDENTITY).unlink()  # its points are then the store's runs
    config = tmp_path / "other.toml"
    config.write_text(ONE_TRIAL, encoding="utf-8")
    before = _contents(out)
    said = _refused_run(config, out)
    assert (
        f"{out} holds the results of study 'tiny' (2 points); study 'other' has 1 point not "
        "among them"
    ) in said
    assert "pass --add to add its points to this directory" in said
    assert _contents(out) == before
    assert run_study(Study(TINY), out)  # the study it holds still runs (all finished)
    added = CliRunner().invoke(app, ["run", str(config), "--out", str(out), "--add"])
    assert added.exit_code == 0, added.output
    assert "0.000 ±" not in added.stdout and "(n = 1)" in added.stdout  # the runs table
    best = CliRunner().invoke(app, ["best", str(out), "-e", "1000", "-d", "1e-5"])
    assert best.exit_code == 0, best.output
    rows = [line for line in best.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == 3 and all(re.search(r"│ \d\.\d{4} \(n = 1\) +│", r) for r in rows)
    assert "± 0.0000" not in best.stdout
    answer = json.loads(
        CliRunner().invoke(app, ["best", str(out), "-e", "1000", "-d", "1e-5", "--json"]).stdout
    )
    assert answer["best"]["std"] is None and answer["best"]["spread"] == "1 trial × 1 seed"


def test_the_same_study_edited_is_refused_naming_it_once(finished: Path, tmp_path: Path) -> None:
    out = shutil.copytree(finished, tmp_path / "study")
    config = tmp_path / "tiny.toml"
    config.write_text(ONE_TRIAL.replace('"other"', '"tiny"'), encoding="utf-8")
    said = _refused_run(config, out)
    assert (
        f"{out} holds the results of study 'tiny' (2 points); as its file now reads, it has "
        "1 point not among them"
    ) in said
    assert said.count("'tiny'") == 1
