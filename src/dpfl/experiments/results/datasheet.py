"""A run's privacy datasheet: what an ethics board needs to judge its guarantee.

Every number comes from the run's ledger (the events its samplers declared), never from
the config: the unit of privacy, the mechanism, the accountant, q, σ, C, how often each
silo took part in each trial, then who sees what, what is released outside ε (test-set
metrics) and whether the noise may be released at all. ε itself is read from the
results store (`ResultsStore.epsilon_by_silo`): the largest over trials, per silo.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dp_accounting import dp_event as dpe

from dpfl import secure
from dpfl.privacy import Ledger, Neighbouring
from dpfl.privacy.accounting import consortium_epsilon
from dpfl.privacy.events import NodeSampledGaussianDpEvent, compose
from dpfl.privacy.ledger import plan_epsilon

if TYPE_CHECKING:  # the report reads datasheets without importing torch
    from dpfl.engines.simulation import SimulationResult
    from dpfl.experiments.results.store import RunRow
    from dpfl.experiments.study.config import StudyConfig
    from dpfl.federation.algorithms import Algorithm

ASSUMPTIONS = [
    "Each patient contributes one record to one hospital (record-level DP; a patient "
    "with several records is protected only if records are grouped first).",
    "Batches are Poisson-sampled by the code that declares the event (no shuffling).",
    "Preprocessing uses public constants only (declared ranges, published signatures, "
    "zero imputation); nothing is fitted on the records.",
    "Noise comes from a cryptographically secure generator in deployment; research runs "
    "with seeded noise are reproducible but must not be released.",
    "Trials are separate releases: each trial's ε is its own; releasing several trials' "
    "models composes them.",
]


RESEARCH_NOISE = (
    "research noise: seeded, so anyone who learns the seed can subtract it; the ε shown "
    "holds only for unpredictable noise, so a model trained with it must not be released "
    "(research_noise = false draws the noise from the operating system's CSPRNG)"
)
"""Said wherever the ε of a run with seeded noise is shown, the ε marked with RESEARCH_MARK."""
RESEARCH_MARK = "†"


def research_noise(run: RunRow) -> bool:
    """Whether a private run's noise was seeded (the study default), so that its ε is a
    research figure and its model must not be released."""
    return bool(run.datasheet.get("research_noise"))


NODE_LEVEL_UNIT = (
    "one person with all their contacts (node-level): neighbouring contact graphs differ by "
    "replacing one person; the graph is pruned so that a person is in at most S training "
    "rows (each silo's events say S), and the guarantee holds for the pruned graph"
)


PATIENT_LEVEL = (
    "one patient with all their records (patient-level): neighbouring datasets differ by "
    "adding or removing one patient; {bound}, so the public sizes count patients"
)
"""The unit of a patient-level run, with how its algorithm bounds a patient."""
USER_LEVEL_SAMPLING = (
    "each batch Poisson-samples patients and clips the mean gradient of a sampled patient's "
    "records to C as one (user-level sampling, Chua et al. 2024)"
)
PATIENT_LEVEL_UNIT = PATIENT_LEVEL.format(bound=USER_LEVEL_SAMPLING)
"""A patient-level DP-SGD run's unit."""
PATIENT_ASSUMPTION = (
    "Each patient is identified by the study's unit column within a hospital (patient-level "
    "DP there; a patient seen by several hospitals is protected by each hospital's guarantee "
    "separately, composed across them only where the study declares it)."
)
GROUP_BOUND = "k-fold group privacy of (ε, δ)-DP: (kε, k·e^((k−1)ε)·δ) (Vadhan 2017, Lemma 2.2)"


def group_privacy(epsilon: float, delta: float, records: int) -> tuple[float, float]:
    """(kε, k·e^((k−1)ε)·δ): what an (ε, δ)-DP release guarantees a group of k records,
    here one patient's k = `records` (Vadhan, "The Complexity of Differential Privacy",
    2017, Lemma 2.2). δ is capped at 1, where the bound says nothing."""
    k = records
    if k < 1:
        raise ValueError(f"a group has at least one record, got {k}")
    exponent = (k - 1) * epsilon
    group_delta = 1.0 if exponent > 700 else min(1.0, k * math.exp(exponent) * delta)
    return k * epsilon, group_delta


def mechanism(config: StudyConfig, kind: type[Algorithm]) -> str:
    """The algorithm's mechanism, with its noise where that is not DP-SGD's own
    independent noise (`algorithm.noise`)."""
    noise = getattr(config.algorithm, "noise", None)
    built = None if noise is None else noise.build(1)
    if noise is None or built is None or not built.correlated:
        return kind.mechanism
    settings = ", ".join(f"{k} = {v}" for k, v in noise.model_dump(exclude={"mechanism"}).items())
    return f"{kind.mechanism}; the noise: {built.described} ({built.name}: {settings})"


def datasheet(
    config: StudyConfig, kind: type[Algorithm], result: SimulationResult, book: Ledger
) -> dict[str, Any]:
    """The datasheet of a finished run of algorithm `kind`. Each silo's charges are
    listed over all its trials, which differ under client sampling; no trial stands for
    the others."""
    algorithm = config.algorithm
    private = config.privacy.private
    sheet: dict[str, Any] = {
        "unit": "one patient record: neighbouring datasets differ by adding or removing it"
        if private
        else "none: the non-private reference protects no one",
        "threat_model": kind.threat_model,
        "secure_aggregation": secure.mode(config.summing).described,
        "assumptions": ASSUMPTIONS,
        "mechanism": mechanism(config, kind)
        if private
        else "none: the non-private reference (ε = ∞)",
        "accountant": config.privacy.accountant,
        "noise_multiplier": result.noise_multiplier if private else None,
        "clip_norm": algorithm.clip_norm if private and not kind.sets_own_noise else None,
        "research_noise": private and config.research_noise,
        "evaluation": _evaluation(config, result),
        "silos": {},
    }
    if not private or not any(result.accounts):
        return sheet
    released = set(result.metadata.get("released_sizes", []))
    # a balanced threshold's histograms are released (and charged) at every evaluation
    balanced = config.threshold.choose == "balanced"
    releases = len({row["round"] for row in result.history}) if balanced else 0
    first = book.budget(next(iter(result.accounts[0].values()))[None])
    if first.neighbouring is Neighbouring.REPLACE_ONE:
        sheet["unit"] = NODE_LEVEL_UNIT
    elif first.neighbouring is Neighbouring.ADD_REMOVE_PATIENT:
        sheet["unit"] = PATIENT_LEVEL.format(bound=kind.patient_bound or USER_LEVEL_SAMPLING)
        sheet["assumptions"] = [PATIENT_ASSUMPTION, *ASSUMPTIONS[1:]]
    record_level = first.neighbouring is Neighbouring.ADD_REMOVE
    records = config.data.declared_max_records() if record_level else None
    for silo in result.accounts[0]:
        trials = [accounts[silo] for accounts in result.accounts]
        entries = [book.entries(views[None]) for views in trials]
        budget = book.budget(trials[0][None])  # every trial has the silo's budget
        charged = [Counter(e.event.describe() for e in mine) for mine in entries]
        events = dict.fromkeys(text for counts in charged for text in counts)
        sheet["silos"][silo] = {
            "public_size": result.metadata.get("public_sizes", {}).get(silo, budget.size),
            "public_size_source": "DP count released through the ledger (charged)"
            if silo in released
            else "declared by the study",
            "noise_multiplier": result.metadata.get("noise_multipliers", {}).get(silo),
            "budget_epsilon": None if budget.epsilon == float("inf") else budget.epsilon,
            "delta": budget.delta,
            "sample_rates": sorted(
                {q for mine in entries for e in mine for q in _sample_rates(e.event.dp_event)}
            ),
            "participations": [
                sum(e.round is not None for e in mine) - releases for mine in entries
            ],
            "events": [f"{span([c[text] for c in charged])} × {text}" for text in events],
            "views": sorted(view for view in trials[0] if view is not None),
        }
        if records is not None:  # record-level training on data with patients in it
            spent = max(
                plan_epsilon(
                    compose([e.event for e in mine]), budget.delta, book.accountant
                ).epsilon
                for mine in entries
            )
            epsilon, delta = group_privacy(spent, budget.delta, records)
            sheet["silos"][silo]["patient_group_privacy"] = {
                "records": records,
                "record_epsilon": spent,
                "record_delta": budget.delta,
                "epsilon": epsilon,
                "delta": delta,
                "bound": GROUP_BOUND,
            }
    if config.privacy.hospitals_per_patient is not None:
        sheet["consortium"] = consortium(result, book, config.privacy.hospitals_per_patient)
    return sheet


CONSORTIUM_UNIT = {
    Neighbouring.ADD_REMOVE: "record",
    Neighbouring.ADD_REMOVE_PATIENT: "patient",
    Neighbouring.REPLACE_ONE: "person",
}
"""What the consortium ε covers at each hospital: one unit of privacy of the silos'."""
CONSORTIUM_COVERS = {
    "record": "one record at each of up to {h} hospitals (record-level: a patient with "
    "several records at a hospital is not covered by it)",
    "patient": "one patient, with all their records, at each of up to {h} hospitals",
    "person": "one person, with all their contacts, at each of up to {h} hospitals",
}


def consortium(result: SimulationResult, book: Ledger, hospitals: int) -> dict[str, Any]:
    """ε of one unit of privacy (a record, or a patient where the study declares its
    unit) at each of up to `hospitals` silos (`accounting.consortium_epsilon` of each
    silo's charged events, at the study's δ), the largest over trials, with the silos of
    the worst subset where it was found by composing every one."""
    worst: tuple[float, list[str], bool] | None = None
    budgets = [book.budget(views[None]) for views in result.accounts[0].values()]
    delta = min(budget.delta for budget in budgets)
    for accounts in result.accounts:
        names = list(accounts)
        plans = [compose([e.event for e in book.entries(accounts[n][None])]) for n in names]
        found = consortium_epsilon(plans, hospitals, delta, book.accountant)
        if worst is None or found.epsilon > worst[0]:
            worst = (found.epsilon, [names[i] for i in found.worst], found.exact)
    assert worst is not None  # a private run has at least one trial
    epsilon, silos, exact = worst
    return {
        "hospitals": min(hospitals, len(result.accounts[0])),
        "declared": hospitals,
        "unit": CONSORTIUM_UNIT[budgets[0].neighbouring],
        "epsilon": epsilon,
        "delta": delta,
        "silos": silos,
        "method": "the worst subset, every one composed"
        if exact
        else "an RDP bound over every subset (too many to compose one by one)",
    }


def consortium_text(figure: dict[str, Any]) -> str:
    """The consortium line of a datasheet: `one record (or patient) at each of up to h
    hospitals: ε ≤ …` (a figure written before it named its unit: the run's unit)."""
    worst = f" (worst: {', '.join(figure['silos'])})" if figure["silos"] else ""
    covers = CONSORTIUM_COVERS.get(
        figure.get("unit", ""), "one unit of privacy (the run's) at each of up to {h} hospitals"
    ).format(h=figure["declared"])
    return (
        f"{covers}: ε ≤ {figure['epsilon']:.3g} at δ = {figure['delta']:g}{worst}; "
        f"{figure['method']}"
    )


def span(counts: Sequence[int] | int) -> str:
    """Per-trial counts as one figure, or their range where trials differ (a datasheet
    written before per-trial counts holds one number)."""
    if isinstance(counts, int):
        return str(counts)
    low, high = min(counts), max(counts)
    return str(low) if low == high else f"{low}–{high} (by trial)"


def _evaluation(config: StudyConfig, result: SimulationResult) -> str:
    evaluated = len({row["round"] for row in result.history})
    return (
        "Simulated research figures, outside ε: metrics on each silo's held-out test "
        "records (and on their union) are released "
        f"after {evaluated} of the {result.rounds_completed} rounds "
        f"(eval_every = {config.eval_every}), without noise, which ε does not cover (it "
        'protects the training records only). eval_every = "end" releases them once. A '
        "deployment releases its evaluation as the study's [evaluation] says: DP counts "
        "charged to each hospital's ledger (the default), or clear figures outside ε."
        + (
            " Every silo's final model is also scored on every silo's test set (cross_silo)."
            if result.cross_silo
            else ""
        )
        + _threshold(config)
    )


def _threshold(config: StudyConfig) -> str:
    cut = config.threshold
    if cut.choose == "fixed":
        return f" Binary predictions are read at the public threshold {cut.value:g}."
    charged = (
        "charged to each silo's ledger (among its events)"
        if config.privacy.private
        else "exact: the reference protects no one"
    )
    return (
        " Binary predictions are read at a threshold chosen at each evaluation: each silo "
        "releases per-class histograms of its model's scores on its training records "
        "(each patient's first max_records where the unit is the patient; "
        f"{cut.bins} bins of logits in ±{cut.logit_range:g}, Gaussian noise of std "
        f"{cut.noise:g} records a count, {charged}); the threshold maximises TPR − FPR "
        "on their sum (on its own where each silo has its own model)."
    )


SELECTION_RECORDS = {
    "from-training": (
        "a stratified part ({fraction}) of each silo's training records, set aside: the "
        "candidates train on the rest (public sizes shrink by as much)",
        "the validation records: they choose the released candidate without noise, and a "
        "later `dpfl run` of the chosen point trains on them (their part in the choice is "
        "in no ε)",
    ),
    "held-out": (
        "a stratified part ({fraction}) of each silo's test records, in no silo's training "
        "set: the candidates train on the study's training records, the released one is "
        "tested on the rest of the test records",
        "the validation records: they choose the released candidate without noise, but no "
        "run of the study trains on them",
    ),
    "official": (
        "each silo's share of the dataset's official val split, in no silo's training or "
        "test set: the candidates train on the study's training records, the released one "
        "is tested on all of the silo's test records",
        "the validation records: they choose the released candidate without noise, but no "
        "run of the study trains on them",
    ),
}
"""Per `tune.validation`: where the validation records come from, and what of them ε
leaves out."""


def selection(validation: str, fraction: float, private: bool) -> dict[str, str]:
    """A `dpfl tune` release's datasheet: its validation records (`TuneConfig`) and what
    its ε covers."""
    records, outside = SELECTION_RECORDS[validation]
    return {
        "validation": validation,
        "validation_records": records.format(fraction=f"{fraction:g}"),
        "in_epsilon": "each silo's records the candidates trained on, the selection among "
        "them included (Papernot & Steinke)"
        if private
        else "nothing: the non-private reference (ε = ∞)",
        "outside_epsilon": f"{outside}; the test records, whose metrics are released",
    }


def _sample_rates(node: dpe.DpEvent) -> set[float]:
    """The Poisson sampling rates q inside a recorded event."""
    if isinstance(node, dpe.PoissonSampledDpEvent | NodeSampledGaussianDpEvent):
        return set() if node.sampling_probability is None else {node.sampling_probability}
    inner = getattr(node, "events", None) or [getattr(node, "event", None)]
    return {q for child in inner if child is not None for q in _sample_rates(child)}
