"""The privacy bookkeeping every engine does around an algorithm's rounds.

One ledger account per (silo, trial) with the silo's (ε, δ) budget, and one per view
(what observers other than the server learn: recorded, never binding); public sizes
(declared, or a DP count released once through the ledger); the whole plan checked
before round 0; σ calibrated to the budgets by the accountant that enforces them; and
the resume rule: only a resume of the same run instance may count an entry as already
paid, and only for a round the ledger does not show released (`note_release`). The
simulator applies it to every account of a run at once; a deployed hospital applies it
to its own accounts.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import torch

from dpfl.federation.algorithms.base import Algorithm
from dpfl.federation.silo import Silo, SiloInfo
from dpfl.local.noise import NoiseSource
from dpfl.privacy import Accountant, Budget, Ledger, calibrate_noise, epsilon, events
from dpfl.privacy.accounts import account as account  # named in privacy; engines use it here
from dpfl.privacy.ledger import plan_epsilon

DEFAULT_SIZE_NOISE = 20.0
"""Std (in records) of the Gaussian noise on a released record count: ε ≈ 0.2 at
δ = 1e-5 on its own, and a ±20 error that barely moves q for a silo of hundreds."""

Budgets = Mapping[str, tuple[float | None, float]]
"""(ε, δ) per silo name; ε None: record without limit (ε read off afterwards)."""
Prepaid = Counter[tuple[str, int, str]]


def register_accounts(book: Ledger, silos: Sequence[Silo], trials: int, budgets: Budgets) -> None:
    """Open every (silo, trial) account with the silo's budget and declared size. A silo
    without an ε budget gets an account that records without limit (a research run at a
    fixed σ, its ε read off afterwards). Where the ledger caps a dataset of the silo's
    name (a hospital's ledger shared by its studies), the accounts spend from it too."""
    opened = {}
    for silo in silos:
        eps, delta = budgets[silo.name]
        dataset = silo.name if book.cap(silo.name) is not None else None
        budget = Budget(
            math.inf if eps is None else eps, delta, silo.neighbouring, silo.public_size, dataset
        )
        opened.update({account(silo, trial): budget for trial in range(trials)})
    book.register_silos(opened)


def register_views(
    book: Ledger,
    algorithm: Algorithm,
    silos: Sequence[SiloInfo],
    trials: int,
    budgets: Budgets,
    declared: Mapping[str, int | None],
    observed: Sequence[SiloInfo] | None = None,
) -> None:
    """Accounts for what observers other than the server learn: recorded, never binding.
    `observed`: the silos whose views to open (default every silo; a hospital opens its
    own)."""
    book.register_silos(
        {
            account(silo, trial, view): Budget(
                math.inf, budgets[silo.name][1], silo.neighbouring, declared[silo.name]
            )
            for silo in (silos if observed is None else observed)
            for view in algorithm.view_events(silo, silos)
            for trial in range(trials)
        }
    )


def public_sizes(
    book: Ledger,
    silos: Sequence[Silo],
    trials: int,
    size_noise: float,
    noise_of: Callable[[int], NoiseSource],
) -> tuple[list[Silo], dict[str, events.PrivacyEvent]]:
    """Each silo with its public size: declared, or a DP count released through the
    ledger (charged to every trial's account before it is drawn with `noise_of(k)`,
    drawn once, kept). Returns the silos and, per released silo, the count's event."""
    out, counts = [], {}
    for k, silo in enumerate(silos):
        if silo.public_size is not None:
            out.append(silo)
            continue
        if not size_noise > 0:
            raise ValueError(f"size_noise must be > 0 to release a DP count, got {size_noise}")
        count = events.gaussian(size_noise, neighbouring=silo.neighbouring)
        noise = noise_of(k)

        def draw(silo: Silo = silo, noise: NoiseSource = noise) -> float:
            return silo.unit_count + float(noise.normal((1,), size_noise, torch.float64)[0])

        value = book.release(
            f"{'patient' if silo.patient_level else 'record'} count of {silo.name}",
            [(account(silo, trial), count) for trial in range(trials)],
            draw,
        )
        out.append(dataclasses.replace(silo, public_size=max(1, round(value))))
        counts[silo.name] = count
    return out, counts


@dataclasses.dataclass
class Calibration:
    """σ for a run's plans: each silo's whole plan (its `rounds[name]` scheduled rounds,
    with the releases `others[name]` whose noise is not σ: a record count, a threshold)
    as a function of σ, held to the silo's budget by the ledger's accountant, which will
    hold the run to it. `wrap`: what the plan is a part of (a tuned selection among runs
    of it). Silos with the same plan and budget share one search."""

    algorithm: Algorithm
    silos: Sequence[SiloInfo]
    rounds: Mapping[str, int]
    budgets: Budgets
    accountant: Accountant | None
    others: Mapping[str, Sequence[events.PrivacyEvent]]
    wrap: Callable[[events.PrivacyEvent], events.PrivacyEvent] | None = None
    memo: dict[tuple[str, float, float], float] = dataclasses.field(default_factory=dict)

    def per_silo(self) -> dict[str, float]:
        """Per silo, the least σ that keeps its plan within its budget."""
        return {silo.name: self.least(silo) for silo in self.silos}

    def common(self) -> float:
        """The least σ that keeps every silo's plan within its budget (`per_silo`'s
        largest). A silo whose plan fits at the largest σ found so far needs no search of
        its own, one ε: with 314 hospitals (Kerkouche's), a few searches and one ε each
        instead of 314 searches. The busiest silos go first, usually the most constrained."""
        sigma = 0.0
        for silo in sorted(self.silos, key=lambda s: -self.rounds[s.name]):
            if not (sigma and self.fits(silo, sigma)):
                sigma = max(sigma, self.least(silo))
        return sigma

    def plan(self, silo: SiloInfo, sigma: float) -> events.PrivacyEvent:
        participation = self.algorithm.with_noise(sigma).participation_event(silo, self.silos)
        rounds_of = events.repeat(participation, self.rounds[silo.name])
        fixed = list(self.others.get(silo.name, ()))
        whole = events.compose([*fixed, rounds_of]) if fixed else rounds_of
        return whole if self.wrap is None else self.wrap(whole)

    def budget(self, silo: SiloInfo) -> tuple[float, float]:
        eps, delta = self.budgets[silo.name]
        if eps is None:
            raise ValueError("calibration needs an ε budget for every silo")
        return eps, delta

    def fits(self, silo: SiloInfo, sigma: float) -> bool:
        eps, delta = self.budget(silo)
        return plan_epsilon(self.plan(silo, sigma), delta, self.accountant).epsilon <= eps

    def least(self, silo: SiloInfo) -> float:
        eps, delta = self.budget(silo)
        key = (self.plan(silo, 1.0).to_json(), eps, delta)
        if key not in self.memo:
            fixed = list(self.others.get(silo.name, ()))
            if fixed:
                alone_plan = events.compose(fixed)
                alone_plan = alone_plan if self.wrap is None else self.wrap(alone_plan)
                alone = epsilon(alone_plan, delta, accountant=self.accountant).epsilon
                if alone > eps:
                    raise ValueError(
                        f"{silo.name}: {' and '.join(e.describe() for e in fixed)} alone "
                        f"spend ε={alone:.4g} of its ε={eps:g}: no σ leaves room for the rounds"
                    )
            self.memo[key] = calibrate_noise(
                eps, delta, functools.partial(self.plan, silo), accountant=self.accountant
            )
        return self.memo[key]


def affordable_rounds(
    book: Ledger,
    algorithm: Algorithm,
    silos: Sequence[SiloInfo],
    rounds_left: int,
    budgets: Budgets,
) -> int:
    """How many of the `rounds_left` rounds every silo can afford. The first trial's
    account stands for all trials: they spend alike."""
    counts = []
    for silo in silos:
        if budgets[silo.name][0] is None:
            raise ValueError(f"{algorithm.name} stops at a budget: give every silo an ε")
        name = account(silo, 0)
        per_round = algorithm.participation_event(silo, silos)
        fits = book.can_afford(name, events.repeat(per_round, rounds_left))
        counts.append(rounds_left if fits else book.affordable_repeats(name, per_round))
    return min(counts)


def prepaid(
    book: Ledger,
    algorithm: Algorithm,
    silos: Sequence[SiloInfo],
    trials: int,
    start: int,
    label: str,
    run: str,
) -> Prepaid:
    """Charges this run instance (by its label) already made for the round it resumes
    with: it stopped after paying for that round but before releasing it. Its outputs
    were never kept, and re-running it releases them once, so what was paid covers it.
    If the ledger shows that round of the `run` released (`note_release`: e.g. a later
    checkpoint was written, and the one resumed from is an older copy) or this
    instance's entries go past it (a new run over an old ledger), re-running it is a new
    release and nothing counts as paid."""
    if was_released(book, run, start):
        return Counter()
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


def note_release(book: Ledger, run: str, round_: int) -> bool:
    """Note in the ledger that `run` (any instance of it: its label without the instance,
    the same in every study directory) releases round `round_`'s outputs (a checkpoint of
    it, a result holding it), before it does: a resume from an older checkpoint then
    pays for that round again (`prepaid`). The ledger, not the checkpoint, keeps it: a
    copy of a checkpoint can be restored, a ledger's fact cannot be taken back. True if
    the round was noted released before."""
    return book.noted(_released(run, round_), note=True)


def was_released(book: Ledger, run: str, round_: int) -> bool:
    """Whether the ledger notes `run`'s round `round_` released (`note_release`)."""
    return book.noted(_released(run, round_))


def _released(run: str, round_: int) -> str:
    return f"{run} released round {round_}"


def unpaid(
    charges: Sequence[tuple[str, events.PrivacyEvent]], paid: Prepaid, round_: int
) -> list[tuple[str, events.PrivacyEvent]]:
    """The charges not covered by `paid`, which gives up what it covers."""
    due = []
    for name, event in charges:
        key = (name, round_, event.to_json())
        if paid[key]:
            paid[key] -= 1
        else:
            due.append((name, event))
    return due


def check_plans(
    book: Ledger,
    algorithm: Algorithm,
    silos: Sequence[SiloInfo],
    trials: int,
    rounds_left: Mapping[tuple[str, int], int],
    budgets: Budgets,
    paid: Prepaid,
    releases: Mapping[str, tuple[events.PrivacyEvent, int]] | None = None,
) -> None:
    """Check that the rest of every account's plan fits: `rounds_left[name, trial]` more
    rounds and `releases[name]` = (event, count) more releases besides (a first round,
    or release, already paid for, see `prepaid`, is not planned twice)."""
    accounts_paid = {name for name, _, _ in paid}
    events_paid = {(name, text) for name, _, text in paid}
    plans = []
    for silo in silos:
        event = algorithm.participation_event(silo, silos)
        release = (releases or {}).get(silo.name)
        for trial in range(trials):
            name = account(silo, trial)
            left = rounds_left[silo.name, trial] - (name in accounts_paid)
            extra = []
            if release is not None:
                count = release[1] - ((name, release[0].to_json()) in events_paid)
                extra = [events.repeat(release[0], count)] if count > 0 else []
            why = unaffordable(book, name, event, left, extra)
            if why is not None:
                raise UnaffordablePlan(why)
            plans.append((name, events.compose([events.repeat(event, left), *extra])))
    why = book.refusal(plans)  # together: every trial's account over one capped dataset
    if why is not None:
        raise UnaffordablePlan(why)


class UnaffordablePlan(ValueError):
    """A plan that would pass a budget, refused before round 0; `why` says whose and by how
    much, and the message adds the Python API's remedies (a study file words its own)."""

    def __init__(self, why: str) -> None:
        super().__init__(
            f"{why}; add noise, run fewer rounds, or calibrate the noise to the budget"
        )
        self.why = why


def unaffordable(
    book: Ledger,
    name: str,
    event: events.PrivacyEvent,
    rounds: int,
    extra: Sequence[events.PrivacyEvent] = (),
) -> str | None:
    """Why `rounds` more rounds of `event` (and the releases `extra`) would pass account
    `name`'s budget, or None if they fit."""
    plan = events.repeat(event, rounds)
    if extra:
        plan = events.compose([plan, *extra])
    why = book.refusal([(name, plan)])
    if why is None:
        return None
    budget = book.budget(name)
    if book.projected(name, plan).epsilon <= budget.epsilon:  # its dataset's cap refuses
        return why
    besides = "".join(f" and {e.describe()}" for e in extra)
    return (
        f"{name}: {rounds} more rounds of {event.describe()}{besides} would exceed "
        f"ε={budget.epsilon:g} at δ={budget.delta:g} (ε would be "
        f"{book.projected(name, plan).epsilon:.4g})"
    )


def worst_spent(book: Ledger, silos: Sequence[SiloInfo], trials: int) -> str:
    """The worst ε spent so far, over silos and trials, by the accountant that enforces
    the budgets (named)."""
    worst = max(
        (book.spent(account(s, r)) for s in silos for r in range(trials)),
        key=lambda report: report.epsilon,
    )
    return f"max ε {worst.epsilon:.3f} ({worst.accountant.value.upper()})"
