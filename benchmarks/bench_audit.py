"""Seconds of a two-world canary audit: the simulator's stacked trials vs one at a time.

    .venv/bin/python benchmarks/bench_audit.py [--json] [--trials N] [--rounds R]

Logs go to stderr; with `--json` stdout carries exactly one JSON object, otherwise a table.
One process, one torch thread (the simulator's `threads=1`); both ways run the same audit
(`dpfl.audit.two_worlds.two_world_audit`) side by side in this run, so a busy machine slows
them alike. The default run takes about 6 minutes on 2 busy CPUs, nearly all of it one
trial at a time.

Workload (the README's study): scikit-learn's breast-cancer table over 3 hospitals
(`iid_stratified`, seed 0; about 152 training records each, declared public sizes),
DP FedAvg on logistic regression (C = 1, σ = 1, learning rate 1, expected batch 16, one
local epoch a round: 10 Poisson steps), `--rounds` rounds (default 3), a Dirac gradient
canary (magnitude 1000·C) in hospital 0, `--trials` trials per world (default 1,000: 500
choose the test, 500 bound it).

- `stacked`: each world is one `simulate` call with `RunPlan(trials=N)`, every trial's hospital
  work one stacked computation;
- `one_at_a_time`: the same audit with `per_run=1`: N `simulate` calls with `RunPlan(trials=1)` a
  world (other seeds, so other draws of the same distribution).

Figures: `stacked_s`, `one_at_a_time_s` (wall clock, `time.perf_counter`), `ratio`
(one at a time over stacked), each way's ε lower bound and the ledger's ε (the bounds
differ only by chance), `loadavg_start`, `loadavg_end` (1-minute load).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from typing import Any

import dpfl
from bench_common import log_to_stderr
from dpfl.audit.canaries import dirac_canaries
from dpfl.audit.two_worlds import two_world_audit
from dpfl.data import partition, preprocess, public_tables

log = logging.getLogger("bench_audit")


def measure(trials: int, rounds: int) -> dict[str, Any]:
    data = preprocess.scale_to_ranges(
        public_tables.breast_cancer_wisconsin(), public_tables.WDBC_RANGES
    )
    silos = dpfl.silos_from_dataset(data, partition.iid_stratified(data.labels, 3, seed=0))
    fedavg = dpfl.algorithms.FedAvg(
        model=dpfl.models.logistic_regression(30),
        loss=dpfl.local.bce,
        dpsgd=dpfl.DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=1.0),
    )
    canary = dirac_canaries(silos[0], 1, 1000.0)[0]
    figures: dict[str, Any] = {"trials": trials, "rounds": rounds, "silos": len(silos)}
    for way, per_run in (("stacked", None), ("one_at_a_time", 1)):
        log.info("%s: %d trials per world ...", way, trials)
        began = time.perf_counter()
        audit = two_world_audit(
            fedavg, silos, canary, rounds=rounds, trials=trials, per_run=per_run
        )
        figures[f"{way}_s"] = time.perf_counter() - began
        figures[f"{way}_epsilon_lower"] = audit.epsilon_lower
        figures["epsilon_ledger"] = audit.epsilon_ledger
        log.info("%s: %.1f s", way, figures[f"{way}_s"])
    figures["ratio"] = figures["one_at_a_time_s"] / figures["stacked_s"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--trials", type=int, default=1000, help="trials per world (≥ 4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the study")
    args = parser.parse_args()
    log_to_stderr(log)
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting's RDP convergence notes
    figures = {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()[0]}
    figures |= measure(args.trials, args.rounds)
    figures["loadavg_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(figures))
        return
    print(f"{'':<14} {'seconds':>9} {'ε lower bound':>14}")
    for way in ("stacked", "one_at_a_time"):
        print(f"{way:<14} {figures[f'{way}_s']:>9.1f} {figures[f'{way}_epsilon_lower']:>14.3f}")
    print(f"ratio          {figures['ratio']:>9.1f}×   (one at a time / stacked)")
    for key in (
        "trials",
        "rounds",
        "silos",
        "epsilon_ledger",
        "cpus",
        "loadavg_start",
        "loadavg_end",
    ):
        print(f"{key:<14} {figures[key]}")


if __name__ == "__main__":
    main()
