"""How long the commands that train nothing take to start, each in a fresh interpreter.

For each command: its start (the command with `--help`: the interpreter, dpfl's imports
and the parsing of its arguments, all that comes before its own work) and the whole
command, as the median over `--runs` runs of wall and CPU seconds (user + system, of the
child). Beside them, the floor of the ε commands: importing dp_accounting, which they
need to compute an ε. Fails (exit status 1) if a command's start, or the whole of a
command that computes no ε (`--help`, `init`), takes more than `--limit` CPU seconds:
CPU, not wall, because on a machine shared with other work the wall time is mostly the
wait for a core.

    .venv/bin/python benchmarks/bench_startup.py
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dpfl.privacy import Ledger, events


def _run(command: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of `command`, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu


def _median(command: Callable[[int], list[str]], runs: int) -> dict[str, float]:
    _run(command(-1))  # warm the file cache
    times = [_run(command(i)) for i in range(runs)]
    return {
        "wall": statistics.median(w for w, _ in times),
        "cpu": statistics.median(c for _, c in times),
    }


def _commands(folder: Path) -> dict[tuple[str, ...], tuple[list[str], bool]]:
    """Each command's words, its arguments, and whether it computes an ε (and so needs
    dp_accounting)."""
    ledger = folder / "study.sqlite"
    with Ledger(ledger) as book:
        book.register_silo("hospital-a", epsilon=1.0, delta=1e-5, size=5000)
        book.record("hospital-a", events.poisson_gaussian(0.01, 1.0, steps=50), round=0)
    table = folder / "cohort.csv"
    table.write_text("age,sex,label\n1.5,f,0\n2.5,m,1\n")
    return {
        (): ([], False),  # dpfl --help
        ("init",): ([str(table), "--label", "label", "--out"], False),  # --out: a new file
        ("privacy", "epsilon"): (["-s", "1", "-q", "0.01", "-T", "1000", "-d", "1e-5"], True),
        ("privacy", "calibrate"): (["-e", "1", "-d", "1e-5", "-q", "0.01", "-T", "1000"], True),
        ("privacy", "max-steps"): (["-e", "1", "-d", "1e-5", "-q", "0.01", "-s", "1"], True),
        ("privacy", "node-level"): (["-s", "1", "-b", "64", "-n", "10000", "-S", "4"], True),
        ("privacy", "ledger"): ([str(ledger)], True),
        ("deploy", "status"): (["--ledger", str(ledger)], True),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="Runs of each command.")
    parser.add_argument("--limit", type=float, default=1.0, help="CPU seconds a start may take.")
    parser.add_argument("--json", action="store_true", help="Print one JSON object.")
    args = parser.parse_args()
    dpfl = [sys.executable, "-m", "dpfl.cli"]
    figures: dict[str, dict[str, float]] = {}
    slow = []
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        floor = _median(lambda _: [sys.executable, "-c", "import dp_accounting"], args.runs)
        for words, (arguments, needs_epsilon) in _commands(folder).items():
            name = " ".join(("dpfl", *words)) if words else "dpfl --help"

            def whole(
                i: int, words: tuple[str, ...] = words, arguments: list[str] = arguments
            ) -> list[str]:
                out = [str(folder / f"study-{i}.toml")] if arguments[-1:] == ["--out"] else []
                return [*dpfl, *words, *(arguments or ["--help"]), *out]

            start = _median(lambda _, words=words: [*dpfl, *words, "--help"], args.runs)
            full = _median(whole, args.runs)
            figures[name] = {
                **{f"start_{k}": v for k, v in start.items()},
                **{f"whole_{k}": v for k, v in full.items()},
            }
            if start["cpu"] > args.limit or (not needs_epsilon and full["cpu"] > args.limit):
                slow.append(name)
    if args.json:
        print(json.dumps({"import_dp_accounting": floor, "commands": figures, "slow": slow}))
    else:
        header = ("command", "start wall", "start cpu", "whole wall", "whole cpu")
        print(f"{header[0]:26}" + "".join(f"{h:>12}" for h in header[1:]))
        for name, f in figures.items():
            row = (f["start_wall"], f["start_cpu"], f["whole_wall"], f["whole_cpu"])
            print(f"{name:26}" + "".join(f"{v:11.2f}s" for v in row))
        shown = f"{floor['wall']:11.2f}s{floor['cpu']:11.2f}s"
        print(f"{'import dp_accounting':26}{'':24}{shown}  (what an ε command needs)")
        print(f"over {args.limit:g} CPU s: {', '.join(slow) or 'none'}")
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
