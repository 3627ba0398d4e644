"""What the commands share: error reporting and the ε table."""

from __future__ import annotations

import json
import math
import sys
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dpfl import __version__
from dpfl.errors import InternalError
from dpfl.sqlite_file import DamagedFileError

if TYPE_CHECKING:
    from dpfl.privacy import SiloAccount

# A pipe or a log file gets 120 columns: ledger tables are wider than 80.
console = Console(width=None if sys.stdout.isatty() else 120)
errors = Console(stderr=True, width=None if sys.stderr.isatty() else 120)

INTERNAL_ERROR_STATUS = 70
"""A bug in dpfl (`InternalError`): sysexits' EX_SOFTWARE, apart from bad input (2) and
a damaged file or failed run (1)."""


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn bad input (privacy parameters, configs, data files, stores) into one red line
    and exit status 2, and a damaged ledger or results store into one with status 1 (the
    input was right, the file is not); show warnings in yellow. A message stays one line
    however long, and is printed as it is: brackets in it (an event's "[add/remove one
    record]", a path) are not rich markup. A bug in dpfl (`InternalError`) is said to be
    one, after its traceback, with exit status 70: printed at once, since running the
    command again to see it could charge the ledgers again."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        except InternalError as exc:
            errors.out("".join(traceback.format_exception(exc)), end="", highlight=False)
            errors.print(
                f"[red]internal error:[/red] {escape(str(exc))}\nThis is a bug in dpfl "
                f"{__version__}, not a mistake in your input: please report it, with the "
                "command you ran and the traceback above.",
                soft_wrap=True,
            )
            raise typer.Exit(INTERNAL_ERROR_STATUS) from exc
        except Exception as exc:
            if not isinstance(exc, DamagedFileError | ValueError | OSError) and not _privacy(exc):
                raise
            errors.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(1 if isinstance(exc, DamagedFileError) else 2) from exc
        finally:
            for warning in caught:
                message = escape(str(warning.message))
                errors.print(f"[yellow]warning:[/yellow] {message}", soft_wrap=True)


def _privacy(exc: Exception) -> bool:
    """Whether `exc` is a PrivacyError: imported only here, as dpfl.privacy loads
    dp_accounting and scipy (a second), which a command that computes no ε must not wait
    for (`dpfl init`, `--help`; tests/test_startup.py)."""
    from dpfl.privacy import PrivacyError

    return isinstance(exc, PrivacyError)


def print_json(data: dict[str, Any] | list[dict[str, Any]]) -> None:
    typer.echo(json.dumps(data, indent=None, sort_keys=True))


def accounts_table(title: str, accounts: list[SiloAccount], rdp: list[SiloAccount]) -> Table:
    """One row per silo: budget, ε spent by the enforcing accountant and by RDP, ε left."""
    table = Table(title=title)
    for column in ("silo", "neighbouring", "budget ε", "δ", "events"):
        table.add_column(column, justify="left" if column in ("silo", "neighbouring") else "right")
    table.add_column("ε spent", justify="right")
    table.add_column("ε spent (RDP)", justify="right")
    table.add_column("ε left", justify="right")
    for account, by_rdp in zip(accounts, rdp, strict=True):
        table.add_row(
            account.silo,
            account.budget.neighbouring.description,
            _bound(account.budget.epsilon),
            f"{account.budget.delta:.2g}",
            str(account.events),
            f"{account.spent.epsilon:.4f} ({account.spent.accountant.value.upper()})",
            f"{by_rdp.spent.epsilon:.4f}",
            _bound(account.remaining, ".4f"),
        )
    return table


def account_json(account: SiloAccount, rdp: SiloAccount) -> dict[str, Any]:
    return {
        "silo": account.silo,
        "neighbouring": account.budget.neighbouring.value,
        "epsilon_budget": None if math.isinf(account.budget.epsilon) else account.budget.epsilon,
        "delta": account.budget.delta,
        "size": account.budget.size,
        "events": account.events,
        "epsilon": account.spent.epsilon,
        "accountant": account.spent.accountant.value,
        "epsilon_rdp": rdp.spent.epsilon,
        "epsilon_remaining": None if math.isinf(account.remaining) else account.remaining,
    }


def _bound(value: float, spec: str = "g") -> str:
    """A budget figure, or "none" for an account that records without a limit."""
    return "none" if math.isinf(value) else format(value, spec)


def mean_std(value: dict[str, Any] | None) -> str:
    """A metric's mean ± sample std as the tables print it (`n = 1` for one value); a
    dash where it is undefined."""
    from dpfl.experiments.results.queries import mean_std_text

    return "—" if value is None else mean_std_text(value["mean"], value["std"])
