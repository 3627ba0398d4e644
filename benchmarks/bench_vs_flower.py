"""One DP federated workload run three ways: Flower + Opacus, a plain torch loop, and dpfl.

    .venv/bin/python benchmarks/bench_vs_flower.py [--json] [--trials N] [--rounds N]
        [--flower-separate-runs] [--skip flower|plain|dpfl ...]

Needs the dev dependencies (`pip install -e ".[dev]"`: flwr[simulation], opacus). Logs go to
stderr; with `--json` stdout carries exactly one JSON object, otherwise a table.

The workload (issue 5, "Benchmark"): scikit-learn's breast-cancer table (569 × 30),
standardised with the fixed constants below, a stratified 20 % held out for testing, the
rest split into 10 stratified IID silos (seed 0); logistic regression `nn.Linear(30, 1)` with
BCE-with-logits; every round each silo runs one epoch of Poisson DP-SGD (sample rate
q = 16 / silo size, so the expected batch is 16; round(1/q) steps; clip C = 1.0, noise
multiplier σ = 1.0, noise std σC on the clipped sum which is then divided by the expected
batch 16; learning rate 0.5, plain SGD), then FedAvg (size-weighted mean of the client
models); 20 rounds. A "trial" is one such run; the 5-trial figures are 5 independent seeds.

Runners, all from the same initial model (PyTorch's default init under seed 0, in every
trial, as dpfl starts all stacked trials from one model) with the same silos and
hyper-parameters; their random streams differ, so accuracies agree only statistically:

- Flower: `flwr.simulation.run_simulation`, Flower's in-process entry point in 1.41/1.42
  (deprecated in favour of `flwr run`, which needs a packaged app and a SuperLink), on its
  Ray backend with the Message API: a `ClientApp` whose `@train` function trains, and a
  `ServerApp` whose `@main` runs the message-based `flwr.serverapp.strategy.FedAvg`
  (weighted by "num-examples") for 20 rounds. Each client, each round, wraps a fresh model
  with Opacus' `PrivacyEngine().make_private(..., poisson_sampling=True)` on a DataLoader
  of batch 16, the idiomatic Flower+Opacus client. Opacus derives q = 1/len(loader) =
  1/ceil(n/16) and divides by int(q·n) (1/3 and 15 here), so the client then sets its
  sampler and optimiser to q = 16/n, round(1/q) steps and expected batch 16, the values of
  the other two runners. One CPU a client, so that Ray runs one client per core (Flower's
  default of 2 CPUs a client runs one at a time here and makes rounds about twice as
  long); telemetry and Ray usage statistics off; Ray only talks to itself on localhost.
  Seeds: torch's global RNG (Opacus draws batches and noise from it) is seeded per trial,
  round and client.
- plain: the reference, a per-silo Python loop in this process: Poisson mask, per-example
  gradients with `torch.func.vmap(grad)`, clip, Gaussian noise, SGD step; weighted mean.
  No framework, no privacy accounting, silos and trials one after another.
- dpfl: `dpfl.engines.simulation.simulate` with `FedAvg`, all trials stacked in one call,
  seeded ("research") noise, evaluation only after the last round; it keeps a privacy
  ledger (a temporary SQLite file) and checks the plan against the budget as it runs.

Figures, keys of the JSON object (seconds are wall time of the call that trains, read
with `time.perf_counter`; importing the libraries is not counted, except that
`flower_import_s` reports `import flwr.simulation`):

- `flower_opacus_1trial_s`: one `run_simulation` of 20 rounds, including Ray's start-up
  (Ray itself, then actors importing torch, Opacus and Flower) and shut-down;
  `flower_opacus_seconds_per_round`: mean length of rounds 2-20 (round 1 waits for the
  actors); `flower_opacus_startup_shutdown_s`: the single run minus 20 such rounds.
- `flower_opacus_{N}trials_s` (N = --trials, default 5): the N trials one after another
  inside one `run_simulation` (one Ray start-up, the cheapest way to run them with Flower);
  with `--flower-separate-runs`, N `run_simulation` calls (N start-ups) instead.
- `plain_torch_1trial_s`, `plain_torch_{N}trials_s`: the plain loop for 1 and N seeds,
  after a 1-round warm-up run (`plain_torch_warmup_s`) that pays torch.func's set-up.
- `dpfl_1trial_s`, `dpfl_{N}trials_s`: `simulate` with `RunPlan(trials=1)` and `(trials=N)` as a
  fresh process pays them: after a 1-round warm-up (`dpfl_warmup_s`), with dpfl's
  per-process memos (its `functools` caches of ε values and privacy-loss distributions,
  listed in `dpfl_caches_cleared`) emptied first, so privacy accounting is included;
  `dpfl_1trial_warm_s`, `dpfl_{N}trials_warm_s`: the same call repeated at once, with
  the memos filled (training and bookkeeping only).
- `flower_over_dpfl_1trial_ratio`, `flower_over_dpfl_{N}trials_ratio`: Flower's time over
  dpfl's (issue 5's goal: ≥ 30 on the single run); `plain_over_dpfl_*` likewise for the
  plain loop; `*_warm_ratio`: the same against dpfl's warm figures.
- `dpfl_{N}trials_over_1trial_ratio` (and `_warm_ratio`): N stacked trials over one
  (issue 5's goal: ≤ 2).
- `flower_opacus_accuracy_1trial`, `plain_torch_accuracy_1trial`, `dpfl_accuracy_1trial`,
  and `*_accuracy_{N}trials_mean`: accuracy of the final global model on the held-out
  20 % (114 records), scored by the same function for all three, for the single run and
  averaged over the N trials, to show that the three learn alike (≈ 0.96; the majority
  class alone scores 0.63).

A run takes about 1.5 minutes on 2 CPUs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import StratifiedKFold, train_test_split
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from bench_common import log_to_stderr
from dpfl.engines.plan import RunPlan

log = logging.getLogger("bench_vs_flower")

# Standardisation constants: the per-feature mean and (population, ddof=0) standard
# deviation of all 569 rows of `load_breast_cancer().data`, computed once offline and
# written here (6 significant digits) so that nothing is fitted at run time and every
# runner sees exactly the same inputs.
FEATURE_MEAN = np.array(
    [
        14.1273, 19.2896, 91.969, 654.889, 0.0963603, 0.104341, 0.0887993, 0.0489191,
        0.181162, 0.0627976, 0.405172, 1.21685, 2.86606, 40.3371, 0.00704098, 0.0254781,
        0.0318937, 0.0117961, 0.0205423, 0.0037949, 16.2692, 25.6772, 107.261, 880.583,
        0.132369, 0.254265, 0.272188, 0.114606, 0.290076, 0.0839458,
    ]
)  # fmt: skip
FEATURE_STD = np.array(
    [
        3.52095, 4.29725, 24.2776, 351.605, 0.0140518, 0.0527663, 0.0796497, 0.0387687,
        0.0273902, 0.00705416, 0.277069, 0.551163, 2.02008, 45.451, 0.00299988, 0.0178924,
        0.0301595, 0.00616486, 0.0082591, 0.00264374, 4.82899, 6.14085, 33.573, 568.856,
        0.0228124, 0.157198, 0.208441, 0.0656746, 0.0618131, 0.0180454,
    ]
)  # fmt: skip

N_FEATURES = 30
N_SILOS = 10
TEST_FRACTION = 0.2
SPLIT_SEED = 0
EXPECTED_BATCH = 16
NOISE_MULTIPLIER = 1.0
CLIP_NORM = 1.0
LEARNING_RATE = 0.5


@dataclasses.dataclass(frozen=True)
class Workload:
    silos: list[tuple[np.ndarray, np.ndarray]]  # (x float32, y int64) per silo
    x_test: np.ndarray
    y_test: np.ndarray
    rounds: int


def load_workload(rounds: int) -> Workload:
    table = load_breast_cancer()
    x = ((table.data - FEATURE_MEAN) / FEATURE_STD).astype(np.float32)
    y = table.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=TEST_FRACTION, stratify=y, random_state=SPLIT_SEED
    )
    folds = StratifiedKFold(N_SILOS, shuffle=True, random_state=SPLIT_SEED)
    silos = [(x_train[i], y_train[i]) for _, i in folds.split(x_train, y_train)]
    return Workload(silos, x_test, y_test, rounds)


def sample_rate(n: int) -> float:
    return EXPECTED_BATCH / n


def steps_per_epoch(n: int) -> int:
    return round(1 / sample_rate(n))


def initial_model() -> nn.Linear:
    """The starting point of every runner and every trial (dpfl starts all its stacked
    trials from one model): PyTorch's default initialisation under seed 0."""
    torch.manual_seed(0)
    return nn.Linear(N_FEATURES, 1)


def accuracy(weight: Tensor, bias: Tensor, x: np.ndarray, y: np.ndarray) -> float:
    logits = torch.as_tensor(x) @ weight.detach().reshape(-1) + bias.detach().reshape(())
    return float(((logits > 0).long() == torch.as_tensor(y)).double().mean())


def fedavg(states: list[dict[str, Tensor]], sizes: list[int]) -> dict[str, Tensor]:
    w = torch.tensor(sizes, dtype=torch.float32) / sum(sizes)
    return {k: sum(wi * s[k] for wi, s in zip(w, states, strict=True)) for k in states[0]}


def client_seed(trial_seed: int, server_round: int, silo: int) -> int:
    return (trial_seed * 1_000 + server_round) * 1_000 + silo


# ---------------------------------------------------------------------------------------
# Plain per-silo torch loop (reference)
# ---------------------------------------------------------------------------------------


def _plain_dp_epoch(
    model: nn.Module, params: dict[str, Tensor], x: Tensor, y: Tensor, gen: torch.Generator
) -> dict[str, Tensor]:
    def example_loss(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        logit = functional_call(model, p, (xi.unsqueeze(0),)).reshape(())
        return nn.functional.binary_cross_entropy_with_logits(logit, yi)

    per_example = vmap(grad(example_loss), in_dims=(None, 0, 0))
    n = x.shape[0]
    q = sample_rate(n)
    for _ in range(steps_per_epoch(n)):
        mask = torch.rand(n, generator=gen) < q
        grads = per_example(params, x[mask], y[mask])
        norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads.values()))
        factor = (CLIP_NORM / (norms + 1e-6)).clamp(max=1.0)
        params = {
            k: p
            - LEARNING_RATE
            * (
                torch.einsum("b,b...->...", factor, grads[k])
                + torch.randn(p.shape, generator=gen) * NOISE_MULTIPLIER * CLIP_NORM
            )
            / (q * n)
            for k, p in params.items()
        }
    return params


def plain_trial(work: Workload, seed: int) -> float:
    model = initial_model()
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    data = [(torch.as_tensor(x), torch.as_tensor(y, dtype=torch.float32)) for x, y in work.silos]
    sizes = [len(x) for x, _ in work.silos]
    for server_round in range(1, work.rounds + 1):
        states = []
        for k, (x, y) in enumerate(data):
            gen = torch.Generator().manual_seed(client_seed(seed, server_round, k))
            states.append(_plain_dp_epoch(model, dict(state), x, y, gen))
        state = fedavg(states, sizes)
    return accuracy(state["weight"], state["bias"], work.x_test, work.y_test)


def run_plain(work: Workload, trials: int) -> tuple[float, list[float]]:
    start = time.perf_counter()
    accs = [plain_trial(work, seed) for seed in range(trials)]
    return time.perf_counter() - start, accs


# ---------------------------------------------------------------------------------------
# Flower + Opacus
# ---------------------------------------------------------------------------------------


def _quiet_flower_environment() -> None:
    # No telemetry (Flower would POST events to flower.ai), no Ray usage statistics.
    os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_DEDUP_LOGS"] = "0"
    # Single-node Ray: its processes bind to and talk over 127.0.0.1 instead of the host's
    # network address (Ray reads this switch at import; it is named for Windows and macOS,
    # where single-node is the default).
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def import_flower() -> float:
    """Import Flower (with its environment quietened first); return the seconds it took."""
    _quiet_flower_environment()
    start = time.perf_counter()
    import flwr.simulation  # noqa: F401

    elapsed = time.perf_counter() - start
    # its deprecation notice for run_simulation and the "evaluation skipped" warning
    logging.getLogger("flwr").setLevel(logging.ERROR)
    return elapsed


def _opacus_client_train(
    state: dict[str, Tensor], x: np.ndarray, y: np.ndarray, seed: int
) -> dict[str, Tensor]:
    """One client round as a Flower+Opacus user writes it (runs inside a Ray actor)."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    warnings.filterwarnings("ignore")  # Opacus: "secure RNG turned off", hooks, etc.
    torch.manual_seed(seed)  # Opacus draws batches and noise from torch's global RNG
    net = nn.Linear(N_FEATURES, 1)
    net.load_state_dict(state)
    optimizer = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE)
    dataset = TensorDataset(torch.as_tensor(x), torch.as_tensor(y, dtype=torch.float32))
    loader = DataLoader(dataset, batch_size=EXPECTED_BATCH)
    module, optimizer, dp_loader = PrivacyEngine().make_private(
        module=net,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=NOISE_MULTIPLIER,
        max_grad_norm=CLIP_NORM,
        poisson_sampling=True,
    )
    # Opacus took q = 1/len(loader) and divides by int(q·n); align both with the workload's
    # q = 16/n, round(1/q) steps and expected batch 16 (no effect on the time).
    n = len(dataset)
    dp_loader.sample_rate = sample_rate(n)
    dp_loader.batch_sampler.sample_rate = sample_rate(n)
    dp_loader.batch_sampler.steps = steps_per_epoch(n)
    optimizer.expected_batch_size = EXPECTED_BATCH
    criterion = nn.BCEWithLogitsLoss()
    module.train()
    for xb, yb in dp_loader:
        optimizer.zero_grad()
        loss = criterion(module(xb).reshape(-1), yb)
        loss.backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def _flower_apps(work: Workload, seeds: list[int], out: dict[str, Any]) -> tuple[Any, Any]:
    """A ServerApp that runs FedAvg once per seed, one trial after another, and the ClientApp."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    silos = work.silos
    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        silo = int(context.node_config["partition-id"])
        config = msg.content["config"]
        seed = client_seed(int(config["trial-seed"]), int(config["server-round"]), silo)
        x, y = silos[silo]
        state = _opacus_client_train(msg.content["arrays"].to_torch_state_dict(), x, y, seed)
        content = RecordDict(
            {"arrays": ArrayRecord(state), "metrics": MetricRecord({"num-examples": len(x)})}
        )
        return Message(content=content, reply_to=msg)

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        for seed in seeds:
            ticks: list[float] = []

            def tick(server_round: int, arrays: ArrayRecord, ticks: list[float] = ticks) -> None:
                ticks.append(time.perf_counter())  # called before round 1 and after each round

            def count_replies(replies: list[RecordDict], weight_key: str) -> MetricRecord:
                # FedAvg averages whatever replies arrived; a failed client must not pass
                if len(replies) != N_SILOS:
                    raise RuntimeError(f"{len(replies)} of {N_SILOS} clients replied")
                return MetricRecord({"replies": len(replies)})

            strategy = FedAvg(
                fraction_train=1.0,
                fraction_evaluate=0.0,
                min_train_nodes=N_SILOS,
                min_available_nodes=N_SILOS,
                train_metrics_aggr_fn=count_replies,
            )
            result = strategy.start(
                grid=grid,
                initial_arrays=ArrayRecord(initial_model().state_dict()),
                num_rounds=work.rounds,
                train_config=ConfigRecord({"trial-seed": seed}),
                evaluate_fn=tick,
            )
            state = result.arrays.to_torch_state_dict()
            out.setdefault("accuracies", []).append(
                accuracy(state["weight"], state["bias"], work.x_test, work.y_test)
            )
            out.setdefault("ticks", []).append(ticks)

    return server, client


def flower_run(work: Workload, seeds: list[int]) -> tuple[float, list[float], list[list[float]]]:
    """One `run_simulation` (Ray up, the trials one after another, Ray down): seconds,
    accuracies, and per trial the times at which its rounds ended."""
    from flwr.simulation import run_simulation

    out: dict[str, Any] = {}
    server, client = _flower_apps(work, seeds, out)
    start = time.perf_counter()
    run_simulation(
        server_app=server,
        client_app=client,
        num_supernodes=N_SILOS,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {
                "num_cpus": os.cpu_count() or 1,
                "logging_level": "ERROR",
                "log_to_driver": False,
                "include_dashboard": False,
            },
        },
    )
    seconds = time.perf_counter() - start
    if len(out.get("accuracies", [])) != len(seeds):
        raise RuntimeError("the Flower simulation did not complete every trial")
    ticks = [[t - start for t in trial] for trial in out["ticks"]]
    return seconds, out["accuracies"], ticks


# ---------------------------------------------------------------------------------------
# dpfl
# ---------------------------------------------------------------------------------------


def clear_dpfl_caches() -> list[str]:
    """Empty the memos dpfl keeps per process (its modules' `functools` caches: ε values,
    privacy-loss distributions), so that the next `simulate` pays its privacy accounting as
    in a fresh process. Returns the names of the caches it emptied."""
    cleared = []
    for name, module in list(sys.modules.items()):
        if name != "dpfl" and not name.startswith("dpfl."):
            continue
        for attr, value in list(vars(module).items()):
            if callable(getattr(value, "cache_clear", None)) and hasattr(value, "cache_info"):
                if getattr(value, "__module__", None) != name:
                    continue  # imported from elsewhere; cleared under its own module
                value.cache_clear()
                cleared.append(f"{name}.{attr}")
    return sorted(cleared)


def run_dpfl(work: Workload, trials: int) -> tuple[float, list[float]]:
    """dpfl's simulator, all trials stacked in one call; the silos carry no test sets (as the
    other runners, it trains only) and the final models are scored here like theirs."""
    from dpfl.engines.simulation import simulate
    from dpfl.federation.algorithms.fedavg import FedAvg
    from dpfl.federation.silo import Silo
    from dpfl.local.dpsgd import DPSGDConfig
    from dpfl.local.losses import bce

    silos = [Silo.from_arrays(f"silo-{k}", x, y) for k, (x, y) in enumerate(work.silos)]
    algorithm = FedAvg(
        model=initial_model(),
        loss=bce,
        dpsgd=DPSGDConfig(
            clip_norm=CLIP_NORM, noise_multiplier=NOISE_MULTIPLIER, learning_rate=LEARNING_RATE
        ),
        expected_batch_size=EXPECTED_BATCH,
        local_epochs=1,
    )
    with tempfile.TemporaryDirectory(prefix="bench-dpfl-") as tmp:
        start = time.perf_counter()
        result = simulate(
            algorithm,
            silos,
            RunPlan(
                rounds=work.rounds,
                trials=trials,
                seed=0,
                research_noise=True,
                progress=False,
                eval_every=work.rounds,
                init="shared",
            ),
            ledger=Path(tmp) / "ledger.sqlite",
        )
        seconds = time.perf_counter() - start
    params = result.params
    accs = [
        accuracy(params["weight"][r], params["bias"][r], work.x_test, work.y_test)
        for r in range(trials)
    ]
    return seconds, accs


# ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to fd 1 (by us, Flower, Ray and its workers) to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def measure_in_process(
    name: str, runner: Callable[[Workload, int], tuple[float, list[float]]], work: Workload, n: int
) -> dict[str, float]:
    """1 trial and n trials, timed warm: a 1-round run first pays the one-off costs of this
    process (torch.func set-up, lazy imports), reported as `{name}_warmup_s`."""
    warmup_s, _ = runner(dataclasses.replace(work, rounds=1), 1)
    seconds_1, accs_1 = runner(work, 1)
    log.info("%s: 1 trial %.2f s, accuracy %.3f", name, seconds_1, accs_1[0])
    seconds_n, accs_n = runner(work, n)
    log.info("%s: %d trials %.2f s, accuracies %s", name, n, seconds_n, np.round(accs_n, 3))
    return {
        f"{name}_warmup_s": warmup_s,
        f"{name}_1trial_s": seconds_1,
        f"{name}_{n}trials_s": seconds_n,
        f"{name}_accuracy_1trial": accs_1[0],
        f"{name}_accuracy_{n}trials_mean": float(np.mean(accs_n)),
    }


def measure_dpfl(work: Workload, n: int) -> dict[str, Any]:
    """As `measure_in_process`, but each figure twice: as a fresh process pays it (dpfl's
    memos emptied first: the call does its privacy accounting, the plan's ε for the budget
    check and the ledger's as it goes) and again with the memos filled (`_warm_s`)."""
    figures: dict[str, Any] = {}
    figures["dpfl_warmup_s"], _ = run_dpfl(dataclasses.replace(work, rounds=1), 1)
    for trials, key in ((1, "1trial"), (n, f"{n}trials")):
        figures["dpfl_caches_cleared"] = clear_dpfl_caches()
        cold_s, accs = run_dpfl(work, trials)
        warm_s, accs_again = run_dpfl(work, trials)
        if accs_again != accs:
            raise RuntimeError("dpfl gave different models for the same seed")
        figures[f"dpfl_{key}_s"] = cold_s
        figures[f"dpfl_{key}_warm_s"] = warm_s
        figures[f"dpfl_accuracy_{key}" + ("_mean" if trials > 1 else "")] = float(np.mean(accs))
        log.info(
            "dpfl: %d trial%s %.2f s (%.2f s with ε memoised), accuracies %s",
            trials,
            "s" if trials > 1 else "",
            cold_s,
            warm_s,
            np.round(accs, 3),
        )
    return figures


def measure_flower(work: Workload, n: int, separate_runs: bool) -> dict[str, Any]:
    import flwr

    figures: dict[str, Any] = {"flower_version": flwr.__version__}
    seconds_1, accs_1, ticks_1 = flower_run(work, [0])
    ends = np.array(ticks_1[0][1:])  # when rounds 1..R ended, from the call's start
    per_round = float(np.mean(np.diff(ends))) if len(ends) > 1 else float("nan")
    figures.update(
        {
            "flower_opacus_1trial_s": seconds_1,
            "flower_opacus_seconds_per_round": per_round,
            # everything but the rounds: Ray and its actors up (workers import torch,
            # Opacus, Flower), the in-memory SuperLink, and everything down again
            "flower_opacus_startup_shutdown_s": seconds_1 - work.rounds * per_round,
            "flower_opacus_accuracy_1trial": accs_1[0],
        }
    )
    log.info(
        "flower_opacus: 1 trial %.2f s (%.3f s a round, %.2f s up/down), accuracy %.3f",
        seconds_1,
        per_round,
        figures["flower_opacus_startup_shutdown_s"],
        accs_1[0],
    )
    seeds = list(range(n))
    if separate_runs:
        runs = [flower_run(work, [seed]) for seed in seeds]
        seconds_n = sum(r[0] for r in runs)
        accs_n = [r[1][0] for r in runs]
    else:
        seconds_n, accs_n, _ = flower_run(work, seeds)
    figures[f"flower_opacus_{n}trials_s"] = seconds_n
    figures[f"flower_opacus_accuracy_{n}trials_mean"] = float(np.mean(accs_n))
    figures["flower_opacus_trials_in"] = "separate runs" if separate_runs else "one simulation"
    log.info("flower_opacus: %d trials %.2f s, accuracies %s", n, seconds_n, np.round(accs_n, 3))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--trials", type=int, default=5, help="the N of the N-trial figures")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--flower-separate-runs",
        action="store_true",
        help="time Flower's N trials as N run_simulation calls (N Ray start-ups) instead of\n"
        "N trials one after another inside one simulation (one start-up)",
    )
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["flower", "plain", "dpfl"],
        metavar="RUNNER",
        help="runners to leave out: flower, plain, dpfl",
    )
    args = parser.parse_args()
    log_to_stderr(log)
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting's RDP convergence notes

    work = load_workload(args.rounds)
    n = args.trials
    figures: dict[str, Any] = {
        "rounds": args.rounds,
        "trials": n,
        "silo_sizes": [len(x) for x, _ in work.silos],
        "test_size": len(work.y_test),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    with stdout_to_stderr():
        if "plain" not in args.skip:
            figures.update(measure_in_process("plain_torch", run_plain, work, n))
        if "dpfl" not in args.skip:
            figures.update(measure_dpfl(work, n))
        if "flower" not in args.skip:
            figures["flower_import_s"] = import_flower()
            figures.update(measure_flower(work, n, args.flower_separate_runs))

    if "dpfl_1trial_s" in figures:
        for suffix in ("", "_warm"):
            one, many = figures[f"dpfl_1trial{suffix}_s"], figures[f"dpfl_{n}trials{suffix}_s"]
            figures[f"dpfl_{n}trials_over_1trial{suffix}_ratio"] = many / one
            for other, short in (("flower_opacus", "flower"), ("plain_torch", "plain")):
                if f"{other}_1trial_s" in figures:
                    figures[f"{short}_over_dpfl_1trial{suffix}_ratio"] = (
                        figures[f"{other}_1trial_s"] / one
                    )
                    figures[f"{short}_over_dpfl_{n}trials{suffix}_ratio"] = (
                        figures[f"{other}_{n}trials_s"] / many
                    )

    if args.json:
        print(json.dumps(figures))
    else:
        width = max(len(k) for k in figures)
        for key, value in figures.items():
            shown = f"{value:.3f}" if isinstance(value, float) else value
            print(f"{key:<{width}}  {shown}")


if __name__ == "__main__":
    main()
