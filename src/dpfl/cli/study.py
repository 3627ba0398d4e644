"""`dpfl run | sweep | best | reproduce`: studies from TOML files and the seed papers."""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from .common import console, errors, mean_std, print_json, reported_errors

if TYPE_CHECKING:
    from dpfl.experiments.recipes.base import Scale
    from dpfl.experiments.results.best import Candidate

OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Study directory (results, ledgers).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
CORES = os.cpu_count() or 1
DEFAULT_DATA = Path("../shared/data")
AddOpt = Annotated[
    bool,
    typer.Option(
        "--add",
        help="Add this study's points to a directory that holds another study's results "
        "(best and report then read both).",
    ),
]
WorkersOpt = Annotated[
    int, typer.Option("--workers", "-j", help="Grid points run at once, one per process.")
]


def run(config: Path, out: OutOpt, json: JsonOpt = False, add: AddOpt = False) -> None:
    """Run one study config (all its trials); refuses a config with grid axes."""
    from dpfl.experiments.study.config import load

    with reported_errors():
        study = load(config)
        if len(study.points) > 1:
            raise ValueError(
                f"{config} is a grid of {len(study.points)} points "
                f"({', '.join(study.axes)}); use `dpfl sweep`"
            )
        again = ["run", str(config), "--out", str(out), *(["--json"] * json), *(["--add"] * add)]
        with _resumable(again):
            _run(study, out, workers=1, json=json, progress=not json, add=add)


def sweep(
    config: Path,
    out: OutOpt,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            "-j",
            help=f"Grid points run at once, one per local process (default: the {CORES} "
            "cores here); not with --ray.",
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="Run the points on this Ray cluster (auto, HOST:PORT or ray://HOST:PORT), "
            "one CPU each; --out must be on a filesystem every node mounts at the same path.",
        ),
    ] = None,
    json: JsonOpt = False,
    add: AddOpt = False,
) -> None:
    """Run every grid point of a study × its trials; rerun to resume after a stop."""
    from dpfl.experiments.study.config import load

    where = ["-j", str(CORES if workers is None else workers)] if ray is None else ["--ray", ray]
    again = ["sweep", str(config), "--out", str(out), *where, *(["--json"] * json)]
    again += ["--add"] * add
    with reported_errors(), _resumable(again):
        if ray is not None and workers is not None:
            raise ValueError(
                "-j/--workers counts local processes; with --ray each point takes one CPU of "
                "the cluster, whose free CPUs decide how many run at once: leave -j out"
            )
        local = CORES if workers is None else workers
        study = load(config)
        _run(
            study, out, workers=1 if ray else local, ray=ray, json=json, progress=not json, add=add
        )


def tune(
    config: Path,
    out: OutOpt,
    metric: Annotated[
        str, typer.Option(help="Validation metric to maximise (loss, ibs: minimise).")
    ] = "accuracy",
    mean: Annotated[
        float, typer.Option(help="Mean number of candidate runs (random, never shown).")
    ] = 10.0,
    shape: Annotated[
        float,
        typer.Option(
            help="Law of the number of runs: truncated negative binomial of this shape "
            "(0 logarithmic, 1 geometric) or, with inf, Poisson."
        ),
    ] = 1.0,
    validation: Annotated[
        float | None,
        typer.Option(
            help="Fraction of the records held out for validation (default: the study's "
            "tune.validation_fraction, 0.2; tune.validation says which records)."
        ),
    ] = None,
    json: JsonOpt = False,
    add: AddOpt = False,
) -> None:
    """Select among the study's grid points privately: a random number of DP runs, only
    the best released, the selection charged to every silo's ledger (Papernot & Steinke)."""
    from dpfl.experiments.study.config import load
    from dpfl.experiments.study.tune import tune

    with reported_errors():
        study = load(config)
        tuned = tune(
            study,
            out,
            metric=metric,
            mean=mean,
            shape=shape,
            validation_fraction=validation,
            add=add,
        )
        if json:
            print_json(dataclasses.asdict(tuned))
            return
        privacy = (
            "non-private: ε = ∞"
            if tuned.noise_multiplier is None
            else f"σ = {tuned.noise_multiplier:.4g}; ε = {max(tuned.epsilon.values()):.4g} at "
            f"δ = {tuned.delta:g} (RDP, the selection included; the largest over silos; "
            f"ledger {out / tuned.ledger})"
        )
        _warn_tuned_one_class(tuned.test_metrics, study.points[0][1].threshold.choose)
        console.print(
            f"chosen: {_grid(tuned.point)}  validation {metric} {tuned.validation:.4f}\n"
            f"test: "
            + "  ".join(f"{k} {v:.4f}" for k, v in tuned.test_metrics.items())
            + f"\n{privacy}\n"
            + "\n".join(f"{key.replace('_', ' ')}: {text}" for key, text in tuned.datasheet.items())
        )


def best(
    directory: Annotated[Path, typer.Argument(help="A study directory.")],
    epsilon: Annotated[float, typer.Option("--epsilon", "-e", help="Target ε per silo.")],
    delta: Annotated[float, typer.Option("--delta", "-d", help="Target δ per silo.")],
    metric: Annotated[
        str, typer.Option(help="Metric to maximise (loss, ibs: minimise).")
    ] = "accuracy",
    validation_silo: Annotated[
        str | None,
        typer.Option(help="Rank by this silo's test set (public or held out), not the union."),
    ] = None,
    pool_seeds: Annotated[
        bool,
        typer.Option(
            "--pool-seeds",
            help="Runs that differ only in their seed are one candidate (metric over every "
            "trial of every seed; within the budget only if every seed is).",
        ),
    ] = False,
    json: JsonOpt = False,
) -> None:
    """The best finished configuration whose every silo is within (ε, δ), and whether its ε
    includes the selection (a `dpfl tune` directory) or not (a sweep's)."""
    from dpfl.experiments.results.best import candidates
    from dpfl.experiments.study.tune import RESULT

    with reported_errors():
        if (directory / RESULT).exists():
            if validation_silo is not None or pool_seeds:
                raise ValueError(
                    f"{directory} holds a private selection (dpfl tune): its one released "
                    "configuration was chosen on validation splits; --validation-silo and "
                    "--pool-seeds are for sweeps"
                )
            _best_tuned(directory, epsilon, delta, metric, json)
            return
        found = candidates(
            directory,
            epsilon=epsilon,
            delta=delta,
            metric=metric,
            validation_silo=validation_silo,
            pool=pool_seeds,
        )
        chosen = next((c for c in found if c.qualifies), None)
        if json:
            print_json(_best_json(found, chosen, metric, delta))
            return
        console.print(_candidates_table(found, metric, epsilon, delta))
        if chosen is None:
            errors.print(f"[red]no finished run is within ε={epsilon:g}, δ={delta:g}[/red]")
            raise typer.Exit(1)
        _print_best(chosen, len(found))


def _best_json(
    found: list[Candidate], chosen: Candidate | None, metric: str, delta: float
) -> dict[str, Any]:
    """`best --json`'s object: the chosen candidate (or None), the counts and the caveat."""
    from dpfl.experiments.results.best import CAVEAT
    from dpfl.experiments.results.datasheet import research_noise
    from dpfl.experiments.results.store import enforcing_accountant

    return {
        "best": None
        if chosen is None
        else {
            "run": chosen.run.id,
            "runs": [r.id for r in chosen.runs],
            "algorithm": chosen.run.algorithm,
            "grid": _pooled_grid(chosen.run.grid, len(chosen.runs)),
            "metric": metric,
            "mean": chosen.mean,
            "std": chosen.std,
            "spread": str(chosen.replicates),
            "epsilon": chosen.epsilon,
            "accountant": enforcing_accountant(chosen.run),
            "research_noise": research_noise(chosen.run),
            "delta": delta,
            "config": chosen.run.config,
            "selection_in_epsilon": False,
            "one_class": None if chosen.one_class is None else str(chosen.one_class),
        },
        "qualifying": sum(c.qualifies for c in found),
        "finished": len(found),
        "caveat": CAVEAT,
    }


def _candidates_table(found: list[Candidate], metric: str, epsilon: float, delta: float) -> Table:
    """`best`'s table: every finished candidate, best first, and whether it is within budget."""
    from dpfl.experiments.results.datasheet import research_noise
    from dpfl.experiments.results.queries import mean_std_text
    from dpfl.experiments.results.store import enforcing_accountant

    table = Table(
        title=f"finished runs by {metric} within ε={epsilon:g}, δ={delta:g}",
        caption=_research_caption(research_noise(c.run) for c in found),
    )
    columns = (
        "run",
        "algorithm",
        "grid point",
        metric,
        "± over",
        f"ε at δ={delta:g}",
        "within",
    )
    for column in columns:
        table.add_column(column)
    for c in found:
        table.add_row(
            c.run.id + (f" +{len(c.runs) - 1}" if len(c.runs) > 1 else ""),
            c.run.algorithm,
            _grid(_pooled_grid(c.run.grid, len(c.runs))),
            mean_std_text(c.mean, c.std, 4),
            str(c.replicates),
            _epsilon(c.epsilon, enforcing_accountant(c.run), research_noise(c.run)),
            "yes" if c.qualifies else "no",
        )
    return table


def _print_best(chosen: Candidate, finished: int) -> None:
    """`best`'s verdict under the table: the chosen run(s), and that its ε leaves the
    selection among `finished` configurations out."""
    from dpfl.experiments.results.best import CAVEAT
    from dpfl.experiments.results.datasheet import RESEARCH_MARK, RESEARCH_NOISE, research_noise

    runs = "runs " + ", ".join(r.id for r in chosen.runs) if len(chosen.runs) > 1 else ""
    console.print(
        f"best: {runs or 'run ' + chosen.run.id} ({chosen.run.algorithm} "
        f"{_grid(_pooled_grid(chosen.run.grid, len(chosen.runs)))}; {chosen.replicates})"
    )
    if research_noise(chosen.run):
        console.print(f"[yellow]{RESEARCH_MARK} {RESEARCH_NOISE}[/yellow]")
    if chosen.one_class is not None:
        console.print(f"[yellow]warning:[/yellow] {escape(str(chosen.one_class))}")
    console.print(
        f"[yellow]ε is the chosen run's alone: choosing it among {finished} finished "
        f"configurations is not in it.[/yellow] {CAVEAT}"
    )


def _best_tuned(directory: Path, epsilon: float, delta: float, metric: str, json: bool) -> None:
    """`best` of a `dpfl tune` directory: its one released configuration, whose ε (from
    its ledger) includes the selection."""
    from dpfl.experiments.study.tune import released

    tuned, worst = released(directory, delta=delta)
    if metric not in tuned.test_metrics:
        raise ValueError(
            f"unknown metric {metric!r}; the selection has {', '.join(tuned.test_metrics)}"
        )
    within = worst <= epsilon
    how = (
        f"dpfl tune: the best of a random number of runs (mean {tuned.mean:g}, "
        f"shape {tuned.shape:g}), only it released"
    )
    if json:
        print_json(
            {
                "best": {
                    "grid": tuned.point,
                    "metric": metric,
                    "mean": tuned.test_metrics[metric],
                    "epsilon": worst,
                    "accountant": "rdp",
                    "delta": delta,
                    "noise_multiplier": tuned.noise_multiplier,
                    "selection_in_epsilon": True,
                    "selection": how,
                }
                if within
                else None,
                "qualifying": int(within),
                "finished": 1,
                "caveat": None,
            }
        )
        if not within:
            raise typer.Exit(1)
        return
    chosen = f"{_grid(tuned.point)}  test {metric} {tuned.test_metrics[metric]:.4f}"
    if tuned.noise_multiplier is None:
        console.print(f"selected (non-private, ε = ∞): {chosen} ({how})")
    else:
        console.print(
            f"selected privately: {chosen}; σ = {tuned.noise_multiplier:.4g}\n"
            f"ε = {worst:.4g} at δ = {delta:g} (RDP, the largest over silos, ledger "
            f"{directory / tuned.ledger}): [green]the selection is in it[/green] ({how})"
        )
    if not within:
        errors.print(f"[red]the selection is not within ε={epsilon:g}, δ={delta:g}[/red]")
        raise typer.Exit(1)


def reproduce(
    name: Annotated[
        str,
        typer.Argument(metavar="RECIPE", help="One of the recipes listed above."),
    ],
    out: OutOpt,
    full: Annotated[bool, typer.Option("--full", help="The paper's scale (hours).")] = False,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder of the real datasets (default: ../shared/data, from the working "
            "directory)."
        ),
    ] = None,
    workers: WorkersOpt = CORES,
    json: JsonOpt = False,
    markdown: Annotated[
        bool,
        typer.Option(
            "--markdown",
            help="Print the table as Markdown, as the reproduction pages hold it; on a "
            "finished directory nothing runs again.",
        ),
    ] = False,
) -> None:
    """Re-run a seed paper's experiment on our data and print ours next to the paper's.

    RECIPE: owkin-idash2020, astar-aop, kerkouche-fl-sign, puffle-mrmtl, puffle-pandemic,
    dopamine, dopamine-retinamnist, scatternet, large-models, flamby-heart-disease,
    flamby-tcga-brca, gse7390-survival or diabetes-readmission
    (docs/reproductions/README.md)."""
    from dpfl.experiments.recipes import reproduce as run_recipe
    from dpfl.experiments.study.runner import StudyBar

    again = ["reproduce", name, "--out", str(out), *(["--full"] * full)]
    again += [*(["--data-dir", str(data_dir)] if data_dir else []), "-j", str(workers)]
    again += [*(["--json"] * json), *(["--markdown"] * markdown)]
    with reported_errors(), _resumable(again):
        if json and markdown:
            raise ValueError("--json and --markdown: choose one")
        if data_dir is not None and not data_dir.is_dir():
            raise ValueError(f"--data-dir: {data_dir} is not a folder")
        folder = data_dir or DEFAULT_DATA
        if not folder.is_dir():
            errors.print(
                f"[yellow]note:[/yellow] no real data: the default data folder {DEFAULT_DATA} "
                f"(from the working directory: {folder.resolve()}) does not exist; pass "
                "--data-dir FOLDER, the folder that holds gse7390/, physionet2012/, ..."
            )
        scale: Scale = "full" if full else "default"
        result = run_recipe(
            name,
            out,
            data_dir=folder,
            scale=scale,
            workers=workers,
            report=(lambda line: None) if json or markdown else StudyBar(errors.print),
        )
        if markdown:
            from dpfl.experiments.recipes.pages import markdown as table_text

            print(table_text(result.title, result.rows, result.notes), end="")
            return
        if json:
            print_json(
                {
                    "recipe": result.name,
                    "title": result.title,
                    "scale": scale,
                    "rows": [vars(row) for row in result.rows],
                    "notes": result.notes,
                    "runs": [run.id for run in result.runs],
                }
            )
            return
        table = Table(title=result.title)
        for column in ("setting", "paper", "ours", "n", "note"):
            table.add_column(column)
        for row in result.rows:
            n = "—" if row.trials is None else str(row.trials)
            table.add_row(row.setting, row.paper, row.ours, n, row.note)
        console.print(table)
        for note in result.notes:
            console.print(f"[yellow]note:[/yellow] {note}")


def _run(
    study: Any,
    out: Path,
    *,
    workers: int,
    json: bool,
    progress: bool,
    ray: str | None = None,
    add: bool = False,
) -> None:
    from dpfl.experiments.results.summary import run_summaries
    from dpfl.experiments.study.runner import run_study

    runs = run_study(
        study,
        out,
        workers=workers,
        ray=ray,
        progress=progress,
        add=add,
        report=(lambda line: None)
        if json
        else lambda line: errors.print(escape(line), soft_wrap=True),
    )
    failed = [run for run in runs if run.status == "failed"]
    by_id = {s["id"]: s for s in run_summaries(out)}
    summaries = [by_id[run.id] for run in runs if run.id in by_id]
    pooled = [s for s in run_summaries(out, pool=True) if len(s["runs"]) > 1]
    mine = {run.id for run in runs}
    pooled = [s for s in pooled if mine.issuperset(s["runs"])]
    if json:
        print_json(
            {"study": study.name, "runs": summaries, "pooled": pooled, "failed": len(failed)}
        )
    else:
        metrics = study.points[0][1].metrics
        console.print(runs_table(summaries, metrics))
        if pooled:
            console.print(runs_table(pooled, metrics, title=POOLED_TITLE))
        for s in summaries:
            if s["cross_silo"]:
                console.print(cross_silo_table(s, metrics[0]))
    warn_one_class(summaries)
    for run in failed:
        error = escape(run.error or "")
        errors.print(
            f"[red]failed:[/red] {run.id} {escape(_grid(run.grid))}: {error}", soft_wrap=True
        )
    if failed:
        raise typer.Exit(1)


def _warn_tuned_one_class(test: dict[str, float], threshold: str) -> None:
    """A yellow warning if the released model predicted one class on the test records
    (a binary task whose test records hold both classes: its AUROC is defined)."""
    import math

    from dpfl.experiments.results.queries import one_class

    figures = [test.get(m, math.nan) for m in ("balanced_accuracy", "recall", "auroc")]
    defined = not any(math.isnan(f) for f in figures)
    found = one_class([figures[0]], [figures[1]], threshold) if defined else None
    if found is not None:
        errors.print(f"[yellow]warning:[/yellow] {escape(str(found))}", soft_wrap=True)


def warn_one_class(summaries: list[dict[str, Any]]) -> None:
    """A yellow warning for each run whose final models predicted one class."""
    for s in summaries:
        if s["one_class"]:
            errors.print(
                f"[yellow]warning:[/yellow] run {s['id'][:8]} ({escape(_grid(s['grid']))}): "
                + escape(s["one_class"]),
                soft_wrap=True,
            )


@contextmanager
def _resumable(command: list[str]) -> Iterator[None]:
    """Ctrl-C ends the command with the exact command that resumes it."""
    try:
        yield
    except KeyboardInterrupt:
        errors.print(
            "[yellow]interrupted:[/yellow] finished points are kept; an unfinished point "
            "resumes from its last checkpoint and pays for no round twice. Resume with:\n  "
            + escape(shlex.join(["dpfl", *command]))
        )
        raise typer.Exit(130) from None


RUNS_TITLE = "runs (means ± sample std over what “± over” says; ε: largest over silos and trials)"
POOLED_TITLE = (
    "runs that differ only in their seed, pooled (means ± sample std over every trial of "
    "every seed; ε: largest over silos, trials and seeds)"
)


def runs_table(
    summaries: list[dict[str, Any]], metrics: list[str], *, title: str = RUNS_TITLE
) -> Table:
    """One row per run (or runs pooled over seeds): grid point, what the ± is over, σ,
    largest ε over silos and trials (by the enforcing accountant), metrics, bytes per
    client."""
    table = Table(
        title=title,
        caption=_research_caption(s["research_noise"] for s in summaries),
    )
    for column in ("run", "algorithm", "grid point", "± over", "σ", "ε", *metrics, "bytes up"):
        table.add_column(column, no_wrap=column in ("run", "± over"))
    for s in summaries:
        eps = s["epsilon"]
        runs = s.get("runs") or [s["id"]]
        table.add_row(
            s["id"][:8] + (f" +{len(runs) - 1}" if len(runs) > 1 else ""),
            s["algorithm"],
            _grid(s["grid"]),
            s.get("spread") or f"{s['trials']} trials",
            "—" if s["noise_multiplier"] is None else f"{s['noise_multiplier']:.4g}",
            "∞"
            if eps is None
            else _epsilon(eps[s["accountant"]], s["accountant"], s["research_noise"]),
            *[mean_std(s["metrics"].get(m)) for m in metrics],
            f"{s['bytes_up_per_client']:,.0f}",
        )
    return table


def cross_silo_table(summary: dict[str, Any], metric: str) -> Table:
    """A run's cross-silo scores: a row per model silo, a column per test silo."""
    rows = summary["cross_silo"]
    tests = sorted({row["test"] for row in rows})
    table = Table(
        title=f"run {summary['id'][:8]}: {metric} of each silo's final model (rows) on each "
        f"silo's test set (columns), mean ± sample std over {summary['spread']}"
    )
    for column in ("model", *tests):
        table.add_column(column)
    by_model: dict[str | None, dict[str, Any]] = {}
    for row in rows:
        by_model.setdefault(row["model"], {})[row["test"]] = row["metrics"].get(metric)
    for model, by_test in by_model.items():
        cells = [mean_std(by_test.get(test)) for test in tests]
        table.add_row("shared (every silo's)" if model is None else model, *cells)
    return table


def _pooled_grid(grid: dict[str, Any], runs: int) -> dict[str, Any]:
    """The grid point of runs pooled over seeds: without the seed that tells them apart."""
    return grid if runs < 2 else {k: v for k, v in grid.items() if k != "seed"}


def _epsilon(value: float, accountant: str, seeded: bool) -> str:
    """ε labelled with the accountant that enforced it, marked if the noise was seeded."""
    from dpfl.experiments.results.datasheet import RESEARCH_MARK

    return f"{value:.4g} ({accountant.upper()})" + (f" {RESEARCH_MARK}" if seeded else "")


def _research_caption(seeded: Iterable[bool]) -> str | None:
    """The warning under a table whose ε include research runs."""
    from dpfl.experiments.results.datasheet import RESEARCH_MARK, RESEARCH_NOISE

    return f"{RESEARCH_MARK} {RESEARCH_NOISE}" if any(seeded) else None


def _grid(grid: dict[str, Any]) -> str:
    """`name=fedavg epsilon=0.5`: the last part of each key is enough to tell points apart."""
    from dpfl.experiments.study.config import grid_pairs

    return " ".join(grid_pairs(grid, last_part=True)) or "—"
