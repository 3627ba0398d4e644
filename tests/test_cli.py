"""The `dpfl` command: JSON outputs agree with the Python API; errors exit with status 2."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dpfl import __version__
from dpfl.cli import app
from dpfl.privacy import Ledger, epsilon, events

runner = CliRunner()


def _json(args: list[str]) -> dict[str, object]:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"dpfl {__version__}"


def test_epsilon_json_is_the_ledgers_number() -> None:
    args = ["privacy", "epsilon", "-s", "1.08", "-q", "0.0036", "-T", "300", "-d", "1.3e-5"]
    for accountant in ("rdp", "pld"):
        data = _json([*args, "--accountant", accountant, "--json"])
        expected = epsilon(events.poisson_gaussian(0.0036, 1.08, steps=300), 1.3e-5, accountant)
        assert data == {
            "epsilon": expected.epsilon,
            "delta": 1.3e-5,
            "accountant": accountant,
            "neighbouring": "add_remove",
        }


def test_epsilon_table_shows_both_accountants_and_the_relation() -> None:
    result = runner.invoke(
        app, ["privacy", "epsilon", "-s", "1.08", "-q", "0.0036", "-T", "300", "-d", "1.3e-5"]
    )
    assert result.exit_code == 0
    for text in ("PLD", "RDP", "0.2873", "add/remove one record"):
        assert text in result.stdout


def test_calibrate_json_meets_the_target() -> None:
    data = _json(
        [
            *("privacy", "calibrate", "-e", "2", "-d", "1e-5", "-q", "0.02", "-T", "500"),
            *("--accountant", "rdp", "--json"),
        ]
    )
    sigma = data["noise_multiplier"]
    assert isinstance(sigma, float)
    event = events.poisson_gaussian(0.02, sigma, steps=500)
    assert epsilon(event, 1e-5, "rdp").epsilon <= 2.0
    assert data["epsilon"] == epsilon(event, 1e-5, "rdp").epsilon


def test_max_steps_json() -> None:
    data = _json(
        [
            *("privacy", "max-steps", "-e", "1", "-d", "1e-5", "-q", "0.01", "-s", "1.0"),
            *("--accountant", "rdp", "--json"),
        ]
    )
    steps = data["steps"]
    assert isinstance(steps, int)
    assert epsilon(events.poisson_gaussian(0.01, 1.0, steps=steps), 1e-5, "rdp").epsilon <= 1
    assert epsilon(events.poisson_gaussian(0.01, 1.0, steps=steps + 1), 1e-5, "rdp").epsilon > 1


def test_impossible_parameters_exit_2_with_a_message() -> None:
    base = ["privacy", "epsilon", "-q", "0.01", "-T", "10", "-d", "1e-5"]
    cases = [
        ([*base, "-s", "0"], "noise multiplier"),
        (["privacy", "epsilon", "-s", "1", "-q", "1.5", "-T", "10", "-d", "1e-5"], "sample rate"),
        ([*base, "-s", "1", "--accountant", "moments"], "unknown accountant"),
        (["privacy", "epsilon", "-s", "1", "-q", "0.1", "-T", "-1", "-d", "1e-5"], "step count"),
        (["privacy", "epsilon", "-s", "1", "-q", "0.1", "-T", "5", "-d", "1"], "δ must lie"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, args
        assert message in result.stderr


def test_large_delta_warns_with_the_dataset_size() -> None:
    result = runner.invoke(
        app, ["privacy", "epsilon", "-s", "1", "-q", "0.1", "-T", "3", "-d", "0.01", "-n", "1000"]
    )
    assert result.exit_code == 0
    assert "silo of 1000 records" in result.stderr


def test_ledger_command_reads_what_the_api_wrote(tmp_path: Path) -> None:
    path = tmp_path / "study.sqlite"
    with Ledger(path) as ledger:
        ledger.register_silo("hospital-a", epsilon=1.0, delta=1e-5, size=5000)
        ledger.register_silo("hospital-b", epsilon=2.0, delta=1e-5, size=8000)
        ledger.record("hospital-a", events.poisson_gaussian(0.01, 1.0, steps=50), round=0)
        expected = ledger.spent("hospital-a")
    result = runner.invoke(app, ["privacy", "ledger", str(path), "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["silo"]: row for row in json.loads(result.stdout)}
    assert rows["hospital-a"]["epsilon"] == expected.epsilon
    assert rows["hospital-a"]["events"] == 1
    assert rows["hospital-b"]["epsilon"] == 0.0
    assert rows["hospital-b"]["epsilon_remaining"] == 2.0
    table = runner.invoke(app, ["privacy", "ledger", str(path), "--events"])
    assert table.exit_code == 0
    assert "50 × Poisson(q=0.01)" in table.stdout


def test_ledger_command_on_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    result = runner.invoke(app, ["privacy", "ledger", str(tmp_path / "none.sqlite")])
    assert result.exit_code == 2
    assert "no ledger at" in result.stderr
    assert not (tmp_path / "none.sqlite").exists()


def test_demo_trains_three_hospitals_within_budget_and_writes_the_report(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (ledger_file,) = (tmp_path / "ledgers").glob("*.sqlite")
    with Ledger(ledger_file, create=False) as ledger:
        accounts = ledger.accounts()
        assert {a.silo.split("/")[0] for a in accounts} == {
            "hospital-0",
            "hospital-1",
            "hospital-2",
        }
        assert len(accounts) == 9  # three hospitals × three trials
        for account in accounts:
            assert account.events == 20 and account.spent.epsilon <= 1.0
    table = result.stdout
    for hospital in ("hospital-0", "hospital-1", "hospital-2"):
        row = next(line for line in table.splitlines() if hospital in line)
        accuracy = float(row.split("│")[2].split("±")[0])
        assert accuracy > 0.8  # the majority class is 0.63
    assert (tmp_path / "report" / "index.html").is_file()
