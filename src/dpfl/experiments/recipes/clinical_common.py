"""What the clinical recipes (Kerkouche, puffle, Dopamine) share: finding their real
data, scale-dependent settings, and reading per-run figures off the results store."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any, TypeVar

from dpfl.experiments.recipes.base import Scale, mean_std
from dpfl.experiments.results.store import ResultsStore, RunRow

T = TypeVar("T")


SMOKE_NOISE = 1.5
"""σ of the private smoke runs. Calibrating σ costs about a second per distinct silo
size, too slow for a seconds-long smoke test, so smoke runs fix σ; their ε budget
still binds (the runner refuses a plan that would exceed it)."""


def by_scale(scale: Scale, smoke: T, default: T, full: T) -> T:
    """The value for `scale`."""
    return {"smoke": smoke, "default": default, "full": full}[scale]


def budget(scale: Scale, epsilon: float | list[float], delta: float) -> dict[str, Any]:
    """The `privacy` section of a private study: σ calibrated to ε (fixed in smoke runs)."""
    fixed = {"noise_multiplier": SMOKE_NOISE} if scale == "smoke" else {}
    return {"epsilon": epsilon, "delta": delta, **fixed}


def setting(run: RunRow, dotted: str) -> Any:
    """A resolved config value of the run, e.g. `setting(run, "privacy.epsilon")`."""
    node: Any = run.config
    for key in dotted.split("."):
        node = node[key]
    return node


def private(run: RunRow) -> bool:
    return bool(setting(run, "privacy.private"))


def final_rows(store: ResultsStore, run: RunRow, metric: str) -> list[dict[str, Any]]:
    """The metric's rows (union and per silo) at the run's last completed round."""
    return [
        row
        for row in store.rows("metrics", run.id)
        if row["metric"] == metric and row["round"] == run.last_round
    ]


def silo_mean(store: ResultsStore, run: RunRow, metric: str) -> list[float]:
    """Per trial, the mean over silos of each silo's final metric on its own test set:
    how personalised models are judged (each silo uses its own model)."""
    by_trial: dict[int, list[float]] = {}
    for row in final_rows(store, run, metric):
        if row["silo"] is not None and row["value"] is not None and not math.isnan(row["value"]):
            by_trial.setdefault(row["trial"], []).append(row["value"])
    return [statistics.fmean(values) for _, values in sorted(by_trial.items())]


def upstream_per_client(store: ResultsStore, run: RunRow) -> float:
    """Bytes a client sends to the server over the whole run, averaged over the clients
    that sent anything (Kerkouche's Table 7: the average upload of a hospital)."""
    sent: dict[tuple[int, str], int] = {}
    for row in store.rows("communication", run.id):
        if row["bytes_up"]:
            key = (row["trial"], row["silo"])
            sent[key] = sent.get(key, 0) + row["bytes_up"]
    return statistics.fmean(sent.values()) if sent else 0.0


def upstream_per_message(store: ResultsStore, run: RunRow) -> float:
    """Bytes of one client-to-server message (every upload of a run has the same size)."""
    sizes = [row["bytes_up"] for row in store.rows("communication", run.id) if row["bytes_up"]]
    return statistics.fmean(sizes) if sizes else 0.0


def epsilon_text(store: ResultsStore, runs: Sequence[RunRow]) -> str:
    """'ε = 0.93 (budget 1)': the largest ε any silo of these runs spent, by the ledger."""
    chosen = [run for run in runs if private(run)]
    if not chosen:
        return "non-private"
    spent = max(store.epsilon_by_silo(run).max for run in chosen)
    budgets = {setting(run, "privacy.epsilon") for run in chosen} - {None}
    limit = f" (budget {', '.join(f'{b:g}' for b in sorted(budgets))})" if budgets else ""
    return f"ε = {spent:.3g}{limit}"


def metric_text(values: Sequence[float], *, percent: bool = False) -> str:
    """Mean ± sd over trials: a percentage (accuracy) or a fraction to 3 places (AUROC)."""
    if percent or not values:
        return mean_std(values)
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.3f}"
    return f"{mean:.3f} ± {statistics.stdev(values):.3f}"
