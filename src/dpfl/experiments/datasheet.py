"""A run's privacy datasheet: what an ethics board needs to judge its guarantee.

Every number comes from the run's ledger (the events its samplers declared), never from
the config: the unit of privacy, the mechanism, the accountant, q, σ, C, how often each
silo took part, and ε per silo at its δ by both PLD and RDP; then who sees what.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from dp_accounting import dp_event as dpe

from dpfl.engines.simulation import SimulationResult
from dpfl.experiments.config import StudyConfig
from dpfl.privacy import Accountant, Ledger

THREAT_MODELS = {
    "fedavg": (
        "The server and every other hospital see each participating hospital's model "
        "update after its local DP-SGD; the guarantee holds against all of them together "
        "(honest-but-curious or colluding). With client sampling, who took part is public."
    ),
    "sign": (
        "As FL-STANDARD-DP: the server sees each hospital's sign vector, computed from a "
        "DP-SGD update, so it is covered by that hospital's DP-SGD guarantee."
    ),
    "cyclic": (
        "Each hospital passes its model to the next in turn; the next hospital (and "
        "anyone who sees the model) learns only what E DP-SGD steps release. Steps at "
        "other hospitals are post-processing for this one."
    ),
    "fedsgd_secure": (
        "Dopamine: the server sees only the secure sum of the hospitals' noisy gradients, "
        "which carries noise σ in all (the server view, bound by the budget). Another "
        "hospital that subtracts its own share still faces noise σ√((K−1)/K): the "
        "'hospitals' view. Secure aggregation itself is simulated in the clear here."
    ),
    "aop": (
        "A*STAR output perturbation: each hospital releases a noisy minimiser per epoch; "
        "the server and the other hospitals see those releases. Basic composition over "
        "the epochs."
    ),
    "mrmtl": (
        "The server sees each hospital's DP-SGD-trained model; the personalised models "
        "stay at their hospitals but are covered by the same steps (silo-level DP)."
    ),
    "ditto": (
        "As MR-MTL; the personal model's extra local steps are charged too, since its "
        "outputs (predictions) may be released."
    ),
    "finetune": "The server sees the federated phase's updates; fine-tuning steps are charged.",
    "local": "Nothing leaves a hospital during training; the released model is DP-SGD-trained.",
    "centralized": (
        "The pooled reference: a trusted curator holds all records and releases a "
        "DP-SGD-trained model (CDP), or a non-private one (C)."
    ),
}

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


def datasheet(config: StudyConfig, result: SimulationResult, book: Ledger) -> dict[str, Any]:
    """The datasheet of a finished run, trial 0 standing for all (trials spend alike)."""
    algorithm = config.algorithm
    private = config.privacy.private
    sheet: dict[str, Any] = {
        "unit": "one patient record: neighbouring datasets differ by adding or removing it"
        if private
        else "none: the non-private reference protects no one",
        "threat_model": THREAT_MODELS[algorithm.name],
        "assumptions": ASSUMPTIONS,
        "mechanism": _mechanism(config),
        "accountant": config.privacy.accountant,
        "noise_multiplier": result.noise_multiplier if private else None,
        "clip_norm": algorithm.clip_norm if private and algorithm.name != "aop" else None,
        "silos": {},
    }
    if not private or not result.accounts:
        return sheet
    for silo, views in result.accounts[0].items():
        name = views[None]
        budget = book.budget(name)
        entries = book.entries(name)
        shown = Counter(e.event.describe() for e in entries)
        sheet["silos"][silo] = {
            "size": budget.size,
            "budget_epsilon": None if budget.epsilon == float("inf") else budget.epsilon,
            "delta": budget.delta,
            "sample_rates": sorted({q for e in entries for q in _sample_rates(e.event.dp_event)}),
            "participations": len(entries),
            "events": [f"{count} × {text}" for text, count in shown.items()],
            "epsilon_pld": book.spent(name, accountant=Accountant.PLD).epsilon,
            "epsilon_rdp": book.spent(name, accountant=Accountant.RDP).epsilon,
            "views": {
                view: book.spent(account).epsilon
                for view, account in views.items()
                if view is not None
            },
        }
    return sheet


def _mechanism(config: StudyConfig) -> str:
    if not config.privacy.private:
        return "none: the non-private reference (ε = ∞)"
    if config.algorithm.name == "aop":
        return "approximate output perturbation (Gaussian), basic composition over epochs"
    return "DP-SGD: per-example clipping to C, Gaussian noise σC on Poisson-sampled batches"


def _sample_rates(node: dpe.DpEvent) -> set[float]:
    """The Poisson sampling rates q inside a recorded event."""
    if isinstance(node, dpe.PoissonSampledDpEvent):
        return {node.sampling_probability}
    inner = getattr(node, "events", None) or [getattr(node, "event", None)]
    return {q for child in inner if child is not None for q in _sample_rates(child)}
