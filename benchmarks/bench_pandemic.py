"""Seconds and memory of the synthetic PETs pandemic: generation, pruning and
tabularisation into neighbourhood rows (dpfl.data.pandemic), then one epoch of node-level
DP-SGD over the region silos.

    .venv/bin/python benchmarks/bench_pandemic.py [--json] [--people N] [--appearances S]
        [--sigma σ] [--threads N]

Each stage is measured alone: `<stage>_s` wall seconds; `<stage>_peak_traced_gb` the
peak of memory traced by tracemalloc while it ran (numpy arrays included, and so what
earlier stages still hold); `<stage>_peak_rss_gb` the process's peak resident memory so
far (Linux ru_maxrss, which also sees memory tracemalloc does not, e.g. torch's).
Then the data's shape: people, contacts, positive rates, rows and feature width.

Training, as a study with `data.split = "official"` and the natural partition: one silo
per region (the same functions as `dpfl.experiments.study.datasets.build_silos`), then
`simulate` runs one round of `Local` (logistic regression, focal loss, C = 1, a fixed σ:
calibration is not what is measured), one epoch at every silo, each charged node-level
steps (replace one person, RDP). The silos copy the features into tensors, so from
`build_silos` on the table is held twice; the seed's slot layout above still fits (about
4 GB at peak for 1M people, S = 10), so it is the one trained on. Reported: the train
rows, the DP steps summed over the silos, rows per second of `simulate` (evaluation on
every test row and the ledger's accounting included), the AUPRC on the union of the test
sets and the largest ε spent over the silos.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from bench_common import log_to_stderr
from dpfl.data import partition
from dpfl.data.pandemic import SUSCEPTIBLE, pandemic_dataset, pandemic_population
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import simulate
from dpfl.experiments.study.datasets import official_splits
from dpfl.federation.algorithms import Local
from dpfl.federation.silo import silos_from_splits
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.losses import focal
from dpfl.models import logistic_regression

log = logging.getLogger("bench_pandemic")
T = TypeVar("T")
BATCH = 512
"""Expected Poisson batch, unless the smallest region declares fewer train rows."""


def measured(figures: dict[str, object], stage: str, run: Callable[[], T]) -> T:
    """Run one stage, recording its seconds and peak memory under `stage`."""
    tracemalloc.reset_peak()
    start = time.perf_counter()
    result = run()
    figures[f"{stage}_s"] = round(time.perf_counter() - start, 2)
    figures[f"{stage}_peak_traced_gb"] = round(tracemalloc.get_traced_memory()[1] / 2**30, 3)
    figures[f"{stage}_peak_rss_gb"] = _peak_rss_gb()
    log.info(
        "%s: %.1f s, peak traced %.2f GB, peak RSS %.2f GB",
        stage,
        figures[f"{stage}_s"],
        figures[f"{stage}_peak_traced_gb"],
        figures[f"{stage}_peak_rss_gb"],
    )
    return result


def _peak_rss_gb() -> float:
    """The process's peak resident memory so far (Linux reports it in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--people", type=int, default=1_000_000)
    parser.add_argument("--appearances", type=int, default=10, help="S: rows a person is in")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sigma", type=float, default=5.0, help="DP-SGD noise multiplier")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch's intra-op threads (1: a logistic regression's tiny ops are not drowned "
        "in OpenMP waits, and the machine is shared)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # the silos' finiteness checks run on torch too
    torch.manual_seed(args.seed)  # the model's initialisation
    log_to_stderr(log)
    tracemalloc.start()
    figures: dict[str, object] = {"people": args.people, "appearances": args.appearances}

    population = measured(
        figures, "generate", lambda: pandemic_population(args.people, seed=args.seed)
    )
    cross = population.region[population.contact_a] != population.region[population.contact_b]
    figures["contacts"] = population.contacts
    figures["mean_degree"] = round(2 * population.contacts / population.people, 2)
    figures["cross_region_contact_share"] = round(float(cross.mean()), 4)
    figures["ever_observed_infected_share"] = round(
        float((population.states[:, -1] != SUSCEPTIBLE).mean()), 4
    )
    figures["newly_infected_days_56_62_share"] = round(
        float(population.newly_infected(56, 7).mean()), 5
    )

    data = measured(
        figures,
        "prune_and_tabularise",
        lambda: pandemic_dataset(population, max_appearances=args.appearances, seed=args.seed),
    )
    train = data.split == "train"
    figures["rows"] = len(data)
    figures["feature_width"] = data.n_features
    figures["features_gb"] = round(data.features.nbytes / 2**30, 3)
    figures["train_positive_rate"] = round(float(data.labels[train].mean()), 5)
    figures["test_positive_rate"] = round(float(data.labels[~train].mean()), 5)
    figures["kept_neighbours_mean"] = round(
        float((data.extra["members"][:, 1:] >= 0).sum(1).mean()), 2
    )

    # Training: one silo per region, each region's rows split as the dataset splits them.
    names = list(data.site_names)
    silos = measured(
        figures,
        "build_silos",
        lambda: silos_from_splits(
            data, official_splits(data, partition.natural(data.site_ids), names), names=names
        ),
    )
    # The sampling rate B / n must stay ≤ 1 in every region (at 20k people the smallest
    # holds ~300 train rows); sizes are declared, so the batch reads no private count.
    batch = min(BATCH, *(s.declared_size for s in silos))
    algorithm = Local(
        model=logistic_regression(data.n_features),
        loss=focal(),
        dpsgd=DPSGDConfig(clip_norm=1.0, noise_multiplier=args.sigma, learning_rate=0.1),
        expected_batch_size=batch,
        local_epochs=1.0,
    )
    with tempfile.TemporaryDirectory(prefix="bench-pandemic-") as folder:
        result = measured(
            figures,
            "dpsgd_epoch",
            lambda: simulate(
                algorithm,
                silos,
                RunPlan(rounds=1, progress=False, threads=args.threads, eval_every=1),
                ledger=Path(folder) / "ledger.sqlite",
            ),
        )
        spent = result.epsilon[0]  # read off the ledger, so before its folder goes
    worst = max(spent, key=lambda name: spent[name].epsilon)
    figures["noise_multiplier"] = args.sigma
    figures["expected_batch_size"] = batch
    rows, seconds = sum(s.size for s in silos), figures["dpsgd_epoch_s"]
    assert isinstance(seconds, float)
    figures["train_rows"] = rows
    figures["dp_steps_summed"] = sum(algorithm.local_steps(s.info) for s in silos)
    figures["rows_per_s"] = round(rows / seconds)
    figures["test_auprc"] = round(result.history[-1]["metrics"]["auprc"], 4)
    figures["epsilon_max"] = round(spent[worst].epsilon, 4)
    figures["epsilon_max_silo"] = worst
    figures["epsilon_delta"] = spent[worst].delta
    figures["epsilon_accounting"] = f"{spent[worst].accountant}, {spent[worst].neighbouring}"

    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key:40s} {value}")


if __name__ == "__main__":
    main()
