"""The seed papers' experiments, each re-run on the closest data we have.

Each recipe module exports one `RECIPE`, a `Recipe` (see `base`): its `name` (the
command's), `title`, `studies(data_dir, scale)` (the study configs to run, as `Study`
objects, possibly none when its real data are absent, with `notes` saying so) and
`compare(runs, store)` (rows: what the paper measured next to ours). `RECIPES` lists
them by name. `reproduce` runs the studies through the ordinary sweep machinery, so a
reproduction is itself a study directory: resumable, with a results store, `best` and
`report`. A plan's tuned studies (`Tuning`) are selected by `dpfl tune`, each into its
own folder under `tuned/`, and read by the recipe's `compare_tuned`. Beside them, `base`
and the `*_common` modules hold what recipes share, and `pages` renders the reproduction
pages' tables from the stored rows.

Scales: `smoke` (seconds; the tests), `default` (minutes), `full` (the paper's trials,
rounds and grid).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

from dpfl.experiments.recipes import (
    astar,
    diabetes_readmission,
    dopamine,
    dopamine_retinamnist,
    flamby_heart,
    flamby_tcga,
    gse7390_survival,
    kerkouche,
    large_models,
    owkin,
    puffle,
    puffle_pandemic,
    scatternet,
)
from dpfl.experiments.recipes.base import (
    Plan,
    Recipe,
    Row,
    Scale,
    Selected,
    Tuning,
    mean_std,
    real_folder,
)
from dpfl.experiments.results.store import ResultsStore, RunRow
from dpfl.experiments.study.point import STORE, Progress
from dpfl.experiments.study.runner import die_with, run_study
from dpfl.experiments.study.tune import RESULT, released, tune

__all__ = [
    "RECIPES",
    "Plan",
    "Recipe",
    "Reproduction",
    "Row",
    "Scale",
    "Selected",
    "Tuning",
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
        dopamine_retinamnist.RECIPE,
        scatternet.RECIPE,
        large_models.RECIPE,
        flamby_heart.RECIPE,
        flamby_tcga.RECIPE,
        gse7390_survival.RECIPE,
        diabetes_readmission.RECIPE,
    )
}
"""Command name -> recipe, in the order the docs present them."""
TUNED = "tuned"
"""A reproduction's folder of selections: one `dpfl tune` directory per tuned study."""


@dataclass(frozen=True)
class Reproduction:
    name: str
    title: str
    rows: list[Row]
    notes: list[str]
    runs: list[RunRow]
    selected: list[Selected] = field(default_factory=list)


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
    selected = _selections(plan.tuned, Path(out) / TUNED, workers, report)
    with ResultsStore(Path(out) / STORE) as store:
        rows = chosen.compare(runs, store) + chosen.compare_tuned(selected)
    return Reproduction(name, chosen.title, rows, plan.notes, runs, selected)


def _selections(tunings: list[Tuning], out: Path, workers: int, report: Progress) -> list[Selected]:
    """Each tuning's selection, in `out / study name`, `workers` at a time."""
    folders = [out / tuning.study.name for tuning in tunings]
    if workers <= 1 or len(tunings) <= 1:
        return _reported(map(select, tunings, folders), report)
    with ProcessPoolExecutor(
        min(workers, len(tunings)),
        mp_context=get_context("spawn"),  # torch and fork do not mix
        initializer=die_with,  # as the sweep's workers: none outlives this process
        initargs=(os.getpid(),),
    ) as pool:
        return _reported(pool.map(select, tunings, folders), report)


def _reported(chosen: Iterator[Selected], report: Progress) -> list[Selected]:
    selected = []
    for one in chosen:
        report(f"selected {one.tuning.study.name}: {one.tuned.point}")
        selected.append(one)
    return selected


def select(tuning: Tuning, folder: Path) -> Selected:
    """The selection released in `folder`, made there first unless it was (a rerun
    resumes: a selection is released once)."""
    if not (folder / RESULT).exists():
        study = tuning.study
        tune(study, folder, metric=tuning.metric, mean=tuning.mean, shape=tuning.shape)
    tuned, epsilon = released(folder, delta=tuning.study.points[0][1].privacy.delta)
    return Selected(tuning, tuned, epsilon)
