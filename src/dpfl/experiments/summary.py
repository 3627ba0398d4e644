"""A study's results in a few numbers: per run, and per silo of one run.

Means are over trials; ε is the server view's, read from the store (which read it off
each run's ledger); bytes are per client over the whole run.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from dpfl.experiments.runner import STORE
from dpfl.experiments.store import ResultsStore, RunRow


def run_summaries(directory: str | Path) -> list[dict[str, Any]]:
    """One dict per finished run: its grid point, σ, largest ε over silos (by the run's
    accountant and by RDP), final metrics mean/std over trials, bytes per client."""
    with ResultsStore(Path(directory) / STORE, create=False) as store:
        return [_run(store, run) for run in store.runs(status="finished")]


def silo_summaries(directory: str | Path, run_id: str) -> list[dict[str, Any]]:
    """One dict per silo of a run: final metrics, ε (PLD and RDP) at its δ, bytes."""
    with ResultsStore(Path(directory) / STORE, create=False) as store:
        run = store.run(run_id)
        last = run.last_round
        metrics = _by(store.rows("metrics", run.id), last, "silo")
        privacy = _final_privacy(store.rows("privacy", run.id), last)
        traffic = _traffic(store.rows("communication", run.id), run.trials)
        silos = sorted(str(s) for s in {*metrics, *privacy, *traffic} if s is not None)
        return [
            {
                "silo": silo,
                "metrics": metrics.get(silo, {}),
                **privacy.get(silo, {"epsilon": {}, "delta": None}),
                **traffic.get(silo, {"bytes_up": 0.0, "bytes_down": 0.0}),
            }
            for silo in silos
        ]


def _run(store: ResultsStore, run: RunRow) -> dict[str, Any]:
    last = run.last_round
    metrics = _by(store.rows("metrics", run.id), last, "silo").get(None, {})
    privacy = _final_privacy(store.rows("privacy", run.id), last)
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
        "accountant": run.datasheet.get("accountant"),
        "epsilon": {
            accountant: max(p["epsilon"].get(accountant, math.inf) for p in privacy.values())
            for accountant in ("pld", "rdp")
        }
        if privacy
        else None,
        "metrics": metrics,
        "bytes_up_per_client": statistics.fmean([t["bytes_up"] for t in per_client])
        if per_client
        else 0.0,
        "bytes_down_per_client": statistics.fmean([t["bytes_down"] for t in per_client])
        if per_client
        else 0.0,
        "seconds": run.seconds,
    }


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


def _final_privacy(rows: list[dict[str, Any]], last: int) -> dict[str, dict[str, Any]]:
    """Per silo: the largest final ε over trials by each accountant (server view), δ."""
    found: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["round"] != last or row["view"] is not None:
            continue
        entry = found.setdefault(row["silo"], {"epsilon": {}, "delta": row["delta"]})
        previous = entry["epsilon"].get(row["accountant"], -math.inf)
        entry["epsilon"][row["accountant"]] = max(previous, row["epsilon"])
    return found


def _traffic(rows: list[dict[str, Any]], trials: int) -> dict[str, dict[str, float]]:
    """Per silo: bytes sent up and down over the run, mean over trials."""
    totals: dict[str, dict[str, float]] = defaultdict(lambda: {"bytes_up": 0.0, "bytes_down": 0.0})
    for row in rows:
        totals[row["silo"]]["bytes_up"] += row["bytes_up"] / trials
        totals[row["silo"]]["bytes_down"] += row["bytes_down"] / trials
    return dict(totals)
