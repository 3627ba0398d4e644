"""A DP step of large image models (issue 53): dpfl's ghost clipping vs a plain step vs Opacus.

    .venv/bin/python benchmarks/bench_large.py [--json] [--threads N] [--repeats N]
        [--batches 64,256] [--side 64] [--models resnet18_gn,vit] [--quick] [--no-cuda]

Logs go to stderr; with `--json` stdout carries exactly one JSON object, otherwise a table.

Models: `dpfl.models.large.resnet18_gn` (11.2 M parameters; at 64×64, ImageNet's 7×7
stride-2 stem and pooling, as the `resnet18_gn` kind builds it) and `vit` (2.7 M; 64
patches of 8×8 and a class token), 3-channel `--side`² inputs, 2 classes, random public
inputs (seed 0), cross-entropy. A step on one fixed batch of B examples:

- `plain`: forward, mean loss, `backward`, `torch.optim.SGD` step: non-private training.
- `dpfl`: `ClippedGradientSum` (the path dpfl picks: ghost clipping for these models,
  `dpfl.local.ghost`), Gaussian noise σ = 1 on the clipped sum (C = 1, `torch.randn`),
  divided by B, an SGD step on the parameters: DP-SGD's step.
- `dpfl_two_pass`: the same with ghost clipping's second backward pass instead of
  book-keeping (`GhostClipping(book_keeping=False)`): less memory, more time.
- `opacus`: Opacus 1.6 `GradSampleModuleFastGradientClipping` (ghost clipping) with
  `DPOptimizerFastGradientClipping`, σ = 1, C = 1; where it refuses the model, its
  vanilla `GradSampleModule` (per-sample gradients) with `DPOptimizer` (named in the
  output: `opacus_mode`).

Each runner runs in a process of its own (spawned), one after the other, `--threads`
torch threads (CPU): a warm-up step, then `--repeats` timed steps, median seconds.
Peak memory: on the CPU, the process's peak resident set (VmHWM) minus its resident set
just before the first step, so the model, the batch and torch itself are not counted;
on CUDA, `torch.cuda.max_memory_allocated` minus the allocated bytes before the first
step. On CUDA (skipped without one) the same runs on `cuda:0`.

Goals (issue 53, at batch 256): a DP step ≤ 1.3× a plain step's time and ≤ 1.5× its
peak memory; ≥ 1.2× faster than Opacus. Printed met or not, with the figures.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import multiprocessing
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

from bench_common import log_to_stderr
from dpfl.local.clipping import ClippedGradientSum
from dpfl.local.dpsgd import parameters_of
from dpfl.local.losses import cross_entropy
from dpfl.models import large

log = logging.getLogger("bench_large")

CLIP, SIGMA, LR = 1.0, 1.0, 0.1
GOALS = {
    "dp_over_plain_time": ("<=", 1.3),
    "dp_over_plain_memory": ("<=", 1.5),
    "opacus_over_dp_time": (">=", 1.2),
}
"""Issue 53's goals at batch 256."""
RUNNERS = ("plain", "dpfl", "dpfl_two_pass", "opacus")


def _model(name: str, side: int) -> nn.Module:
    torch.manual_seed(0)
    if name == "resnet18_gn":
        return large.resnet18_gn(3, 2, small_inputs=side <= 32)
    if name == "vit":
        return large.vit(3, side, 2)
    raise ValueError(f"no model {name!r}")


def _plain(model: nn.Module, x: Tensor, y: Tensor) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    def step() -> None:
        optimizer.zero_grad()
        cross_entropy(model(x), y).mean().backward()
        optimizer.step()

    return step


def _dpfl(model: nn.Module, x: Tensor, y: Tensor, book_keeping: bool) -> Callable[[], None]:
    clipped = ClippedGradientSum(model, cross_entropy)
    if clipped._ghost is not None:
        clipped._ghost.book_keeping = book_keeping
    params = parameters_of(model)
    mask = torch.ones(len(y), dtype=x.dtype, device=x.device)
    log.info("dpfl path: %s", "ghost" if clipped.ghost(x) else "vmap")

    def step() -> None:
        sums, _ = clipped(params, x, y, mask, CLIP)
        for name, p in params.items():
            noisy = sums[name].add_(torch.randn_like(p), alpha=SIGMA * CLIP)
            p.sub_(noisy, alpha=LR / len(y))

    return step


class _Loss(nn.Module):
    """Opacus' ghost clipping wants a criterion module with a `reduction` attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.reduction = "mean"

    def forward(self, out: Tensor, target: Tensor) -> Tensor:
        return cross_entropy(out, target)


def _opacus(model: nn.Module, x: Tensor, y: Tensor) -> tuple[Callable[[], None], str]:
    from opacus import GradSampleModule
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    kwargs: dict[str, Any] = {
        "noise_multiplier": SIGMA,
        "max_grad_norm": CLIP,
        "expected_batch_size": len(y),
    }
    try:
        ghost = GradSampleModuleFastGradientClipping(
            copy.deepcopy(model), max_grad_norm=CLIP, use_ghost_clipping=True
        )
        sgd = torch.optim.SGD(ghost.parameters(), lr=LR)
        ghost_opt = DPOptimizerFastGradientClipping(sgd, **kwargs)
        criterion = DPLossFastGradientClipping(ghost, ghost_opt, _Loss(), loss_reduction="mean")

        def ghost_step() -> None:
            ghost_opt.zero_grad()
            criterion(ghost(x), y).backward()
            ghost_opt.step()

        ghost_step()  # Opacus checks some layers only on the first pass
        return ghost_step, "ghost"
    except Exception as exc:
        log.info("opacus ghost clipping refused the model (%r): vanilla", exc)
    vanilla = GradSampleModule(copy.deepcopy(model))
    optimizer = DPOptimizer(torch.optim.SGD(vanilla.parameters(), lr=LR), **kwargs)

    def vanilla_step() -> None:
        optimizer.zero_grad()
        cross_entropy(vanilla(x), y).mean().backward()
        optimizer.step()

    return vanilla_step, "vanilla"


def _rss(field: str) -> int:
    """A field of /proc/self/status in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _measure(job: dict[str, Any]) -> dict[str, Any]:
    """One runner's step in this (spawned) process: median seconds, peak bytes."""
    warnings.filterwarnings("ignore", module="opacus")
    warnings.filterwarnings("ignore", message="Full backward hook")
    torch.set_num_threads(job["threads"])
    device = torch.device(job["device"])
    model = _model(job["model"], job["side"]).to(device)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(job["batch"], 3, job["side"], job["side"], generator=g).to(device)
    y = torch.randint(0, 2, (job["batch"],), generator=g).to(device)
    cuda = device.type == "cuda"
    mode = ""
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _rss("VmRSS")
    if job["runner"] == "plain":
        step = _plain(model, x, y)
    elif job["runner"].startswith("dpfl"):
        step = _dpfl(model, x, y, book_keeping=job["runner"] == "dpfl")
    else:
        step, mode = _opacus(model, x, y)
    step()  # warm-up
    times = []
    for _ in range(job["repeats"]):
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if cuda else _rss("VmHWM")
    return {"seconds": statistics.median(times), "peak_bytes": peak - before, "mode": mode}


def _run(job: dict[str, Any]) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        result: dict[str, Any] = pool.apply(_measure, (job,))
    return result


def _ratios(figures: dict[str, Any], key: str) -> dict[str, Any]:
    plain, dp, opacus = (figures[f"{key}.{r}"] for r in ("plain", "dpfl", "opacus"))
    return {
        "dp_over_plain_time": round(dp["seconds"] / plain["seconds"], 3),
        "dp_over_plain_memory": round(dp["peak_bytes"] / max(plain["peak_bytes"], 1), 3),
        "opacus_over_dp_time": round(opacus["seconds"] / dp["seconds"], 3),
        "opacus_over_dp_memory": round(opacus["peak_bytes"] / max(dp["peak_bytes"], 1), 3),
        "two_pass_over_plain_time": round(
            figures[f"{key}.dpfl_two_pass"]["seconds"] / plain["seconds"], 3
        ),
        "two_pass_over_plain_memory": round(
            figures[f"{key}.dpfl_two_pass"]["peak_bytes"] / max(plain["peak_bytes"], 1), 3
        ),
        "opacus_mode": opacus["mode"],
    }


def _met(ratios: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name, (sign, goal) in GOALS.items():
        value = ratios[name]
        met = value <= goal if sign == "<=" else value >= goal
        out[name] = f"{value} {sign} {goal}: {'met' if met else 'NOT met'}"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--side", type=int, default=64)
    parser.add_argument("--models", default="resnet18_gn,vit")
    parser.add_argument("--quick", action="store_true", help="batch 8, 32×32, 1 repeat")
    parser.add_argument("--no-cuda", action="store_true")
    args = parser.parse_args()
    log_to_stderr(log)
    batches = [8] if args.quick else [int(b) for b in args.batches.split(",")]
    side, repeats = (32, 1) if args.quick else (args.side, args.repeats)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and not args.no_cuda else [])
    if len(devices) == 1:
        log.info("no CUDA device: the GPU part is skipped")
    out: dict[str, Any] = {
        "threads": args.threads,
        "repeats": repeats,
        "side": side,
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg()[0],
    }
    table = []
    for device in devices:
        for model in args.models.split(","):
            for batch in batches:
                key = f"{device}.{model}.b{batch}"
                for runner in RUNNERS:
                    job = {
                        "device": device,
                        "model": model,
                        "batch": batch,
                        "side": side,
                        "runner": runner,
                        "threads": args.threads,
                        "repeats": repeats,
                    }
                    log.info("%s %s", key, runner)
                    out[f"{key}.{runner}"] = _run(job)
                ratios = _ratios(out, key)
                out[f"{key}.ratios"] = ratios
                if batch == max(batches):
                    out[f"{key}.goals"] = _met(ratios)
                table.append((key, {r: out[f"{key}.{r}"] for r in RUNNERS}, ratios))
    out["loadavg_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(out, indent=1))
        return
    load = f"load {out['loadavg_start']:.2f} → {out['loadavg_end']:.2f}"
    print(f"threads {args.threads}, side {side}, median of {repeats}; {load}")
    print(
        "| case | plain s | dp s | dp 2-pass s | opacus s | plain MiB | dp MiB | dp 2-pass MiB "
        "| opacus MiB | dp/plain time | dp/plain mem | 2-pass/plain time | 2-pass/plain mem "
        "| opacus/dp time | opacus |"
    )
    print("|---" * 16 + "|")
    for key, runs, r in table:
        secs = " | ".join(f"{runs[n]['seconds']:.3f}" for n in RUNNERS)
        mib = " | ".join(f"{runs[n]['peak_bytes'] / 2**20:.0f}" for n in RUNNERS)
        columns = (
            "dp_over_plain_time",
            "dp_over_plain_memory",
            "two_pass_over_plain_time",
            "two_pass_over_plain_memory",
            "opacus_over_dp_time",
            "opacus_mode",
        )
        print(f"| {key} | {secs} | {mib} | " + " | ".join(str(r[k]) for k in columns) + " |")
    for key, value in out.items():
        if key.endswith(".goals"):
            print(
                f"goals at {key[: -len('.goals')]}: "
                + "; ".join(f"{k} {v}" for k, v in value.items())
            )


if __name__ == "__main__":
    main()
