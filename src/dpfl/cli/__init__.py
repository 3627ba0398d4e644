"""The `dpfl` command. Every command here is a thin layer over the Python API."""

from __future__ import annotations

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
