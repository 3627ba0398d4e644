"""`dpfl deploy`: a study on Flower's deployment runtime (see docs/deployment.md).

`dpfl deploy hospital` starts this hospital's SuperNode with its own settings (data,
public size, budget, ledger: never the server's); `dpfl deploy register` lets a
hospital's key join a SuperLink that authenticates SuperNodes, which `dpfl deploy
superlink` starts; `dpfl deploy server` submits the study to a running SuperLink with
`flwr run` and waits for its result. Both are thin
over `dpfl.experiments.study.deployment` and Flower's own commands, which they print before running.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from . import processes
from .common import errors, reported_errors

if TYPE_CHECKING:
    from dpfl.privacy.statement import Statement

app = typer.Typer(
    help="Run a study across machines on Flower: a SuperLink, one SuperNode per hospital.",
    no_args_is_help=True,
)

InsecureOpt = Annotated[
    bool,
    typer.Option(
        "--insecure",
        help="Talk to the SuperLink without TLS: everything on the wire is readable.",
    ),
]
RootCertOpt = Annotated[
    Path | None,
    typer.Option(help="The CA certificate (PEM) that signed the SuperLink's certificate."),
]
UnionOpt = Annotated[
    bool,
    typer.Option(
        help="Let the server pool this hospital's evaluation into the union of the test "
        "sets; --no-union: the server reports no union. Its own metrics follow the study's "
        "\\[evaluation] all the same (DP counts charged to its ledger, or, where the study "
        "says 'clear', exact figures outside ε without the union's counts)."
    ),
]


def _flower(command: str) -> str:
    """Flower's command beside this Python (the venv dpfl runs in)."""
    return str(Path(sys.executable).parent / command)


def _transport(insecure: bool, root_certificates: Path | None) -> list[str]:
    if insecure == (root_certificates is not None):
        raise ValueError("give either --insecure or --root-certificates")
    return ["--insecure"] if insecure else ["--root-certificates", str(root_certificates)]


REJOIN_SECONDS = 90.0
"""How long a restarted hospital tries to rejoin: a SuperNode that died without leaving
(a crash, a power cut) counts as connected at the SuperLink until it has missed two
heartbeats (60 s in Flower 1.42), and until then its node cannot be activated again."""


def _run(
    command: list[str], env: dict[str, str] | None = None, beside: list[list[str]] | None = None
) -> int:
    """Run one of Flower's commands (and those `beside` it), shown first; its exit status.
    SIGTERM or Ctrl-C stops it with every process it started (`processes.run`)."""
    for shown in [command, *(beside or [])]:
        typer.echo(shlex.join(shown), err=True)
    return processes.run(command, env=env, beside=beside or [])


def _clientapp(port: int) -> list[str]:
    """The warm ClientApp process serving the SuperNode whose Runtime API is on `port`
    (`dpfl.engines.flower.clientapp`): the SuperNode runs in Flower's `process`
    isolation mode, so no process starts per message."""
    address = f"127.0.0.1:{port}"
    worker = [sys.executable, "-m", "dpfl.engines.flower.clientapp"]
    return [*worker, "--runtime-api-address", address, "--parent-pid", str(os.getpid())]


def _run_supernode(command: list[str], beside: list[list[str]] | None = None) -> None:
    """Run the SuperNode; if it fails within REJOIN_SECONDS of the first start, try
    again every 5 s: a restarted hospital's SuperNode is refused while the SuperLink
    still holds its previous one as connected."""
    deadline = time.monotonic() + REJOIN_SECONDS
    while True:
        code = _run(command, beside=beside)
        if code == 0 or time.monotonic() > deadline:
            raise typer.Exit(code)
        typer.echo(
            f"the SuperNode or its ClientApp process stopped (status {code}; why is above). "
            "If the SuperLink refused it because it still counts this hospital's previous "
            "SuperNode as connected (after a crash, for up to 60 s), it lets it go soon: "
            "trying again in 5 s",
            err=True,
        )
        time.sleep(5)


@app.command("hospital")
def hospital(
    study: Annotated[Path, typer.Argument(help="The study file, as the server has it.")],
    name: Annotated[str, typer.Option(help="This hospital's name in the study.")],
    data: Annotated[
        Path,
        typer.Option(
            help="This hospital's records: its own CSV or Parquet file, read through the "
            "study's \\[data] schema (a table study), or a folder holding train.npz (arrays "
            "x, y) and, optionally, test.npz.",
            exists=True,
        ),
    ],
    epsilon: Annotated[float, typer.Option(help="This hospital's ε budget.")],
    delta: Annotated[float, typer.Option(help="This hospital's δ.")],
    ledger: Annotated[
        Path, typer.Option(help="This hospital's ledger (SQLite), kept across runs.")
    ],
    identity: Annotated[
        Path,
        typer.Option(
            help="This hospital's identity key (`dpfl deploy identity`): the study's "
            "[roster] must list it."
        ),
    ],
    superlink: Annotated[str, typer.Option(help="The SuperLink's HOST:PORT.")],
    insecure: InsecureOpt = False,
    root_certificates: RootCertOpt = None,
    auth_key: Annotated[
        Path | None,
        typer.Option(help="This hospital's private key (OpenSSH), registered at the SuperLink."),
    ] = None,
    port: Annotated[int, typer.Option(help="Local port of the SuperNode's runtime API.")] = 9094,
    he_keys: Annotated[
        Path | None,
        typer.Option(help="This hospital's HE key file (studies with secure_aggregation 'he')."),
    ] = None,
    public_size: Annotated[
        int | None,
        typer.Option(
            help="The record count this hospital declares (studies whose public sizes are "
            "declared; with 'dp-count' it releases a DP count instead)."
        ),
    ] = None,
    dataset_budget: Annotated[
        float | None,
        typer.Option(
            help="The data steward's cap: ε (at --delta) that every study over this "
            "hospital's records may spend together, in one ledger; a study past it is "
            "refused before round 0, naming the studies that spent it."
        ),
    ] = None,
    union: UnionOpt = True,
) -> None:
    """Start this hospital's SuperNode; it trains only what its own budget affords, in a
    federation of the study's \\[roster] only."""
    from dpfl.engines.flower import HospitalConfig, approval
    from dpfl.engines.flower.loopback import node_config
    from dpfl.experiments.study.deployment import deployment_of

    with reported_errors():
        node = {
            "name": name,
            "study": str(study.resolve()),
            "data": str(data.resolve()),
            **({} if public_size is None else {"public-size": public_size}),
            "epsilon": epsilon,
            "delta": delta,
            "ledger": str(ledger.resolve()),
            "identity": str(identity.resolve()),
            **({} if he_keys is None else {"he-keys": str(he_keys.resolve())}),
            **({} if dataset_budget is None else {"dataset-budget": dataset_budget}),
            **({} if union else {"union": False}),
        }
        me = HospitalConfig.from_node_config(node)
        # refuse, before connecting, a study that cannot be deployed or that its officer
        # did not approve (a damaged ledger: refused reading it), a roster without its
        # key, and data that cannot be read
        approval.check(me.ledger, me.approval(run := me.deployment(deployment_of)), me.identity)
        me.silo(run)
        transport = _transport(insecure, root_certificates)
        typer.echo(f"{name}'s evaluation: {run.evaluation.describe()}", err=True)
    config = node_config(node)
    _run_supernode(
        [
            _flower("flower-supernode"),
            *transport,
            *([] if auth_key is None else ["--auth-supernode-private-key", str(auth_key)]),
            "--superlink",
            superlink,
            "--port",
            str(port),
            "--isolation",
            "process",
            "--node-config",
            config,
        ],
        beside=[_clientapp(port)],
    )


IdentityOpt = Annotated[
    Path, typer.Option(help="The hospital's identity key (`dpfl deploy identity`), which signs.")
]
LedgerOpt = Annotated[Path, typer.Option(help="The hospital's ledger (SQLite).")]


@app.command("approve")
def approve_command(
    study: Annotated[Path, typer.Argument(help="The study file, as the hospital will run it.")],
    ledger: LedgerOpt,
    identity: IdentityOpt,
    epsilon: Annotated[float, typer.Option(help="The ε budget approved for this study.")],
    delta: Annotated[float, typer.Option(help="The δ approved.")],
    dataset_budget: Annotated[
        float | None,
        typer.Option(help="The dataset's cap approved (`dpfl deploy hospital --dataset-budget`)."),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            help="The approval's name (default: the study's); one of the same name is superseded."
        ),
    ] = None,
) -> None:
    """The officer's approval of a study: the digests of its study file, its model file,
    its data schema and this dpfl, with the budget and cap, signed with the hospital's
    identity key and kept in its ledger. `dpfl deploy hospital` runs nothing else."""
    from dpfl.experiments.study.deployment import approve

    with reported_errors():
        made = approve(
            study,
            ledger=ledger,
            identity=identity,
            epsilon=epsilon,
            delta=delta,
            dataset_cap=dataset_budget,
            name=name,
        )
    cap = "" if made.dataset_cap is None else f", dataset cap ε={made.dataset_cap:g}"
    typer.echo(
        f"approved {made.name!r}: study {made.study!r} ({made.study_digest[:12]}), model "
        f"{(made.model_digest or 'built-in')[:12]}, schema {made.schema_digest[:12]}, dpfl "
        f"{made.dpfl_version}; ε={made.epsilon:g} at δ={made.delta:g}{cap}; signed by {made.key}"
    )


@app.command("approvals")
def approvals_command(
    ledger: LedgerOpt,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON, not a table.")] = False,
) -> None:
    """Every approval in the ledger: active, superseded or revoked. Read-only."""
    import dataclasses
    import json

    from rich.console import Console
    from rich.table import Table

    from dpfl.privacy import Ledger

    with reported_errors(), Ledger(ledger, create=False) as book:
        found = book.approvals()
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(a) for a in found], indent=2))
        return
    table = Table(title=f"approvals in {escape(str(ledger))}")
    for column in ("name", "study", "ε", "δ", "cap", "approved", "state"):
        table.add_column(column)
    for a in found:
        state = "active" if a.active else "revoked" if a.revoked_at else "superseded"
        table.add_row(
            escape(a.name),
            escape(a.study),
            f"{a.epsilon:g}",
            f"{a.delta:g}",
            "" if a.dataset_cap is None else f"{a.dataset_cap:g}",
            time.strftime("%Y-%m-%d %H:%M", time.localtime(a.approved_at)),
            state,
        )
    Console().print(table)


@app.command("revoke")
def revoke_command(
    name: Annotated[str, typer.Argument(help="The approval's name (`dpfl deploy approvals`).")],
    ledger: LedgerOpt,
    identity: IdentityOpt,
) -> None:
    """End an approval: the study runs no more at this hospital (signed, kept)."""
    from dpfl.engines.flower.roster import read_identity
    from dpfl.privacy import Ledger

    with reported_errors(), Ledger(ledger, create=False) as reader:
        reader.approvals()  # a missing or foreign file: refused before anything is written
    with reported_errors(), Ledger(ledger) as book:
        book.revoke(name, read_identity(identity))
    typer.echo(f"revoked {name!r}")


@app.command("server")
def server(
    study: Annotated[Path, typer.Argument(help="The study file, as the hospitals have it.")],
    superlink: Annotated[str, typer.Option(help="The SuperLink's HOST:PORT.")],
    out: Annotated[
        Path, typer.Option(help="The study folder: result.pt, the results store, the checkpoint.")
    ],
    insecure: InsecureOpt = False,
    root_certificates: RootCertOpt = None,
    wait: Annotated[float, typer.Option(help="Seconds to wait for the hospitals.")] = 600.0,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each reply.")] = 3600.0,
    missing: Annotated[
        str,
        typer.Option(
            help="A hospital that refuses, fails or does not reply in time: 'stop' the run, "
            "or 'continue' the round without it."
        ),
    ] = "stop",
    grace: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Seconds to wait mid-run for a hospital whose SuperNode went away (a "
            "restart) or did not reply in time to come back, then ask it again; 0: it fails "
            "at once, as --missing says.",
        ),
    ] = 120.0,
    he_keys: Annotated[
        Path | None,
        typer.Option(help="The run's public HE key file (secure_aggregation 'he')."),
    ] = None,
    stats: Annotated[
        bool,
        typer.Option(
            "--stats",
            help="Release the study's \\[analytics] instead of training (docs/analytics.md): "
            "OUT/stats.json, OUT/stats.html and a table, as `dpfl stats`.",
        ),
    ] = False,
) -> None:
    """Run the study on its roster's hospitals: the result goes to OUT/result.pt and to
    OUT's results store (`dpfl report OUT`). The server checkpoints each round in OUT: run
    it again with the same OUT to resume. With --stats, the hospitals release the study's
    statistics instead, each charged to its own ledger."""
    from dpfl.experiments.study.deployment import deployment_of, unfinished, write_app
    from dpfl.experiments.study.runner import owning

    with reported_errors():
        if deployment_of(study).analytics is None and stats:
            raise ValueError(
                f"{study} declares no [analytics] a deployment releases (a table study's, "
                "each hospital reading its own file)"
            )
        transport = _transport(insecure, root_certificates)
        if missing not in ("stop", "continue"):
            raise ValueError(f"--missing must be 'stop' or 'continue', got {missing!r}")
        with owning(out):  # another server on OUT: refused now, naming it, not after the run
            pass
    home = _home(superlink, transport)
    run_config = (
        f'study="{study.resolve()}" out="{out.resolve()}" '
        f'wait={float(wait)} timeout={float(timeout)} missing="{missing}" grace={float(grace)} '
        f'he-keys="{"" if he_keys is None else he_keys.resolve()}" '
        f'task="{"stats" if stats else "train"}"'
    )
    command = [_flower("flwr"), "run", str(write_app(home / "app")), "dpfl", "--stream"]
    command += ["--run-config", run_config]
    started = time.time()
    code = _run(command, env={**os.environ, "FLWR_HOME": str(home)})
    if code != 0:
        raise typer.Exit(code)
    if stats:
        _released(out, started)
        return
    with reported_errors():
        why = unfinished(study, out)
    if why is not None:
        errors.print(f"[red]error:[/red] {escape(why)}", soft_wrap=True)
        raise typer.Exit(1)


def _released(out: Path, started: float) -> None:
    """The statistics the server wrote in OUT since `started`, as a table; or exit 1 with
    why none were (a hospital refused or failed: its line, as the server wrote it)."""
    from dpfl.experiments.study.analytics import STATS_JSON, StatsRun
    from dpfl.experiments.study.deployment import STATS_ERROR

    from .stats import show

    def new(name: str) -> bool:
        return (out / name).is_file() and (out / name).stat().st_mtime >= started

    if new(STATS_ERROR):
        why = (out / STATS_ERROR).read_text(encoding="utf-8").strip()
    elif not new(STATS_JSON):
        why = f"the server wrote no statistics in {out}: see its log above"
    else:
        show(StatsRun.read(out / STATS_JSON), out)
        return
    errors.print(f"[red]error:[/red] {escape(why)}", soft_wrap=True)
    raise typer.Exit(1)


SUPEREXEC_POLL = "0.1"
"""Seconds between the SuperLink's SuperExec's looks for a ServerApp to start (1 s by
default in Flower 1.42): `FLWR_SUPEREXEC_TASK_POLL_INTERVAL`."""


def _superlink(
    tls: list[Path], host: str, port: int, supernode_auth: bool
) -> tuple[list[str], dict[str, str]]:
    """flower-superlink beside this Python with its TLS files (CA, certificate, key; none:
    --insecure), and its environment: this venv's bin first on the PATH, since the
    SuperLink starts `flower-superexec` by name."""
    files = zip(("--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"), tls, strict=False)
    command = [_flower("flower-superlink"), *([] if tls else ["--insecure"])]
    command += [str(v) for pair in files for v in pair] + ["--host", host, "--port", str(port)]
    command += ["--disable-runtime-dependency-installation"]
    command += ["--enable-supernode-auth"] if supernode_auth else []
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return command, {
        **os.environ,
        "PATH": path,
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": SUPEREXEC_POLL,
    }


@app.command("superlink")
def superlink_command(
    insecure: Annotated[
        bool,
        typer.Option("--insecure", help="Serve without TLS: everything on the wire is readable."),
    ] = False,
    ssl_ca_certfile: Annotated[
        Path | None, typer.Option(help="The CA certificate (PEM) the hospitals trust.")
    ] = None,
    ssl_certfile: Annotated[
        Path | None, typer.Option(help="The SuperLink's certificate (PEM), signed by that CA.")
    ] = None,
    ssl_keyfile: Annotated[Path | None, typer.Option(help="The SuperLink's private key.")] = None,
    host: Annotated[str, typer.Option(help="The address to listen on.")] = "0.0.0.0",
    port: Annotated[
        int, typer.Option(help="The port of its Fleet, Control and Runtime APIs.")
    ] = 9091,
    supernode_auth: Annotated[
        bool,
        typer.Option(
            "--enable-supernode-auth/--no-supernode-auth",
            help="Admit only SuperNodes whose keys were registered (`dpfl deploy register`).",
        ),
    ] = True,
) -> None:
    """Start the coordinator's SuperLink (Flower's flower-superlink, from dpfl's venv with
    its commands on the PATH); dpfl is installed, so Flower installs no app dependency."""
    tls = [f for f in (ssl_ca_certfile, ssl_certfile, ssl_keyfile) if f is not None]
    with reported_errors():
        if len(tls) != (0 if insecure else 3):
            raise ValueError(
                "give either --insecure or --ssl-ca-certfile, --ssl-certfile and --ssl-keyfile"
            )
    command, env = _superlink(tls, host, port, supernode_auth)
    raise typer.Exit(_run(command, env=env))


@app.command("certs")
def certs_command(
    folder: Annotated[Path, typer.Argument(help="Where to write the certificates and keys.")],
    host: Annotated[
        list[str],
        typer.Option(
            help="The SuperLink's host name or IP address, as hospitals dial it "
            "(repeat for several)."
        ),
    ],
    hospital: Annotated[
        list[str] | None,
        typer.Option(help="Also make this hospital's SuperNode key pair (repeat for several)."),
    ] = None,
    days: Annotated[float, typer.Option(help="How long the certificates are valid.")] = 30.0,
) -> None:
    """For tests and trials: a new CA (ca.crt), the SuperLink's certificate (server.pem,
    server.key) for each --host, and with --hospital, that hospital's SuperNode key pair
    (NAME.key, NAME.key.pub). In production, take the certificate from your CA and let each
    hospital make its own key (docs/deployment.md)."""
    from dpfl.engines.flower.certificates import certificates, keys

    with reported_errors():
        tls = certificates(folder, host, days=days)
        pairs = keys(folder, hospital or [])
    typer.echo(f"CA certificate (give it to every hospital): {tls.ca}")
    typer.echo(f"SuperLink certificate and key: {tls.certificate} {tls.key}")
    for name, key in pairs.items():
        typer.echo(f"{name}'s SuperNode key (give it to {name} only): {key}, public: {key}.pub")


@app.command("he-keys")
def he_keys_command(
    folder: Annotated[Path, typer.Argument(help="Where to write the run's two key files.")],
) -> None:
    """Make a new run's HE keys: key-holder.he (the secret key: give it to one hospital
    only) and public.he (for the other hospitals and the server)."""
    from dpfl.engines.flower.he import make_key_files

    with reported_errors():
        secret, public = make_key_files(folder)
    typer.echo(f"key holder's file (secret): {secret}\neveryone else's: {public}")


@app.command("identity")
def identity_command(
    file: Annotated[Path, typer.Argument(help="Where to write the new identity key (private).")],
    name: Annotated[str, typer.Option(help="This hospital's name in the study.")],
) -> None:
    """Make this hospital's identity key: keep FILE, and send the coordinator the line
    printed, which the study file lists under \\[roster] for every hospital."""
    from dpfl.engines.flower.roster import make_identity

    with reported_errors():
        public = make_identity(file)
    typer.echo(f'"{name}" = "{public}"')


@app.command("register")
def register(
    public_key: Annotated[Path, typer.Argument(help="A hospital's public key (OpenSSH, NIST EC).")],
    name: Annotated[
        str, typer.Option(help="The hospital's name in the study: the only one it may use.")
    ],
    superlink: Annotated[str, typer.Option(help="The SuperLink's HOST:PORT.")],
    insecure: InsecureOpt = False,
    root_certificates: RootCertOpt = None,
) -> None:
    """Let the hospital holding this key's private half join (a SuperLink started with
    --enable-supernode-auth refuses every other SuperNode)."""
    with reported_errors():
        transport = _transport(insecure, root_certificates)
    home = _home(superlink, transport)
    key = str(public_key.resolve())
    command = [_flower("flwr"), "supernode", "register", key, "dpfl", "--name", name]
    raise typer.Exit(_run(command, env={**os.environ, "FLWR_HOME": str(home)}))


def _home(superlink: str, transport: list[str]) -> Path:
    """A fresh FLWR_HOME whose default connection is the SuperLink."""
    home = Path(tempfile.mkdtemp(prefix="dpfl-deploy-"))
    connection = (
        "insecure = true"
        if transport == ["--insecure"]
        else f'root-certificates = "{Path(transport[1]).resolve()}"'
    )
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "dpfl"\n\n[superlink.dpfl]\naddress = "{superlink}"\n'
        f"{connection}\n",
        encoding="utf-8",
    )
    return home


@app.command("status")
def status(
    ledger: Annotated[Path, typer.Option(help="A hospital's ledger (SQLite).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON, not a table.")] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            help="Also write the statement as one self-contained page (for the data-"
            "protection officer): caps, approvals, spending over time, refusals, "
            "statistics released, the chain's verification.",
        ),
    ] = None,
) -> None:
    """A hospital's ledger across its studies: each study (by name) and its accounts
    (rounds trained, training events, statistics, ε spent and left under its budget and
    its dataset's cap, whichever binds), each capped dataset (ε spent by all studies
    together, per study, and left), refusals and the chain's verification. Read-only:
    creates nothing beside the file."""
    import json

    from dpfl.privacy import Ledger
    from dpfl.privacy.statement import read, to_json

    with reported_errors(), Ledger(ledger, create=False) as book:
        statement = read(book, over_time=html is not None)
    if html is not None:
        from dpfl.experiments.study.statement_page import render

        with reported_errors():
            html.write_text(render(statement), encoding="utf-8")
        typer.echo(f"statement written to {html}", err=True)
    if as_json:
        typer.echo(json.dumps(to_json(statement), indent=2))
    else:
        _status_tables(statement)


def _status_tables(statement: Statement) -> None:
    """The statement as tables: accounts, capped datasets, refusals; then the chain."""
    from rich.console import Console
    from rich.table import Table

    from dpfl.privacy.statement import (
        EVALUATION,
        STATISTIC,
        TRAINING,
        chain_text,
        epsilon_text,
        own_name,
        when,
    )

    rows = [
        [
            escape(statement.name_of(a.study)),
            escape(a.own),
            escape(a.budget.dataset or ""),
            str(a.rounds_trained),
            str(a.kinds[TRAINING]),
            str(a.kinds[STATISTIC]),
            str(a.kinds[EVALUATION]),
            epsilon_text(a.spent),
            epsilon_text(a.budget.epsilon),
            epsilon_text(a.left) + ("" if a.left_binding is None else f"\n({a.left_binding})"),
        ]
        for a in statement.accounts
    ]
    table = Table(title=f"ledger {escape(statement.path)}")
    columns = ["study", "account", "dataset", "rounds trained", "training events"]
    columns += ["statistics", "evaluations", "ε spent", "ε budget", "ε left"]
    for i, column in enumerate(columns):  # a narrow terminal folds cells, never cuts them
        table.add_column(column, overflow="fold", justify="left" if i < 3 else "right")
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.print(table)
    for d in statement.datasets:
        caps = Table(
            title=f"dataset {escape(d.cap.dataset)}: ε {d.spent.epsilon:.4g} of its cap "
            f"{d.cap.epsilon:g} at δ={d.cap.delta:g}, {d.remaining:.4g} left"
        )
        caps.add_column("study")
        caps.add_column("ε (its events alone)", justify="right")
        for study, report in d.studies.items():
            caps.add_row(escape(statement.name_of(study)), f"{report.epsilon:.4g}")
        console.print(caps)
    if statement.refusals:
        refused = Table(title="refused")
        for column in ("when", "study", "account", "round", "why"):
            refused.add_column(column, overflow="fold")
        for r in statement.refusals:
            shown = "" if r.round is None else str(r.round)
            refused.add_row(
                when(r.recorded_at),
                escape(statement.name_of(r.study)),
                escape(own_name(r.account, r.study)),
                shown,
                escape(r.reason),
            )
        console.print(refused)
    console.print(escape(chain_text(statement.verification)))
