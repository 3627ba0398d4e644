"""Seconds and memory of the synthetic PETs pandemic: generation, then pruning and
tabularisation into neighbourhood rows (dpfl.data.pandemic).

    .venv/bin/python benchmarks/bench_pandemic.py [--json] [--people N] [--appearances S]

Each stage is measured alone: `<stage>_s` wall seconds; `<stage>_peak_traced_gb` the
peak of memory traced by tracemalloc while it ran (numpy arrays included, and so what
earlier stages still hold); `<stage>_peak_rss_gb` the process's peak resident memory so
far (Linux ru_maxrss, which also sees memory tracemalloc does not, e.g. torch's).
Then the data's shape: people, contacts, positive rates, rows and feature width.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import time
import tracemalloc
from collections.abc import Callable
from typing import TypeVar

from bench_common import log_to_stderr
from dpfl.data.pandemic import SUSCEPTIBLE, pandemic_dataset, pandemic_population

log = logging.getLogger("bench_pandemic")
T = TypeVar("T")


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
    args = parser.parse_args()
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
    # Further stages (training over the silos) are measured the same way, through `measured`.

    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key:40s} {value}")


if __name__ == "__main__":
    main()
