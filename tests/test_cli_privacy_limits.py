"""`dpfl privacy …` answers any request within bounded memory, or refuses in one line.

The four requests of a user-testing report, each of which used to run out of memory (23.8
GB), raise a traceback or run for minutes, run here under a 1.5 GiB address-space limit.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.cli.common import reported_errors
from dpfl.privacy import PrivacyParameterError, epsilon, events

MEMORY_LIMIT = 3 * 2**29
"""1.5 GiB of address space: a privacy command maps under 1 GiB, its libraries included."""
runner = CliRunner()


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _dpfl(*args: str) -> subprocess.CompletedProcess[str]:
    """The command in its own process under the memory limit (the timeout only keeps a
    regression from hanging the suite)."""
    return subprocess.run(
        [sys.executable, "-m", "dpfl.cli", "privacy", *args],
        capture_output=True,
        text=True,
        preexec_fn=_limit_memory,
        timeout=300,
        check=False,
    )


def _answered(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ("epsilon", "-s", "1", "-q", "0.01", "-T", "1000000000"),  # 10⁹ steps: 23.8 GB before
        ("epsilon", "-s", "0.01", "-q", "0.5", "-T", "100000"),  # tiny σ: > 300 s before
    ],
    ids=["many-steps", "little-noise"],
)
def test_epsilon_past_the_pld_limit_is_answered_by_rdp_which_says_so(args: tuple[str, ...]) -> None:
    data = _answered(_dpfl(*args, "-d", "1e-5", "--json"))
    assert data["accountant"] == "rdp"
    assert str(data["note"]).startswith("RDP answered: the PLD would need")
    q, sigma, steps = float(args[4]), float(args[2]), int(args[6])
    rdp = epsilon(events.poisson_gaussian(q, sigma, steps=steps), 1e-5, "rdp")
    assert data["epsilon"] == rdp.epsilon


@pytest.mark.slow
def test_calibrating_for_a_hundred_million_steps_answers_with_rdp() -> None:
    data = _answered(
        _dpfl("calibrate", "-e", "1", "-d", "1e-5", "-q", "0.01", "-T", "100000000", "--json")
    )
    assert data["accountant"] == "rdp" and "PLD would need" in str(data["note"])
    assert float(str(data["epsilon"])) <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("epsilon", "-s", "1", "-q", "0.01", "-T", "99999999999999999999"),
            "dpfl accounts for at most 1e+09",
        ),
        (
            ("epsilon", "-s", "1", "-q", "0.01", "-T", "1000000000", "--accountant", "pld"),
            "above the limit of 1,048,576 that keeps PLD accounting within memory and time; "
            "use the RDP accountant",
        ),
    ],
    ids=["too-many-steps", "pld-asked-for"],
)
def test_what_cannot_be_answered_is_refused_in_one_line(
    args: tuple[str, ...], message: str
) -> None:
    result = _dpfl(*args, "-d", "1e-5")
    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and message in line
    assert "accountant=" not in line  # the CLI's words, not the Python API's


def test_max_steps_says_where_its_search_stops() -> None:
    args = ["privacy", "max-steps", "-e", "10", "-d", "1e-5", "-q", "0.001", "-s", "5"]
    text = runner.invoke(app, args)
    assert text.exit_code == 0, text.output
    assert text.stdout.startswith("at least 10,000,000 steps (ε = ")
    assert "the search stops at 10,000,000 steps; more may fit" in text.stdout
    data = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert data["steps"] == 10_000_000 and "the search stops" in data["note"]


def test_an_error_is_one_line_printed_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    """Brackets in a message are not rich markup: "[add/remove one record]" used to vanish
    and "[/x]" to raise; a long message used to be wrapped over several lines."""
    message = "x" * 150 + " [add/remove one record] [/x]"
    with pytest.raises(typer.Exit) as exit_, reported_errors():
        raise PrivacyParameterError(message)
    assert exit_.value.exit_code == 2
    assert capsys.readouterr().err == f"error: {message}\n"
