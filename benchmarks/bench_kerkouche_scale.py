"""Rounds per second of DP FedAvg at Kerkouche et al.'s scale, on the synthetic EHR.

314 hospitals (sizes of their Table 4, ≈1.22M admissions, 24,428 sparse features), 3
hospitals sampled per round, their MLP 24,428→200→200→1 (4.9M parameters) on sparse input,
each sampled hospital running `--local-steps` Poisson DP-SGD steps at an expected batch
of 300 (σ = 1.08, C = 1): the shape of FL-STANDARD-DP in their experiments.

    .venv/bin/python benchmarks/bench_kerkouche_scale.py [--json] [--rounds N]

Figures: seconds to generate the data and build the silos and the process's peak
resident memory then (the goal: under 4 GB), seconds per round (the median time from one
round's end to the next: the run's set-up of 314 accounts and plans is not a round's)
and rounds per second of the simulator, with seeded research noise and, separately,
secure noise, each whole run's seconds (`*_run_s`), and the peak resident memory at the
end.

The machine's limit for one round, measured here in the same process: each of the
round's hospitals × local steps draws one Gaussian value per parameter and writes each
parameter once (an axpy), and the server adds the hospitals' updates and applies them
(hospitals + 1 axpys). Its draws cost `torch.Tensor.normal_` seeded, and for secure
noise the AES-256-CTR keystream (16 bytes a value) plus the Box–Muller math of four normals
a value (`bench_local.py --sections noise`); `*_over_limit_ratio` is a round's time over
that limit. Everything else a round does (gradients, batches, bookkeeping) is what the
ratio's excess measures.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dpfl.allocator import keep_freed_memory
from dpfl.data.synthetic import synthetic_ehr
from dpfl.engines.simulation import simulate
from dpfl.federation.algorithms import FedAvg
from dpfl.federation.silo import SiloInfo, silos_from_dataset
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import bce
from dpfl.models import mlp

sys.path.insert(0, str(Path(__file__).parent))
from bench_local import box_muller_math, keystream


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--local-steps", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # as the simulator runs (its `threads`), limits too
    kept = keep_freed_memory()  # as the dpfl command runs (dpfl.allocator)

    start = time.perf_counter()
    data = synthetic_ehr(0)
    hospitals = int(data.site_ids.max()) + 1 if data.site_ids is not None else 0
    parts = [
        (data.site_ids == h).nonzero()[0]  # type: ignore[union-attr]
        for h in range(hospitals)
    ]
    # Rounds only: the silos keep no test sets, so no evaluation is timed.
    silos = [
        dataclasses.replace(s, x_test=None, y_test=None)
        for s in silos_from_dataset(data, parts, seed=0)
    ]
    prepared = time.perf_counter() - start

    figures: dict[str, object] = {
        "hospitals": len(silos),
        "admissions": int(data.features.shape[0]),
        "features": int(data.features.shape[1]),
        "data_and_silos_s": round(prepared, 2),
        "data_and_silos_peak_rss_gb": _peak_rss_gb(),
        "memory_goal_gb": MEMORY_GOAL_GB,
        "freed_memory_kept": kept,
    }
    parameters = sum(p.numel() for p in mlp(data.features.shape[1]).parameters())
    limits = _limits(parameters, args.local_steps)
    figures["parameters"] = parameters
    for mode, research in (("seeded_noise", True), ("secure_noise", False)):
        algorithm = _FixedSteps(
            model=mlp(data.features.shape[1]),
            loss=bce,
            dpsgd=DPSGDConfig(clip_norm=1.0, noise_multiplier=1.08, learning_rate=0.05),
            expected_batch_size=300.0,
            clients_per_round=HOSPITALS_PER_ROUND,
            steps=args.local_steps,
        )
        with tempfile.TemporaryDirectory() as tmp:
            ends: list[float] = []  # when each round's exchange ended
            began = time.perf_counter()
            simulate(
                algorithm,
                silos,
                rounds=args.rounds,
                research_noise=research,
                progress=False,
                eval_every=10**9,
                ledger=Path(tmp) / "ledger.sqlite",
                observe=lambda *_, ends=ends: ends.append(time.perf_counter()),
            )
            figures[f"{mode}_run_s"] = round(time.perf_counter() - began, 2)
            per_round = statistics.median(b - a for a, b in itertools.pairwise(ends))
        figures[f"{mode}_seconds_per_round"] = round(per_round, 3)
        figures[f"{mode}_rounds_per_s"] = round(1 / per_round, 3)
        figures[f"{mode}_limit_s"] = round(limits[mode], 3)
        figures[f"{mode}_over_limit_ratio"] = round(per_round / limits[mode], 2)
    figures |= {f"limit_{k}_s": round(v, 4) for k, v in limits.items() if "noise" not in k}
    figures["peak_rss_gb"] = _peak_rss_gb()
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key:32s} {value}", file=sys.stdout)


HOSPITALS_PER_ROUND = 3
MEMORY_GOAL_GB = 4.0
"""Issue 18: the 1.22M-admission EHR and its silos in under 4 GB."""


@dataclasses.dataclass(frozen=True)
class _FixedSteps(FedAvg):
    """FedAvg whose sampled hospitals run `steps` DP-SGD steps each, whatever their size:
    the round of the issue's figures (3 hospitals × 5 steps)."""

    steps: int = 5

    def local_steps(self, silo: SiloInfo) -> int:
        return self.steps


def _limits(parameters: int, steps: int, repeats: int = 5) -> dict[str, float]:
    """The least a round can cost here: its draws and parameter writes (module docstring),
    each timed as the median of `repeats`, one thread, as the simulator runs."""
    values, target = torch.empty(parameters), torch.zeros(parameters)
    generator = torch.Generator().manual_seed(0)

    def median(run: Callable[[], object]) -> float:
        run()
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            run()
            times.append(time.perf_counter() - began)
        return statistics.median(times)

    draw = median(lambda: values.normal_(0.0, 1.0, generator=generator))
    axpy = median(lambda: target.add_(values, alpha=0.5))
    secure = median(keystream(parameters)) + median(box_muller_math(parameters))
    draws = HOSPITALS_PER_ROUND * steps
    writes = draws + HOSPITALS_PER_ROUND + 1
    return {
        "seeded_draw": draw,
        "secure_draw": secure,
        "axpy": axpy,
        "seeded_noise": draws * draw + writes * axpy,
        "secure_noise": draws * secure + writes * axpy,
    }


def _peak_rss_gb() -> float:
    """The process's peak resident memory so far (Linux reports it in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)


if __name__ == "__main__":
    main()
