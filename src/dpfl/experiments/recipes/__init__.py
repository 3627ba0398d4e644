"""The seed papers' experiments, each re-run on the closest data we have.

Each recipe module exports one `RECIPE`, a `Recipe` (see `base`): its `name` (the
command's), `title`, `studies(data_dir, scale)` (the study configs to run, as `Study`
objects, possibly none when its real data are absent, with `notes` saying so) and
`compare(runs, store)` (rows: what the paper measured next to ours). `RECIPES` lists
them by name. `reproduce` runs the studies through the ordinary sweep machinery, so a
reproduction is itself a study directory: resumable, with a results store, `best` and
`report`.

Scales: `smoke` (seconds; the tests), `default` (minutes), `full` (the paper's trials,
rounds and grid).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dpfl.experiments.recipes import (
    astar,
    diabetes_readmission,
    dopamine,
    flamby_heart,
    flamby_tcga,
    gse7390_survival,
    kerkouche,
    owkin,
    puffle,
    puffle_pandemic,
)
from dpfl.experiments.recipes.base import Plan, Recipe, Row, Scale, mean_std, real_folder
from dpfl.experiments.runner import STORE, Progress, run_study
from dpfl.experiments.store import ResultsStore, RunRow

__all__ = [
    "RECIPES",
    "Plan",
    "Recipe",
    "Reproduction",
    "Row",
    "Scale",
    "mean_std",
    "real_folder",
    "recipe",
    "reproduce",
]

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        owkin.RECIPE,
        astar.RECIPE,
        kerkouche.RECIPE,
        puffle.RECIPE,
        puffle_pandemic.RECIPE,
        dopamine.RECIPE,
        flamby_heart.RECIPE,
        flamby_tcga.RECIPE,
        gse7390_survival.RECIPE,
        diabetes_readmission.RECIPE,
    )
}
"""Command name -> recipe, in the order the docs present them."""


@dataclass(frozen=True)
class Reproduction:
    name: str
    title: str
    rows: list[Row]
    notes: list[str]
    runs: list[RunRow]


def recipe(name: str) -> Recipe:
    """The recipe called `name`; a ValueError naming the known ones otherwise."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}")
    return RECIPES[name]


def reproduce(
    name: str,
    out: str | Path,
    *,
    data_dir: Path | None = None,
    scale: Scale = "default",
    workers: int = 1,
    report: Progress = lambda line: None,
) -> Reproduction:
    """Run recipe `name` into `out` (resuming what is there) and compare with the paper."""
    chosen = recipe(name)
    plan = chosen.studies(data_dir, scale)
    runs = (  # all studies' points share the workers
        run_study(plan.studies, out, workers=workers, report=report) if plan.studies else []
    )
    with ResultsStore(Path(out) / STORE) as store:
        rows = chosen.compare(runs, store)
    return Reproduction(name, chosen.title, rows, plan.notes, runs)
