"""Seconds a round and bytes on the wire of a study deployed on loopback, vs bare Flower.

    .venv/bin/python benchmarks/bench_deploy.py [--json] [--quick] [--rounds N]

Logs go to stderr; with `--json` stdout carries exactly one JSON object, otherwise a table.

The study: DP-FedAvg on breast_cancer as tests/engines/test_flower.py deploys it
(learning rate 2, expected batch 16, one local epoch, σ = 1, seed 3), IID over K = 3 and
K = 10 hospitals, `--rounds` rounds (default 4; `--quick`: K = 3 only, 3 rounds), each
hospital with the simulator's seeded noise (research noise), so that the deployed model
must equal the simulator's bit for bit (`same_model`, a check that both ran the same
study) and with a budget of ε = 100 that no round exceeds.

Deployment: `dpfl.engines.flower.loopback.cluster`, a SuperLink and K SuperNodes (Flower's
`process` isolation mode, each served by one warm ClientApp process,
`dpfl.engines.flower.clientapp`) as separate processes on 127.0.0.1, TLS with a CA made
on the spot, SuperNode keys registered, the ClientApp processes asking for tasks every
0.1 s. The SuperNodes connect to the SuperLink through a relay in this process (`Relay`:
threads forwarding TCP bytes both ways and logging each chunk's time, direction and
size); TLS stays end to end through it, so it counts what crosses a network: TLS
records, HTTP/2 framing, Flower's protobufs, heartbeats and polls, the app bundle and
the messages. `flwr run` and key registration talk to the SuperLink directly and are
not counted. On that cluster, first a bare Flower app (`BARE_MODULE`: a ServerApp that
each round sends every SuperNode as many bytes as dpfl's model message carries and a
ClientApp that echoes them, pulling every 0.1 s as dpfl's server does), then `dpfl
deploy server` of the study.

Seconds per round, without start-up. dpfl: each hospital's ledger records, with the
wall clock, when it was charged for each round, as it trains; round r's time is the
latest charge of round r over the hospitals, and `deploy_s_per_round` is (t_last −
t_first) / (rounds − 1): steady-state rounds, without processes starting, hello, the
budget check and the final evaluation. `bare_s_per_round`: the same of the bare app's
round ends: Flower's own floor (an idle SuperNode sleeps 3 s between pulls and polls
for its reply every 0.5 s, hard-coded in Flower 1.42), the wire and the dispatch.
`deploy_over_bare` their ratio, `dpfl_s_per_round` their difference: dpfl's own part of
a round (reading the study and records, the budget check, training, the ledger, the
hospital's state file, the server's aggregation and checkpoint). `cold_start_s`: a new
Python process importing Flower's ClientApp and dpfl's app, what Flower's default
isolation pays every message and the warm ClientApp process pays once.
`deploy_total_s`: the whole cluster, start-up, both apps and shut-down included.
`simulate_s_per_round`: `simulate` of the same study in this process, evaluation after
the last round only as in the deployment, (T(21 rounds) − T(1 round)) / 20: its rounds
take milliseconds, too few to time over 3 on a busy machine; every T is the median of 5
runs after an untimed one (which pays the ε of a plan of that length; dpfl memoises
it). `simulate_run_s`: T(rounds), the study's whole simulation with its budget check,
ledger and evaluation. `deploy_over_simulate`: the two seconds per round's ratio.

Bytes per round: the relay's bytes up (SuperNodes to SuperLink) and down in the same
window (t_first, t_last], over rounds − 1, against dpfl's own accounting, the
simulator's message rows (`SimulationResult.messages`: each model sent down and each
reply up, `messages.payload_bytes` of their encodings; 31 float32 parameters, 124 bytes
each way per hospital); `wire_over_dpfl` the ratio (up + down). `bare_wire_bytes`: the
bare app's bytes (up + down) per round in its own window: what Flower moves for the
same 124 bytes each way, the rest of dpfl's figure is dpfl's own fields.

The server's wall time outside its rounds (`outside.*_s`, a second table), from when each
line of `dpfl deploy server`'s output arrived, the results store's start and finish
times and the command's exit (`outside_rounds`): the command until it starts `flwr
run`, the submission until the ServerApp's `main` starts, the hellos, the hospitals'
plan checks, the final evaluation, the writing of the result, and the shut-down; with
`server_s`, the command's whole wall time, the rest is the rounds.

Every figure depends on the machine's load: the cores and the 1-minute load average
(/proc/loadavg's first field) at the start and the end are printed beside the figures
(and in the JSON: `cpus`, `loadavg_start`, `loadavg_end`).

Figures and the command: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import torch

from bench_common import log_to_stderr
from dpfl.engines.flower import DeploymentResult, loopback
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import SimulationResult, simulate
from dpfl.experiments.study.build import build_algorithm
from dpfl.experiments.study.datasets import build_silos
from dpfl.experiments.study.deployment import study_point
from dpfl.experiments.study.point import STORE
from dpfl.federation.algorithms.base import flat
from dpfl.local.dpsgd import parameters_of
from dpfl.privacy import Ledger

log = logging.getLogger("bench_deploy")
Lines = list[tuple[float, str]]
"""Output lines, each with the wall clock it came at."""

STUDY = """
name = "deployed"
seed = 3
rounds = {rounds}
[data]
dataset = "breast_cancer"
partition = {{ kind = "iid", silos = {silos} }}
[algorithm]
name = "fedavg"
learning_rate = 2.0
expected_batch_size = 16
local_epochs = 1.0
[privacy]
noise_multiplier = 1.0
epsilon = 100.0
"""
EPSILON, DELTA = 100.0, 1e-5
HOSPITALS = (3, 10)
LONG, REPEATS = 20, 5
"""The simulator's rounds take milliseconds: too little to time 3 of on a busy machine, so
its steady round is timed over LONG more rounds, and every time is the median of REPEATS."""


BARE_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "bare-echo"
version = "1.0.0"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "bench"

[tool.flwr.app.components]
serverapp = "bare_echo:server"
clientapp = "bare_echo:client"

[tool.flwr.app.config]
rounds = 3
nodes = 3
size = 124
out = ""
"""
BARE_MODULE = """\
\"\"\"A bare Flower app: each round the ServerApp sends every SuperNode `size` bytes and
waits for all to echo them, pulling every 0.1 s as dpfl's server does; it writes when
each round ended (wall clock, JSON) to `out`.\"\"\"

import json
import time
from pathlib import Path

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

client = ClientApp()
server = ServerApp()


@client.train()
def echo(message, context):
    return Message(RecordDict({"echo": message.content.config_records["echo"]}), reply_to=message)


@server.main()
def main(grid, context):
    config = context.run_config
    while len(nodes := list(grid.get_node_ids())) < int(config["nodes"]):
        time.sleep(0.1)
    ended = []
    for _ in range(int(config["rounds"])):
        content = {"echo": ConfigRecord({"params": bytes(int(config["size"]))})}
        sent = [Message(RecordDict(content), dst_node_id=n, message_type="train") for n in nodes]
        waiting = set(grid.push_messages(sent))
        while waiting:
            time.sleep(0.1)
            waiting -= {r.metadata.reply_to_message_id for r in grid.pull_messages(list(waiting))}
        ended.append(time.time())
    Path(str(config["out"])).write_text(json.dumps(ended))
"""


class Relay:
    """A TCP relay on 127.0.0.1 to the SuperLink's `upstream` port: forwards bytes both
    ways untouched and logs (time, "up" or "down", bytes) of every chunk."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.chunks: list[tuple[float, str, int]] = []
        self.connections = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._connection, args=(client,), daemon=True).start()

    def _connection(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(("127.0.0.1", self.upstream))
        except OSError:  # the SuperLink is down (being stopped): refuse the SuperNode too
            client.close()
            return
        with self._lock:
            self.connections += 1
        with client, server:
            up = threading.Thread(target=self._pump, args=(client, server, "up"), daemon=True)
            up.start()
            self._pump(server, client, "down")
            up.join()

    def _pump(self, source: socket.socket, sink: socket.socket, direction: str) -> None:
        with suppress(OSError):  # a side reset the connection: it is over
            while data := source.recv(1 << 16):
                sink.sendall(data)
                with self._lock:
                    self.chunks.append((time.time(), direction, len(data)))
        with suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def bytes(self, after: float = 0.0, until: float = float("inf")) -> dict[str, int]:
        """Bytes up and down relayed in the wall-clock window (after, until]."""
        with self._lock:
            chunks = list(self.chunks)
        return {
            way: sum(n for t, d, n in chunks if d == way and after < t <= until)
            for way in ("up", "down")
        }

    def close(self) -> None:
        self.listener.close()


@contextmanager
def relay(upstream: int) -> Iterator[Relay]:
    running = Relay(upstream)
    try:
        yield running
    finally:
        running.close()


def round_times(nodes: dict[str, dict[str, Any]], rounds: int) -> list[float]:
    """When each round was last charged at a hospital (wall clock, from their ledgers;
    the DP evaluation's release, of no round, left out)."""
    times: list[list[float]] = [[] for _ in range(rounds)]
    for name, node in nodes.items():
        with Ledger(Path(node["ledger"]), create=False) as book:
            for entry in book.entries(f"{name}/trial-0"):
                if entry.round is not None:
                    times[entry.round].append(entry.recorded_at)
    return [max(t) for t in times]


def simulated(study: Path, rounds: int, folder: Path) -> tuple[float, SimulationResult]:
    """`simulate` of the study cut to `rounds` rounds: seconds and result."""
    config = study_point(study)
    silos = build_silos(config.data, config.seed)
    algorithm = build_algorithm(config, silos)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        start = time.perf_counter()
        result = simulate(
            algorithm,
            silos,
            RunPlan(
                rounds=rounds,
                seed=config.seed,
                epsilon=EPSILON,
                delta=DELTA,
                progress=False,
                eval_every=rounds,
            ),
            ledger=Path(tmp) / "ledger.sqlite",
        )
        return time.perf_counter() - start, result


def time_simulator(
    study: Path, rounds: int, root: Path
) -> tuple[dict[str, float], SimulationResult]:
    """The simulator's steady round, (T(1 + LONG) − T(1)) / LONG, and its whole run of
    the study's rounds (`simulate_run_s`), each T the median of REPEATS runs after an
    untimed one (which pays the ε of a plan of that length, memoised after); and the
    result of the study's rounds."""
    seconds, results = {}, {}
    for n in (1, rounds, 1 + LONG):
        _, results[n] = simulated(study, n, root)
        seconds[n] = statistics.median(simulated(study, n, root)[0] for _ in range(REPEATS))
    per_round = (seconds[1 + LONG] - seconds[1]) / LONG
    return {"simulate_s_per_round": per_round, "simulate_run_s": seconds[rounds]}, results[rounds]


def measure(silos: int, rounds: int, root: Path) -> dict[str, Any]:
    """The deployment and the simulator of the study with `silos` hospitals, side by side."""
    root.mkdir()
    study = root / "study.toml"
    study.write_text(STUDY.format(rounds=rounds, silos=silos), encoding="utf-8")
    config = study_point(study)
    nodes = {
        silo.name: loopback.hospital_node(
            silo, study, root / "hospitals" / silo.name, epsilon=EPSILON, delta=DELTA
        )
        for silo in build_silos(config.data, config.seed)
    }
    loopback.pin_roster(study, nodes)
    size = (
        4
        * flat(
            parameters_of(build_algorithm(config, build_silos(config.data, config.seed)).model)
        ).numel()
    )
    port, out = loopback.free_port(), root / "server-out"
    start = time.perf_counter()
    with (
        relay(port) as wire,
        loopback.cluster(nodes, root, port=port, fleet=wire.address) as running,
    ):
        ended = bare(running, root / "bare", silos, rounds, int(size))
        bare_window = wire.bytes(ended[0], ended[-1])
        command = running.server(
            study, out, "--wait", str(60 + 10 * silos), "--timeout", str(60 + 20 * silos)
        )
        lines, began, ended_at = stamped(command, running.env, 300 + 120 * silos)
    total_s = time.perf_counter() - start
    output = "\n".join(line for _, line in lines)
    if not (out / "result.pt").exists():
        raise RuntimeError(f"the deployment of {silos} hospitals wrote no result:\n{output}")
    deployed = DeploymentResult.load(out)
    if deployed.rounds_completed != rounds or deployed.refused:
        raise RuntimeError(f"the deployment of {silos} hospitals stopped early:\n{output}")
    times = round_times(nodes, rounds)
    window = wire.bytes(times[0], times[-1])
    deploy_s = (times[-1] - times[0]) / (rounds - 1)
    bare_s = (ended[-1] - ended[0]) / (rounds - 1)
    outside = outside_rounds(lines, began, ended_at, out)
    log.info(
        "k=%d: deployed %d rounds, %.2f s a round (bare Flower: %.2f s), %.1f s all told; "
        "the server's %.1f s outside its rounds: %s (load %.2f on %d cores)",
        silos,
        rounds,
        deploy_s,
        bare_s,
        total_s,
        sum(outside.values()),
        ", ".join(f"{name} {s:.1f}" for name, s in outside.items()),
        os.getloadavg()[0],
        os.cpu_count(),
    )

    simulator, result = time_simulator(study, rounds, root)
    log.info("k=%d: simulated %.4f s a round", silos, simulator["simulate_s_per_round"])
    dpfl_bytes = {way: sum(row[way] for row in result.messages) / rounds for way in ("up", "down")}
    wire_bytes = {way: window[way] / (rounds - 1) for way in ("up", "down")}
    return {
        "deploy_s_per_round": deploy_s,
        "bare_s_per_round": bare_s,
        "deploy_over_bare": deploy_s / bare_s,
        "dpfl_s_per_round": deploy_s - bare_s,
        **simulator,
        "deploy_over_simulate": deploy_s / simulator["simulate_s_per_round"],
        "cold_start_s": cold_start(),
        "deploy_total_s": total_s,
        "server_s": ended_at - began,
        **{f"outside.{name}_s": seconds for name, seconds in outside.items()},
        "wire_up_bytes_per_round": wire_bytes["up"],
        "wire_down_bytes_per_round": wire_bytes["down"],
        "dpfl_up_bytes_per_round": dpfl_bytes["up"],
        "dpfl_down_bytes_per_round": dpfl_bytes["down"],
        "wire_over_dpfl": sum(wire_bytes.values()) / sum(dpfl_bytes.values()),
        "bare_wire_bytes_per_round": sum(bare_window.values()) / (rounds - 1),
        "wire_total_bytes": sum(wire.bytes().values()),
        "connections": wire.connections,
        "same_model": all(
            torch.equal(deployed.params[name], value[0]) for name, value in result.params.items()
        ),
    }


def stamped(command: list[str], env: dict[str, str], timeout: float) -> tuple[Lines, float, float]:
    """Run `dpfl deploy server`: each line of its output (the ServerApp's log streamed by
    `flwr run`) with the wall clock it came at, and when it started and exited."""
    lines: Lines = []
    began = time.time()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
    )
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    assert process.stdout is not None
    for line in process.stdout:
        lines.append((time.time(), line.rstrip("\n")))
    process.wait()
    timer.cancel()
    return lines, began, time.time()


def outside_rounds(lines: Lines, began: float, ended: float, out: Path) -> dict[str, float]:
    """Where the server's wall time outside its rounds went, in seconds: `cli`, `dpfl
    deploy server` until it starts `flwr run` (Python, imports, the study's checks);
    `submit`, from then until the ServerApp's `main` recorded its start in the results
    store (`flwr run`, the app bundle, the SuperLink's SuperExec, the ServerApp process
    and its imports: `cold_start_s` is about those imports); from the ServerApp's `time:`
    line, `hellos`, `plans` (calibration, each hospital's plan check) and `evaluation`;
    `writing`, the rest of `main` (the results store, result.pt); `shutdown`, from the
    store's finish to the command's exit (the ServerApp process ending, `flwr run` seeing
    it, the command's check of the result)."""
    flwr = next(t for t, line in lines if line.split(" ", 1)[0].endswith("/flwr"))
    laps = next(line for _, line in lines if "time: " in line).split("time: ", 1)[1]
    phases = {
        name: float(s.rstrip("s")) for name, s in (p.rsplit(" ", 1) for p in laps.split(", "))
    }
    with sqlite3.connect(out / STORE) as db:
        started, finished = db.execute("SELECT started_at, finished_at FROM runs").fetchone()
    return {
        "cli": flwr - began,
        "submit": started - flwr,
        "hellos": phases["hellos"],
        "plans": phases["calibration and plans"],
        "evaluation": phases["evaluation"],
        "writing": finished - started - sum(phases.values()),
        "shutdown": ended - finished,
    }


def bare(
    running: loopback.Cluster, folder: Path, silos: int, rounds: int, size: int
) -> list[float]:
    """Run the bare Flower app (`BARE_MODULE`) on the cluster: when each round ended."""
    app, home, ended = folder / "app", folder / "home", folder / "ended.json"
    app.mkdir(parents=True)
    home.mkdir()
    (app / "pyproject.toml").write_text(BARE_PYPROJECT, encoding="utf-8")
    (app / "bare_echo.py").write_text(BARE_MODULE, encoding="utf-8")
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "bench"\n\n[superlink.bench]\n'
        f'address = "127.0.0.1:{running.port}"\nroot-certificates = "{running.ca}"\n',
        encoding="utf-8",
    )
    config = f'rounds={rounds} nodes={silos} size={size} out="{ended}"'
    done = subprocess.run(
        [str(loopback.BIN / "flwr"), "run", str(app), "bench", "--stream", "--run-config", config],
        env={**running.env, "FLWR_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120 + 30 * silos * rounds,
    )
    if not ended.exists():
        raise RuntimeError(f"the bare Flower app failed:\n{done.stdout}{done.stderr}")
    times: list[float] = json.loads(ended.read_text())
    return times


def cold_start() -> float:
    """Seconds a new ClientApp process spends importing Flower's ClientApp and dpfl's
    app before it can answer: what Flower's default isolation pays every message."""
    began = time.perf_counter()
    imports = "import flwr.clientapp, dpfl.experiments.study.deployment"
    subprocess.run([sys.executable, "-c", imports], check=True)
    return time.perf_counter() - began


def _table(figures: dict[str, Any]) -> str:
    """One row per K, the figures side by side."""
    columns = [
        ("K", "{}"),
        ("deploy_s_per_round", "{:.2f}"),
        ("bare_s_per_round", "{:.2f}"),
        ("deploy_over_bare", "{:.2f}"),
        ("dpfl_s_per_round", "{:.2f}"),
        ("cold_start_s", "{:.1f}"),
        ("simulate_s_per_round", "{:.4f}"),
        ("deploy_over_simulate", "{:.0f}"),
        ("simulate_run_s", "{:.2f}"),
        ("wire_up_bytes_per_round", "{:.0f}"),
        ("wire_down_bytes_per_round", "{:.0f}"),
        ("dpfl_up_bytes_per_round", "{:.0f}"),
        ("dpfl_down_bytes_per_round", "{:.0f}"),
        ("wire_over_dpfl", "{:.0f}"),
        ("bare_wire_bytes_per_round", "{:.0f}"),
        ("deploy_total_s", "{:.1f}"),
        ("same_model", "{}"),
    ]
    outside = [("K", "{}"), ("server_s", "{:.1f}")]
    outside += [(name, "{:.1f}") for name in figures[f"k{figures['hospitals'][0]}"] if "." in name]
    return f"{_rows(figures, columns)}\n\nthe server's seconds outside its rounds\n" + _rows(
        figures, outside
    )


def _rows(figures: dict[str, Any], columns: list[tuple[str, str]]) -> str:
    rows = [[name.removesuffix("_per_round").removeprefix("outside.") for name, _ in columns]]
    for k in figures["hospitals"]:
        case = {"K": k, **figures[f"k{k}"]}
        rows.append([form.format(case[name]) for name, form in columns])
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--quick", action="store_true", help="3 hospitals only, 3 rounds")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of the study (≥ 2)")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    if rounds < 2:
        parser.error("--rounds must be at least 2: a round's time is between two rounds")
    log_to_stderr(log)
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting's RDP convergence notes
    missing = loopback.missing_binaries()
    if missing:
        raise SystemExit(f"Flower's {', '.join(missing)} are not installed in {loopback.BIN}")

    hospitals = HOSPITALS[:1] if args.quick else HOSPITALS
    figures: dict[str, Any] = {
        "rounds": rounds,
        "hospitals": list(hospitals),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg()[0],  # /proc/loadavg's first field
    }
    with tempfile.TemporaryDirectory(prefix="bench-deploy-") as tmp:
        for k in hospitals:
            figures[f"k{k}"] = measure(k, rounds, Path(tmp) / f"k{k}")
    figures["loadavg_end"] = os.getloadavg()[0]

    if args.json:
        flat = {k: v for k, v in figures.items() if not k.startswith("k")}
        for k in hospitals:
            flat |= {f"k{k}.{name}": v for name, v in figures[f"k{k}"].items()}
        print(json.dumps(flat))
        return
    print(_table(figures))
    print(
        f"rounds {rounds}; measured on {figures['cpus']} cores at a 1-minute load average "
        f"of {figures['loadavg_start']:.2f} at the start, {figures['loadavg_end']:.2f} at "
        "the end (/proc/loadavg): figures under another load differ"
    )


if __name__ == "__main__":
    main()
