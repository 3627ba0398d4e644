"""Hyperparameter selection whose privacy cost is in the ledger (Papernot & Steinke,
"Hyperparameter tuning with Rényi differential privacy", ICLR 2022).

A study's grid is the search space. A random number K of candidate runs is drawn from
the declared law (`dpfl.privacy.selection.repetitions`: truncated negative binomial, or
Poisson), each candidate takes a point of the grid uniformly at random, trains with DP
and is scored on the silos' validation records; only the best candidate is released.
Each silo is charged `tuned(run, mean, shape)`, where `run` is the composition of the
events a candidate's sampling code recorded for it: the search space may vary only what
leaves that mechanism unchanged (learning rates, a pull λ, the model's width, the
loss), so every candidate records the same events, which is checked. σ is calibrated
(by RDP, the only accountant of the selection) so that the selection fits each silo's ε.

What stays secret for the bound to hold: K and every candidate but the chosen one, so
nothing about them is kept or printed. The validation records pick the winner without
noise: like the test records they are outside ε, which covers the records the
candidates train on. The study's `[tune] validation` says where they come from
(`TuneConfig`): "from-training" (the default), a part of each silo's training records,
which the candidates train without (a later `dpfl run` of the chosen point would train
on them); "held-out", a part of each silo's test records, in no silo's training set, so
the candidates train on the study's training records and every training record is
covered; "official", each silo's share of the dataset's official val split (MedMNIST's),
neither trained nor tested on, so every official test record tests. The released
`datasheet` (`dpfl.experiments.results.datasheet.selection`) says which.

A non-private study is tuned by the same procedure, K from the same law, so that a
private method and its non-private reference get the same budget of tuning runs
(Dopamine's comparison); nothing is charged and its ε is ∞.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpfl.data import partition
from dpfl.engines.accounts import Calibration, register_accounts
from dpfl.engines.evaluation import evaluate
from dpfl.engines.plan import RunPlan, drawn_schedule, participations
from dpfl.engines.simulation import SimulationResult, simulate
from dpfl.errors import InternalError
from dpfl.experiments.results import datasheet
from dpfl.experiments.results.best import LOWER_IS_BETTER
from dpfl.experiments.study import spending
from dpfl.experiments.study.build import build_algorithm, decision_threshold
from dpfl.experiments.study.config import Study, StudyConfig
from dpfl.experiments.study.datasets import build_silos
from dpfl.experiments.study.directory import claim
from dpfl.federation.algorithms import Algorithm
from dpfl.federation.silo import Silo
from dpfl.federation.threshold import BalancedThreshold
from dpfl.privacy import Accountant, Ledger, events, selection
from dpfl.privacy.accounts import account
from dpfl.privacy.errors import BudgetExceededError

RESULT = "tuned.json"
LEDGER = "ledger.sqlite"
Records = tuple[torch.Tensor, torch.Tensor]
"""A set of records: features and labels."""


@dataclass(frozen=True)
class Tuned:
    """The released outcome of a private selection: the chosen point, its noise, each
    silo's ε from the ledger (the selection included) and its test metrics."""

    point: dict[str, Any]
    noise_multiplier: float | None
    """None: a non-private study"""
    epsilon: dict[str, float]
    """empty for a non-private study"""
    delta: float
    validation: float
    metric: str
    test_metrics: dict[str, float]
    mean: float
    shape: float
    datasheet: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The validation records and what ε covers (`datasheet.selection`); empty in a
    selection released before it was written (its validation was from the training
    records)."""
    ledger: str = LEDGER
    """The ledger charged (`dpfl.experiments.study.spending`): relative to the selection's
    folder, or the study's shared ledger."""
    book: str | None = None
    """The selection's accounts' book in a shared ledger (`spending.book`)."""


def tune(
    study: Study,
    out: str | Path,
    *,
    metric: str,
    mean: float = 10.0,
    shape: float = 1.0,
    validation_fraction: float | None = None,
    add: bool = False,
) -> Tuned:
    """Select among `study`'s grid points privately (see the module docstring) and write
    the outcome to `out/tuned.json`, the charges where the study's spending goes
    (`dpfl.experiments.study.spending`: its shared ledger, or `out/ledger.sqlite`), the whole
    selection checked against its budgets and caps before any candidate trains.
    `validation_fraction`: the study's `tune.validation_fraction` unless given. `out` is
    claimed for the study (`study_dir.claim`; `add` as there) only once every check has
    passed: a refused selection writes nothing."""
    points = [config for _, config in study.points]
    first = _check(points, validation_fraction)
    fraction = (
        first.tune.validation_fraction if validation_fraction is None else validation_fraction
    )
    folder = Path(out)
    if (folder / RESULT).exists():
        raise ValueError(f"{folder / RESULT} exists: a selection is released once")
    tuning, tested = selection_silos(first, fraction)
    privacy = first.privacy
    budgets = {s.name: _budget(first, s.name) for s in tested} if privacy.private else {}
    sigma, planned = (
        _calibrated(points, tuning, budgets, mean, shape) if privacy.private else (None, {})
    )
    release = _release(points, metric, mean, shape, fraction)
    if privacy.private:  # the whole selection, before any candidate trains
        _check_plan(first, release, folder, tuning, budgets, planned)
    folder.mkdir(parents=True, exist_ok=True)  # only once every check has passed
    claim(folder, points, [study.name], add=add)
    # K and the candidates' points must be unpredictable for the bound to hold, as the
    # noise must: seeded only with research noise (whose ε holds for no release anyway)
    rng = np.random.default_rng([first.seed, 17] if first.research_noise else None)
    count = selection.repetitions(mean, shape, rng)
    best: tuple[float, int, Any] | None = None
    recorded: list[dict[str, Counter[str]]] = []
    lower = metric in LOWER_IS_BETTER
    with tempfile.TemporaryDirectory(prefix="dpfl-tune-") as scratch:
        for k in range(count):
            chosen = int(rng.integers(len(points)))
            config = points[chosen] if sigma is None else fixed_noise(points[chosen], sigma)
            ledger = Path(scratch) / f"candidate-{k}.sqlite"
            algorithm, result = _candidate(config, tuning, ledger, budgets)
            if sigma is not None:
                recorded.append(_events(ledger, [s.name for s in tuning]))
            score = result.final_metrics().get(metric, math.nan)
            if math.isnan(score):
                raise ValueError(f"unknown or undefined validation metric {metric!r}")
            key = -score if not lower else score
            if best is None or key < best[0]:
                best = (key, chosen, (algorithm, result))
    if any(r != recorded[0] for r in recorded):
        raise RuntimeError(
            "the candidates recorded different privacy events: the search space may vary "
            "only what leaves the mechanism unchanged (not rounds, batch sizes, epochs)"
        )
    spent = {}
    if privacy.private:
        with _charging(first, release, folder, tuning, budgets) as book:
            spent = _charge(book, tuning, recorded, mean, shape, study)
    if best is None:  # Poisson K = 0: the selection released nothing
        raise ValueError("the selection drew no candidate (Poisson K = 0): nothing to release")
    algorithm, result = best[2]
    tuned = Tuned(
        point=study.points[best[1]][0],
        noise_multiplier=sigma,
        epsilon=spent,
        delta=privacy.delta,
        validation=-best[0] if not lower else best[0],
        metric=metric,
        test_metrics=_tested(algorithm, result, tested),
        mean=mean,
        shape=shape,
        datasheet=datasheet.selection(first.tune.validation, fraction, privacy.private),
        ledger=str(spending.ledger_file(first, Path(LEDGER))),
        book=spending.book(first.name, release, privacy.ledger),
    )
    (folder / RESULT).write_text(json.dumps(dataclasses.asdict(tuned), indent=1) + "\n")
    return tuned


def _candidate(
    config: StudyConfig, silos: list[Silo], ledger: Path, budgets: dict[str, tuple[float, float]]
) -> tuple[Algorithm, SimulationResult]:
    """One candidate's run on the tuning silos, its events in its own scratch `ledger`."""
    algorithm = build_algorithm(config, silos)
    plan = RunPlan(
        rounds=config.rounds,
        # the study's seed: its schedule (public cohorts) is the one planned; the silos'
        # batches and noise are the OS's unless the noise is research noise
        seed=config.seed,
        budgets=budgets,  # each candidate alone spends less than the selection
        research_noise=config.research_noise,
        progress=False,
        eval_every=config.rounds,
        init=config.model.init,
        threshold=decision_threshold(config.threshold),
    )
    result = simulate(algorithm, silos, plan, ledger=ledger)
    return algorithm, result


def _release(
    points: list[StudyConfig], metric: str, mean: float, shape: float, fraction: float
) -> str:
    """The selection's id, its accounts' book in a shared ledger (`spending.book`): its
    grid's points, metric, law and validation fraction (the same selection made again
    reopens its accounts, whose budget it spent)."""
    chosen = json.dumps([sorted(p.key() for p in points), metric, mean, shape, fraction])
    return "tune-" + hashlib.sha256(chosen.encode()).hexdigest()[:16]


@contextmanager
def _charging(
    config: StudyConfig,
    release: str,
    folder: Path,
    silos: list[Silo],
    budgets: dict[str, tuple[float, float]],
) -> Iterator[Ledger]:
    """The ledger the selection is charged to (`spending.charged`: the study's shared
    ledger, its caps set, or `folder/ledger.sqlite`), each silo's account opened with its
    budget, spending from its hospital's cap where the ledger has one."""
    hospitals = {s.name: s.neighbouring for s in silos}
    own = folder / LEDGER
    with spending.charged(config, release, own, hospitals, accountant=Accountant.RDP) as book:
        register_accounts(book, silos, 1, budgets)
        yield book


def _check_plan(
    config: StudyConfig,
    release: str,
    folder: Path,
    silos: list[Silo],
    budgets: dict[str, tuple[float, float]],
    planned: dict[str, events.PrivacyEvent],
) -> None:
    """Refuse the selection (`planned`: each silo's tuned event, every candidate's
    training in it) where it would pass a silo's budget or its hospital's cap, with what
    every other study spent, before any candidate trains; nothing is charged. An own
    ledger not yet in `folder` holds nothing, and σ is calibrated so that the selection
    fits the budgets: it is left uncreated until the selection is charged."""
    if config.privacy.ledger is None and not (folder / LEDGER).exists():
        return
    with _charging(config, release, folder, silos, budgets) as book:
        why = book.refusal([(account(s, 0), planned[s.name]) for s in silos])
    if why is not None:
        raise BudgetExceededError(
            f"the selection is refused before any candidate trains: {why}; lower "
            "privacy.epsilon (σ is calibrated to it)"
        )


def _charge(
    book: Ledger,
    silos: list[Silo],
    recorded: list[dict[str, Counter[str]]],
    mean: float,
    shape: float,
    study: Study,
) -> dict[str, float]:
    """Charge each silo the selection, once; each silo's ε after it."""
    run = recorded[0] if recorded else {s.name: Counter[str]() for s in silos}
    book.record_many(
        [
            (account(s, 0), events.tuned(_composed(run[s.name]), mean=mean, shape=shape))
            for s in silos
        ],
        label=f"private selection over {len(study.points)} points of {study.name}",
    )
    return {s.name: book.spent(account(s, 0)).epsilon for s in silos}


def released(folder: str | Path, *, delta: float) -> tuple[Tuned, float]:
    """The selection released in `folder` (by `tune`) and the largest ε over its silos at
    `delta`, re-read from its ledger (RDP, the selection's accountant)."""
    folder = Path(folder)
    try:
        tuned = Tuned(**json.loads((folder / RESULT).read_text()))
    except (OSError, ValueError, TypeError) as exc:
        why = f"{folder / RESULT} is not a selection `dpfl tune` released: {exc}"
        raise ValueError(why) from exc
    if tuned.noise_multiplier is None:  # a non-private study: no ledger
        return tuned, math.inf
    with Ledger(folder / tuned.ledger, create=False, study=tuned.book) as book:
        worst = max(book.spent(silo, delta=delta).epsilon for silo in book.silos())
    return tuned, worst


def _check(points: list[StudyConfig], fraction: float | None) -> StudyConfig:
    """Refuse a study the selection cannot be accounted for."""
    first = points[0]
    if fraction is not None and not 0 < fraction < 1:
        raise ValueError(f"the validation fraction must lie in (0, 1), got {fraction}")
    problems = []
    if any(p.privacy.noise_multiplier is not None for p in points):
        problems.append("leave privacy.noise_multiplier out: σ is calibrated")
    if any(p.trials != 1 for p in points):
        problems.append("trials must be 1 (a selection releases one model)")
    for section in ("privacy", "data", "rounds", "seed", "tune"):
        if any(getattr(p, section) != getattr(first, section) for p in points):
            problems.append(f"{section} must be the same at every point (it is no hyperparameter)")
    if any(p.algorithm.name != first.algorithm.name for p in points):
        problems.append("algorithm.name must be the same at every point")
    if first.data.public_sizes != "declared":
        problems.append("data.public_sizes must be 'declared'")
    if first.tune.validation == "official" and first.data.split != "official":
        problems.append("tune.validation = 'official' needs data.split = 'official'")
    if problems:
        raise ValueError("cannot tune this study: " + "; ".join(dict.fromkeys(problems)))
    return first


def _budget(config: StudyConfig, name: str) -> tuple[float, float]:
    own = config.privacy.silos.get(name)
    if own is not None:
        return own.epsilon, own.delta
    assert config.privacy.epsilon is not None
    return config.privacy.epsilon, config.privacy.delta


def selection_silos(config: StudyConfig, fraction: float) -> tuple[list[Silo], list[Silo]]:
    """The study's silos as the candidates see them (validation records as their test
    sets) and as the released one is tested (`TuneConfig`). "official": each silo's share
    of the dataset's official val split validates, its official test records test."""
    if config.tune.validation == "official":
        tuning = build_silos(config.data, config.seed, tested="val")
        return tuning, build_silos(config.data, config.seed)
    silos = build_silos(config.data, config.seed)
    return validation_split(silos, config.tune.validation, fraction, config.seed)


def validation_split(
    silos: list[Silo], validation: str, fraction: float, seed: int
) -> tuple[list[Silo], list[Silo]]:
    """The silos the candidates train and are validated on (their test records are the
    validation records), and those the released one is tested on (`TuneConfig`)."""
    if validation == "from-training":
        return [with_validation(s, fraction, seed) for s in silos], silos
    if validation == "held-out":
        pairs = [held_out(s, fraction, seed) for s in silos]
        return [tuning for tuning, _ in pairs], [tested for _, tested in pairs]
    raise InternalError(
        f"split by 'from-training' or 'held-out' ('official': selection_silos), not {validation!r}"
    )


def with_validation(silo: Silo, fraction: float, seed: int) -> Silo:
    """The silo's training records less a stratified validation part, which becomes its
    test set during the selection; the public size shrinks by the public fraction. Under
    a patient unit whole patients are held out (`partition.patient_sides`: none is on
    both sides), and the public size counts patients."""
    if silo.units is None:
        (x, y), validation = _stratified(silo.name, "training", silo.x, silo.y, fraction, seed)
        units = None
    else:
        kept, held = partition.patient_sides(
            silo.units, _strata(silo.y), [1 - fraction, fraction], seed
        )
        if not len(kept) or not len(held):
            raise ValueError(
                f"silo {silo.name!r}: its patients leave no validation or no other patient "
                f"at a validation fraction of {fraction:g}"
            )
        x, y = silo.x.index_select(0, _index(kept)), silo.y[_index(kept)]
        validation = silo.x.index_select(0, _index(held)), silo.y[_index(held)]
        units = silo.units[kept]
    size = silo.declared_size - round(fraction * silo.declared_size)
    return dataclasses.replace(
        silo,
        x=x,
        y=y,
        x_test=validation[0],
        y_test=validation[1],
        public_size=size,
        units=units,
    )


def held_out(silo: Silo, fraction: float, seed: int) -> tuple[Silo, Silo]:
    """The silo with a stratified part of its test records as its test set during the
    selection, and with the rest as the test set of the released candidate; its training
    records (and public size) are the study's."""
    if silo.x_test is None or silo.y_test is None:
        raise ValueError(f"silo {silo.name!r} has no test records to hold validation out of")
    rest, validation = _stratified(silo.name, "test", silo.x_test, silo.y_test, fraction, seed)
    return (
        dataclasses.replace(silo, x_test=validation[0], y_test=validation[1]),
        dataclasses.replace(silo, x_test=rest[0], y_test=rest[1]),
    )


def _stratified(
    name: str, kind: str, x: torch.Tensor, y: torch.Tensor, fraction: float, seed: int
) -> tuple[Records, Records]:
    """Records split into the rest and a stratified `fraction` (by class, or by event for
    survival labels); refuses a split that leaves either part empty."""
    kept, held = partition.stratified_split(_strata(y), [1 - fraction, fraction], seed)
    if not len(kept) or not len(held):
        raise ValueError(
            f"silo {name!r}: its {len(y)} {kind} records leave no validation or no "
            f"other record at a validation fraction of {fraction:g}"
        )
    return (x.index_select(0, _index(kept)), y[_index(kept)]), (
        x.index_select(0, _index(held)),
        y[_index(held)],
    )


def _strata(y: torch.Tensor) -> np.ndarray:
    """What a split stratifies by: the class, or for survival labels the event."""
    labels = y.numpy()
    return labels if labels.ndim == 1 else labels[:, 1].astype(np.int64)


def _index(rows: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.sort(rows), dtype=torch.int64)


def _calibrated(
    points: list[StudyConfig],
    silos: list[Silo],
    budgets: dict[str, tuple[float, float]],
    mean: float,
    shape: float,
) -> tuple[float, dict[str, events.PrivacyEvent]]:
    """The least σ for which the selection (over runs of the points' one plan) fits
    every silo's budget, and each silo's selection at that σ (its tuned event); points
    that plan different events are refused."""
    infos = [s.info for s in silos]
    plans = [_plan(config, silos) for config in points]
    if any(plan[0] != plans[0][0] for plan in plans):
        raise ValueError(
            "the grid's points plan different privacy events: the search space may "
            "vary only what leaves the mechanism unchanged (not rounds, batch sizes, "
            "epochs, client rates, threshold noise)"
        )
    _, algorithm, planned, others = plans[0]
    calibration = Calibration(
        algorithm,
        infos,
        planned,
        budgets,
        Accountant.RDP,
        others,
        wrap=lambda run: events.tuned(run, mean=mean, shape=shape),
    )
    sigma = calibration.common()
    return sigma, {s.name: calibration.plan(s, sigma) for s in infos}


def _plan(
    config: StudyConfig, silos: list[Silo]
) -> tuple[tuple[str, ...], Any, dict[str, int], dict[str, list[events.PrivacyEvent]]]:
    """A point's plan per silo (as text, to compare points), its algorithm, scheduled
    rounds and the releases besides them (a balanced threshold's)."""
    infos = [s.info for s in silos]
    algorithm = build_algorithm(config, silos)
    schedule = drawn_schedule(algorithm, infos, 1, config.seed, config.rounds)
    counts = participations(schedule, 0, config.rounds)
    planned = {s.name: counts[s.name, 0] for s in infos}
    threshold = decision_threshold(config.threshold)
    others = {
        s.name: [threshold.event(s)] if isinstance(threshold, BalancedThreshold) else []
        for s in infos
    }
    text = tuple(
        events.compose(
            [
                events.repeat(algorithm.participation_event(s, infos), planned[s.name]),
                *others[s.name],
            ]
        ).to_json()
        for s in infos
    )
    return text, algorithm, planned, others


def fixed_noise(config: StudyConfig, sigma: float) -> StudyConfig:
    """The point at noise σ. An algorithm that stops at its budget keeps its ε, which σ
    (planned for the whole selection) leaves unspent, so a candidate runs every round."""
    from dpfl.federation.algorithms import BY_NAME

    keep = BY_NAME[config.algorithm.name].stops_at_budget
    update = {"noise_multiplier": sigma, **({} if keep else {"epsilon": None})}
    return config.model_copy(update={"privacy": config.privacy.model_copy(update=update)})


def _events(ledger: Path, names: list[str]) -> dict[str, Counter[str]]:
    """Per silo, the events a candidate's run recorded (as their texts, with counts)."""
    with Ledger(ledger, create=False) as book:
        return {
            name: Counter(e.event.to_json() for e in book.entries(account(name, 0)))
            for name in names
        }


def _composed(recorded: Counter[str]) -> events.PrivacyEvent:
    return events.compose(
        [
            events.repeat(events.PrivacyEvent.from_json(text), count)
            for text, count in sorted(recorded.items())
        ]
    )


def _tested(algorithm: Any, result: Any, silos: list[Silo]) -> dict[str, float]:
    """The chosen candidate's models on the silos' test sets (never seen in the
    selection), each read at its own released threshold."""
    models = [[{n: v[0] for n, v in result.silo_models[s.name].items()}] for s in silos]
    own = result.history[-1]["silos"]
    cuts = [[own.get(s.name, {}).get("threshold", 0.5)] for s in silos]
    (row,) = evaluate(
        algorithm.model, models, silos, result.rounds_completed - 1, algorithm.loss, cuts
    )
    metrics: dict[str, float] = row["metrics"]
    return metrics
