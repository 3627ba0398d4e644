"""A whole deployment on one machine: a SuperLink and one SuperNode per hospital as
separate processes on loopback, TLS with a CA made on the spot, SuperNode keys
registered: for trying a deployment before the real machines, its tests and its benchmark.

Every process is Flower's or dpfl's own command, run from the binaries beside this
Python (`BIN`), as docs/deployment.md runs them on real machines; only the addresses
(127.0.0.1) and the certificates and keys (made on the spot by
`dpfl.engines.flower.certificates`, valid for an hour) differ. The
SuperNodes may be pointed at another address than the SuperLink's (`fleet`), e.g. a
relay that counts the bytes between them; TLS stays end to end through it. Each SuperNode
runs in Flower's `process` isolation mode, served by one warm ClientApp process
(`dpfl.engines.flower.clientapp`) that `dpfl deploy hospital` starts beside it, or, with
`flower-supernode` itself, that the cluster starts beside it in its process group."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypedDict, Unpack

import numpy as np

from dpfl.engines.flower.certificates import certificates, keys
from dpfl.engines.flower.roster import make_identity, public_text, read_identity, roster_table
from dpfl.federation.silo import Silo

BIN = Path(sys.executable).parent
"""Where Flower's commands and `dpfl` are: beside the Python that runs dpfl (its venv)."""
BINARIES = ("flower-superlink", "flower-supernode", "flwr", "dpfl")


class LoopbackError(RuntimeError):
    """The loopback deployment could not start or did not finish in time."""


class Layout(TypedDict, total=False):
    """How a `cluster` is laid out; every key may be left out."""

    cli: bool
    """SuperNodes started by `dpfl deploy hospital` (default: `flower-supernode` itself)."""
    intruder: bool
    """One more SuperNode, as the first hospital (its name, roster key and records) but
    with a SuperNode key nobody registered."""
    port: int
    """The SuperLink's port (default: a free one)."""
    fleet: str
    """HOST:PORT the SuperNodes connect to (default: the SuperLink's), e.g. a relay's."""


@dataclass
class Cluster:
    port: int
    """The SuperLink's port on 127.0.0.1 (Fleet, Control and Runtime APIs)."""
    ca: Path
    """The CA certificate every client trusts."""
    logs: Path
    """One log file per process: superlink.log, NAME.log."""
    env: dict[str, str]
    """The environment the processes run in (BIN first on the PATH)."""
    commands: dict[str, list[str]]
    """Each process's command, by name ("superlink", then the hospitals')."""
    beside: dict[str, list[str]] = field(default_factory=dict)
    """A command started with the named one that ends when it ends (`--parent-pid`), or
    when it is killed: a SuperNode's ClientApp process."""
    processes: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)
    """Each name's processes, the running one last."""
    companions: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)
    """Each name's processes started `beside` it, the running one last."""

    def start(self, name: str) -> None:
        """Start the named process (and the one beside it); its log goes on."""
        command = self.commands[name]
        with open(self.logs / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                [str(BIN / command[0]), *command[1:]],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
            if name in self.beside:
                other = self.beside[name]
                companion = subprocess.Popen(
                    [str(BIN / other[0]), *other[1:], "--parent-pid", str(process.pid)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,
                )
                self.companions.setdefault(name, []).append(companion)
        self.processes.setdefault(name, []).append(process)

    def kill(self, name: str, command: str | None = None) -> None:
        """SIGKILL the named process and all its descendants at once, as a machine that
        loses power: nothing gets to clean up. With `command`, only the descendants
        running it (e.g. "flwr-serverapp": the ServerApp the SuperLink started)."""
        running = self.processes[name][-1]
        roots = {running.pid, *(p.pid for p in self.companions.get(name, [])[-1:])}
        family = roots | descendants(roots)
        if command is not None:
            family = {pid for pid in family if command in _command_line(pid)}
        _signal(family, signal.SIGKILL)
        if running.pid in family:
            running.wait()

    def server(self, study: Path, out: Path, *options: str) -> list[str]:
        """`dpfl deploy server` of the study on this cluster, with more `options`."""
        return [
            str(BIN / "dpfl"), "deploy", "server", str(study),
            "--superlink", f"127.0.0.1:{self.port}", "--out", str(out),
            "--root-certificates", str(self.ca), *options,
        ]  # fmt: skip

    def tails(self) -> str:
        """The end of every process's log."""
        return "\n".join(f"{p.name}:\n{p.read_text()[-2000:]}" for p in self.logs.iterdir())


class Deployed(NamedTuple):
    output: str
    """`dpfl deploy server`'s output and error streams, in that order."""
    out: Path
    """The server's out folder (result.pt)."""
    logs: Path


def missing_binaries() -> list[str]:
    """The commands a loopback deployment runs that are not installed in BIN."""
    return [b for b in BINARIES if not (BIN / b).exists()]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def node_config(node: Mapping[str, Any]) -> str:
    """`--node-config` syntax: space separated key=value, values in TOML."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return f'"{v}"' if isinstance(v, str) else repr(v)

    return " ".join(f"{k}={value(v)}" for k, v in node.items())


def hospital_node(
    silo: Silo,
    study: Path,
    folder: Path,
    *,
    epsilon: float,
    delta: float,
    table: Path | None = None,
) -> dict[str, Any]:
    """Write `silo` as a hospital's data folder (train.npz, test.npz if it has a test
    set, a new identity key) and return its node config: its budget, its ledger in that
    folder, and the simulator's seeded noise, so that its updates can be compared with a
    simulation. With `table` (its own CSV or Parquet file, read through a table study's
    schema) the folder holds that file in place of the arrays. `pin_roster` lists the
    hospitals' keys in the study."""
    folder.mkdir(parents=True)
    make_identity(folder / "identity.pem")
    data = folder if table is None else folder / table.name
    if table is not None:
        shutil.copyfile(table, data)
    else:
        np.savez(folder / "train.npz", x=silo.x.numpy(), y=silo.y.numpy())
        if silo.x_test is not None and silo.y_test is not None:
            np.savez(folder / "test.npz", x=silo.x_test.numpy(), y=silo.y_test.numpy())
    return {
        "name": silo.name,
        "study": str(study),
        "data": str(data),
        "public-size": silo.declared_size,
        "epsilon": epsilon,
        "delta": delta,
        "ledger": str(folder / "ledger.sqlite"),
        "identity": str(folder / "identity.pem"),
        "research-noise": True,
    }


def pin_roster(study: Path, nodes: Mapping[str, Mapping[str, Any]]) -> None:
    """List the hospitals of `nodes` (name: node config) with their identity keys as the
    study file's roster, in place of any roster it had."""
    text = study.read_text(encoding="utf-8")
    kept = text.split("\n[roster]\n")[0].rstrip("\n")
    lines = {n: public_text(read_identity(Path(node["identity"]))) for n, node in nodes.items()}
    study.write_text(f"{kept}\n\n{roster_table(lines)}", encoding="utf-8")


@contextmanager
def cluster(
    nodes: Mapping[str, Mapping[str, Any]],
    root: Path,
    **layout: Unpack[Layout],
) -> Iterator[Cluster]:
    """A SuperLink and one SuperNode per hospital of `nodes` (name: node config), each
    its own process on loopback, laid out as `layout` says; all killed on the way out,
    whatever happens. Every link is TLS with a CA made here (in `root`/tls); the
    SuperLink admits only SuperNodes whose keys were registered (`dpfl deploy
    register`), which an intruder's is not. Each hospital's officer approves its study
    first, as its node config runs it (`dpfl deploy approve`)."""
    missing = missing_binaries()
    if missing:
        raise LoopbackError(f"Flower's {', '.join(missing)} are not installed in {BIN}")
    cli, intruder = layout.get("cli", False), layout.get("intruder", False)
    port = layout.get("port") or free_port()
    fleet = layout.get("fleet", f"127.0.0.1:{port}")
    ca, cert, key = certificates(root / "tls", ["127.0.0.1"])
    auth = keys(root / "keys", [*nodes, "intruder"])
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1",  # 1 s by default, at every message
    }
    logs = root / "logs"
    logs.mkdir()
    members = {**nodes, **({"intruder": next(iter(nodes.values()))} if intruder else {})}
    runtime = {name: free_port() for name in members}  # where its ClientApp takes tasks
    commands = {
        "superlink": [
            "flower-superlink", "--ssl-ca-certfile", str(ca), "--ssl-certfile", str(cert),
            "--ssl-keyfile", str(key), "--host", "127.0.0.1", "--port", str(port),
            "--disable-runtime-dependency-installation", "--enable-supernode-auth",
        ],
        **{
            name: [
                "dpfl", "deploy", "hospital", node["study"], "--name", node["name"],
                "--data", node["data"], "--public-size", str(node["public-size"]),
                "--epsilon", str(node["epsilon"]), "--delta", str(node["delta"]),
                "--ledger", node["ledger"], "--identity", node["identity"],
                "--superlink", fleet,
                "--root-certificates", str(ca), "--port", str(runtime[name]),
                "--auth-key", str(auth[name]),
                *(["--dataset-budget", str(node["dataset-budget"])]
                  if "dataset-budget" in node else []),
                *(["--no-union"] if node.get("union") is False else []),
            ]
            if cli
            else [
                "flower-supernode", "--root-certificates", str(ca), "--superlink", fleet,
                "--port", str(runtime[name]), "--isolation", "process",
                "--node-config", node_config(node),
                "--auth-supernode-private-key", str(auth[name]),
            ]
            for name, node in members.items()
        },
    }  # fmt: skip
    beside = {
        name: ["python", "-m", "dpfl.engines.flower.clientapp",
               "--runtime-api-address", f"127.0.0.1:{runtime[name]}"]
        for name in ([] if cli else members)
    }  # fmt: skip
    running = Cluster(port, ca, logs, env, commands, beside)
    approve(nodes, env)
    try:
        for name in commands:
            running.start(name)
            if name == "superlink":
                wait_for(port, ca, time.monotonic() + 20)
                register(port, ca, {n: auth[n].with_name(f"{n}.key.pub") for n in nodes}, env)
        yield running
    finally:
        started = [*running.processes.values(), *running.companions.values()]
        stop([p for processes in started for p in processes])


def deploy(
    study: Path,
    nodes: Mapping[str, Mapping[str, Any]],
    root: Path,
    *,
    deadline: float = 180.0,
    wait: float = 30.0,
    timeout: float = 30.0,
    **layout: Unpack[Layout],
) -> Deployed:
    """`dpfl deploy server` of the study over the hospitals' SuperNodes of a `cluster`
    in `root` laid out as `layout` says, waiting `wait` seconds for the hospitals and
    `timeout` for each reply; everything is killed if it takes over `deadline` seconds,
    start to finish (LoopbackError, with the logs' tails)."""
    began, out = time.monotonic(), root / "server-out"
    with cluster(nodes, root, **layout) as running:
        timing = ("--wait", str(wait), "--timeout", str(timeout))
        command = running.server(study, out, *timing)
        left = deadline - (time.monotonic() - began)
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, env=running.env, timeout=left
            )
        except subprocess.TimeoutExpired as exc:
            raise LoopbackError(
                f"the deployment took over {deadline:g}s\n{running.tails()}"
            ) from exc
    return Deployed(done.stdout + done.stderr, out, running.logs)


def register(port: int, ca: Path, public_keys: Mapping[str, Path], env: dict[str, str]) -> None:
    """`dpfl deploy register` each hospital's key under its name, all at once."""
    _all_at_once(
        [
            [str(BIN / "dpfl"), "deploy", "register", str(key), "--name", name,
             "--superlink", f"127.0.0.1:{port}", "--root-certificates", str(ca)]
            for name, key in public_keys.items()
        ],
        env,
        "registering a key",
    )  # fmt: skip


def approve(nodes: Mapping[str, Mapping[str, Any]], env: dict[str, str]) -> None:
    """`dpfl deploy approve` each hospital's study as its node config runs it (its
    officer's approval, without which it runs nothing), all at once."""
    _all_at_once(
        [
            [str(BIN / "dpfl"), "deploy", "approve", node["study"], "--ledger", node["ledger"],
             "--identity", node["identity"], "--epsilon", str(node["epsilon"]),
             "--delta", str(node["delta"]),
             *(["--dataset-budget", str(node["dataset-budget"])]
               if "dataset-budget" in node else [])]
            for node in nodes.values()
        ],
        env,
        "approving a study",
    )  # fmt: skip


def _all_at_once(commands: list[list[str]], env: dict[str, str], what: str) -> None:
    running = [
        subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for c in commands
    ]
    for process in running:
        output, _ = process.communicate(timeout=60)
        if process.returncode != 0:
            raise LoopbackError(f"{what} failed:\n{output.decode()}")


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """Terminate each process's session and every descendant (Flower detaches its
    ServerApp into a session of its own), then kill what is left."""
    started = {p.pid for p in processes}
    family = started | descendants(started)
    _signal(family, signal.SIGTERM)
    for process in processes:
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
    _signal(family, signal.SIGKILL)
    for process in processes:
        process.wait()


def descendants(roots: set[int]) -> set[int]:
    """Processes whose ancestry leads to `roots` (from /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = set(roots)
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _command_line(pid: int) -> str:
    """A process's command line ('' if it is gone)."""
    with suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""


def _signal(pids: set[int], sig: signal.Signals) -> None:
    """Send `sig` to each process that is still there."""
    for pid in pids:
        with suppress(ProcessLookupError):  # it died on its own
            os.kill(pid, sig)


def wait_for(port: int, ca: Path, until: float) -> None:
    """Until the SuperLink answers its health check over TLS (it takes seconds to start);
    LoopbackError after `until` (time.monotonic)."""
    trusted = ssl.create_default_context(cafile=str(ca))
    while True:
        with (
            suppress(OSError),
            urllib.request.urlopen(
                f"https://127.0.0.1:{port}/health", timeout=1, context=trusted
            ) as answer,
        ):
            if answer.status == 200:
                return
        if time.monotonic() > until:
            raise LoopbackError(f"no SuperLink on port {port}")
        time.sleep(0.2)
