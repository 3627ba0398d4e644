"""Running studies: one config point (all its trials, stacked) or a whole grid.

Each point's run keeps, beside the study's `results.sqlite`, its own privacy ledger
(`ledgers/<id>.sqlite`) and, while it runs, a checkpoint (`checkpoints/<id>.pt`). A
sweep that is killed and restarted skips the finished points and resumes the others
from their checkpoints with their ledgers, so it loses nothing and pays for nothing
twice. Points run in separate processes (`workers`), trials stacked inside each.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch

from dpfl import models
from dpfl.engines.simulation import SimulationResult, simulate
from dpfl.experiments.config import Study, StudyConfig
from dpfl.experiments.datasets import build_silos
from dpfl.experiments.datasheet import datasheet
from dpfl.experiments.store import ResultsStore, RunResults, RunRow
from dpfl.federation import algorithms
from dpfl.federation.silo import Silo
from dpfl.local import losses
from dpfl.local.dpsgd import DPSGDConfig
from dpfl.local.output_perturbation import AOPConfig
from dpfl.privacy import Accountant, Ledger

STORE = "results.sqlite"

Progress = Callable[[str], None]


def run_study(
    study: Study | Sequence[Study],
    out: str | Path,
    *,
    workers: int = 1,
    progress: bool = False,
    report: Progress = lambda line: None,
) -> list[RunRow]:
    """Run every point of `study` (or of several studies, sharing the workers) not yet
    finished in `out`; return all their runs, in grid order.

    A point that fails is marked failed with its error, and the others go on."""
    out = Path(out)
    studies = [study] if isinstance(study, Study) else list(study)
    points = [point for s in studies for point in s.points]
    with ResultsStore(out / STORE) as store:
        todo = [(g, c) for g, c in points if store.status(c.key()) != "finished"]
    names = ", ".join(s.name for s in studies)
    report(f"{names}: {len(points) - len(todo)} of {len(points)} points done")
    if workers > 1 and len(todo) > 1:
        context = get_context("spawn")  # torch and fork do not mix
        with ProcessPoolExecutor(min(workers, len(todo)), mp_context=context) as pool:
            futures = {
                pool.submit(_run_in_worker, c.model_dump(mode="json"), g, str(out)): c
                for g, c in todo
            }
            for future in as_completed(futures):
                report(future.result())
    else:
        for grid, config in todo:
            report(run_point(config, grid, out, progress=progress))
    with ResultsStore(out / STORE) as store:
        runs = {run.id: run for run in store.runs()}
    return [runs[c.key()] for _, c in points]


def _run_in_worker(config: dict[str, Any], grid: dict[str, Any], out: str) -> str:
    torch.set_num_threads(1)  # one core per process: the pool uses them all
    return run_point(StudyConfig.model_validate(config), grid, Path(out))


def run_point(
    config: StudyConfig, grid: dict[str, Any], out: Path, *, progress: bool = False
) -> str:
    """Run one point (or resume it) and store its results; a one-line summary."""
    key = config.key()
    ledger_file = Path("ledgers") / f"{key}.sqlite"
    checkpoint = out / "checkpoints" / f"{key}.pt"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    with ResultsStore(out / STORE) as store:
        store.start(
            key,
            study=config.name,
            algorithm=config.algorithm.name,
            config=config.model_dump(mode="json"),
            grid=grid,
            trials=config.trials,
            rounds=config.rounds,
        )
        started = time.perf_counter()
        try:
            result = _simulate(config, out / ledger_file, checkpoint, progress)
            if result.interrupted:
                raise KeyboardInterrupt
            results = _results(config, result, ledger_file, time.perf_counter() - started)
        except (KeyboardInterrupt, SystemExit):
            raise  # left 'running': a restart resumes it from its checkpoint
        except Exception as exc:
            store.fail(key, f"{type(exc).__name__}: {exc}")
            return f"{key} {config.algorithm.name} FAILED: {exc}\n{traceback.format_exc()}"
        store.finish(key, results)
    checkpoint.unlink(missing_ok=True)
    return f"{key} {config.algorithm.name} {_show(grid)}finished in {results.seconds:.1f} s"


def _show(grid: dict[str, Any]) -> str:
    return "".join(f"{k}={v} " for k, v in grid.items())


def _simulate(
    config: StudyConfig, ledger: Path, checkpoint: Path, progress: bool
) -> SimulationResult:
    silos = build_silos(config.data, config.seed)
    algorithm = build_algorithm(config, silos)
    privacy = config.privacy
    fixed_noise = privacy.noise_multiplier is not None or config.algorithm.name == "aop"
    with Ledger(ledger, accountant=privacy.accountant) as book:
        return simulate(
            algorithm,
            silos,
            rounds=config.rounds,
            trials=config.trials,
            seed=config.seed,
            epsilon_budget=privacy.epsilon if privacy.private else None,
            delta=privacy.delta,
            budgets={name: (b.epsilon, b.delta) for name, b in privacy.silos.items()},
            calibrate=privacy.private and not fixed_noise,
            ledger=book,
            research_noise=config.research_noise,
            progress=progress,
            checkpoint=checkpoint,
            eval_every=config.eval_every,
        )


def build_algorithm(config: StudyConfig, silos: Sequence[Silo]) -> algorithms.Algorithm:
    """The configured algorithm, its model initialised from the study's seed."""
    spec, privacy = config.algorithm, config.privacy
    classes = int(max(int(s.y.max()) for s in silos)) + 1
    outputs = 1 if classes == 2 else classes
    torch.manual_seed(config.seed)
    model = _model(config, silos[0], classes, outputs)
    loss = _loss(spec.loss or ("bce" if outputs == 1 else "cross_entropy"), spec.positive_weight)
    if spec.name == "aop":
        if not isinstance(model, torch.nn.Linear):
            raise ValueError("aop needs model.kind = 'logistic_regression'")
        assert privacy.epsilon is not None  # checked by StudyConfig
        aop = AOPConfig(
            privacy.epsilon,
            privacy.delta,
            spec.regularization,
            spec.gradient_tolerance,
            spec.feature_norm_bound,
        )
        return algorithms.AOP(model=model, loss=loss, config=aop, epochs=config.rounds)
    dpsgd = (
        DPSGDConfig(
            spec.clip_norm, privacy.noise_multiplier or 1.0, spec.learning_rate, spec.momentum
        )
        if privacy.private
        else DPSGDConfig.non_private(spec.learning_rate, spec.momentum)  # no clipping either
    )
    common: dict[str, Any] = {
        "model": model,
        "loss": loss,
        "dpsgd": dpsgd,
        "expected_batch_size": spec.expected_batch_size,
    }
    local: dict[str, Any] = {"local_epochs": spec.local_epochs}
    sampled: dict[str, Any] = {
        "client_rate": spec.client_rate,
        "clients_per_round": spec.clients_per_round,
        **({} if spec.weighting is None else {"weighting": spec.weighting}),
    }
    makers: dict[str, Callable[[], algorithms.Algorithm]] = {
        "fedavg": lambda: algorithms.FedAvg(**common, **local, **sampled),
        "sign": lambda: algorithms.Sign(
            **common, **local, **sampled, server_learning_rate=spec.server_learning_rate
        ),
        "cyclic": lambda: algorithms.Cyclic(**common, steps_per_visit=spec.steps_per_visit),
        "fedsgd_secure": lambda: algorithms.FedSGDSecure(**common),
        "mrmtl": lambda: algorithms.MRMTL(**common, **local, strength=spec.strength),
        "ditto": lambda: algorithms.Ditto(**common, **local, strength=spec.strength),
        "finetune": lambda: algorithms.Finetune(
            **common, **local, federated_rounds=spec.federated_rounds
        ),
        "local": lambda: algorithms.Local(**common, **local),
        "centralized": lambda: algorithms.Centralized(
            **common, epochs_per_round=spec.epochs_per_round
        ),
    }
    return makers[spec.name]()


def _model(config: StudyConfig, silo: Silo, classes: int, outputs: int) -> torch.nn.Module:
    shape = tuple(silo.x.shape[1:])
    if config.model.kind == "small_cnn":
        if len(shape) != 3:
            raise ValueError(f"model.kind: small_cnn needs images, the data have shape {shape}")
        return models.small_cnn(shape[0], shape[1], n_classes=classes)
    if len(shape) != 1:
        raise ValueError(f"model.kind: {config.model.kind} needs a feature vector, got {shape}")
    if config.model.kind == "mlp":
        return models.mlp(shape[0], config.model.hidden, n_outputs=outputs)
    return models.logistic_regression(shape[0], classes)


def _loss(name: str, positive_weight: float) -> losses.Loss:
    if name == "weighted_bce":
        return losses.weighted_bce(positive_weight)
    if name == "focal":
        return losses.focal()
    loss: losses.Loss = getattr(losses, name)
    return loss


def _results(
    config: StudyConfig, result: SimulationResult, ledger: Path, seconds: float
) -> RunResults:
    metrics = [
        (row["trial"], row["round"], silo, name, value)
        for row in result.history
        for silo, values in [(None, row["metrics"]), *row["silos"].items()]
        for name, value in values.items()
    ]
    communication = [
        (row["trial"], row["round"], row["silo"], row["down"], row["up"], messages)
        for row in result.messages
        for messages in [(row["down"] > 0) + (row["up"] > 0)]
    ]
    last = result.rounds_completed - 1
    rounds = sorted({row["round"] for row in result.history} | {last})
    own = Accountant(config.privacy.accountant)
    other = Accountant.RDP if own is Accountant.PLD else Accountant.PLD
    privacy = []
    with Ledger(result.ledger_path, create=False) as book:
        for trial, accounts in enumerate(result.accounts):
            for silo, views in accounts.items():
                for view, name in views.items():
                    delta = book.budget(name).delta
                    for r, accountant in [(r, own) for r in rounds] + [(last, other)]:
                        spent = book.spent(name, accountant=accountant, through_round=r)
                        privacy.append(
                            (trial, r, silo, view, accountant.value, delta, spent.epsilon)
                        )
        sheet = datasheet(config, result, book)
    return RunResults(
        rounds_completed=result.rounds_completed,
        noise_multiplier=result.noise_multiplier if config.privacy.private else None,
        stopped_by_budget=result.stopped_by_budget,
        seconds=seconds,
        ledger=ledger,
        datasheet=sheet,
        metrics=metrics,
        privacy=privacy,
        communication=communication,
    )
