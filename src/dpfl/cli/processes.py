"""Child commands that end with the `dpfl` command that started them.

Flower's commands start children of their own (a SuperNode its SuperExec, `flwr run` its
app): killing only the process `dpfl` started would leave those running, re-parented to
PID 1, a stale SuperNode still connected. So each command runs in a session (process group)
of its own, a SIGTERM or SIGINT to `dpfl` goes to the whole group, and the group is
killed if it is not gone within a grace period; `dpfl` then exits with 128 + the signal.
A group's members left behind after its leader exits are ended the same way. Commands
that serve each other (a SuperNode and its ClientApp process) each run in a group of
their own: when one exits, the others are ended with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import typer

GRACE_SECONDS = 10.0
"""How long a stopped group has to exit on its own (a SuperNode leaving its SuperLink)
before it is killed."""

STOPPING = (signal.SIGTERM, signal.SIGINT)


class _Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stopped(signum)


def run(
    command: list[str],
    env: dict[str, str] | None = None,
    grace: float = GRACE_SECONDS,
    beside: Sequence[list[str]] = (),
) -> int:
    """Run `command`, and the `beside` commands that serve it (a SuperNode's ClientApp
    process), each in a process group of its own: when any of them exits, every group
    ends (`end_groups`). The exit status of the first that exited (128 + N if a signal
    N ended it). A SIGTERM or SIGINT received meanwhile ends every group and exits with
    `typer.Exit(128 + signal)`."""
    started = [subprocess.Popen(command, env=env, start_new_session=True)]
    previous = {s: signal.signal(s, _stop) for s in STOPPING}
    try:
        started += [subprocess.Popen(c, env=env, start_new_session=True) for c in beside]
        code = _first_exit(started)
        end_groups(started, signal.SIGTERM, grace)  # whatever they left behind
    except _Stopped as stopped:
        end_groups(started, stopped.signum, grace)
        raise typer.Exit(128 + stopped.signum) from None
    except BaseException:  # one that could not start: none is left behind
        end_groups(started, signal.SIGTERM, grace)
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code


def _first_exit(started: list[subprocess.Popen[bytes]]) -> int:
    """The exit status of the first of `started` to exit (waits for it)."""
    while True:
        for process in started:
            if (code := process.poll()) is not None:
                return code
        time.sleep(0.1)


def end_groups(processes: list[subprocess.Popen[bytes]], signum: int, grace: float) -> None:
    """Send `signum` to every process of each of `processes`' groups, wait up to
    `grace` seconds for all to exit, then SIGKILL those left. Further SIGTERM/SIGINT are
    ignored meanwhile: the groups are already being ended."""
    for s in STOPPING:
        signal.signal(s, signal.SIG_IGN)
    deadline = time.monotonic() + grace
    left = _signalled(processes, signum)  # a group's id: its leader's, which leads a session
    while left and time.monotonic() < deadline:
        for process in left:
            process.poll()  # reap the leader, or the group never empties
        left = [p for p in left if _running(p.pid)]
        time.sleep(0.05)
    _signalled(left, signal.SIGKILL)
    for process in processes:
        process.wait()


def _signalled(
    processes: list[subprocess.Popen[bytes]], signum: int
) -> list[subprocess.Popen[bytes]]:
    """Send `signum` to each process's group: those whose group was still there."""
    found = []
    for process in processes:
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:  # none left
            continue
        found.append(process)
    return found


def _running(group: int) -> bool:
    """Whether a process of `group` still runs. Where /proc is, its exited members that
    their new parent has not reaped (zombies: a PID 1 that reaps none) do not count."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:  # none is left, zombies included
        return False
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            state, _, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except OSError:  # exited meanwhile
            continue
        if int(pgrp) == group and state != "Z":
            return True
    return False
