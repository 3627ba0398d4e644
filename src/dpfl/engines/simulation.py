"""The in-process simulator: every silo and trial of a federated run in one process.

What it adds around an algorithm's rounds:

* privacy: one ledger account per (silo, trial), with the silo's (ε, δ) budget. The
  whole plan (every round the silo could take part in) is checked before round 0, so an
  unaffordable run fails before it touches data; each event is recorded during the
  round, before the update it paid for is aggregated. With `calibrate=True`, σ is the
  least noise that keeps every silo's plan within its budget.
* public sizes: a silo that declares no public size gets a DP count of its records,
  released once (charged to each of its accounts before anything else, kept in the
  ledger and re-used by every later run over it); mechanisms are shaped by it alone.
* run instances: each run gets an id kept in its checkpoint and in the label of every
  ledger entry it makes. Only a resume of that instance from its own checkpoint may
  count an entry as already paid (a round paid for but never checkpointed); a rerun, or
  the same run with a new checkpoint, pays in full.
* determinism: every generator and noise source is derived from (seed, trial, silo,
  round), so a run repeats bit for bit, trials stacked together equal trials run alone,
  and a run resumed from its checkpoint ends with the same model as an uninterrupted one.
* metrics each `eval_every` rounds on the union of the silos' test sets and per silo;
  bytes sent and received per silo and round; a rich progress bar; Ctrl-C stops after
  the current round with the ledger and results intact.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch import Tensor
from torch.func import functional_call

from dpfl.federation.algorithms.base import Algorithm, RoundContext, State
from dpfl.federation.metrics import classification_metrics
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params
from dpfl.local.noise import NoiseSource, SecureNoise, SeededNoise
from dpfl.privacy import Accountant, EpsilonReport, Ledger, calibrate_noise, events

_T = TypeVar("_T")

DEFAULT_SIZE_NOISE = 20.0
"""Std (in records) of the Gaussian noise on a released record count: ε ≈ 0.2 at
δ = 1e-5 on its own, and a ±20 error that barely moves q for a silo of hundreds."""


@dataclass
class SimulationResult:
    """A finished (or interrupted) run: models stacked over trials, metrics, ε per silo
    from the ledger (empty for a non-private run: its ε is unbounded), bytes."""

    algorithm: str
    noise_multiplier: float | None
    trials: int
    rounds_completed: int
    params: Params
    """The shared model, stacked over trials."""
    silo_models: dict[str, Params]
    """Each silo's model, stacked over trials (the shared one unless personalised)."""
    history: list[dict[str, Any]]
    """One row per evaluated round and trial: `metrics` on the union of the test sets,
    `silos` each silo's own."""
    silo_metrics: list[dict[str, dict[str, float]]]
    """Per trial, each silo's metrics of the final models."""
    accounts: list[dict[str, dict[str | None, str]]]
    """Per trial and silo, the ledger account of each view (None: the server's, which the
    budget binds); empty for a non-private run."""
    messages: list[dict[str, Any]]
    """One row per silo and round it exchanged models in: round, trial, silo, the bytes
    it received (down) and sent (up)."""
    ledger_path: Path
    interrupted: bool = False
    stopped_by_budget: bool = False
    """The algorithm stops at its budget (Dopamine) and fewer rounds than asked fitted."""
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def traffic(self) -> dict[str, dict[str, int]]:
        """Per ledger account (silo, trial): bytes down and up and messages, all rounds."""
        totals: dict[str, dict[str, int]] = {}
        for row in self.messages:
            total = totals.setdefault(row["account"], {"down": 0, "up": 0, "messages": 0})
            total["down"] += row["down"]
            total["up"] += row["up"]
            total["messages"] += (row["down"] > 0) + (row["up"] > 0)
        return totals

    @functools.cached_property
    def epsilon(self) -> list[dict[str, EpsilonReport]]:
        """Per trial and silo: ε spent at the silo's δ, read off the ledger (computed on
        first use: a sweep that only needs the models does not pay for the accounting)."""
        return [{silo: reports[None] for silo, reports in trial.items()} for trial in self._reports]

    @functools.cached_property
    def views(self) -> list[dict[str, dict[str, EpsilonReport]]]:
        """Per trial, silo and view: ε against observers other than the server."""
        return [
            {
                silo: {view: r for view, r in reports.items() if view is not None}
                for silo, reports in trial.items()
            }
            for trial in self._reports
        ]

    @functools.cached_property
    def _reports(self) -> list[dict[str, dict[str | None, EpsilonReport]]]:
        if not any(self.accounts):
            return [{} for _ in self.accounts]
        with Ledger(self.ledger_path, create=False) as book:
            return [
                {
                    silo: {view: book.spent(name) for view, name in names.items()}
                    for silo, names in trial.items()
                }
                for trial in self.accounts
            ]

    def final_metrics(self, trial: int = 0) -> dict[str, float]:
        """Metrics of the last evaluated round of `trial` on the union of test sets."""
        mine = [h for h in self.history if h["trial"] == trial]
        if not mine:
            raise ValueError("no round was evaluated (no test sets, or no round completed)")
        metrics: dict[str, float] = mine[-1]["metrics"]
        return metrics


def account(silo: Silo | str, trial: int, view: str | None = None) -> str:
    """The ledger account of a silo (or silo name) in one trial: trials are separate runs
    on the same records, each with the silo's budget (releasing several trials' models
    composes them). A `view` account records what another observer (e.g. the other
    hospitals) learns."""
    name = silo if isinstance(silo, str) else silo.name
    return f"{name}/trial-{trial}" + ("" if view is None else f"/{view}")


def simulate(
    algorithm: Algorithm,
    silos: Sequence[Silo],
    *,
    rounds: int,
    trials: int = 1,
    seed: int = 0,
    epsilon_budget: float | None = None,
    delta: float = 1e-5,
    budgets: Mapping[str, tuple[float, float]] | None = None,
    calibrate: bool = False,
    ledger: Ledger | str | Path | None = None,
    research_noise: bool = True,
    progress: bool = True,
    checkpoint: str | Path | None = None,
    eval_every: int = 1,
    size_noise: float = DEFAULT_SIZE_NOISE,
) -> SimulationResult:
    """Run `rounds` rounds of `algorithm` over `silos`, `trials` times in one stack.

    Budgets: `budgets[name] = (ε, δ)` per silo, else (`epsilon_budget`, `delta`) for all;
    with no ε given, each account's budget is what the plan spends. `research_noise`
    uses seeded noise (reproducible, for research); False draws from the CSPRNG. A silo
    without a declared public size gets a DP count with Gaussian noise of std
    `size_noise` records (sensitivity 1), charged first (a non-private run uses the true
    count: it protects no one)."""
    _check_run(silos, rounds, trials, eval_every)
    targets = {s.name: (budgets or {}).get(s.name, (epsilon_budget, delta)) for s in silos}
    book = ledger if isinstance(ledger, Ledger) else Ledger(_ledger_path(ledger))
    counts: dict[str, events.PrivacyEvent] = {}
    if algorithm.private:
        declared = {s.name: s.public_size for s in silos}
        _register_accounts(book, silos, trials, targets)
        silos, counts = _public_sizes(book, silos, trials, size_noise, research_noise, seed)
        _register_views(book, algorithm, silos, trials, targets, declared)
    else:  # nothing is protected, so the true counts may shape the reference run
        silos = [
            s if s.public_size is not None else dataclasses.replace(s, public_size=s.size)
            for s in silos
        ]
    if calibrate:
        if not algorithm.private:
            raise ValueError("calibrate=True needs a private algorithm (σ > 0 to start from)")
        sigma = _calibrated_sigma(algorithm, silos, rounds, targets, book.accountant, counts)
        algorithm = algorithm.with_noise(sigma)
    start, state, history = 0, algorithm.initial_state(silos, trials), []
    messages: list[dict[str, Any]] = []
    fingerprint = _fingerprint(algorithm, silos, trials, seed, research_noise)
    instance, resumed = uuid.uuid4().hex[:16], False
    if checkpoint is not None and Path(checkpoint).exists():
        saved = torch.load(checkpoint, weights_only=False)
        if saved["fingerprint"] != fingerprint:
            raise ValueError(f"checkpoint {checkpoint} belongs to a different run")
        start, state, history, messages = (
            saved["round"] + 1,
            saved["state"],
            saved["history"],
            saved["messages"],
        )
        # a checkpoint of an older dpfl has no instance: its entries count as unpaid
        instance, resumed = saved.get("instance", instance), "instance" in saved
    elif checkpoint is not None:  # before round 0: a crash in it resumes this instance
        _save(checkpoint, fingerprint, instance, -1, state, history, messages)
    stopped_by_budget = False
    if algorithm.private and algorithm.stops_at_budget:
        affordable = start + _affordable_rounds(book, algorithm, silos, rounds - start, targets)
        if affordable <= start:
            raise ValueError(
                f"{algorithm.name}: no further round fits every silo's budget; a round "
                "costs more than what is left (add noise or raise the budget)"
            )
        stopped_by_budget, rounds = affordable < rounds, min(rounds, affordable)
    label = f"{algorithm.name} run {fingerprint[:12]} instance {instance}"
    prepaid = _prepaid(book, algorithm, silos, trials, start, label) if resumed else Counter[Any]()
    if algorithm.private:
        _check_plans(book, algorithm, silos, trials, rounds - start, targets, prepaid)

    def record(charges: Sequence[tuple[str, events.PrivacyEvent]]) -> None:
        if prepaid and current == start:  # only the resumed round can have been paid
            charges = _unpaid(charges, prepaid, current)
        if charges:
            book.record_many(charges, label=label, round=current)

    def charge(trial: int, k: int, event: events.PrivacyEvent) -> None:
        record([(account(silos[k], trial), event)])

    def charge_many(charges: Sequence[tuple[int, int, events.PrivacyEvent]]) -> None:
        record([(account(silos[k], trial), event) for trial, k, event in charges])

    def charge_view(trial: int, k: int, view: str, event: events.PrivacyEvent) -> None:
        record([(account(silos[k], trial, view), event)])

    def traffic_of(trial: int, k: int, down: int, up: int) -> None:
        messages.append(
            {
                "round": current,
                "trial": trial,
                "silo": silos[k].name,
                "account": account(silos[k], trial),
                "down": down,
                "up": up,
            }
        )

    interrupted, current, completed, next_status = False, start, start, -math.inf
    bar = Progress(
        TextColumn(f"{algorithm.name}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        disable=not progress,
        transient=False,
    )
    with bar:
        task = bar.add_task("rounds", total=rounds, completed=start, status="")
        try:
            for current in range(start, rounds):
                context = RoundContext(
                    round=current,
                    trials=trials,
                    rng=_Streams(seed, current, _rng),
                    noise=_Streams(seed, current, functools.partial(_noise, research_noise)),
                    charge=charge,
                    charge_many=charge_many,
                    charge_view=charge_view,
                    traffic=traffic_of,
                )
                state = algorithm.run_round(state, silos, context)
                if (current + 1) % eval_every == 0 or current == rounds - 1:
                    history += _evaluate(algorithm, state, silos, current)
                if checkpoint is not None:
                    _save(checkpoint, fingerprint, instance, current, state, history, messages)
                if progress and (time.monotonic() >= next_status or current == rounds - 1):
                    began = time.monotonic()
                    bar.update(task, status=_status(book, silos, trials, history, algorithm))
                    # every account's ε can be costly (client sampling: many histories):
                    # the status takes at most a tenth of the run, and is shown each second
                    next_status = time.monotonic() + max(1.0, 10 * (time.monotonic() - began))
                bar.update(task, advance=1)
                completed = current + 1
        except KeyboardInterrupt:
            interrupted = True
    return SimulationResult(
        algorithm=algorithm.name,
        noise_multiplier=algorithm.noise_multiplier,
        trials=trials,
        rounds_completed=completed,
        params=algorithm.global_params(state),
        silo_models={s.name: algorithm.silo_params(state, k) for k, s in enumerate(silos)},
        history=history,
        silo_metrics=_final_silo_metrics(algorithm, state, silos, history, completed - 1),
        accounts=[
            {
                s.name: {
                    None: account(s, r),
                    **{v: account(s, r, v) for v in algorithm.view_events(s, silos)},
                }
                for s in silos
            }
            if algorithm.private
            else {}
            for r in range(trials)
        ],
        messages=messages,
        ledger_path=book.path,
        interrupted=interrupted,
        stopped_by_budget=stopped_by_budget,
        metadata={
            "seed": seed,
            "research_noise": research_noise,
            "rounds": rounds,
            "fingerprint": fingerprint,
            "instance": instance,
            "public_sizes": {s.name: s.public_size for s in silos},
            "released_sizes": sorted(counts),
        },
    )


def _check_run(silos: Sequence[Silo], rounds: int, trials: int, eval_every: int) -> None:
    if not silos:
        raise ValueError("need at least one silo")
    names = [s.name for s in silos]
    if len(set(names)) != len(names):
        raise ValueError(f"silo names must be unique, got {names}")
    if rounds < 1 or trials < 1 or eval_every < 1:
        raise ValueError("rounds, trials and eval_every must be ≥ 1")


def _register_accounts(
    book: Ledger,
    silos: Sequence[Silo],
    trials: int,
    targets: Mapping[str, tuple[float | None, float]],
) -> None:
    """Open every (silo, trial) account with the silo's budget and declared size. A silo
    without an ε budget gets an account that records without limit (a research run at a
    fixed σ, its ε read off afterwards)."""
    for silo in silos:
        eps, delta = targets[silo.name]
        for trial in range(trials):
            book.register_silo(
                account(silo, trial),
                epsilon=math.inf if eps is None else eps,
                delta=delta,
                size=silo.public_size,
            )


def _register_views(
    book: Ledger,
    algorithm: Algorithm,
    silos: Sequence[Silo],
    trials: int,
    targets: Mapping[str, tuple[float | None, float]],
    declared: Mapping[str, int | None],
) -> None:
    """Accounts for what observers other than the server learn: recorded, never binding."""
    for silo in silos:
        for view in algorithm.view_events(silo, silos):
            for trial in range(trials):
                book.register_silo(
                    account(silo, trial, view),
                    epsilon=math.inf,
                    delta=targets[silo.name][1],
                    size=declared[silo.name],
                )


def _public_sizes(
    book: Ledger,
    silos: Sequence[Silo],
    trials: int,
    size_noise: float,
    research: bool,
    seed: int,
) -> tuple[list[Silo], dict[str, events.PrivacyEvent]]:
    """Each silo with its public size: declared, or a DP count released through the
    ledger (charged to every trial's account before it is drawn, drawn once, kept).
    Returns the silos and, per released silo, the count's event (for calibration)."""
    out, counts = [], {}
    for k, silo in enumerate(silos):
        if silo.public_size is not None:
            out.append(silo)
            continue
        if not size_noise > 0:
            raise ValueError(f"size_noise must be > 0 to release a DP count, got {size_noise}")
        count = events.gaussian(size_noise)
        noise = _noise(research, [seed, 0, k + 1, 0, 0, 2])

        def draw(silo: Silo = silo, noise: NoiseSource = noise) -> float:
            return silo.size + float(noise.normal((1,), size_noise, torch.float64)[0])

        value = book.release(
            f"record count of {silo.name}",
            [(account(silo, trial), count) for trial in range(trials)],
            draw,
        )
        out.append(dataclasses.replace(silo, public_size=max(1, round(value))))
        counts[silo.name] = count
    return out, counts


def _calibrated_sigma(
    algorithm: Algorithm,
    silos: Sequence[Silo],
    rounds: int,
    targets: Mapping[str, tuple[float | None, float]],
    accountant: Accountant | None,
    counts: Mapping[str, events.PrivacyEvent],
) -> float:
    """The least σ that keeps every silo's whole plan (with its released count, if any)
    within its budget, by the ledger's accountant, which will hold the run to it."""
    sigmas: dict[tuple[str, float, float], float] = {}
    for silo in silos:
        eps, delta = targets[silo.name]
        if eps is None:
            raise ValueError("calibrate=True needs an ε budget for every silo")
        before = [counts[silo.name]] if silo.name in counts else []

        def plan(
            sigma: float, silo: Silo = silo, before: list[events.PrivacyEvent] = before
        ) -> events.PrivacyEvent:
            rounds_of = events.repeat(
                algorithm.with_noise(sigma).participation_event(silo, silos), rounds
            )
            return events.compose([*before, rounds_of]) if before else rounds_of

        key = (plan(1.0).to_json(), eps, delta)
        if key not in sigmas:
            sigmas[key] = calibrate_noise(eps, delta, plan, accountant=accountant)
    return max(sigmas.values())


def _affordable_rounds(
    book: Ledger,
    algorithm: Algorithm,
    silos: Sequence[Silo],
    rounds_left: int,
    targets: Mapping[str, tuple[float | None, float]],
) -> int:
    """How many of the `rounds_left` rounds every silo can afford. The first trial's
    account stands for all trials: they spend alike."""
    counts = []
    for silo in silos:
        if targets[silo.name][0] is None:
            raise ValueError(f"{algorithm.name} stops at a budget: give every silo an ε")
        name = account(silo, 0)
        per_round = algorithm.participation_event(silo, silos)
        fits = book.can_afford(name, events.repeat(per_round, rounds_left))
        counts.append(rounds_left if fits else book.affordable_repeats(name, per_round))
    return min(counts)


def _prepaid(
    book: Ledger,
    algorithm: Algorithm,
    silos: Sequence[Silo],
    trials: int,
    start: int,
    label: str,
) -> Counter[tuple[str, int, str]]:
    """Charges this run (by its label) already made for the round it resumes with: it
    stopped after paying for that round but before checkpointing it. The round's outputs
    were never kept, and re-running it releases them once, so what was paid covers it.
    If this run's entries go past that round, it is a new run over an old ledger, and
    nothing counts as paid."""
    names = [
        account(s, r, view)
        for s in silos
        for r in range(trials)
        for view in [None, *algorithm.view_events(s, silos)]
    ]
    known = set(book.silos())
    mine = [
        (name, entry)
        for name in names
        if name in known
        for entry in book.entries(name)
        if entry.label == label
    ]
    if any(entry.round is not None and entry.round > start for _, entry in mine):
        return Counter()
    return Counter(
        (name, start, entry.event.to_json()) for name, entry in mine if entry.round == start
    )


def _unpaid(
    charges: Sequence[tuple[str, events.PrivacyEvent]],
    prepaid: Counter[tuple[str, int, str]],
    round_: int,
) -> list[tuple[str, events.PrivacyEvent]]:
    """The charges not covered by `prepaid`, which gives up what it covers."""
    due = []
    for name, event in charges:
        key = (name, round_, event.to_json())
        if prepaid[key]:
            prepaid[key] -= 1
        else:
            due.append((name, event))
    return due


def _check_plans(
    book: Ledger,
    algorithm: Algorithm,
    silos: Sequence[Silo],
    trials: int,
    rounds_left: int,
    targets: Mapping[str, tuple[float | None, float]],
    prepaid: Counter[tuple[str, int, str]],
) -> None:
    """Check that the rest of every account's plan fits (a first round already paid for,
    see `_prepaid`, is not planned twice)."""
    paid = {name for name, _, _ in prepaid}
    for silo in silos:
        event = algorithm.participation_event(silo, silos)
        eps, delta = targets[silo.name]
        budget = math.inf if eps is None else eps
        for trial in range(trials):
            name = account(silo, trial)
            plan = events.repeat(event, rounds_left - (name in paid))
            if not book.can_afford(name, plan):
                raise ValueError(
                    f"{name}: {rounds_left} more rounds of {plan.describe()} would exceed "
                    f"ε={budget:g} at δ={delta:g} (ε would be "
                    f"{book.projected(name, plan).epsilon:.4g}); add noise, run fewer "
                    "rounds, or calibrate the noise to the budget"
                )


class _Streams(Generic[_T]):
    """Independent random streams for one round: the n-th call for (trial, silo) gets the
    n-th stream of that pair, so no two draws (batches, noise) of a round ever share
    randomness, and the same calls in the same order repeat exactly (and on resume)."""

    def __init__(self, seed: int, round_: int, make: Callable[[list[int]], _T]) -> None:
        self._seed, self._round, self._make = seed, round_, make
        self._calls: Counter[tuple[int, int]] = Counter()

    def __call__(self, trial: int, silo: int) -> _T:
        call = self._calls[trial, silo]
        self._calls[trial, silo] += 1
        return self._make([self._seed, trial, silo + 1, self._round, call])


def _rng(key: list[int]) -> np.random.Generator:
    return np.random.default_rng([*key, 0])


def _noise(research: bool, key: list[int]) -> NoiseSource:
    if not research:
        return SecureNoise()
    state = np.random.SeedSequence([*key, 1]).generate_state(1)
    return SeededNoise(int(state[0]))


def _probabilities(logits: Tensor) -> np.ndarray:
    if logits.shape[-1] == 1:
        return torch.sigmoid(logits.squeeze(-1)).double().numpy()
    return torch.softmax(logits.double(), dim=-1).numpy()


def _scores(algorithm: Algorithm, params: Params, x: Tensor) -> np.ndarray:
    with torch.no_grad():
        return _probabilities(functional_call(algorithm.model, params, (x,)))


def _silo_scores(
    algorithm: Algorithm, state: State, silos: Sequence[Silo]
) -> list[tuple[Silo, list[np.ndarray]]]:
    """Each tested silo's test-set scores under its own model, one array per trial."""
    scored = []
    for k, silo in enumerate(silos):
        if silo.x_test is None:
            continue
        stacked = algorithm.silo_params(state, k)
        trials = next(iter(stacked.values())).shape[0]
        scored.append(
            (
                silo,
                [
                    _scores(algorithm, {n: v[r] for n, v in stacked.items()}, silo.x_test)
                    for r in range(trials)
                ],
            )
        )
    return scored


def _evaluate(
    algorithm: Algorithm, state: State, silos: Sequence[Silo], round_: int
) -> list[dict[str, Any]]:
    """Metrics on the union of the silos' test sets (each scored by its silo's model)."""
    scored = _silo_scores(algorithm, state, silos)
    if not scored:
        return []
    labels = np.concatenate([s.y_test.numpy() for s, _ in scored if s.y_test is not None])
    return [
        {
            "round": round_,
            "trial": r,
            "metrics": classification_metrics(
                labels, np.concatenate([scores[r] for _, scores in scored])
            ),
            "silos": {
                silo.name: classification_metrics(silo.y_test.numpy(), scores[r])
                for silo, scores in scored
                if silo.y_test is not None
            },
        }
        for r in range(len(scored[0][1]))
    ]


def _final_silo_metrics(
    algorithm: Algorithm,
    state: State,
    silos: Sequence[Silo],
    history: list[dict[str, Any]],
    last_round: int,
) -> list[dict[str, dict[str, float]]]:
    """Per trial and silo, the metrics of the final models (evaluated unless the last
    round already was)."""
    evaluated = [h for h in history if h["round"] == last_round]
    return [h["silos"] for h in evaluated or _evaluate(algorithm, state, silos, last_round)]


def _status(
    book: Ledger,
    silos: Sequence[Silo],
    trials: int,
    history: list[dict[str, Any]],
    algorithm: Algorithm,
) -> str:
    """The worst ε spent so far, over silos and trials, by the accountant that enforces
    the budgets (named), and the latest accuracy."""
    accuracy = history[-1]["metrics"]["accuracy"] if history else math.nan
    if not algorithm.private:
        return f"non-private  accuracy {accuracy:.3f}"
    worst = max(
        (book.spent(account(s, r)) for s in silos for r in range(trials)),
        key=lambda report: report.epsilon,
    )
    return f"max ε {worst.epsilon:.3f} ({worst.accountant.value.upper()})  accuracy {accuracy:.3f}"


def _ledger_path(ledger: str | Path | None) -> Path:
    if ledger is not None:
        return Path(ledger)
    return Path(tempfile.mkdtemp(prefix="dpfl-run-")) / "ledger.sqlite"


def _fingerprint(
    algorithm: Algorithm, silos: Sequence[Silo], trials: int, seed: int, research: bool
) -> str:
    """Identifies a run across processes: what a checkpoint may be resumed into."""
    sizes = [(s.name, s.public_size, s.size) for s in silos]
    text = _stable((algorithm, sizes, trials, seed, research))
    return hashlib.sha256(text.encode()).hexdigest()


def _stable(value: Any) -> str:
    """A description that is the same in every process (reprs of functions carry memory
    addresses): functions by qualified name and captured values, dataclasses by field."""
    if isinstance(value, functools.partial):
        return f"partial({_stable(value.func)}, {_stable(value.args)}, {_stable(value.keywords)})"
    if callable(value) and hasattr(value, "__qualname__") and not isinstance(value, type):
        cells = [c.cell_contents for c in getattr(value, "__closure__", None) or ()]
        return f"{value.__module__}.{value.__qualname__}{_stable(cells)}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _stable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return f"{type(value).__qualname__}{fields}"
    if isinstance(value, list | tuple):
        return "(" + ", ".join(_stable(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_stable(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _save(
    path: str | Path,
    fingerprint: str,
    instance: str,
    round_: int,
    state: State,
    history: list[dict[str, Any]],
    messages: list[dict[str, Any]],
) -> None:
    """Write the checkpoint atomically: a crash leaves the previous one intact."""
    target = Path(path)
    partial = target.with_suffix(target.suffix + ".partial")
    torch.save(
        {
            "fingerprint": fingerprint,
            "instance": instance,
            "round": round_,
            "state": state,
            "history": history,
            "messages": messages,
        },
        partial,
    )
    os.replace(partial, target)
