"""`dpfl privacy …`: ε of a DP-SGD run, the noise for a budget, and ledger inspection."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from .common import account_json, accounts_table, console, print_json, reported_errors

if TYPE_CHECKING:
    from dpfl.privacy import EpsilonReport

app = typer.Typer(help="Privacy accounting and the per-silo ledger.", no_args_is_help=True)

NoiseOpt = Annotated[float, typer.Option("--noise-multiplier", "-s", help="σ: noise std / C.")]
RateOpt = Annotated[
    float, typer.Option("--sample-rate", "-q", help="q: Poisson sampling probability.")
]
StepsOpt = Annotated[int, typer.Option("--steps", "-T", help="Number of DP-SGD steps.")]
DeltaOpt = Annotated[float, typer.Option("--delta", "-d", help="δ of the guarantee.")]
AccountantOpt = Annotated[
    str | None,
    typer.Option("--accountant", help="rdp or pld (default: pld where it applies, else rdp)."),
]
SizeOpt = Annotated[
    int | None, typer.Option("--dataset-size", "-n", help="Records at the silo: warns if δ > 1/n.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
MechanismOpt = Annotated[
    str | None,
    typer.Option(
        "--mechanism",
        "-m",
        help="The noise mechanism: independent (DP-SGD, the default), bandmf or blt "
        "(correlated; the T steps as one run).",
    ),
]
BandOpt = Annotated[
    int | None, typer.Option("--band", help="bandmf's bands b (default 4): needs b·q ≤ 1.")
]
BuffersOpt = Annotated[int | None, typer.Option("--buffers", help="blt's buffers (default 4).")]


def _event_of(mechanism: str | None, band: int | None, buffers: int | None) -> Any:
    """(q, σ, T) ↦ the privacy event of T steps at rate q under the named mechanism (by
    default DP-SGD's, without loading the training code the others live beside)."""
    settings = {k: v for k, v in (("band", band), ("buffers", buffers)) if v is not None}
    if mechanism is None and not settings:
        from dpfl.privacy import events

        return lambda q, sigma, steps: events.poisson_gaussian(q, sigma, steps=steps)
    from dpfl.local.mechanisms import mechanism as named

    return named(mechanism or "independent", **settings).event


@app.command("epsilon")
def epsilon_command(
    noise_multiplier: NoiseOpt,
    sample_rate: RateOpt,
    steps: StepsOpt,
    delta: DeltaOpt,
    accountant: AccountantOpt = None,
    dataset_size: SizeOpt = None,
    json: JsonOpt = False,
    mechanism: MechanismOpt = None,
    band: BandOpt = None,
    buffers: BuffersOpt = None,
) -> None:
    """ε after T DP-SGD steps at rate q (add/remove-one neighbouring): Poisson-sampled with
    independent noise, or with a correlated mechanism's batches and noise."""
    from dpfl.privacy import Accountant, epsilon
    from dpfl.privacy.accounting import check_delta

    with reported_errors():
        check_delta(delta, dataset_size=dataset_size)
        event = _event_of(mechanism, band, buffers)(sample_rate, noise_multiplier, steps)
        chosen = epsilon(event, delta, accountant)
        if json:
            print_json(_report_json(chosen))
            return
        shown = [chosen]
        if accountant is None and not chosen.note:  # the other accountant beside PLD
            shown.append(epsilon(event, delta, Accountant.RDP))
        relation = f" [{event.neighbouring.description}]"  # it has its own column
        table = Table(title=escape(event.describe().removesuffix(relation)))
        for column in ("accountant", "ε", "δ", "neighbouring"):
            table.add_column(column)
        for report in shown:
            table.add_row(
                report.accountant.value.upper(),
                f"{report.epsilon:.4f}",
                f"{report.delta:g}",
                report.neighbouring.description,
            )
        console.print(table)
        if chosen.note:
            console.print(escape(chosen.note), soft_wrap=True)


NODE_RELATION = "replace one person with all their contacts: up to 2S − 1 rows change"


@app.command("node-level")
def node_level_command(
    noise_multiplier: NoiseOpt,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Rows in each batch.")],
    dataset_size: Annotated[
        int, typer.Option("--dataset-size", "-n", help="Rows (neighbourhoods) at the silo.")
    ],
    appearances: Annotated[
        list[int],
        typer.Option("--appearances", "-S", help="Most rows one person is in; repeat for more."),
    ],
    epochs: Annotated[float, typer.Option(help="Passes over the rows: n/b steps each.")] = 1.0,
    delta: Annotated[float | None, typer.Option("--delta", "-d", help="δ (default 1/n).")] = None,
    json: JsonOpt = False,
) -> None:
    """Node-level ε of DP-SGD on fixed-size batches of graph neighbourhoods, for each S,
    under replace-one-person neighbouring (one person and all their contacts replaced):
    that changes up to 2S − 1 rows, which the bound charges. The seed's Fig. 10 (puffle,
    after Daigavane et al. 2021), which counted S rows, the add/remove count."""
    from dpfl.privacy import epsilon, events
    from dpfl.privacy.accounting import check_delta

    with reported_errors():
        chosen_delta = 1 / dataset_size if delta is None else delta
        check_delta(chosen_delta)
        steps = max(1, round(epochs * dataset_size / batch_size))
        reports = {
            s: epsilon(
                events.node_gaussian(
                    noise_multiplier,
                    appearances=s,
                    dataset_size=dataset_size,
                    batch_size=batch_size,
                    steps=steps,
                ),
                chosen_delta,
            )
            for s in appearances
        }
        if json:
            print_json(
                {
                    "steps": steps,
                    "relation": NODE_RELATION,
                    "by_appearances": {
                        s: {**_report_json(r), "changed_rows": events.replacement_rows(s)}
                        for s, r in reports.items()
                    },
                }
            )
            return
        console.print(
            f"{steps:,} steps of {batch_size} of {dataset_size:,} rows, "
            f"σ = {noise_multiplier:g}, δ = {chosen_delta:.3g} (RDP; {NODE_RELATION})"
        )
        table = Table()
        table.add_column("S (rows a person is in)", justify="right")
        table.add_column("rows a replacement changes", justify="right")
        table.add_column("ε", justify="right")
        for s, report in reports.items():
            table.add_row(str(s), str(events.replacement_rows(s)), f"{report.epsilon:.2f}")
        console.print(table)


@app.command("calibrate")
def calibrate_command(
    target_epsilon: Annotated[float, typer.Option("--epsilon", "-e", help="Target ε.")],
    delta: DeltaOpt,
    sample_rate: RateOpt,
    steps: StepsOpt,
    accountant: AccountantOpt = None,
    tolerance: Annotated[
        float, typer.Option(help="σ is at most this far above the least σ that meets ε.")
    ] = 1e-4,  # calibration.NOISE_TOLERANCE (tests/test_startup.py): not imported for --help
    dataset_size: SizeOpt = None,
    json: JsonOpt = False,
    mechanism: MechanismOpt = None,
    band: BandOpt = None,
    buffers: BuffersOpt = None,
) -> None:
    """The smallest noise multiplier σ that keeps T DP-SGD steps within (ε, δ), under the
    noise mechanism chosen (independent noise by default)."""
    from dpfl.privacy import calibration, epsilon
    from dpfl.privacy.accounting import check_delta, parse_accountant

    with reported_errors():
        check_delta(delta, dataset_size=dataset_size)
        chosen = None if accountant is None else parse_accountant(accountant)
        event_of = _event_of(mechanism, band, buffers)
        event_of(sample_rate, 1.0, steps)  # validate q, T and the mechanism up front
        sigma = calibration.calibrate_noise(
            target_epsilon,
            delta,
            lambda s: event_of(sample_rate, s, steps),
            accountant=chosen,
            tolerance=tolerance,
        )
        report = epsilon(event_of(sample_rate, sigma, steps), delta, chosen)
        # Shown rounded up: σ rounded to nearest could fall below the least σ that meets ε.
        shown = math.ceil(sigma * 10**4) / 10**4
        text = f"noise multiplier σ = {shown:.4f}"
        _answer(json, "noise_multiplier", sigma, text, report, target_epsilon)


@app.command("max-steps")
def max_steps_command(
    target_epsilon: Annotated[float, typer.Option("--epsilon", "-e", help="Target ε.")],
    delta: DeltaOpt,
    sample_rate: RateOpt,
    noise_multiplier: NoiseOpt,
    accountant: AccountantOpt = None,
    json: JsonOpt = False,
) -> None:
    """The largest number of DP-SGD steps at (q, σ) that stays within (ε, δ)."""
    from dpfl.privacy import calibration, epsilon, events

    with reported_errors():
        steps = calibration.max_dpsgd_steps(
            target_epsilon,
            delta,
            sample_rate=sample_rate,
            noise_multiplier=noise_multiplier,
            accountant=accountant,
        )
        report = epsilon(
            events.poisson_gaussian(sample_rate, noise_multiplier, steps=steps), delta, accountant
        )
        if steps == calibration.STEPS_LIMIT:  # more may fit: the search stops here
            limit = f"the search stops at {steps:,} steps; more may fit"
            note = f"{report.note}; {limit}" if report.note else limit
            report = dataclasses.replace(report, note=note)
            _answer(json, "steps", steps, f"at least {steps:,} steps", report, target_epsilon)
        else:
            _answer(json, "steps", steps, f"at most {steps:,} steps", report, target_epsilon)


@app.command("ledger")
def ledger_command(
    path: Annotated[Path, typer.Argument(help="The study's ledger file.")],
    events_: Annotated[bool, typer.Option("--events", help="List every recorded event.")] = False,
    json: JsonOpt = False,
) -> None:
    """Per silo: budget, events recorded, ε spent (PLD where it applies, and RDP), ε left."""
    from dpfl.privacy import Accountant, Ledger

    with reported_errors(), Ledger(path, create=False) as ledger:
        accounts = ledger.accounts()
        by_rdp = ledger.accounts(accountant=Accountant.RDP)
        if json:
            print_json([account_json(a, r) for a, r in zip(accounts, by_rdp, strict=True)])
            return
        owner = "" if ledger.owner is None else f" of run {ledger.owner}"
        console.print(accounts_table(f"privacy ledger {path}{owner}", accounts, by_rdp))
        if events_:
            for silo in ledger.silos():
                table = Table(title=escape(f"events of {silo}"))
                for column in ("#", "round", "label", "event"):
                    table.add_column(column)
                for entry in ledger.entries(silo):
                    round_ = "" if entry.round is None else str(entry.round)
                    table.add_row(
                        str(entry.id), round_, escape(entry.label), escape(entry.event.describe())
                    )
                console.print(table)


@app.command("verify")
def verify_command(
    path: Annotated[Path, typer.Argument(help="A hospital's or a study's ledger file.")],
    receipts: Annotated[
        Path | None,
        typer.Option(
            help="A folder of the receipts a server kept (`dpfl deploy server`'s "
            "OUT/receipts): each one of this ledger is checked against it."
        ),
    ] = None,
    json: JsonOpt = False,
) -> None:
    """Check the ledger's hash chain, its seals and its tables; with --receipts, that it
    still holds what each receipt a server was given says. Exit status 1 where it
    breaks, saying where. Read-only: creates nothing beside the file."""
    from dpfl.privacy import Ledger

    with reported_errors():
        given = [] if receipts is None else _receipts(receipts)
        with Ledger(path, create=False) as ledger:
            found = ledger.verify()
            against, mine = ledger.checked(given) if given else ([], 0)
    problems = found.problems + [p for p in against if p not in found.problems]
    shown = {
        "ledger": str(path),
        "ok": not problems,
        "chained": found.chained,
        "entries": found.entries,
        "head": found.head,
        "seals": found.seals,
        "receipts": mine,
        "other_receipts": len(given) - mine,
        "problems": problems,
    }
    if json:
        print_json(shown)
    else:
        verdict = (
            "[green]intact[/green]"
            if not problems
            else "[red]BROKEN[/red]"
            if found.chained
            else "[yellow]not chained[/yellow]"
        )
        console.print(
            f"ledger {escape(str(path))}: {verdict}: {found.entries} chain entries, "
            f"{found.seals} seals, head {found.head[:16]}"
            + ("" if receipts is None else f"; {mine} receipts of it checked")
            + (
                ""
                if not given or mine == len(given)
                else f" ({len(given) - mine} of other ledgers)"
            )
        )
        for problem in problems:
            console.print(f"  {escape(problem)}", soft_wrap=True)
    if problems:
        raise typer.Exit(1)


def _receipts(folder: Path) -> list[Any]:
    """Every receipt (`*.json`) under `folder`; one that is not a receipt is refused by
    name."""
    from dpfl.privacy.chain import Receipt

    if not folder.is_dir():
        raise ValueError(f"no folder of receipts at {folder}")
    read = []
    for path in sorted(folder.rglob("*.json")):
        try:
            read.append(Receipt.from_json(path.read_text(encoding="utf-8")))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    return read


@app.command("upgrade")
def upgrade_command(
    path: Annotated[Path, typer.Argument(help="A ledger written by an older dpfl.")],
    yes: Annotated[
        bool, typer.Option("--yes", help="Upgrade without asking (you backed it up).")
    ] = False,
) -> None:
    """Upgrade a ledger written before the hash chain: every entry it holds is chained,
    in one transaction. Older dpfl can no longer write to it: back it up first."""
    from dpfl.privacy import Ledger

    with reported_errors():
        with Ledger(path, create=False) as reader:
            chained = reader.chained
        if chained:
            console.print(f"{escape(str(path))} is already chained: nothing to upgrade")
            return
        if not yes and not typer.confirm(
            f"Upgrade {path}? Older dpfl can no longer write to it (back it up first)"
        ):
            raise typer.Exit(1)
        with Ledger(path, upgrade=True) as ledger:
            found = ledger.verify()
    console.print(
        f"upgraded {escape(str(path))}: {found.entries} chain entries, head {found.head[:16]}"
    )


def _answer(
    json: bool, key: str, value: float, shown: str, report: EpsilonReport, target: float
) -> None:
    """Print a calibration answer with the ε it achieves (and which accountant said so,
    and why if not the default), or one JSON object."""
    if json:
        print_json({key: value, **_report_json(report)})
        return
    console.print(
        f"[bold]{shown}[/bold] (ε = {report.epsilon:.4f} ≤ {target:g} at δ = {report.delta:g}, "
        f"{report.accountant.value.upper()}, {report.neighbouring.description})"
    )
    if report.note:
        console.print(escape(report.note), soft_wrap=True)


def _report_json(report: EpsilonReport) -> dict[str, object]:
    """The report's fields; `note` only when there is one."""
    data: dict[str, object] = {
        "epsilon": report.epsilon,
        "delta": report.delta,
        "accountant": report.accountant.value,
        "neighbouring": report.neighbouring.value,
    }
    if report.note:
        data["note"] = report.note
    return data
