"""The `dpfl` command. Every command here is a thin layer over the Python API, which it
imports in its body (torch, Flower, dp_accounting: seconds), so that `dpfl --help` and
the commands that need none of them start at once (tests/test_startup.py)."""

from __future__ import annotations

import inspect

import typer

from dpfl import __version__
from dpfl.allocator import keep_freed_memory
from dpfl.cli import audit, demo, deploy, init, privacy, report, stats, study

app = typer.Typer(
    name="dpfl",
    help="Differentially private federated learning for medical data.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(privacy.app, name="privacy")
app.add_typer(deploy.app, name="deploy")
app.command("demo")(demo.demo)
app.command("init")(init.init)
app.command("run")(study.run)
app.command("sweep")(study.sweep)
app.command("best")(study.best)
app.command("tune")(study.tune)
app.command("report")(report.report)
app.command("reproduce")(study.reproduce)
app.command("audit")(audit.audit)
app.command("stats")(stats.stats)


def _unwrap_help(typer_app: typer.Typer) -> None:
    """Give every command its docstring as prose: the source's line breaks inside a
    paragraph joined. Typer's rich markup keeps them in the command lists and in a help's
    later paragraphs, which then break mid-sentence ("print the" / "privacy–utility
    table") whatever the terminal's width."""
    for info in typer_app.registered_commands:
        doc = info.help or inspect.getdoc(info.callback) or ""
        info.help = "\n\n".join(" ".join(part.split()) for part in doc.split("\n\n"))
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _unwrap_help(group.typer_instance)


_unwrap_help(app)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"dpfl {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_show_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """Differentially private federated learning for medical data."""
    keep_freed_memory()
