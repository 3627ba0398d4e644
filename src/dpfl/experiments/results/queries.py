"""What a study's results store says about its runs, read one way for every reader.

`dpfl report`, the summaries printed by `sweep`/`run`/`demo` and `dpfl best` all read
these functions, so that a run's accuracy, ε and bytes are the same figures wherever
they are shown. The conventions, in one place:

* A run's *final* metric is its value after the run's last round (earlier than planned
  for a run stopped by its budget; every trial is evaluated there), one value per trial.
  Undefined values (stored as NULL: e.g. AUROC on a one-class test set) are left out
  of means and spreads, so one undefined trial does not blank the others.
* ε per silo is `ResultsStore.epsilon_by_silo`: the largest over the run's trials, at
  the silo's δ, by the accountant named (the enforcing one unless asked), in the
  server's view unless another observer is named. A deployed run's ε is each
  hospital's own report (`SiloEpsilons.reported`): shown as such, never pooled with ε
  read off a ledger, and a hospital that never reported has none (it was charged
  nothing in the run).
* Bytes are totals over the run's rounds per (trial, silo); a silo that sent nothing in
  a trial (client sampling) counts as 0 bytes there.
* Cross-silo scores (runs with `cross_silo = true`) are, per (model silo, test silo),
  the final value in each trial, as the final metrics are.
* Audits (`dpfl audit`) are kept, every one; a run's audit figures are the latest of
  each kind: each (method, silo, observer, canary) ε lower bound, each (silo, model,
  attack) membership attack. They are measurements on the training records, not DP
  releases, and never change a run's ε.
* A single value has no spread: its std is NaN (None in JSON) and printed as `n = 1`
  (`mean_std_text`), never as a spread of 0.
* A spread is over what varied, said as `Replicates` ("5 trials × 3 seeds"): a run's
  trials vary the batches, the noise and (with `model.init = "per-trial"`) the model's
  initialisation; its seed also varies the split into silos and the first
  initialisation. Runs that differ only in `seed` are pooled by `pool_seeds`: every
  figure over every trial of every seed, ε the largest over them.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from dpfl.experiments.results.store import ResultsStore, RunRow, SiloEpsilons, enforcing_accountant
from dpfl.privacy import Accountant

RESULTS_FILE = "results.sqlite"
"""The results store's file name in a study directory."""
ACCOUNTANTS = tuple(a.value for a in Accountant)
Direction = Literal["up", "down"]
"""client → server, or server → client"""
_K = TypeVar("_K")


def open_results(directory: str | Path) -> ResultsStore:
    """A study directory's results store, read-only (readers never write)."""
    return ResultsStore(Path(directory) / RESULTS_FILE, create=False)


@dataclass(frozen=True)
class Spread:
    """A figure over trials: the defined values, their mean and sample std."""

    values: tuple[float, ...]
    """one per trial that defined it"""

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread:
        """The spread of the values that are defined (SQLite stores NaN as NULL)."""
        return cls(tuple(v for v in values if v is not None))

    @property
    def defined(self) -> bool:
        return bool(self.values)

    @property
    def mean(self) -> float:
        """The mean; NaN if no trial defined the figure."""
        return statistics.fmean(self.values) if self.values else math.nan

    @property
    def std(self) -> float:
        """The sample std; NaN under two values (one trial has no spread)."""
        return statistics.stdev(self.values) if len(self.values) > 1 else math.nan


def mean_std_text(mean: float, std: float | None, digits: int = 3, *, space: str = " ") -> str:
    """`0.838 ± 0.012` as every table prints a mean and its sample std; `0.838 (n = 1)`
    where the std is unknown (None or NaN: a single value), which a `± 0.000` would hide."""
    if std is None or math.isnan(std):
        return f"{mean:.{digits}f}{space}(n{space}={space}1)"
    return f"{mean:.{digits}f}{space}±{space}{std:.{digits}f}"


@dataclass(frozen=True)
class Metrics:
    """A run's metrics, over trials: final values on the union of the test sets and on
    each silo's, and the union's learning curves."""

    final: dict[str | None, dict[str, Spread]]
    """silo (None: the union) -> metric -> its final value; every metric with a row at
    the last round is here, even one that no trial defined"""
    curves: dict[str, dict[int, Spread]]
    """metric -> evaluated round (ascending) -> its value on the union"""

    def score(self, metric: str, silo: str | None = None) -> Spread:
        """The final `metric` on the union or on `silo`'s test set; undefined (no
        values) if the run did not report it."""
        return self.final.get(silo, {}).get(metric, Spread(()))

    @property
    def names(self) -> set[str]:
        """The metrics the run reported."""
        return {m for by_metric in self.final.values() for m in by_metric} | set(self.curves)

    @property
    def silos(self) -> set[str]:
        """The silos that have metrics of their own."""
        return {s for s in self.final if s is not None}


def read_metrics(store: ResultsStore, run: RunRow) -> Metrics:
    """The run's metrics, read in one pass over its rows."""
    final: dict[str | None, dict[str, list[float | None]]] = defaultdict(lambda: defaultdict(list))
    curves: dict[str, dict[int, list[float | None]]] = defaultdict(lambda: defaultdict(list))
    for row in store.rows("metrics", run.id):
        if row["round"] == run.last_round:
            final[row["silo"]][row["metric"]].append(row["value"])
        if row["silo"] is None:
            curves[row["metric"]][row["round"]].append(row["value"])
    return Metrics(
        final={silo: _spreads(by_metric) for silo, by_metric in final.items()},
        curves={metric: _spreads(dict(sorted(by.items()))) for metric, by in curves.items()},
    )


def _spreads(values: dict[Any, list[float | None]]) -> dict[Any, Spread]:
    return {key: Spread.of(listed) for key, listed in values.items()}


@dataclass(frozen=True)
class OneClass:
    """Trials whose final model put every record of the union's test set in one class
    (a binary task: balanced accuracy 0.5 with recall 0, all "no", or 1, all "yes"; exact
    for a test set that holds both classes). Its accuracy is then the majority's share
    and its balanced accuracy 0.5, whatever its AUROC says of the ranking."""

    predicted: str
    """"negative", "positive", or both where the trials differ"""
    trials: int
    of: int
    threshold: str
    """the study's `threshold.choose`: "fixed" (at 0.5 by default), or "balanced"""

    def __str__(self) -> str:
        advice = (
            "its model does not separate the classes even at a balanced threshold"
            if self.threshold == "balanced"
            else 'set [threshold] choose = "balanced" in the study file: a threshold '
            "chosen from the silos' DP score histograms (charged to their ledgers) "
            "instead of the fixed one, which lies beyond every score"
        )
        return (
            f"its final model predicted the {self.predicted} class for every test record "
            f"in {self.trials} of {self.of} trials (balanced accuracy 0.500): {advice}"
        )


def one_class(
    balanced_accuracy: Iterable[float], recall: Iterable[float], threshold: str
) -> OneClass | None:
    """Which trials' models predicted one class (`OneClass`), from the per-trial final
    balanced accuracy and recall the run recorded; None if none did."""
    pairs = list(zip(balanced_accuracy, recall, strict=True))
    found = [
        "negative" if r == 0 else "positive"
        for b, r in pairs
        if math.isclose(b, 0.5, abs_tol=1e-12) and r in (0.0, 1.0)
    ]
    if not found:
        return None
    return OneClass(" and ".join(sorted(set(found))), len(found), len(pairs), threshold)


def one_class_of(metrics: Metrics, config: dict[str, Any]) -> OneClass | None:
    """`one_class` of a run's (or pooled runs') final metrics on the union; None where
    a trial left either figure or AUROC undefined (a test set of one class)."""
    final = metrics.final.get(None, {})
    spreads = [final.get(m, Spread(())) for m in ("balanced_accuracy", "recall", "auroc")]
    if not spreads[0].defined or len({len(s.values) for s in spreads}) != 1:
        return None
    choose = str((config.get("threshold") or {}).get("choose", "fixed"))
    return one_class(spreads[0].values, spreads[1].values, choose)


CrossSilo = dict[str | None, dict[str, dict[str, Spread]]]
"""model silo (None: the model every silo shared) -> test silo -> metric -> its final
value over trials"""


def read_cross_silo(store: ResultsStore, run: RunRow) -> CrossSilo:
    """Every silo's final model on every silo's test set; empty for a run that was not
    asked for it (or a store older than the table)."""
    values: dict[str | None, dict[str, dict[str, list[float | None]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for row in store.rows("cross_silo", run.id):
        if row["round"] == run.last_round:
            values[row["model_silo"]][row["test_silo"]][row["metric"]].append(row["value"])
    return {
        model: {test: _spreads(by_metric) for test, by_metric in by_test.items()}
        for model, by_test in values.items()
    }


@dataclass(frozen=True)
class Replicates:
    """What a spread is over: `trials` per seed, for each of `seeds` (a run: one seed).
    A trial varies the batches, the noise and the initialisation (but trial 0's); a seed
    also varies the split into silos and trial 0's initialisation."""

    trials: int
    seeds: tuple[int | None, ...]
    """the study seed of each run pooled (None: a run whose config does not say)"""

    def __str__(self) -> str:
        """`5 trials × 3 seeds`"""
        m = len(self.seeds)
        return f"{self.trials} trial{'' if self.trials == 1 else 's'} × {m} seed" + (
            "" if m == 1 else "s"
        )


@dataclass(frozen=True)
class Traffic:
    """Bytes per silo over a run: one total over the rounds per trial."""

    up: dict[str, tuple[int, ...]]
    """silo -> bytes it sent to the server, per trial"""
    down: dict[str, tuple[int, ...]]
    """silo -> bytes it received, per trial"""

    def totals(self, direction: Direction) -> list[int]:
        """Every (trial, silo) total of bytes `up` or `down`."""
        by_silo = self.up if direction == "up" else self.down
        return [n for per_trial in by_silo.values() for n in per_trial]

    def per_client(self, direction: Direction, silo: str | None = None) -> float:
        """Mean bytes `up` or `down` over trials, of `silo` or (None) of every silo;
        0 for a run that recorded no messages."""
        by_silo = self.up if direction == "up" else self.down
        listed = self.totals(direction) if silo is None else list(by_silo.get(silo, ()))
        return statistics.fmean(listed) if listed else 0.0


def read_traffic(store: ResultsStore, run: RunRow) -> Traffic:
    up: dict[str, list[int]] = defaultdict(lambda: [0] * run.trials)
    down: dict[str, list[int]] = defaultdict(lambda: [0] * run.trials)
    for row in store.rows("communication", run.id):
        up[row["silo"]][row["trial"]] += int(row["bytes_up"])
        down[row["silo"]][row["trial"]] += int(row["bytes_down"])
    return Traffic(
        up={silo: tuple(totals) for silo, totals in up.items()},
        down={silo: tuple(totals) for silo, totals in down.items()},
    )


def epsilon_over_rounds(store: ResultsStore, run: RunRow) -> dict[str, list[tuple[int, float]]]:
    """silo -> (round, ε) after each round accounted in the server's view by the run's
    own accountant, each ε the largest over trials."""
    rounds = sorted({int(row["round"]) for row in store.rows("privacy", run.id)})
    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for round_ in rounds:
        for silo, spent in store.epsilon_by_silo(run, through_round=round_).by_silo.items():
            curves[silo].append((round_, spent))
    return dict(curves)


@dataclass(frozen=True)
class Audits:
    """A run's latest audit figures (rows of the store's `audit_bounds`, `audit_membership`)."""

    bounds: list[dict[str, Any]] = field(default_factory=list)
    membership: list[dict[str, Any]] = field(default_factory=list)


def read_audits(store: ResultsStore, run: RunRow) -> Audits:
    """The latest audit of each kind (see the module docstring), in the order first audited."""
    keys = {
        "audit_bounds": ("method", "silo", "observer", "canary"),
        "audit_membership": ("silo", "model", "attack"),
    }
    latest: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {t: {} for t in keys}
    for table, key in keys.items():
        for row in store.rows(table, run.id):  # in the order written: later ones win
            latest[table][tuple(row[k] for k in key)] = row
    return Audits(*(list(rows.values()) for rows in latest.values()))


def exceeds_ledger(bound: dict[str, Any]) -> bool:
    """A stored lower bound above its ledger's ε: the code leaks more than it accounts for
    (`LowerBound.exceeds_ledger`, read off an `audit_bounds` row)."""
    return bool(bound["epsilon_lower"] > bound["epsilon_ledger"])


def bound_text(epsilon_ledger: float, epsilon_lower: float, confidence: float) -> str:
    """An audit's ε lower bound beside the ledger's ε, as the report and the CLI print it."""
    ledger = "∞" if math.isinf(epsilon_ledger) else f"{epsilon_ledger:.2f}"
    return f"ledger ε = {ledger}; measured lower bound {epsilon_lower:.2f} ({confidence:.0%})"


@dataclass(frozen=True)
class RunSummary:
    """A finished run's figures: metrics, ε per silo, bytes."""

    run: RunRow
    metrics: Metrics
    private: bool
    """whether the run has any server-view privacy rows (a non-private run has none), or
    is a deployment (always private: its ε is the hospitals' report)"""
    epsilon: dict[str, SiloEpsilons]
    """accountant -> final ε per silo in the server's view"""
    views: dict[str, SiloEpsilons]
    """observer other than the server -> its final ε per silo (recorded, never enforced)"""
    traffic: Traffic
    cross_silo: CrossSilo = field(default_factory=dict)
    """every silo's model on every silo's test set, if the run was asked for it"""
    audits: Audits = field(default_factory=Audits)

    @property
    def replicates(self) -> Replicates:
        """The spread's replicates: the run's trials, of its one seed."""
        return Replicates(self.run.trials, (self.run.config.get("seed"),))

    @property
    def accountant(self) -> str:
        """The accountant that enforced the budgets."""
        return enforcing_accountant(self.run)

    @property
    def other_accountant(self) -> str:
        return next(a for a in ACCOUNTANTS if a != self.accountant)

    @property
    def own_epsilon(self) -> float | None:
        """The largest final ε over silos and trials by the enforcing accountant; None if
        it accounted none (non-private, or no figure at the last round)."""
        spent = self.epsilon[self.accountant]
        return spent.max if spent.by_silo else None


def summarise(store: ResultsStore, run: RunRow) -> RunSummary:
    views = {row["view"] for row in store.rows("privacy", run.id)}
    return RunSummary(
        run=run,
        metrics=read_metrics(store, run),
        private=None in views or run.reported,
        epsilon={a: store.epsilon_by_silo(run, accountant=a) for a in ACCOUNTANTS},
        views={view: store.epsilon_by_silo(run, view) for view in sorted(views - {None})},
        traffic=read_traffic(store, run),
        cross_silo=read_cross_silo(store, run),
        audits=read_audits(store, run),
    )


@dataclass(frozen=True)
class Pooled:
    """Finished runs that differ only in their `seed` (one run if nothing else matches),
    their figures pooled: metrics over every trial of every seed, ε per silo the largest
    over every trial of every seed, bytes per client the mean over them all."""

    summaries: tuple[RunSummary, ...]
    """in the order of their seeds as the store lists the runs"""
    metrics: Metrics
    cross_silo: CrossSilo
    epsilon: dict[str, SiloEpsilons]
    traffic: Traffic

    @property
    def runs(self) -> tuple[RunRow, ...]:
        return tuple(s.run for s in self.summaries)

    @property
    def run(self) -> RunRow:
        """The first of the runs (its config is every run's, but for the seed)."""
        return self.summaries[0].run

    @property
    def grid(self) -> dict[str, Any]:
        """The grid point without `seed` when the runs were pooled over it."""
        if len(self.summaries) == 1:
            return self.run.grid
        return {k: v for k, v in self.run.grid.items() if k != "seed"}

    @property
    def replicates(self) -> Replicates:
        return Replicates(self.run.trials, tuple(s.run.config.get("seed") for s in self.summaries))

    @property
    def private(self) -> bool:
        return any(s.private for s in self.summaries)

    @property
    def accountant(self) -> str:
        return self.summaries[0].accountant

    @property
    def own_epsilon(self) -> float | None:
        """The largest final ε over silos, trials and seeds by the enforcing accountant;
        None if none was accounted."""
        spent = self.epsilon[self.accountant]
        return spent.max if spent.by_silo else None


def pool_seeds(summaries: Iterable[RunSummary], *, pool: bool = True) -> list[Pooled]:
    """Group runs that differ only in their study `seed` (same study, algorithm and
    every other setting), in the order of each group's first run; `pool=False` keeps
    every run a group of its own, so that callers show either through one type."""
    groups: dict[str, list[RunSummary]] = {}
    for s in summaries:
        groups.setdefault(_seed_group(s.run) if pool else s.run.id, []).append(s)
    return [_pooled(tuple(members)) for members in groups.values()]


def _seed_group(run: RunRow) -> str:
    """What runs pooled over seeds share: everything but the seed, in their resolved
    config and in their grid point, and where their ε comes from (a run whose stored
    config names no seed is pooled with none)."""
    if "seed" not in run.config:
        return run.id
    config = {k: v for k, v in run.config.items() if k != "seed"}
    grid = {k: v for k, v in run.grid.items() if k != "seed"}
    return json.dumps(
        [run.study, run.algorithm, run.status, run.epsilon_source, config, grid], sort_keys=True
    )


def _pooled(summaries: tuple[RunSummary, ...]) -> Pooled:
    if len(summaries) == 1:
        (s,) = summaries
        return Pooled(summaries, s.metrics, s.cross_silo, s.epsilon, s.traffic)
    final: dict[str | None, dict[str, list[Spread]]] = defaultdict(lambda: defaultdict(list))
    curves: dict[str, dict[int, list[Spread]]] = defaultdict(lambda: defaultdict(list))
    cross: dict[str | None, dict[str, dict[str, list[Spread]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for s in summaries:
        for silo, by_metric in s.metrics.final.items():
            for metric, spread in by_metric.items():
                final[silo][metric].append(spread)
        for metric, by_round in s.metrics.curves.items():
            for round_, spread in by_round.items():
                curves[metric][round_].append(spread)
        for model, by_test in s.cross_silo.items():
            for test, by_metric in by_test.items():
                for metric, spread in by_metric.items():
                    cross[model][test][metric].append(spread)
    return Pooled(
        summaries,
        Metrics(
            final={silo: _joined(by_metric) for silo, by_metric in final.items()},
            curves={m: _joined(dict(sorted(by.items()))) for m, by in curves.items()},
        ),
        {model: {t: _joined(by) for t, by in by_test.items()} for model, by_test in cross.items()},
        {a: _worst([s.epsilon[a] for s in summaries]) for a in summaries[0].epsilon},
        _all_trials([s.traffic for s in summaries], [s.run.trials for s in summaries]),
    )


def _joined(spreads: dict[_K, list[Spread]]) -> dict[_K, Spread]:
    """Each key's values of every run, one after the other."""
    return {
        key: Spread(tuple(v for s in listed for v in s.values)) for key, listed in spreads.items()
    }


def _worst(spent: list[SiloEpsilons]) -> SiloEpsilons:
    """Per silo, the largest ε of any run (and its δ, if known); the runs' ε all come
    from one source (`_seed_group`)."""
    by_silo: dict[str, float] = {}
    delta: dict[str, float] = {}
    for e in spent:
        for silo, value in e.by_silo.items():
            by_silo[silo] = max(by_silo.get(silo, -math.inf), value)
        delta.update(e.delta)
    return SiloEpsilons(spent[0].accountant, by_silo, delta, spent[0].reported)


def _all_trials(traffic: list[Traffic], trials: list[int]) -> Traffic:
    """Each silo's per-trial totals of every run in turn (0 where a run had none)."""
    silos = sorted({silo for t in traffic for silo in (*t.up, *t.down)})

    def joined(direction: Direction) -> dict[str, tuple[int, ...]]:
        return {
            silo: tuple(
                n
                for t, count in zip(traffic, trials, strict=True)
                for n in (t.up if direction == "up" else t.down).get(silo, (0,) * count)
            )
            for silo in silos
        }

    return Traffic(up=joined("up"), down=joined("down"))
