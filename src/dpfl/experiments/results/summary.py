"""A study's results in a few numbers, as JSON-ready dicts: per run, and per silo of one run.

The figures are `dpfl.experiments.results.queries`' (as in the report and `best`): means over
trials of the final metrics; ε in the server's view, each silo's largest over its
trials, by both accountants; bytes per client over the whole run, mean over trials.
Every mean ± std says what it is over (`spread`: "5 trials × 1 seed"); with
`pool_seeds`, runs that differ only in their seed are one row, over every trial of
every seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpfl.experiments.results.datasheet import research_noise
from dpfl.experiments.results.queries import (
    CrossSilo,
    Pooled,
    Spread,
    one_class_of,
    open_results,
    pool_seeds,
    summarise,
)


def run_summaries(directory: str | Path, *, pool: bool = False) -> list[dict[str, Any]]:
    """One dict per finished run: its grid point, σ, largest ε over silos and trials by
    both accountants (`accountant` names the one that enforced the budgets), whether
    the noise was seeded (research only), final metrics mean/std over trials and what
    they are over (`spread`), bytes per client, and each silo's model on each silo's
    test set if the run scored it (`cross_silo`, else None); `one_class`: the warning
    where its final models put every test record in one class (`queries.OneClass`).

    `pool`: one dict per group of runs that differ only in their seed (`runs`, `seeds`;
    `id` is the first run's), every figure over all their trials; σ the largest, seconds
    the sum."""
    with open_results(directory) as store:
        summaries = [summarise(store, run) for run in store.runs(status="finished")]
    return [_summary(p) for p in pool_seeds(summaries, pool=pool)]


def _summary(p: Pooled) -> dict[str, Any]:
    runs = p.runs
    sigmas = [r.noise_multiplier for r in runs if r.noise_multiplier is not None]
    one = one_class_of(p.metrics, p.run.config)
    return {
        "id": p.run.id,
        "runs": [r.id for r in runs],
        "seeds": list(p.replicates.seeds),
        "algorithm": p.run.algorithm,
        "grid": p.grid,
        "trials": p.run.trials,
        "spread": str(p.replicates),
        "rounds": p.run.rounds_completed
        if len({r.rounds_completed for r in runs}) == 1
        else [r.rounds_completed for r in runs],
        "stopped_by_budget": any(r.stopped_by_budget for r in runs),
        "noise_multiplier": max(sigmas) if sigmas else None,
        "accountant": p.accountant,
        "epsilon": {a: e.max for a, e in p.epsilon.items() if e.by_silo} or None,
        "research_noise": any(research_noise(r) for r in runs),
        "metrics": _mean_std(p.metrics.final.get(None, {})),
        "one_class": None if one is None else str(one),
        "cross_silo": cross_silo_rows(p.cross_silo) or None,
        "bytes_up_per_client": p.traffic.per_client("up"),
        "bytes_down_per_client": p.traffic.per_client("down"),
        "seconds": None
        if all(r.seconds is None for r in runs)
        else sum(r.seconds or 0.0 for r in runs),
    }


def cross_silo_rows(cross: CrossSilo) -> list[dict[str, Any]]:
    """One dict per (model silo, test silo): `model` (None: the model every silo
    shared), `test`, and the defined metrics' mean/std over the replicates."""
    return [
        {"model": model, "test": test, "metrics": _mean_std(by_metric)}
        for model, by_test in sorted(
            cross.items(), key=lambda item: (item[0] is not None, item[0] or "")
        )
        for test, by_metric in sorted(by_test.items())
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


def _mean_std(final: dict[str, Spread]) -> dict[str, dict[str, float | None]]:
    """{metric: {mean, std}} of the defined metrics; std None for a single value (its
    spread is unknown, not 0)."""
    return {
        metric: {"mean": spread.mean, "std": spread.std if len(spread.values) > 1 else None}
        for metric, spread in final.items()
        if spread.defined
    }
