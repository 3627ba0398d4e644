"""A study's results in a few numbers: per run, and per silo of one run.

Means are over trials; ε is the server view's, each silo's largest over its trials
(`ResultsStore.epsilon_by_silo`, which read it off each run's ledger); bytes are per
client over the whole run.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from dpfl.experiments.datasheet import research_noise
from dpfl.experiments.runner import STORE
from dpfl.experiments.store import ResultsStore, RunRow, SiloEpsilons, enforcing_accountant
from dpfl.privacy import Accountant


def run_summaries(directory: str | Path) -> list[dict[str, Any]]:
    """One dict per finished run: its grid point, σ, largest ε over silos and trials by
    both accountants (`accountant` names the one that enforced the budgets), whether
    the noise was seeded (research only), final metrics mean/std over trials, bytes per
    client."""
    with ResultsStore(Path(directory) / STORE, create=False) as store:
        return [_run(store, run) for run in store.runs(status="finished")]


def silo_summaries(directory: str | Path, run_id: str) -> list[dict[str, Any]]:
    """One dict per silo of a run: final metrics, ε (PLD and RDP, each the largest over
    trials) at its δ, bytes."""
    with ResultsStore(Path(directory) / STORE, create=False) as store:
        run = store.run(run_id)
        metrics = _by(store.rows("metrics", run.id), run.last_round, "silo")
        spent = _spent(store, run)
        deltas = {silo: d for s in spent.values() for silo, d in s.delta.items()}
        traffic = _traffic(store.rows("communication", run.id), run.trials)
        silos = sorted(str(s) for s in {*metrics, *deltas, *traffic} if s is not None)
        return [
            {
                "silo": silo,
                "metrics": metrics.get(silo, {}),
                "epsilon": {a: s.by_silo[silo] for a, s in spent.items() if silo in s.by_silo},
                "delta": deltas.get(silo),
                **traffic.get(silo, {"bytes_up": 0.0, "bytes_down": 0.0}),
            }
            for silo in silos
        ]


def _run(store: ResultsStore, run: RunRow) -> dict[str, Any]:
    metrics = _by(store.rows("metrics", run.id), run.last_round, "silo").get(None, {})
    spent = _spent(store, run)
    traffic = _traffic(store.rows("communication", run.id), run.trials)
    per_client = list(traffic.values())
    return {
        "id": run.id,
        "algorithm": run.algorithm,
        "grid": run.grid,
        "trials": run.trials,
        "rounds": run.rounds_completed,
        "stopped_by_budget": run.stopped_by_budget,
        "noise_multiplier": run.noise_multiplier,
        "accountant": enforcing_accountant(run),
        "epsilon": {a: s.max for a, s in spent.items() if s.by_silo} or None,
        "research_noise": research_noise(run),
        "metrics": metrics,
        "bytes_up_per_client": statistics.fmean([t["bytes_up"] for t in per_client])
        if per_client
        else 0.0,
        "bytes_down_per_client": statistics.fmean([t["bytes_down"] for t in per_client])
        if per_client
        else 0.0,
        "seconds": run.seconds,
    }


def _spent(store: ResultsStore, run: RunRow) -> dict[str, SiloEpsilons]:
    """ε per silo by each accountant."""
    return {a.value: store.epsilon_by_silo(run, accountant=a.value) for a in Accountant}


def _by(
    rows: list[dict[str, Any]], last: int, key: str
) -> dict[str | None, dict[str, dict[str, float]]]:
    """Final-round metrics grouped by `key`: {key: {metric: {mean, std}}} over trials."""
    values: dict[str | None, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["round"] == last and row["value"] is not None:
            values[row[key]][row["metric"]].append(row["value"])
    return {group: {m: _mean_std(v) for m, v in ms.items()} for group, ms in values.items()}


def _mean_std(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def _traffic(rows: list[dict[str, Any]], trials: int) -> dict[str, dict[str, float]]:
    """Per silo: bytes sent up and down over the run, mean over trials."""
    totals: dict[str, dict[str, float]] = defaultdict(lambda: {"bytes_up": 0.0, "bytes_down": 0.0})
    for row in rows:
        totals[row["silo"]]["bytes_up"] += row["bytes_up"] / trials
        totals[row["silo"]]["bytes_down"] += row["bytes_down"] / trials
    return dict(totals)
