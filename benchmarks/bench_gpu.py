"""DP-SGD on CUDA: dpfl's step on the GPU against the CPU and against Opacus on the GPU,
and one federated round (`RunPlan(device=...)`) on the GPU against the CPU.

    .venv/bin/python benchmarks/bench_gpu.py [--json] [--repeats N] [--device cuda]

Where torch sees no CUDA device it prints one line saying so and exits 0. The cases are
bench_local.py's dense ones (its pieces: (a) logistic regression, 240 features; (c) the
GroupNorm CNN on 28×28×3), each figure the median over repeats, after a warm-up.
`cuda_over_cpu_speedup` > 1: dpfl's step is faster on the GPU; `opacus_over_dpfl_time_ratio`
> 1: dpfl is faster than Opacus on the same GPU; `round.cuda_over_cpu_speedup`: a round of
FedAvg over 3 silos × 4 stacked trials (the study's path, training on the device, the
server half on the CPU). The noise is drawn on the CPU and copied (`dpfl.local.device`).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))  # bench_local's pieces

from bench_local import CONFIG, Case, _cases, _Counting, _opacus, _time
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import simulate
from dpfl.experiments.study.build import build_algorithm
from dpfl.experiments.study.config import StudyConfig
from dpfl.experiments.study.datasets import build_silos
from dpfl.local.dpsgd import DPSGD, parameters_of
from dpfl.local.noise import SeededNoise

DENSE_CASES = ("a", "c")


def dpfl_step(case: Case, device: str) -> Callable[[], int]:
    """dpfl's DP-SGD steps of `case` on `device` (seeded noise); returns examples seen."""
    dpsgd = DPSGD(case.model, case.loss, CONFIG, device=device)
    params = parameters_of(case.model)
    rng = np.random.default_rng(1)

    def run() -> int:
        sampler = _Counting(len(case.y), case.sample_rate, rng, public_size=len(case.y))
        dpsgd.run(params, (case.x, case.y), sampler, case.steps, noise=SeededNoise(0))
        _sync(device)
        return sampler.examples

    return run


def opacus_step(case: Case, device: str) -> Callable[[], int]:
    """bench_local's Opacus steps, with the model and records on `device`."""
    moved = dataclasses.replace(
        case,
        model=copy.deepcopy(case.model).to(device),
        x_dense=case.x_dense.to(device),
        y=case.y.to(device),
    )
    run = _opacus(moved)

    def synced() -> int:
        examples = run()
        _sync(device)
        return examples

    return synced


def federated_round(device: str) -> Callable[[], int]:
    """One round of FedAvg (3 silos, 4 trials stacked) on breast_cancer, training on
    `device`, as a study runs it; returns the records (a figure per record)."""
    config = StudyConfig.model_validate(
        {
            "rounds": 1,
            "trials": 4,
            "device": device,
            "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 3}},
            "model": {"kind": "mlp", "hidden": [64, 64]},
            "algorithm": {"name": "fedavg", "learning_rate": 0.5, "expected_batch_size": 32},
            "privacy": {"noise_multiplier": 1.0},
        }
    )
    silos = build_silos(config.data, config.seed)
    algorithm = build_algorithm(config, silos)

    def run() -> int:
        simulate(
            algorithm, silos, RunPlan(rounds=1, trials=4, progress=False, device=config.device)
        )
        _sync(device)
        return sum(s.size for s in silos)

    return run


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _median_rate(run: Callable[[], int], repeats: int) -> float:
    """Examples per second, the median over `repeats` calls after one warm-up."""
    run()
    return 1.0 / statistics.median(_time(run) for _ in range(repeats))


def figures(device: str, repeats: int, cases: tuple[str, ...] = DENSE_CASES) -> dict[str, float]:
    """Every figure and ratio, `device` against the CPU (the CPU against itself in the
    unit test that runs this path without CUDA)."""
    out: dict[str, float] = {}
    for case in (c for c in _cases() if c.name[0] in cases):
        on_device = _median_rate(dpfl_step(case, device), repeats)
        on_cpu = _median_rate(dpfl_step(case, "cpu"), repeats)
        opacus = _median_rate(opacus_step(case, device), repeats)
        out[f"{case.name}.dpfl_{device}_examples_per_s"] = round(on_device, 1)
        out[f"{case.name}.dpfl_cpu_examples_per_s"] = round(on_cpu, 1)
        out[f"{case.name}.opacus_{device}_examples_per_s"] = round(opacus, 1)
        out[f"{case.name}.cuda_over_cpu_speedup"] = round(on_device / on_cpu, 3)
        out[f"{case.name}.opacus_over_dpfl_time_ratio"] = round(on_device / opacus, 3)
    round_device = _median_rate(federated_round(device), repeats)
    round_cpu = _median_rate(federated_round("cpu"), repeats)
    out["round.cuda_over_cpu_speedup"] = round(round_device / round_cpu, 3)
    out["round.cuda_records_per_s"] = round(round_device, 1)
    out["round.cpu_records_per_s"] = round(round_cpu, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda", help="the CUDA device to measure")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        reason = "no CUDA device (torch.cuda.is_available() is False)"
        print(json.dumps({"skipped": reason}) if args.json else f"bench_gpu: skipped: {reason}")
        return
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    out: dict[str, float | str] = {
        "device": torch.cuda.get_device_name(torch.device(args.device)),
        "repeats": args.repeats,
        **figures(args.device, args.repeats),
    }
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:60s} {value}")


if __name__ == "__main__":
    main()
