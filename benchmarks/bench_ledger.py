"""Many writers charging one ledger at once, with the ledger of a given commit and today's.

8 processes (`--writers`) share one ledger whose account already holds 1,000 events
(`--events`) of one 10-step Poisson Gaussian (q = 0.01, σ = 2, budget ε = 4); each calls
`can_afford` then `record` `--charges` times. `--load N` runs N busy processes beside
them (a machine shared with training runs). Prints, per ledger code, the charges a
second in total, the failures ("database is locked" and others) and whether ε stayed
within the budget. The old code is this module's file at `--before` (git show), loaded
from a temporary file: side by side in the same run, each on its own new ledger.

    .venv/bin/python benchmarks/bench_ledger.py --before 239fa49 --load 2
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from dpfl.privacy import events

EVENT = events.poisson_gaussian(0.01, 2.0, steps=10)
BUDGET, DELTA = 4.0, 1e-5


def _code(commit: str | None) -> ModuleType:
    """dpfl.privacy.ledger, today's or as it was at `commit`."""
    if commit is None:
        from dpfl.privacy import ledger

        return ledger
    text = subprocess.run(
        ["git", "show", f"{commit}:src/dpfl/privacy/ledger.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    file = Path(tempfile.mkdtemp()) / f"ledger_{commit}.py"
    file.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"ledger_{commit}", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _writer(commit: str | None, path: Path, charges: int, start: float, out) -> None:  # type: ignore[no-untyped-def]
    book = _code(commit).Ledger(path)
    while time.time() < start:
        time.sleep(0.01)
    done, failures = 0, []
    for _ in range(charges):
        try:
            if book.can_afford("a", EVENT):
                book.record("a", EVENT)
                done += 1
        except Exception as exc:  # counted, not raised: the figure is how many fail
            failures.append(str(exc).splitlines()[0][:120])
    out.put((done, failures, time.time()))


def _burn(stop: float) -> None:
    while time.time() < stop:
        sum(i * i for i in range(10_000))


def run(commit: str | None, writers: int, prior: int, charges: int, load: int) -> dict:
    folder = Path(tempfile.mkdtemp())
    path = folder / "ledger.sqlite"
    code = _code(commit)
    with code.Ledger(path) as book:
        book.register_silo("a", epsilon=BUDGET, delta=DELTA)
        book.record("a", events.repeat(EVENT, prior))  # one row for the 1,000 prior events
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    start = time.time() + 2.0
    burners = [context.Process(target=_burn, args=(start + 600,)) for _ in range(load)]
    procs = [
        context.Process(target=_writer, args=(commit, path, charges, start, out))
        for _ in range(writers)
    ]
    for p in burners + procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    for p in burners:
        p.terminate()
        p.join()
    with code.Ledger(path, create=False) as reader:
        spent = reader.spent("a").epsilon
    done = sum(r[0] for r in results)
    seconds = max(r[2] for r in results) - start
    return {
        "code": commit or "today",
        "charges": done,
        "per_second": done / seconds,
        "failures": sum(len(r[1]) for r in results),
        "why": sorted({w for r in results for w in r[1]}),
        "epsilon": spent,
        "within": spent <= BUDGET,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="the commit whose ledger to compare (git show)")
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--charges", type=int, default=20, help="per writer")
    parser.add_argument("--load", type=int, default=0, help="busy processes beside them")
    args = parser.parse_args()
    for commit in [args.before, None] if args.before else [None]:
        r = run(commit, args.writers, args.events, args.charges, args.load)
        print(
            f"{r['code']:>10}: {r['charges']} charges, {r['per_second']:.2f}/s in total, "
            f"{r['failures']} failures {r['why']}, ε {r['epsilon']:.4f} "
            f"{'within' if r['within'] else 'PAST'} the budget {BUDGET}",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
