"""SIGTERM or Ctrl-C to `dpfl deploy hospital|server` ends the whole tree of processes
that Flower's command started (`dpfl.cli.processes`): none is left re-parented to PID 1,
and the command exits with 128 + the signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WAIT = 60.0

# A child that starts a grandchild and waits; both write their PIDs. A stubborn tree
# ignores SIGTERM, as a process stuck in a call would.
TREE = """
import pathlib, signal, subprocess, sys, time
pids, stubborn = pathlib.Path(sys.argv[1]), sys.argv[2] == "stubborn"
if stubborn:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
pids.write_text(f"{grandchild.pid} {__import__('os').getpid()}")
time.sleep(600)
"""

# `dpfl deploy hospital`'s runner of Flower's commands, as the command calls it (a typer
# command: typer.Exit sets the exit status), in a process of its own.
WRAPPER = """
import sys, typer
from dpfl.cli import deploy, processes
processes.GRACE_SECONDS = 2.0
command = [sys.executable, "-c", *sys.argv[1:]]
del sys.argv[1:]
typer.run(lambda: deploy._run_supernode(command))
"""


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie that nobody reaped has ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def _started_tree(tmp_path: Path, kind: str) -> tuple[subprocess.Popen[bytes], list[int]]:
    pids = tmp_path / "pids"
    wrapper = subprocess.Popen([sys.executable, "-c", WRAPPER, TREE, str(pids), kind])
    deadline = time.monotonic() + WAIT
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        assert time.monotonic() < deadline and wrapper.poll() is None, "the tree never started"
        time.sleep(0.05)
    tree = [int(pid) for pid in pids.read_text().split()]
    assert all(_alive(pid) for pid in tree)
    return wrapper, tree


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_command_ends_every_process_it_started(
    tmp_path: Path, signum: signal.Signals
) -> None:
    wrapper, tree = _started_tree(tmp_path, "cooperative")
    wrapper.send_signal(signum)
    assert wrapper.wait(timeout=WAIT) == 128 + signum
    assert not any(_alive(pid) for pid in tree)


def test_a_tree_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    wrapper, tree = _started_tree(tmp_path, "stubborn")
    wrapper.send_signal(signal.SIGTERM)
    assert wrapper.wait(timeout=WAIT) == 128 + signal.SIGTERM
    assert not any(_alive(pid) for pid in tree)


def test_the_exit_status_of_a_command_that_a_signal_ended_is_128_plus_it() -> None:
    from dpfl.cli import processes

    killed = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert processes.run([sys.executable, "-c", killed]) == 128 + signal.SIGKILL
    assert processes.run([sys.executable, "-c", "raise SystemExit(3)"]) == 3


def test_a_command_and_the_one_beside_it_end_together(tmp_path: Path) -> None:
    """A SuperNode whose ClientApp process exits is ended with it (and the reverse):
    the status is the first one's to exit."""
    from dpfl.cli import processes

    pid = tmp_path / "pid"
    leader = f"import os, pathlib, time; pathlib.Path({str(pid)!r}).write_text(str(os.getpid()))"
    waits = f"import pathlib, time\nwhile not pathlib.Path({str(pid)!r}).exists(): time.sleep(0.05)"
    beside = [[sys.executable, "-c", f"{waits}\nraise SystemExit(4)"]]
    assert processes.run([sys.executable, "-c", f"{leader}; time.sleep(600)"], beside=beside) == 4
    assert not _alive(int(pid.read_text()))
