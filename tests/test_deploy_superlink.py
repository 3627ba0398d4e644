"""`dpfl deploy superlink`: Flower's SuperLink from dpfl's venv, which it needs on the
PATH (the SuperLink starts `flower-superexec` by name). No SuperLink is started here."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dpfl.cli import app, deploy

BIN = str(Path(sys.executable).parent)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, str]]]:
    """What `processes.run` was asked to start, instead of starting it."""
    runs: list[tuple[list[str], dict[str, str]]] = []

    def run(command: list[str], env: dict[str, str], **_: Any) -> int:
        runs.append((command, env))
        return 0

    monkeypatch.setattr(deploy.processes, "run", run)
    monkeypatch.setenv("PATH", "/usr/bin")
    return runs


def test_the_superlink_runs_from_the_venv_with_its_bin_first_on_the_path(
    started: list[tuple[list[str], dict[str, str]]],
) -> None:
    tls = ["--ssl-ca-certfile", "ca.crt", "--ssl-certfile", "s.pem", "--ssl-keyfile", "s.key"]
    ran = CliRunner().invoke(app, ["deploy", "superlink", *tls, "--port", "9191"])
    assert ran.exit_code == 0, ran.output
    [(command, env)] = started
    assert command == [
        os.path.join(BIN, "flower-superlink"),
        *tls,
        *["--host", "0.0.0.0", "--port", "9191"],
        "--disable-runtime-dependency-installation",
        "--enable-supernode-auth",
    ]
    assert env["PATH"].split(os.pathsep) == [BIN, "/usr/bin"]
    assert (Path(BIN) / "flower-superexec").exists()  # what it starts by name
    assert env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.1"
    assert command[0] in ran.output  # shown first, as every deploy command


def test_an_insecure_superlink_without_node_auth(
    started: list[tuple[list[str], dict[str, str]]],
) -> None:
    ran = CliRunner().invoke(app, ["deploy", "superlink", "--insecure", "--no-supernode-auth"])
    assert ran.exit_code == 0, ran.output
    [(command, _)] = started
    assert command[1:] == [
        "--insecure",
        *["--host", "0.0.0.0", "--port", "9091"],
        "--disable-runtime-dependency-installation",
    ]


@pytest.mark.parametrize(
    "options", [[], ["--insecure", "--ssl-keyfile", "k"], ["--ssl-certfile", "c"]]
)
def test_a_superlink_needs_either_insecure_or_its_three_tls_files(
    started: list[tuple[list[str], dict[str, str]]], options: list[str]
) -> None:
    ran = CliRunner().invoke(app, ["deploy", "superlink", *options])
    assert ran.exit_code == 2 and not started
    assert "give either --insecure or --ssl-ca-certfile" in ran.output
