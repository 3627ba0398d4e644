"""A study's results in a few numbers, as JSON-ready dicts: per run, and per silo of one run.

The figures are `dpfl.experiments.queries`' (as in the report and `best`): means over
trials of the final metrics; ε in the server's view, each silo's largest over its
trials, by both accountants; bytes per client over the whole run, mean over trials.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpfl.experiments.datasheet import research_noise
from dpfl.experiments.queries import Spread, open_results, summarise


def run_summaries(directory: str | Path) -> list[dict[str, Any]]:
    """One dict per finished run: its grid point, σ, largest ε over silos and trials by
    both accountants (`accountant` names the one that enforced the budgets), whether
    the noise was seeded (research only), final metrics mean/std over trials, bytes per
    client."""
    with open_results(directory) as store:
        summaries = [summarise(store, run) for run in store.runs(status="finished")]
    return [
        {
            "id": s.run.id,
            "algorithm": s.run.algorithm,
            "grid": s.run.grid,
            "trials": s.run.trials,
            "rounds": s.run.rounds_completed,
            "stopped_by_budget": s.run.stopped_by_budget,
            "noise_multiplier": s.run.noise_multiplier,
            "accountant": s.accountant,
            "epsilon": {a: e.max for a, e in s.epsilon.items() if e.by_silo} or None,
            "research_noise": research_noise(s.run),
            "metrics": _mean_std(s.metrics.final.get(None, {})),
            "bytes_up_per_client": s.traffic.per_client("up"),
            "bytes_down_per_client": s.traffic.per_client("down"),
            "seconds": s.run.seconds,
        }
        for s in summaries
    ]


def silo_summaries(directory: str | Path, run_id: str) -> list[dict[str, Any]]:
    """One dict per silo of a run: final metrics, ε (PLD and RDP, each the largest over
    trials) at its δ, bytes (mean over trials)."""
    with open_results(directory) as store:
        s = summarise(store, store.run(run_id))
    metrics = {silo: _mean_std(m) for silo, m in s.metrics.final.items() if silo is not None}
    deltas = {silo: d for e in s.epsilon.values() for silo, d in e.delta.items()}
    silos = sorted({*(silo for silo, m in metrics.items() if m), *deltas, *s.traffic.up})
    return [
        {
            "silo": silo,
            "metrics": metrics.get(silo, {}),
            "epsilon": {a: e.by_silo[silo] for a, e in s.epsilon.items() if silo in e.by_silo},
            "delta": deltas.get(silo),
            "bytes_up": s.traffic.per_client("up", silo),
            "bytes_down": s.traffic.per_client("down", silo),
        }
        for silo in silos
    ]


def _mean_std(final: dict[str, Spread]) -> dict[str, dict[str, float]]:
    """{metric: {mean, std}} of the defined metrics; std 0 for a single trial."""
    return {
        metric: {"mean": spread.mean, "std": spread.std if len(spread.values) > 1 else 0.0}
        for metric, spread in final.items()
        if spread.defined
    }
