"""The commands that train nothing import nothing that trains: `dpfl --help`, `dpfl init`
and the `privacy` and `deploy status` commands start without torch or Flower, and those
that compute no ε without dp_accounting and scipy (a second to import). Checked by what
each command leaves in `sys.modules`, in a fresh interpreter, not by timing it
(benchmarks/bench_startup.py times them)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpfl.privacy import Ledger, calibration, events

TRAINING = ("torch", "flwr", "ray", "matplotlib", "pandas", "sklearn", "tenseal")
"""What only training, deploying and reporting need."""
ACCOUNTING = ("dp_accounting", "scipy.stats", "scipy.signal")
"""What only the ε of a mechanism needs (`dpfl init` reads a table with scipy.sparse)."""

# Runs `dpfl ARGS...` as the entry point does, then prints the heavy modules it loaded.
COMMAND = """
import json, sys
from dpfl.cli import app
heavy = json.loads(sys.argv[1])
args = sys.argv[2:]
sys.argv = ["dpfl", *args]
try:
    app()
except SystemExit:
    pass
print(json.dumps([m for m in heavy if m in sys.modules]))
"""


def _loaded(*args: str, heavy: tuple[str, ...] = TRAINING + ACCOUNTING) -> list[str]:
    """The modules of `heavy` that `dpfl ARGS` imported, in a fresh interpreter."""
    shown = subprocess.run(
        [sys.executable, "-c", COMMAND, json.dumps(heavy), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(shown.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ledger") / "study.sqlite"
    with Ledger(path) as book:
        book.register_silo("hospital-a", epsilon=1.0, delta=1e-5, size=5000)
        book.record("hospital-a", events.poisson_gaussian(0.01, 1.0, steps=50), round=0)
    return path


def test_importing_the_cli_loads_neither_training_nor_accounting() -> None:
    code = "import json, sys, dpfl.cli; print(json.dumps(sorted(sys.modules)))"
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    loaded = set(json.loads(shown.stdout))
    assert loaded.isdisjoint(TRAINING + ACCOUNTING), loaded & {*TRAINING, *ACCOUNTING}


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["privacy", "--help"],
        ["privacy", "calibrate", "--help"],
        ["deploy", "--help"],
        ["deploy", "status", "--help"],
    ],
)
def test_help_loads_neither_training_nor_accounting(args: list[str]) -> None:
    assert _loaded(*args) == []


def test_init_loads_neither_training_nor_accounting(tmp_path: Path) -> None:
    table = tmp_path / "cohort.csv"
    table.write_text("age,label\n1.5,0\n2.5,1\n")
    study = tmp_path / "study.toml"
    assert _loaded("init", str(table), "--label", "label", "--out", str(study)) == []
    assert study.exists()
    # Refused (the file exists): a ValueError, reported without loading dp_accounting.
    assert _loaded("init", str(table), "--label", "label", "--out", str(study)) == []


@pytest.mark.parametrize(
    "args",
    [
        ["privacy", "epsilon", "-s", "1", "-q", "0.01", "-T", "100", "-d", "1e-5"],
        ["privacy", "node-level", "-s", "1", "-b", "64", "-n", "1000", "-S", "2"],
        ["privacy", "max-steps", "-e", "8", "-d", "1e-5", "-q", "0.5", "-s", "1"],
        ["privacy", "calibrate", "-e", "1", "-d", "1e-5", "-q", "0.01", "-T", "10"],
    ],
)
def test_privacy_commands_load_no_training(args: list[str]) -> None:
    assert _loaded(*args, heavy=TRAINING) == []


@pytest.mark.parametrize("command", [["privacy", "ledger"], ["deploy", "status", "--ledger"]])
def test_ledger_commands_load_no_training(command: list[str], ledger: Path) -> None:
    assert _loaded(*command, str(ledger), heavy=TRAINING) == []


@pytest.mark.parametrize(
    "module", ["dpfl.engines.flower.protocol", "dpfl.secure", "dpfl.experiments.study.config"]
)
def test_importing_the_protocol_the_modes_or_the_study_file_loads_no_encryption(
    module: str,
) -> None:
    """TenSEAL is loaded where a sum is encrypted: `dpfl.engines.flower` imports its
    server and hospital only when one of their names is used, and the registry of
    secure-sum modes (which every study file's schema reads) holds `he`'s mode, not
    TenSEAL."""
    code = f"import sys, {module}; print('tenseal' in sys.modules)"
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert shown.stdout.strip() == "False", shown.stderr


def test_calibrate_defaults_to_the_api_tolerance() -> None:
    """The command writes the default out (calibration would load dp_accounting at
    import); it must stay the API's."""
    from dpfl.cli.privacy import calibrate_command

    default = inspect.signature(calibrate_command).parameters["tolerance"].default
    assert default == calibration.NOISE_TOLERANCE
