"""The in-process simulator: every silo and trial of a federated run in one process.

Each round it calls the algorithm's server half once per trial and its hospital half
once for all (trial, silo) members together, which the algorithm runs as one stacked
computation; the replies reach the server half through a secure sum (`dpfl.secure`).
It runs a frozen `RunPlan` (`dpfl.engines.plan`, with the public schedule every engine
draws alike). What it adds around the halves (the bookkeeping shared with any engine is
in `dpfl.engines.accounts`):

* privacy: one ledger account per (silo, trial), with the silo's (ε, δ) budget. The
  server's cohorts depend on the run's seed alone (`Algorithm.cohort`), so the schedule
  of every round is drawn before round 0, and each account's plan is the rounds its
  silo is scheduled for. The whole plan is checked before round 0, so an unaffordable
  run fails before it touches data; each event is recorded during the round, before
  the update it paid for is aggregated. With the plan's `calibrate`, σ is the least noise
  that keeps every silo's plan within its budget: under client sampling, its own
  scheduled rounds, not every round.
* public sizes: a silo that declares no public size gets a DP count of its records,
  released once (charged to each of its accounts before anything else, kept in the
  ledger and re-used by every later run over it); mechanisms are shaped by it alone.
* run instances: each run gets an id kept in its checkpoint and in the label of every
  ledger entry it makes. Only a resume of that instance from its own checkpoint may
  count an entry as already paid (a round paid for but never released); a rerun, the
  same run with a new checkpoint, or a resume from an older copy of its checkpoint (the
  ledger notes each round released before its checkpoint takes its name) pays in full.
* determinism with research noise: every generator and noise source is derived from
  (seed, trial, silo, round), so a run repeats bit for bit, trials stacked together
  equal trials run alone, and a run resumed from its checkpoint ends with the same model
  as an uninterrupted one. Without it, the silos' noise and batches come from the OS
  (`member_rng`, `stream_noise`): nothing a silo draws can be replayed from the seed.
* metrics each `eval_every` rounds on the union of the silos' test sets and per silo
  (with `cross_silo=True`, also every silo's final model on every silo's test set);
  bytes sent and received per silo and round; a rich progress bar; Ctrl-C stops after
  the current round with the ledger and results intact.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import math
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch import nn

from dpfl.engines.accounts import (
    Budgets,
    Calibration,
    Prepaid,
    affordable_rounds,
    check_plans,
    note_release,
    prepaid,
    public_sizes,
    register_accounts,
    register_views,
    unpaid,
    was_released,
    worst_spent,
)
from dpfl.engines.evaluation import chosen_thresholds, cross_evaluate, evaluate
from dpfl.engines.plan import (
    Init,
    Observer,
    RunPlan,
    Schedule,
    drawn_schedule,
    participations,
)
from dpfl.engines.streams import Streams, count_noise, member_rng, stream_noise
from dpfl.federation.algorithms.base import (
    Algorithm,
    Charges,
    HospitalContext,
    LocalState,
    Member,
    Reply,
    State,
    refuse_non_finite,
)
from dpfl.federation.algorithms.centralized import pool
from dpfl.federation.messages import Encoding, SecureSum, payload_bytes
from dpfl.federation.silo import Silo, SiloInfo
from dpfl.federation.threshold import FIXED, BalancedThreshold
from dpfl.files import replacing
from dpfl.local.clipping import Params
from dpfl.local.device import training_device
from dpfl.local.dpsgd import parameters_of
from dpfl.local.mechanisms import forget_streams
from dpfl.local.noise import NoiseSource
from dpfl.local.threads import torch_threads
from dpfl.privacy import Accountant, EpsilonReport, Ledger, events
from dpfl.privacy.accounts import account
from dpfl.privacy.calibration import calibrate_consortium_noise
from dpfl.secure import IdealSecureSum, InTheClear

__all__ = ["SimulationResult", "initial_models", "simulate"]

CHECKPOINT_FORMAT = 2
"""Checkpoints hold per-trial server states and per-hospital local states."""


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
    """Each silo's model, stacked over trials: `params` itself (the same tensors, not a
    copy) for a silo that uses the shared model, its own for a personalised one."""
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
    cross_silo: list[dict[str, Any]] = field(default_factory=list)
    """With `RunPlan(cross_silo=True)`, the final models only: one row per trial, model
    silo and test silo (`model` None: the one model every silo shares), each silo's
    model scored on every silo's test set; empty unless asked."""
    accountant: Accountant | None = None
    """The accountant the ledger enforced the budgets with (None: PLD where it applies,
    else RDP), which `epsilon` and `views` read the ledger with."""

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
        with Ledger(self.ledger_path, create=False, accountant=self.accountant) as book:
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


@dataclass
class _RunState:
    """Per trial, the server's state and every hospital's local state (by silo name)."""

    server: list[State]
    hospitals: list[dict[str, LocalState]]

    def without_streams(self) -> _RunState:
        """The states with new noise streams: the checkpoint's were continued by rounds
        released since, and continuing them again would take that noise back out."""
        hospitals = [{k: forget_streams(v) for k, v in h.items()} for h in self.hospitals]
        return _RunState(self.server, hospitals)

    def models(self, algorithm: Algorithm, silos: Sequence[Silo]) -> list[list[Params]]:
        """Per silo, the model it uses in each trial."""
        return [
            [
                algorithm.model_of(server, local[s.name])
                for server, local in zip(self.server, self.hospitals, strict=True)
            ]
            for s in silos
        ]

    def exchange(
        self,
        algorithm: Algorithm,
        silos: Sequence[Silo],
        curator: Silo | None,
        round_: int,
        exchange: int,
        rng: Streams[np.random.Generator],
        noise: Streams[NoiseSource],
        ledger: Charges,
        secure_sum: SecureSum,
        schedule: Schedule,
        observe: Observer | None = None,
    ) -> list[dict[str, Any]]:
        """One configure-train-aggregate exchange of every trial: the server half once per
        trial, the hospital half once for all (trial, silo) members. The hospitals'
        charges are written to the ledger in one commit before any reply reaches the
        server half (a refusal stops the exchange there). Returns its message rows
        (none for a pooled reference: it exchanges no models). `observe`, if given, then
        sees the new states and the replies (see `simulate`)."""
        infos = [s.info for s in silos]
        index = {s.name: k for k, s in enumerate(silos)}
        charges: list[tuple[Any, str | None, events.PrivacyEvent]] = []
        members: list[tuple[int, Member]] = []
        for r, server in enumerate(self.server):
            orders = algorithm.configure(
                server, round_, infos, functools.partial(rng, r, -1), exchange
            )
            unplanned = set(orders) - schedule[round_, r] if curator is None else set()
            if unplanned:
                raise RuntimeError(
                    f"{algorithm.name} instructed {sorted(unplanned)} in round {round_}, "
                    "outside the schedule its plan was made of: its configure must draw "
                    "the round's silos with `cohort`"
                )
            for name, instruction in orders.items():
                k = -1 if curator is not None else _index(index, name)
                ctx = HospitalContext(
                    round_,
                    functools.partial(rng, r, k),
                    functools.partial(noise, r, k),
                    charges.extend,
                    (r, k),
                )
                silo = silos[k] if curator is None else curator
                local = self.hospitals[r].get(name, {})
                members.append((r, Member(instruction, silo, local, ctx)))
        refuse_non_finite([m for _, m in members])
        outcomes = algorithm.client_updates([m for _, m in members]) if members else []
        if charges:
            ledger(charges)
        replies: list[dict[str, Reply]] = [{} for _ in self.server]
        messages = []
        for (r, member), (reply, local) in zip(members, outcomes, strict=True):
            name = member.silo.name
            self.hospitals[r][name] = local
            if reply is not None:
                replies[r][name] = reply
            if curator is None:
                messages += _traffic(round_, r, member, reply)
        for r, server in enumerate(self.server):
            self.server[r] = algorithm.next_state(server, replies[r], secure_sum)
        if observe is not None:
            observe(round_, exchange, self.server, replies, secure_sum.reveals_inputs)
        return messages


def simulate(
    algorithm: Algorithm,
    silos: Sequence[Silo],
    plan: RunPlan,
    ledger: Ledger | str | Path | None = None,
) -> SimulationResult:
    """Run `algorithm` over `silos` as `plan` says: its rounds (`RunPlan.rounds`), its
    trials stacked in one computation (`RunPlan.trials`).

    Args:
        algorithm: The federated algorithm (its server and hospital halves), at the σ it
            runs with unless `RunPlan.calibrate` replaces it.
        silos: The hospitals' records; names must be unique.
        plan: What the run is asked for (`dpfl.engines.plan.RunPlan`).
        ledger: The privacy ledger, or its path (None: a new one in a temporary folder).

    Returns:
        The run, or its rounds before a Ctrl-C (`interrupted`) or the budget's end.
    """
    with torch_threads(plan.threads), training_device(plan.device):
        _check_silos(silos)
        _check_threshold(plan.threshold, algorithm, silos)
        summing = plan.secure_sum or (
            IdealSecureSum() if algorithm.needs_secure_sum else InTheClear()
        )
        book = ledger if isinstance(ledger, Ledger) else Ledger(_ledger_path(ledger))
        planned = _Planned.made(algorithm, silos, plan, book, summing)
        if plan.calibrate is not None:
            planned = planned.calibrated()
        run = _Rounds(planned, _resume(planned))
        run.loop()
        return run.result()


@dataclass(frozen=True)
class _Planned:
    """What a call of `simulate` fixes before round 0: accounts registered, public sizes
    released, every round's cohorts drawn and, with the plan's `calibrate`, σ."""

    plan: RunPlan
    algorithm: Algorithm
    silos: list[Silo]
    """The run's silos, each with its public size (declared, released or, for a
    non-private run, true)."""
    book: Ledger
    targets: Budgets
    summing: SecureSum
    counts: dict[str, events.PrivacyEvent]
    """Per silo, the release of its record count (silos that declared none)."""
    schedule: Schedule
    evaluations: list[int]
    """The rounds evaluated (thresholds are released at each)."""
    rounds: int
    """The rounds asked for."""

    @property
    def infos(self) -> list[SiloInfo]:
        return [s.info for s in self.silos]

    @classmethod
    def made(
        cls,
        algorithm: Algorithm,
        silos: Sequence[Silo],
        plan: RunPlan,
        book: Ledger,
        summing: SecureSum,
    ) -> _Planned:
        """Accounts registered and public sizes released (private runs), and every
        round's cohorts drawn from the seed."""
        trials, rounds = plan.trials, plan.rounds
        targets = plan.targets([s.name for s in silos])
        counts: dict[str, events.PrivacyEvent] = {}
        if algorithm.private:
            declared = {s.name: s.public_size for s in silos}
            register_accounts(book, silos, trials, targets)
            noise_of = functools.partial(count_noise, plan.research_noise, plan.seed)
            silos, counts = public_sizes(book, silos, trials, plan.size_noise, noise_of)
            register_views(book, algorithm, [s.info for s in silos], trials, targets, declared)
        else:  # nothing is protected, so the true counts may shape the reference run
            silos = [s if s.public_size is not None else s.with_public_size(s.size) for s in silos]
        infos = [s.info for s in silos]
        return cls(
            plan,
            algorithm,
            list(silos),
            book,
            targets,
            summing,
            counts,
            drawn_schedule(algorithm, infos, trials, plan.seed, rounds),
            plan.evaluations(rounds),
            rounds,
        )

    def releases(self, first: int) -> dict[str, tuple[events.PrivacyEvent, int]]:
        """Per silo, the threshold releases of the evaluations from round `first` on."""
        threshold = self.plan.threshold
        if not (self.algorithm.private and isinstance(threshold, BalancedThreshold)):
            return {}
        count = sum(r >= first for r in self.evaluations)
        return {s.name: (threshold.event(s), count) for s in self.infos}

    def calibrated(self) -> _Planned:
        """The plan with the algorithm at the least σ that keeps each silo's scheduled
        rounds (and its other releases) within its budget, and with the plan's
        `consortium` (h, ε), a patient of up to h silos within ε at the plan's δ: the
        only place a run's σ is replaced."""
        calibrate, consortium = self.plan.calibrate, self.plan.consortium
        if not self.algorithm.private:
            raise ValueError("calibrate needs a private algorithm (σ > 0 to start from)")
        infos, trials = self.infos, self.plan.trials
        scheduled = participations(self.schedule, 0, self.rounds)
        planned = {s.name: max(scheduled[s.name, r] for r in range(trials)) for s in infos}
        others = {s.name: [self.counts[s.name]] if s.name in self.counts else [] for s in infos}
        for name, (release, count) in self.releases(0).items():
            others[name].append(events.repeat(release, count))
        sigmas = Calibration(
            self.algorithm, infos, planned, self.targets, self.book.accountant, others
        )
        if consortium is not None:
            hospitals, target = consortium
            least = calibrate_consortium_noise(
                target,
                self.plan.delta,
                lambda sigma: [sigmas.plan(s, sigma) for s in infos],
                hospitals,
                accountant=self.book.accountant,
            )
            if any(self.targets[s.name][0] is not None for s in infos):
                least = max(least, sigmas.common())
            return dataclasses.replace(self, algorithm=self.algorithm.with_noise(least))
        return dataclasses.replace(
            self,
            algorithm=self.algorithm.with_silo_noise(sigmas.per_silo())
            if calibrate == "per-silo"
            else self.algorithm.with_noise(sigmas.common()),
        )


@dataclass(frozen=True)
class _Resumed:
    """Where this process's rounds start (`_resume`): the run's state, history and
    message rows at `start` (the rounds carry them on in place), the run's identity,
    the rounds the budget affords and what the ledger already holds."""

    state: _RunState
    start: int
    end: int
    """The round the run stops before: the rounds asked for, fewer when the budget
    stops the algorithm."""
    stopped_by_budget: bool
    history: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    fingerprint: str
    instance: str
    run_name: str
    """The run across its instances: what the ledger notes rounds released under."""
    label: str
    """The label of this instance's ledger entries."""
    paid: Prepaid
    """The resumed round's charges already in the ledger (a resume of this instance)."""


def _resume(planned: _Planned) -> _Resumed:
    """The initial states, or the checkpoint's if it holds this run (a new one is saved
    before round 0: a crash in it resumes this instance); the rounds the budget affords,
    and the plan left checked against the ledger."""
    s, algorithm, infos, book = planned.plan, planned.algorithm, planned.infos, planned.book
    state = _initial(algorithm, infos, s.trials, s.seed, s.init)
    fingerprint = _fingerprint(
        algorithm, planned.silos, s.trials, s.seed, s.research_noise, s.init, s.threshold
    )
    instance, resumed = uuid.uuid4().hex[:16], False
    start, history, messages = 0, [], []
    checkpoint = s.checkpoint_file
    if checkpoint is not None and checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=False)
        if saved["fingerprint"] != fingerprint:
            raise ValueError(f"checkpoint {checkpoint} belongs to a different run")
        start, state = saved["round"] + 1, saved["state"]
        history, messages = saved["history"], saved["messages"]
        instance, resumed = saved["instance"], True
    elif checkpoint is not None:  # before round 0: a crash in it resumes this instance
        _save(checkpoint, fingerprint, instance, -1, state, history, messages)
    end, stopped_by_budget = planned.rounds, False
    if algorithm.private and algorithm.stops_at_budget:
        left = end - start
        affordable = start + affordable_rounds(book, algorithm, infos, left, planned.targets)
        if affordable <= start:
            raise ValueError(
                f"{algorithm.name}: no further round fits every silo's budget; a round "
                "costs more than what is left (add noise or raise the budget)"
            )
        stopped_by_budget = affordable < end
        end = min(end, affordable)
    run_name = f"{algorithm.name} run {fingerprint[:12]}"
    if resumed and was_released(book, run_name, start):  # an older copy of the checkpoint
        state = state.without_streams()
    label = f"{run_name} instance {instance}"
    paid = (
        prepaid(book, algorithm, infos, s.trials, start, label, run_name) if resumed else Prepaid()
    )
    if algorithm.private:
        left_plan = participations(planned.schedule, start, end)
        check_plans(
            book,
            algorithm,
            infos,
            s.trials,
            left_plan,
            planned.targets,
            paid,
            planned.releases(start),
        )
    return _Resumed(
        state,
        start,
        end,
        stopped_by_budget,
        history,
        messages,
        fingerprint,
        instance,
        run_name,
        label,
        paid,
    )


@dataclass
class _Rounds:
    """The rounds of one call of `simulate`, from the resumed start (`loop`), and their
    `result`: the progress they make on what was planned and resumed."""

    planned: _Planned
    resumed: _Resumed
    begun: set[int] = field(default_factory=set)
    """Rounds whose charges were recorded: from then on their outputs may be out."""
    noted: set[int] = field(default_factory=set)
    """Rounds this process noted released."""
    current: int = field(init=False)
    """The round under way (from `start`)."""
    completed: int = field(init=False)
    """The rounds completed, resumed ones included."""
    cuts: list[list[float]] | None = None
    """Each silo's thresholds per trial (None: 0.5, not reported)."""
    interrupted: bool = False

    def __post_init__(self) -> None:
        self.current = self.completed = self.resumed.start

    def record(self, charges: Sequence[tuple[Any, str | None, events.PrivacyEvent]]) -> None:
        """A hospital's ledger: `(trial, silo index)` keys its accounts (-1: the pooled
        curator, whose every event is charged to every silo)."""
        silos, current, resumed = self.planned.silos, self.current, self.resumed
        named = [
            (account(silos[k], trial, view), event)
            for (trial, index), view, event in charges
            for k in (range(len(silos)) if index < 0 else [index])
        ]
        self.begun.add(current)  # from here on the round's outputs may be in the result
        if resumed.paid and current == resumed.start:  # only the resumed round can be paid
            named = unpaid(named, resumed.paid, current)
        if named:
            self.planned.book.record_many(named, label=resumed.label, round=current)

    def mark_released(self, round_: int) -> None:
        """Note the round released in the ledger before anything holding it is written or
        returned. A round re-run on charges paid for one release, which another process
        released meanwhile (e.g. from the same checkpoint), is not released."""
        planned, resumed = self.planned, self.resumed
        again = planned.algorithm.private and note_release(planned.book, resumed.run_name, round_)
        if again and resumed.paid and round_ == resumed.start and round_ not in self.noted:
            raise RuntimeError(
                f"round {round_} of {resumed.run_name} was released meanwhile by another "
                f"process while this one resumed it from {planned.plan.checkpoint}; its "
                "charges pay for one release, so this one is not released"
            )
        self.noted.add(round_)

    def loop(self) -> None:
        """The rounds from `start`, with a progress bar; Ctrl-C stops after the round
        under way, noting it released if the result may hold it."""
        planned, resumed = self.planned, self.resumed
        s, algorithm = planned.plan, planned.algorithm
        bar = Progress(
            TextColumn(f"{algorithm.name}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            disable=not s.progress,
            transient=False,
        )
        curator = pool(planned.silos) if algorithm.pools_data else None
        # a balanced threshold's are released at evaluations, 0.5 until the first
        public = FIXED if isinstance(s.threshold, BalancedThreshold) else s.threshold
        if s.threshold != FIXED:
            self.cuts = [[public] * s.trials for _ in planned.silos]
        next_status = -math.inf
        with bar:
            task = bar.add_task("rounds", total=resumed.end, completed=resumed.start, status="")
            try:
                for round_ in range(resumed.start, resumed.end):
                    self.current = round_
                    self.round(curator)
                    if s.progress and (time.monotonic() >= next_status or self.last_round):
                        began = time.monotonic()
                        status = _status(
                            planned.book, planned.infos, s.trials, resumed.history, algorithm
                        )
                        bar.update(task, status=status)
                        # every account's ε can be costly (client sampling: many histories):
                        # the status takes at most a tenth of the run, and is shown each second
                        next_status = time.monotonic() + max(1.0, 10 * (time.monotonic() - began))
                    bar.update(task, advance=1)
                    self.completed = round_ + 1
            except KeyboardInterrupt:
                self.interrupted = True
                if s.checkpoint_file is not None and self.current in self.begun:  # it may hold it
                    self.mark_released(self.current)

    @property
    def last_round(self) -> bool:
        return self.current == self.resumed.end - 1

    def round(self, curator: Silo | None) -> None:
        """Round `current`: its exchanges, its evaluation if due, its checkpoint."""
        planned, resumed, current = self.planned, self.resumed, self.current
        s, algorithm, silos, state = planned.plan, planned.algorithm, planned.silos, resumed.state
        rng = Streams(s.seed, current, functools.partial(member_rng, s.research_noise))
        noise = Streams(s.seed, current, functools.partial(stream_noise, s.research_noise))
        for exchange in range(algorithm.exchanges(planned.infos)):
            resumed.messages.extend(
                state.exchange(
                    algorithm,
                    silos,
                    curator,
                    current,
                    exchange,
                    rng,
                    noise,
                    self.record,
                    planned.summing,
                    planned.schedule,
                    s.observe,
                )
            )
        if (current + 1) % s.eval_every == 0 or self.last_round:
            models = state.models(algorithm, silos)
            if isinstance(s.threshold, BalancedThreshold):
                self.cuts = _released_thresholds(
                    s.threshold, algorithm, models, silos, noise, self.record
                )
            resumed.history.extend(
                evaluate(algorithm.model, models, silos, current, algorithm.loss, self.cuts)
            )
        checkpoint = s.checkpoint_file
        if checkpoint is not None:
            _save(
                checkpoint,
                resumed.fingerprint,
                resumed.instance,
                current,
                state,
                resumed.history,
                resumed.messages,
                self.mark_released,
            )

    def result(self) -> SimulationResult:
        """The models, metrics, accounts and traffic of the rounds completed."""
        planned, resumed = self.planned, self.resumed
        s, algorithm, silos, infos = planned.plan, planned.algorithm, planned.silos, planned.infos
        completed, state = self.completed, resumed.state
        shared = [server["global"] for server in state.server]
        params = _stacked(shared)
        models = state.models(algorithm, silos)
        evaluated = [h for h in resumed.history if h["round"] == completed - 1] or evaluate(
            algorithm.model, models, silos, completed - 1, algorithm.loss, self.cuts
        )
        return SimulationResult(
            algorithm=algorithm.name,
            noise_multiplier=algorithm.noise_multiplier,
            trials=s.trials,
            rounds_completed=completed,
            params=params,
            silo_models={
                # a silo that uses the shared model gets the very same tensors, not a copy
                # (at Kerkouche's scale, copies would take gigabytes)
                silo.name: params
                if all(m is g for m, g in zip(models[k], shared, strict=True))
                else _stacked(models[k])
                for k, silo in enumerate(silos)
            },
            history=resumed.history,
            silo_metrics=[h["silos"] for h in evaluated],
            accounts=[
                {
                    silo.name: {
                        None: account(silo, r),
                        **{v: account(silo, r, v) for v in algorithm.view_events(silo.info, infos)},
                    }
                    for silo in silos
                }
                if algorithm.private
                else {}
                for r in range(s.trials)
            ],
            messages=resumed.messages,
            cross_silo=(
                cross_evaluate(
                    algorithm.model, models, silos, completed - 1, algorithm.loss, self.cuts
                )
                if s.cross_silo
                else []
            ),
            ledger_path=planned.book.path,
            accountant=planned.book.accountant,
            interrupted=self.interrupted,
            stopped_by_budget=resumed.stopped_by_budget,
            metadata={
                "seed": s.seed,
                "research_noise": s.research_noise,
                "init": s.init,
                "rounds": resumed.end,
                "fingerprint": resumed.fingerprint,
                "instance": resumed.instance,
                "public_sizes": {silo.name: silo.public_size for silo in silos},
                "released_sizes": sorted(planned.counts),
                "secure_sum": type(planned.summing).__name__,
                "noise_multipliers": {silo.name: algorithm.noise_of(silo.name) for silo in silos},
            },
        )


def _check_threshold(
    threshold: float | BalancedThreshold, algorithm: Algorithm, silos: Sequence[Silo]
) -> None:
    """Refuse, before anything is charged, a threshold the run cannot use."""
    if not isinstance(threshold, BalancedThreshold):
        if not (isinstance(threshold, int | float) and 0 < threshold < 1):
            raise ValueError(f"a decision threshold lies in (0, 1), got {threshold!r}")
        return
    if algorithm.private and algorithm.stops_at_budget:
        raise ValueError(
            f"{algorithm.name} runs until its budget is spent: no room is left to release "
            "a threshold; use a fixed threshold"
        )
    for silo in silos:
        if silo.survival or not np.isin(silo.y.numpy(), (0, 1)).all():
            raise ValueError(
                f"silo {silo.name!r}: a balanced threshold is for binary classifiers "
                "(labels 0 and 1)"
            )


def _released_thresholds(
    threshold: BalancedThreshold,
    algorithm: Algorithm,
    models: list[list[Params]],
    silos: Sequence[Silo],
    noise: Streams[NoiseSource],
    record: Charges,
) -> list[list[float]]:
    """Every (trial, silo)'s histogram release charged to its accounts (every view
    learns the threshold too), then each silo's threshold chosen on the releases; a
    non-private run's exact histograms are free."""
    if not algorithm.private:
        return chosen_thresholds(threshold, algorithm.model, models, silos, None)
    infos = [s.info for s in silos]
    record(
        [
            ((r, k), view, threshold.event(info))
            for k, info in enumerate(infos)
            for view in [None, *algorithm.view_events(info, infos)]
            for r in range(len(models[k]))
        ]
    )
    return chosen_thresholds(threshold, algorithm.model, models, silos, noise)


def _check_silos(silos: Sequence[Silo]) -> None:
    if not silos:
        raise ValueError("need at least one silo")
    names = [s.name for s in silos]
    if len(set(names)) != len(names):
        raise ValueError(f"silo names must be unique, got {names}")


def _initial(
    algorithm: Algorithm, silos: Sequence[SiloInfo], trials: int, seed: int, init: Init
) -> _RunState:
    """Every trial's server state and every hospital's local state before round 0."""
    starts = initial_models(algorithm.model, trials, seed, init)
    server = [algorithm.initial_state(silos, start) for start in starts]
    return _RunState(
        server,
        [
            {s.name: algorithm.initial_local_state(state["global"]) for s in silos}
            for state in server
        ],
    )


def initial_models(model: nn.Module, trials: int, seed: int, init: Init) -> list[Params]:
    """Each trial's initial parameters: the model's own in trial 0, and with "per-trial"
    a fresh initialisation of the same architecture in every other trial, seeded by
    (seed, trial), so that the spread over trials includes the initialisation's."""
    if init not in ("per-trial", "shared"):
        raise ValueError(f"init must be 'per-trial' or 'shared', got {init!r}")
    first = parameters_of(model)
    if init == "shared":
        return [first] * trials
    return [first] + [_reinitialised(model, seed, r) for r in range(1, trials)]


def _reinitialised(model: nn.Module, seed: int, trial: int) -> Params:
    fresh = copy.deepcopy(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(np.random.SeedSequence([seed, trial, 3]).generate_state(1)[0]))
        for module in fresh.modules():
            reset = getattr(module, "reset_parameters", None)
            if callable(reset):
                reset()
            elif any(True for _ in module.parameters(recurse=False)):
                raise ValueError(
                    f"{type(module).__name__} has parameters but no reset_parameters(): "
                    "trials cannot re-initialise it; use init='shared'"
                )
    return parameters_of(fresh)


def _index(index: Mapping[str, int], name: str) -> int:
    if name not in index:
        raise ValueError(f"the server instructed {name!r}, which is not a silo of this run")
    return index[name]


def _traffic(round_: int, trial: int, member: Member, reply: Reply | None) -> list[dict[str, Any]]:
    """The step's message row of one member: bytes it received and sent (none: no row)."""
    sent = member.instruction.params
    down = (
        0
        if sent is None
        else payload_bytes(Encoding.FLOAT32, sum(v.numel() for v in sent.values()))
    )
    up = 0 if reply is None else payload_bytes(reply.encoding, reply.vector.numel())
    if not down and not up:
        return []
    name = member.silo.name
    return [
        {
            "round": round_,
            "trial": trial,
            "silo": name,
            "account": account(name, trial),
            "down": down,
            "up": up,
        }
    ]


def _stacked(params: Sequence[Params]) -> Params:
    return {name: torch.stack([p[name] for p in params]) for name in params[0]}


def _status(
    book: Ledger,
    silos: Sequence[SiloInfo],
    trials: int,
    history: list[dict[str, Any]],
    algorithm: Algorithm,
) -> str:
    """The worst ε spent so far over silos and trials (by the accountant that enforces
    the budgets) and the latest accuracy (C-index for survival)."""
    latest = history[-1]["metrics"] if history else {}
    name = "accuracy" if "accuracy" in latest or not latest else "c_index"
    shown = f"{name} {latest.get(name, math.nan):.3f}"
    if not algorithm.private:
        return f"non-private  {shown}"
    return f"{worst_spent(book, silos, trials)}  {shown}"


def _ledger_path(ledger: str | Path | None) -> Path:
    if ledger is not None:
        return Path(ledger)
    return Path(tempfile.mkdtemp(prefix="dpfl-run-")) / "ledger.sqlite"


def _fingerprint(
    algorithm: Algorithm,
    silos: Sequence[Silo],
    trials: int,
    seed: int,
    research: bool,
    init: Init,
    threshold: float | BalancedThreshold = FIXED,
) -> str:
    """Identifies a run across processes: what a checkpoint may be resumed into (a run
    at the default threshold keeps the fingerprint it had before thresholds existed)."""
    sizes = [(s.name, s.public_size, s.size) for s in silos]
    parts = (CHECKPOINT_FORMAT, algorithm, sizes, trials, seed, research, init)
    text = _stable(parts if threshold == FIXED else (*parts, threshold))
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
    state: _RunState,
    history: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    release: Callable[[int], None] | None = None,
) -> None:
    """Write the checkpoint atomically: a crash leaves the previous one intact. It holds
    the round's outputs: `release(round_)` notes them released just before the file takes
    its name (a crash between the two makes a resume pay for the round again, never
    release it unpaid)."""
    saved = {
        "fingerprint": fingerprint,
        "instance": instance,
        "round": round_,
        "state": state,
        "history": history,
        "messages": messages,
    }
    with replacing(Path(path)) as partial:
        torch.save(saved, partial)
        if release is not None:
            release(round_)
