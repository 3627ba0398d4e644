"""Throughput of one silo's DP-SGD step: dpfl vs plain SGD vs Opacus, and stacked trials.

Measured side by side in one process, on the same batches and thread count, interleaved
so that a busy machine slows all three alike; each figure is the median over repeats.

    .venv/bin/python benchmarks/bench_local.py [--json] [--threads N] [--repeats N]
        [--sections steps,stacked,noise,methods] [--cases a,b,c] [--glibc-defaults]

Ratios: `dp_over_plain_time_ratio` is dpfl's DP step time over a plain SGD step (goal
≤ 2.5 for (a), (b); ≤ 1.25 for (c), issue 42); `opacus_over_dpfl_time_ratio` > 1 means
dpfl is faster (goal ≥ 1.3 for (c)); `secure_over_seeded_step_ratio` is the step with
`SecureNoise` over the step with `SeededNoise`. Each goal is printed beside its ratio
(`*_goal`, `*_met`). For (c), `plain_sgd_same_pooling` is the plain step with the
model's max poolings computed as dpfl's DP step computes them (channels-last,
`clipping._ChannelsLastMaxPool`), and `dp_over_same_pooling_plain_time_ratio` compares
the DP step with it: the cost of DP itself, with the faster pooling, which a plain step
could use too, credited to neither.

Cases (issue 4): (a) logistic regression, 240 features, batches of ~20; (b) Kerkouche's
MLP 24,428→200→200→1 on sparse input, batches of ~300; (c) the small GroupNorm CNN on
28×28×3, batches of ~64. Opacus gets dense input for (b) (its per-sample gradients do
not take sparse tensors) and runs in its ghost-clipping mode there, because its standard
mode would hold 300 × 4.9M per-sample gradients.

Noise (issue 18, `--sections noise`, about 15 s): one draw of the 4,926,201 float32
values of case (b)'s MLP, into a preallocated buffer as DP-SGD draws it, by `SecureNoise`
and `SeededNoise`, beside the parts that bound the secure draw from below, all measured
in each repeat: `keystream_gb_per_s`, the keystream (AES-256-CTR, `update_into` of zeros
into a reused buffer, in `SecureNoise`'s block size) producing the `keystream_bytes` a
draw consumes (16 bytes a value: four uniforms of 32-bit words), in `keystream_s`;
`box_muller_math_s`, NumPy's log2, sqrt, cos and sin over the four Box–Muller draws'
uniforms (the transcendental work any vectorised Box–Muller does, done as `SecureNoise`
does it since issue 42), in place over block-sized buffers; `limit_s` their sum.
`box_muller_math_torch_s` is the same work by torch's kernels (as before issue 42), and
`box_muller_math_torch_over_numpy_ratio` why NumPy's are used.
`secure_over_seeded_noise_ratio` (issue 18's goal: ≤ 1.3) and `secure_over_limit_ratio`
compare the draw with them; `before_s` is the implementation before issue 18 (kept here,
only, for this comparison). Every noise time is given as wall-clock (`*_s`) and as this
process's CPU time (`*_cpu_s`), which other processes on a busy machine disturb less;
ratios of both.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from torch import Tensor, nn
from torch.nn.grad import conv2d_weight

from dpfl.allocator import keep_freed_memory
from dpfl.data.sampling import PoissonSampler
from dpfl.local.clipping import _ChannelsLastMaxPool, _conv_weight_gradients
from dpfl.local.dpsgd import DPSGD, DPSGDConfig, parameters_of, stack
from dpfl.local.losses import Loss, bce, cross_entropy
from dpfl.local.noise import BLOCK_BYTES, NoiseSource, SecureNoise, SeededNoise
from dpfl.local.noise import keystream as noise_keystream
from dpfl.models import logistic_regression, mlp, small_cnn

CONFIG = DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0, learning_rate=0.05)


@dataclass
class Case:
    name: str
    model: nn.Module
    loss: Loss
    x: Tensor  # what dpfl and plain SGD read (sparse for the MLP)
    x_dense: Tensor  # what Opacus reads
    y: Tensor
    sample_rate: float
    steps: int
    opacus_mode: str = "hooks"


def _cases() -> list[Case]:
    g = torch.Generator().manual_seed(0)
    cases = []
    x = torch.randn(1000, 240, generator=g)
    cases.append(
        Case("a_logreg_240", logistic_regression(240), bce, x, x, (x[:, 0] > 0).float(), 0.02, 200)
    )
    n, d, nnz = 3000, 24_428, 30
    rows = torch.arange(n).repeat_interleave(nnz)
    cols = torch.randint(0, d, (n * nnz,), generator=g)
    sparse = torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.ones(n * nnz), (n, d))
    sparse = sparse.coalesce()
    y = (torch.rand(n, generator=g) < 0.03).float()
    cases.append(Case("b_mlp_sparse_24428", mlp(d), bce, sparse, sparse, y, 0.1, 4, "ghost"))
    images = torch.randn(640, 3, 28, 28, generator=g)
    labels = torch.randint(0, 2, (640,), generator=g)
    cnn = small_cnn(3, 28, 2)
    cases.append(Case("c_cnn_28x28x3", cnn, cross_entropy, images, images, labels, 0.1, 8))
    return cases


def _time(fn: Callable[[], int]) -> float:
    """Seconds per example for one call of `fn`, which returns how many it processed."""
    start = time.perf_counter()
    examples = fn()
    return (time.perf_counter() - start) / max(examples, 1)


class _Counting(PoissonSampler):
    examples = 0

    def sample(self) -> np.ndarray:
        batch = super().sample()
        self.examples += len(batch)
        return batch


def _dpfl(case: Case, secure: bool) -> Callable[[], int]:
    dpsgd = DPSGD(case.model, case.loss, CONFIG)
    params = parameters_of(case.model)
    rng = np.random.default_rng(1)

    def run() -> int:
        sampler = _Counting(len(case.y), case.sample_rate, rng, public_size=len(case.y))
        noise = SecureNoise() if secure else SeededNoise(0)
        dpsgd.run(params, (case.x, case.y), sampler, case.steps, noise=noise)
        return sampler.examples

    return run


GOALS: dict[str, dict[str, tuple[str, float]]] = {
    "c_cnn_28x28x3": {
        "dp_over_plain_time_ratio": ("<=", 1.25),
        "opacus_over_dpfl_time_ratio": (">=", 1.3),
    }
}
"""Issue 42's goals for the small CNN's step, printed beside the ratios."""


class _SamePooling(nn.Module):
    """A max pooling computed as dpfl's DP step computes it."""

    def __init__(self, pool: nn.MaxPool2d) -> None:
        super().__init__()
        self.pool = pool

    def forward(self, h: Tensor) -> Tensor:
        pooled: Tensor = _ChannelsLastMaxPool.apply(h, self.pool)  # type: ignore[no-untyped-call]
        return pooled


def _same_pooling(model: nn.Module) -> nn.Module:
    """A copy of a `nn.Sequential` with its `nn.MaxPool2d` layers as `_SamePooling`."""
    copied = copy.deepcopy(model)
    assert isinstance(copied, nn.Sequential)
    layers = [_SamePooling(m) if type(m) is nn.MaxPool2d else m for m in copied]
    return nn.Sequential(*layers)


def _plain(case: Case, same_pooling: bool = False) -> Callable[[], int]:
    model = _same_pooling(case.model) if same_pooling else copy.deepcopy(case.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=CONFIG.learning_rate)
    sampler = PoissonSampler(
        len(case.y), case.sample_rate, np.random.default_rng(1), public_size=len(case.y)
    )

    def run() -> int:
        examples = 0
        for _ in range(case.steps):
            idx = torch.from_numpy(sampler.sample())
            optimizer.zero_grad()
            case.loss(model(case.x.index_select(0, idx)), case.y[idx]).mean().backward()
            optimizer.step()
            examples += len(idx)
        return examples

    return run


def _opacus(case: Case) -> Callable[[], int]:
    from opacus import GradSampleModule
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    expected = round(case.sample_rate * len(case.y))
    sampler = PoissonSampler(
        len(case.y), case.sample_rate, np.random.default_rng(1), public_size=len(case.y)
    )
    x = case.x_dense.to_dense() if case.x_dense.is_sparse else case.x_dense
    kwargs = {
        "noise_multiplier": CONFIG.noise_multiplier,
        "max_grad_norm": CONFIG.clip_norm,
        "expected_batch_size": expected,
    }
    if case.opacus_mode == "ghost":
        ghost = GradSampleModuleFastGradientClipping(
            copy.deepcopy(case.model), max_grad_norm=CONFIG.clip_norm, use_ghost_clipping=True
        )
        sgd = torch.optim.SGD(ghost.parameters(), lr=CONFIG.learning_rate)
        optimizer: DPOptimizer = DPOptimizerFastGradientClipping(sgd, **kwargs)
        criterion = DPLossFastGradientClipping(
            ghost, optimizer, _OpacusLoss(case.loss), loss_reduction="mean"
        )
    else:
        model = GradSampleModule(copy.deepcopy(case.model))
        optimizer = DPOptimizer(
            torch.optim.SGD(model.parameters(), lr=CONFIG.learning_rate), **kwargs
        )

    def run() -> int:
        examples = 0
        for _ in range(case.steps):
            idx = torch.from_numpy(sampler.sample())
            xb, yb = x[idx], case.y[idx]
            optimizer.zero_grad()
            if case.opacus_mode == "ghost":
                criterion(ghost(xb), yb).backward()
            else:
                case.loss(model(xb), yb).mean().backward()
            optimizer.step()
            examples += len(idx)
        return examples

    return run


class _OpacusLoss(nn.Module):
    """Opacus' ghost clipping wants a criterion module with a `reduction` attribute."""

    def __init__(self, loss: Loss) -> None:
        super().__init__()
        self.loss = loss
        self.reduction = "mean"  # Opacus switches it to "none" around each call

    def forward(self, out: Tensor, target: Tensor) -> Tensor:
        return self.loss(out, target)


def _stacked_trials(trials: int, steps: int, repeats: int) -> tuple[float, float]:
    """Median seconds for `trials` runs of case (a) as one stacked run, and one by one."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1000, 240, generator=g)
    data = (x, (x[:, 0] > 0).float())
    model = logistic_regression(240)
    dpsgd = DPSGD(model, bce, CONFIG)
    inits = [parameters_of(model)] * trials

    def samplers() -> list[PoissonSampler]:
        return [
            PoissonSampler(1000, 0.02, np.random.default_rng(t), public_size=1000)
            for t in range(trials)
        ]

    def stacked() -> None:
        noises = [SeededNoise(t) for t in range(trials)]
        dpsgd.run_stacked(stack(inits), [data] * trials, samplers(), noises, steps)

    def one_by_one() -> None:
        for t, (init, sampler) in enumerate(zip(inits, samplers(), strict=True)):
            dpsgd.run(init, data, sampler, steps, noise=SeededNoise(t))

    seconds: dict[str, list[float]] = {"stacked": [], "one_by_one": []}
    for fn in (stacked, one_by_one):
        fn()  # warm-up
    for _ in range(repeats):
        for key, fn in (("stacked", stacked), ("one_by_one", one_by_one)):
            start = time.perf_counter()
            fn()
            seconds[key].append(time.perf_counter() - start)
    return statistics.median(seconds["stacked"]), statistics.median(seconds["one_by_one"])


def _conv_methods(repeats: int) -> dict[str, float]:
    """Milliseconds (median, one call each in turn) of the ways to get the small CNN's
    per-example convolution gradients, their norms and their clipped sum, on its two
    convolutions' own shapes (batch 64): the grouped convolution that dpfl uses
    (`clipping._conv_weight_gradients`); `F.unfold` + `bmm`; shifted views + `bmm`;
    ghost clipping's norms from Gram matrices (Li et al. 2022), without per-example
    gradients; and the clipped sum by book-keeping (one batched weight gradient of
    c ⊙ δ, Bu et al. 2023) against c @ the per-example gradients that dpfl forms."""
    g = torch.Generator().manual_seed(3)
    out: dict[str, float] = {}
    for cin, cout, side in ((3, 16, 28), (16, 32, 14)):
        runs = _conv_runs(nn.Conv2d(cin, cout, 3, padding=1), side, g)
        seconds: dict[str, list[float]] = {k: [] for k in runs}
        for run in runs.values():
            run()  # warm-up
        for _ in range(repeats):
            for key, run in runs.items():
                start = time.perf_counter()
                run()
                seconds[key].append(time.perf_counter() - start)
        for key, values in seconds.items():
            out[f"c_cnn_28x28x3.conv_{cin}to{cout}.{key}_ms"] = round(
                1e3 * statistics.median(values), 3
            )
    return out


def _conv_runs(conv: nn.Conv2d, side: int, g: torch.Generator) -> dict[str, Callable[[], object]]:
    """`_conv_methods`' runs for one 3×3 convolution (padding 1) on a batch of 64."""
    cin, cout = conv.in_channels, conv.out_channels
    a = torch.randn(64, cin, side, side, generator=g)
    d = torch.randn(64, cout, side, side, generator=g)
    c = torch.rand(64, generator=g)
    per_example = _conv_weight_gradients(conv, a, d)

    def shifted() -> Tensor:
        padded = F.pad(a, (1, 1, 1, 1))
        s = padded.stride()
        views = padded.as_strided((64, cin, 3, 3, side, side), (*s, s[2], s[3]))
        return views.reshape(64, cin * 9, side * side)

    def ghost() -> Tensor:
        u, dd = F.unfold(a, 3, padding=1), d.flatten(2)
        grams = torch.bmm(u.transpose(1, 2), u) * torch.bmm(dd.transpose(1, 2), dd)
        return grams.sum((1, 2)).sqrt()

    torch.testing.assert_close(ghost(), per_example.flatten(1).norm(dim=1), rtol=1e-3, atol=1e-3)
    return {
        "grouped_conv": lambda: _conv_weight_gradients(conv, a, d),
        "unfold_bmm": lambda: torch.bmm(d.flatten(2), F.unfold(a, 3, padding=1).mT),
        "shifted_bmm": lambda: torch.bmm(d.flatten(2), shifted().mT),
        "ghost_norms": ghost,
        "bookkeeping_sum": lambda: conv2d_weight(  # type: ignore[no-untyped-call]
            a, conv.weight.shape, d * c.view(-1, 1, 1, 1), 1, 1
        ),
        "per_example_sum": lambda: c @ per_example.flatten(1),
    }


NOISE_VALUES = 4_926_201  # case (b)'s MLP, Kerkouche's 24,428→200→200→1


class _SecureNoiseBefore(NoiseSource):
    """`SecureNoise` as it was before issue 18, for `before_s` only: four keystream calls
    through fresh `bytes`, four Box–Muller passes, `torch.cat`."""

    def __init__(self) -> None:
        cipher = Cipher(algorithms.ChaCha20(os.urandom(32), os.urandom(16)), mode=None)
        self._keystream = cipher.encryptor()

    def normal(self, shape: tuple[int, ...], std: float, dtype: torch.dtype) -> Tensor:
        count = math.prod(shape)
        work = torch.float32 if torch.finfo(dtype).bits <= 32 else torch.float64
        total = self._box_muller(count, work)
        for _ in range(3):
            total += self._box_muller(count, work)
        return total.mul_(std / 2.0).to(dtype).reshape(shape)

    def metadata(self) -> dict[str, str]:
        return {"noise": "secure-before-issue-18"}

    def _box_muller(self, count: int, dtype: torch.dtype) -> Tensor:
        pairs = (count + 1) // 2
        mantissa, word = (24, torch.int32) if dtype == torch.float32 else (53, torch.int64)
        width = torch.iinfo(word).bits
        raw = bytearray(self._keystream.update(bytes(2 * pairs * width // 8)))
        bits = torch.frombuffer(raw, dtype=word) >> (width - mantissa)
        bits &= (1 << mantissa) - 1
        uniform = bits.to(dtype).add_(1.0).mul_(2.0**-mantissa)
        radius = torch.sqrt(-2.0 * torch.log(uniform[:pairs]))
        angle = (2.0 * math.pi) * uniform[pairs:]
        return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:count]


def keystream(count: int) -> Callable[[], None]:
    """A run of the keystream (`noise.keystream`, AES-256-CTR) that a secure draw of `count`
    float32 values consumes (16 bytes a value), in `SecureNoise`'s block size, into a
    reused buffer."""
    used_bytes = 8 * ((count + 1) // 2) * 4  # four terms × (radius, angle) × a 32-bit word
    encryptor = noise_keystream(os.urandom(32), os.urandom(16))
    zeros, words = memoryview(bytes(BLOCK_BYTES)), memoryview(bytearray(BLOCK_BYTES))

    def run() -> None:
        for start in range(0, used_bytes, BLOCK_BYTES):
            used = min(BLOCK_BYTES, used_bytes - start)
            encryptor.update_into(zeros[:used], words[:used])

    return run


def box_muller_math(count: int, library: str = "numpy") -> Callable[[], None]:
    """A run of the log2, sqrt, cos and sin over the uniforms of the four Box–Muller draws
    of `count` float32 values (the transcendental work any vectorised Box–Muller does), in
    place over block-sized buffers: NumPy's, as `noise.BoxMuller4` computes them, or
    torch's (`library="torch"`, what it used before issue 42)."""
    pairs = (count + 1) // 2
    block = BLOCK_BYTES // 8  # uniforms of one block: 4p radii and 4p angles
    radii = torch.rand(block, generator=torch.Generator().manual_seed(0)).add_(2.0**-24)
    angles = radii.mul(2.0 * math.pi)
    spare: Any = torch.empty(block)
    ops: list[tuple[Callable[..., object], Any]]
    if library == "torch":
        ops = [(torch.log, radii), (torch.sqrt, radii), (torch.cos, angles), (torch.sin, angles)]
    else:
        numpy_ops = [(np.log2, radii), (np.sqrt, radii), (np.cos, angles), (np.sin, angles)]
        ops, spare = [(op, x.numpy()) for op, x in numpy_ops], spare.numpy()

    def run() -> None:
        for start in range(0, 4 * pairs, block):
            used = min(block, 4 * pairs - start)
            for op, x in ops:
                op(x[:used], out=spare[:used])

    return run


def _noise_figures(repeats: int, count: int = NOISE_VALUES) -> dict[str, float | int | str]:
    """One float32 draw of `count` values by each source and the secure draw's floor."""
    keystream_bytes = 8 * ((count + 1) // 2) * 4
    out = torch.empty(count)
    secure, seeded, before = SecureNoise(), SeededNoise(0), _SecureNoiseBefore()
    runs: dict[str, Callable[[], object]] = {
        "keystream": keystream(count),
        "box_muller_math": box_muller_math(count),
        "box_muller_math_torch": box_muller_math(count, "torch"),
        "secure": lambda: secure.normal_into(out, 1.0),
        "secure_normal": lambda: secure.normal((count,), 1.0, torch.float32),
        "seeded": lambda: seeded.normal_into(out, 1.0),
        "before": lambda: before.normal((count,), 1.0, torch.float32),
    }
    for run in runs.values():
        run()  # warm-up: buffers, lazy set-up
    wall: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        for key, run in runs.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            run()
            wall[key].append(time.perf_counter() - start)
            cpu[key].append(time.process_time() - start_cpu)
    out_figures: dict[str, float | int | str] = {
        "noise.values": count,
        "noise.dtype": "float32",
        "noise.keystream_bytes": keystream_bytes,
        "noise.block_bytes": BLOCK_BYTES,
    }
    for kind, seconds in (("", wall), ("_cpu", cpu)):
        s = {k: statistics.median(v) for k, v in seconds.items()}
        s["limit"] = s["keystream"] + s["box_muller_math"]
        for key in ("keystream", "box_muller_math", "limit", *list(runs)[2:]):
            out_figures[f"noise.{key}{kind}_s"] = round(s[key], 4)
        out_figures[f"noise.keystream{kind}_gb_per_s"] = round(
            keystream_bytes / s["keystream"] / 1e9, 3
        )
        out_figures[f"noise.secure_over_seeded_noise_ratio{kind}"] = round(
            s["secure"] / s["seeded"], 2
        )
        out_figures[f"noise.secure_over_limit_ratio{kind}"] = round(s["secure"] / s["limit"], 2)
        out_figures[f"noise.keystream_over_seeded_ratio{kind}"] = round(
            s["keystream"] / s["seeded"], 2
        )
        out_figures[f"noise.before_over_secure_ratio{kind}"] = round(s["before"] / s["secure"], 2)
        out_figures[f"noise.box_muller_math_torch_over_numpy_ratio{kind}"] = round(
            s["box_muller_math_torch"] / s["box_muller_math"], 2
        )
    return out_figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads for all three (1: tiny ops are not drowned in OpenMP waits)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--sections",
        default="steps,stacked,noise",
        help="what to run, comma-separated: steps (the cases), stacked (trials), noise, "
        "methods (case (c)'s per-example convolution gradients, by method; not by default)",
    )
    parser.add_argument("--cases", default="a,b,c", help="which step cases, by letter")
    parser.add_argument(
        "--glibc-defaults",
        action="store_true",
        help="leave malloc as it is (by default freed memory is kept, as the dpfl command "
        "does: dpfl.allocator; for all three alike)",
    )
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    torch.set_num_threads(args.threads)
    kept = False if args.glibc_defaults else keep_freed_memory()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    out: dict[str, float | int | str] = {
        "threads": args.threads,
        "repeats": args.repeats,
        "freed_memory_kept": str(kept),
    }
    if "methods" in sections:
        out |= _conv_methods(args.repeats)
    if "noise" in sections:
        out |= _noise_figures(args.repeats)
    letters = set(args.cases.split(",")) if "steps" in sections else set()
    for case in (c for c in _cases() if c.name[0] in letters):
        runners = {
            "dpfl_dp": _dpfl(case, secure=False),
            "dpfl_dp_secure_noise": _dpfl(case, secure=True),
            "plain_sgd": _plain(case),
            "opacus_dp": _opacus(case),
        }
        if case.name in GOALS:
            runners["plain_sgd_same_pooling"] = _plain(case, same_pooling=True)
        for run in runners.values():
            run()  # warm-up
        seconds: dict[str, list[float]] = {k: [] for k in runners}
        order = list(runners.items())
        for repeat in range(args.repeats):  # each runner first in turn: no fixed neighbour
            turn = repeat % len(order)
            for key, run in order[turn:] + order[:turn]:
                seconds[key].append(_time(run))
        rate = {k: 1.0 / statistics.median(v) for k, v in seconds.items()}
        for key, value in rate.items():
            out[f"{case.name}.{key}_examples_per_s"] = round(value, 1)
        out[f"{case.name}.dp_over_plain_time_ratio"] = round(rate["plain_sgd"] / rate["dpfl_dp"], 3)
        out[f"{case.name}.opacus_over_dpfl_time_ratio"] = round(
            rate["dpfl_dp"] / rate["opacus_dp"], 3
        )
        out[f"{case.name}.secure_over_seeded_step_ratio"] = round(
            rate["dpfl_dp"] / rate["dpfl_dp_secure_noise"], 3
        )
        if "plain_sgd_same_pooling" in rate:
            out[f"{case.name}.dp_over_same_pooling_plain_time_ratio"] = round(
                rate["plain_sgd_same_pooling"] / rate["dpfl_dp"], 3
            )
        for key, (sense, goal) in GOALS.get(case.name, {}).items():
            value = float(out[f"{case.name}.{key}"])
            out[f"{case.name}.{key}_goal"] = f"{sense} {goal}"
            out[f"{case.name}.{key}_met"] = str(value <= goal if sense == "<=" else value >= goal)
        out[f"{case.name}.opacus_mode"] = case.opacus_mode
    if "stacked" in sections:
        stacked, one_by_one = _stacked_trials(trials=50, steps=50, repeats=args.repeats)
        out["a_logreg_240.50_trials_stacked_s"] = round(stacked, 3)
        out["a_logreg_240.50_trials_one_by_one_s"] = round(one_by_one, 3)
        out["a_logreg_240.50_trials_one_by_one_over_stacked"] = round(one_by_one / stacked, 2)
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:60s} {value}")


if __name__ == "__main__":
    main()
