"""Child commands that end with the `dpfl` command that started them.

Flower's commands start children of their own (a SuperNode its SuperExec, `flwr run` its
app): killing only the process `dpfl` started would leave those running, re-parented to
PID 1, a stale SuperNode still connected. So each command runs in a session (process group)
of its own, a SIGTERM or SIGINT to `dpfl` goes to the whole group, and the group is
killed if it is not gone within a grace period; `dpfl` then exits with 128 + the signal.
A group's members left behind after its leader exits are ended the same way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
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


def run(command: list[str], env: dict[str, str] | None = None, grace: float = GRACE_SECONDS) -> int:
    """Run `command` in its own process group; its exit status (128 + N if a signal N
    ended it). A SIGTERM or SIGINT received meanwhile ends the group (`end_group`) and
    exits with `typer.Exit(128 + signal)`."""
    process = subprocess.Popen(command, env=env, start_new_session=True)
    previous = {s: signal.signal(s, _stop) for s in STOPPING}
    try:
        code = process.wait()
        end_group(process, signal.SIGTERM, grace)  # whatever it left behind
    except _Stopped as stopped:
        end_group(process, stopped.signum, grace)
        raise typer.Exit(128 + stopped.signum) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code


def end_group(process: subprocess.Popen[bytes], signum: int, grace: float) -> None:
    """Send `signum` to every process of `process`'s group, wait up to `grace` seconds
    for all to exit, then SIGKILL those left. Further SIGTERM/SIGINT are ignored
    meanwhile: the group is already being ended."""
    for s in STOPPING:
        signal.signal(s, signal.SIG_IGN)
    group = process.pid  # the group's id: `process` leads its own session
    deadline = time.monotonic() + grace
    try:
        os.killpg(group, signum)
        while time.monotonic() < deadline:
            process.poll()  # reap the leader, or the group never empties
            if not _running(group):
                break
            time.sleep(0.05)
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:  # none left
        pass
    process.wait()


def _running(group: int) -> bool:
    """Whether a process of `group` still runs. Where /proc is, its exited members that
    their new parent has not reaped (zombies: a PID 1 that reaps none) do not count."""
    os.killpg(group, 0)  # ProcessLookupError once none is left, zombies included
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
