"""What both halves of a Flower deployment agree on: the study's public design
(`Deployment`), the protocol's version and message record, and its errors.

The hospital half is `dpfl.engines.flower.hospital` (a ClientApp at each hospital), the
server half `dpfl.engines.flower.server` (the ServerApp); `dpfl.engines.flower` gathers
what the rest of dpfl uses of them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sklearn
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode
from sklearn import metrics as skm

from dpfl.analytics import Query, Records
from dpfl.engines.evaluation import metrics
from dpfl.engines.flower.roster import Roster
from dpfl.federation import threshold
from dpfl.federation.algorithms.base import Algorithm
from dpfl.federation.metrics import balanced_accuracy
from dpfl.federation.silo import Silo, SiloInfo
from dpfl.federation.survival_metrics import risk_scores
from dpfl.local.losses import Loss, time_cuts
from dpfl.privacy import events

PROTOCOL = 2
"""Version of the messages below; a hospital on another version is refused. 2: the
evaluation is a release (`Evaluation`), its reply DP counts or declared clear figures."""
LOG = logging.getLogger("flwr")
"""Flower's logger: what the ServerApp logs, `flwr run --stream` shows."""
INSTANCE = re.compile(r"[0-9a-f]{16}")
"""A run instance's id (hex): it names files at the hospitals."""
RECORD = "dpfl"
"""The one ConfigRecord every message carries."""

SURVIVAL = 0
"""The "number of classes" a hospital with survival (time, event) labels announces."""
MOST_CLASSES = 1024
"""The most classes a hospital builds its model at in a study that declares none (no
table schema): the server's count is at least the hospital's own, since other hospitals
may hold labels it lacks, but never a count that would exhaust its memory."""


class DeploymentError(RuntimeError):
    """A deployment that cannot go on: a hospital that is not dpfl's, or that disagrees
    with the study, or no reply in time."""


class NodeUnavailable(DeploymentError):
    """The SuperLink gave up on a hospital's SuperNode: it missed its heartbeats (its
    machine died, or it is restarting and has not joined again yet)."""


class Silent(DeploymentError):
    """No reply in time. A hospital whose machine died looks so until the SuperLink has
    missed two of its heartbeats (60 s in Flower 1.42), which may be after the timeout:
    within a grace period the server presumes it gone (`NodeUnavailable`)."""


@dataclass(frozen=True)
class Deployment:
    """The public design of one run, which the server and every hospital build from the
    same study file (`dpfl.experiments.study.deployment`): nothing in it is a private fact."""

    key: str
    """The study's id: a hospital of another study is refused."""
    rounds: int
    seed: int
    accountant: str
    build: Callable[[Sequence[SiloInfo], Sequence[int], int], Algorithm]
    """The algorithm from public facts only: each silo's name and public size, the
    feature shape and the number of classes."""
    roster: Roster
    """The federation, pinned in the study file: its silos are exactly these hospitals,
    and every party of a cohort or a sum is one of them (`dpfl.engines.flower.roster`)."""
    summing: str = "none"
    """How the server learns the replies' sum: the study's `secure_aggregation`, a mode
    of `dpfl.secure.MODES` whose halves `flower.sums` holds ("none", it sees each;
    "masking", they leave each hospital masked, `flower.masking`; "he", encrypted,
    `flower.he`)."""
    calibration: str | None = None
    """None: σ is the study's. "common": every hospital publishes the least σ its budget
    allows for the study's plan, and the run uses the largest; "per-silo": each hospital
    trains with its own (algorithms whose silos' noise is their own)."""
    size_noise: float | None = None
    """None: each hospital declares its public size. Otherwise each releases a DP count
    of its records, with Gaussian noise of this std, once, charged to its own ledger."""
    schema: tuple[tuple[int, ...], int] | None = None
    """The feature shape and number of classes (`SURVIVAL`) the study declares (a table's
    schema), which every hospital's hello must announce; None: the hellos say."""
    sizes: Mapping[str, int] = field(default_factory=dict)
    """The public sizes the study declares, by hospital (a table's `[data.sites]`): such
    a hospital's is the study's, never its own word."""
    read: Callable[[str, Path], Silo] | None = None
    """How a hospital reads its own file through the study's schema into its silo (name,
    file), with its test set and no public size; None: the study reads no such file (a
    hospital gives a folder holding train.npz)."""
    analytics: Analytics | None = None
    """The study's statistics (`dpfl deploy server --stats`); None: it declares none a
    deployment can release."""
    evaluation: Evaluation = field(default_factory=lambda: Evaluation())
    """What each hospital's evaluation of the final model releases, and how often."""
    name: str = ""
    """The study's name: how a hospital's ledger and statement show it."""
    digests: Mapping[str, str | None] = field(default_factory=dict)
    """SHA-256 of what a hospital's approval covers (`flower.approval`): "study" (the
    study file's bytes), "model" (the model file it names; None: a built-in model),
    "schema" (its `[data]` section, canonical)."""


@dataclass(frozen=True)
class Analytics:
    """A study's `[analytics]` as a deployment releases it (`flower.analytics`): the public
    plan both halves build from the study file, and how a hospital reads its records."""

    queries: tuple[Query, ...]
    noise_multiplier: float
    records: Callable[[str, Path], Records]
    """How a hospital reads its own file (name, file) into the records its statistics
    read, as the simulator's `dpfl stats` reads its silo."""
    max_records: int | None = None
    """The records a patient may hold (`bounded`); None: each record is its own unit."""

    def length(self, hospitals: int) -> int:
        """The length of a hospital's reply: every query's vector, end to end."""
        return sum(q.length(hospitals) for q in self.queries)

    def plan(self, hospitals: int) -> list[str]:
        """The plan in words, as the server states it and each hospital checks it: every
        query whole (its declared values, bins and their order), its sensitivity and
        length."""
        return [
            *(
                f"{q!r}: sensitivity {q.sensitivity!r}, {q.length(hospitals)} values"
                for q in self.queries
            ),
            f"noise multiplier {self.noise_multiplier!r}, "
            + (
                "a record a unit"
                if self.max_records is None
                else f"a patient's first {self.max_records} records"
            ),
        ]


@dataclass(frozen=True)
class Evaluation:
    """A study's `[evaluation]` as a deployment releases it. "dp": each hospital releases
    its test records counted by (label, score bin) on `bins` public bins of [0, 1] (0.5
    an edge), and for several classes its confusion matrix and each class's one-vs-rest
    scores so counted, with Gaussian noise (`noise_multiplier` × `sensitivity`), charged
    to its ledger before it leaves (`dpfl.analytics.release`); the server reads every
    metric off the noisy counts (`counted`, `union_metrics`). "clear": its exact metrics
    and `union_counts`, outside ε. A hospital answers `queries` evaluations over the
    study's runs, each of the final model of a run it trained in."""

    release: str = "dp"
    queries: int = 1
    noise_multiplier: float = 5.0
    bins: int = 10

    def describe(self) -> str:
        """In words, as a hospital logs it and the datasheet shows it."""
        times = f"at most {self.queries} of the final model of a run each hospital trained in"
        if self.release == "clear":
            return (
                f"{times}: its exact metrics in the clear, OUTSIDE ε ([evaluation] release = "
                "'clear'): the test records are not protected"
            )
        return (
            f"{times}: its test records counted by label and score ({self.bins} bins), with "
            f"Gaussian noise (σ = {self.noise_multiplier:g} × the counts' sensitivity), "
            "charged to its ledger"
        )

    def event(self, silo: SiloInfo) -> events.PrivacyEvent:
        """What one DP evaluation charges the hospital `silo`."""
        return events.gaussian(self.noise_multiplier, neighbouring=silo.neighbouring)

    def plan(self, silo: SiloInfo, left: int) -> list[events.PrivacyEvent]:
        """What `left` more evaluations will charge: nothing where they are clear."""
        return [events.repeat(self.event(silo), left)] if self.release == "dp" and left else []

    def histogram(self, labels: np.ndarray, predicted: np.ndarray) -> np.ndarray:
        """The exact counts a DP evaluation adds noise to: a binary model's records by
        (label, bin); a multi-class model's confusion matrix, then per class its records
        by (is of the class, bin of the class's score). Refused for survival labels."""
        if labels.ndim == 2:
            raise DeploymentError(
                "a DP evaluation counts a classifier's scores: this study's survival labels "
                "need [evaluation] release = 'clear' (outside ε) or queries = 0"
            )
        labels, width = labels.astype(np.int64), 2 * self.bins
        if predicted.ndim == 1:
            return np.bincount(
                labels * self.bins + _score_bins(predicted, self.bins), minlength=width
            )
        classes = predicted.shape[1]
        confusion = np.bincount(labels * classes + predicted.argmax(axis=1), minlength=classes**2)
        per_class = [
            np.bincount(
                (labels == c) * self.bins + _score_bins(predicted[:, c], self.bins), minlength=width
            )
            for c in range(classes)
        ]
        return np.concatenate([confusion, *per_class])

    def sensitivity(self, silo: SiloInfo, length: int) -> float:
        """The L2 sensitivity of a `histogram` of that length: a record is in one cell of a
        binary model's, in 1 + C of a C-class model's; a unit of privacy moves its
        records as it moves a threshold's histogram (`threshold.sensitivity`). Refused
        for patients: their test records are counted unbounded."""
        if silo.patient_level:
            raise DeploymentError("a DP evaluation of patient-level records is not implemented")
        cells = 1 if length == 2 * self.bins else 1 + self._classes(length)
        return math.sqrt(cells) * threshold.sensitivity(silo)

    def counted(self, noisy: Sequence[float]) -> dict[str, Any]:
        """A noisy `histogram` as `union_counts` would give it (each count rounded and
        clamped at 0; each bin at its centre among the `SCORE_BINS`), which
        `union_metrics` reads: post-processing."""
        counts = np.maximum(np.rint(np.asarray(noisy, dtype=np.float64)), 0).astype(np.int64)
        centre = ((np.arange(self.bins) + 0.5) * SCORE_BINS / self.bins).astype(np.int64)
        cells = (np.arange(2)[:, None] * SCORE_BINS + centre).ravel()
        if len(counts) == 2 * self.bins:
            return {"cells": cells.tolist(), "counts": counts.tolist()}
        classes = self._classes(len(counts))
        per_class = [2 * c * SCORE_BINS + cells for c in range(classes)]
        return {
            "confusion": counts[: classes**2].tolist(),
            "cells": np.concatenate(per_class).tolist(),
            "counts": counts[classes**2 :].tolist(),
        }

    def _classes(self, length: int) -> int:
        """C, from a C-class histogram's length C² + 2·bins·C."""
        return math.isqrt(self.bins**2 + length) - self.bins


DeploymentOf = Callable[[Path], Deployment]
"""How a half reads a study file (the hospital's from its node config, the server's
from its run config) into its `Deployment`; refuses one that cannot be deployed."""


def record(fields: Mapping[str, Any]) -> RecordDict:
    """A message's content: its fields in dpfl's one ConfigRecord."""
    return RecordDict({RECORD: ConfigRecord(dict(fields))})


def fields_of(message: Message) -> dict[str, Any]:
    """A reply's fields; its error, or a reply that is not dpfl's, raised."""
    if message.has_error():
        gone = message.error.code == ErrorCode.NODE_UNAVAILABLE
        error = NodeUnavailable if gone else DeploymentError
        raise error(f"error {message.error.code}: {message.error.reason}")
    records = message.content.config_records
    if RECORD not in records:
        raise DeploymentError("the reply is not dpfl's (no dpfl record)")
    return dict(records[RECORD])


FACTS = ("study", "instance", "silos", "sizes", "shape", "classes", "noise")
"""The run's public facts, which every message after hello stands on: sent in full until
a hospital holds them, then by their `digest` (`by_reference`, `held`)."""
HELD = "dpfl.facts"
"""Where a hospital keeps the facts it was sent, in its node's context state."""


def digest(facts: Mapping[str, Any]) -> str:
    """The public facts' SHA-256, 16 hex digits: what a message refers to them by."""
    text = json.dumps({k: facts[k] for k in sorted(facts)}, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_digest(sent: bytes) -> str:
    """A model's SHA-256 as the server sends it (its float32 bytes), 16 hex digits."""
    return hashlib.sha256(sent).hexdigest()[:16]


def by_reference(fields: Mapping[str, Any], holds: str | None) -> tuple[dict[str, Any], str | None]:
    """A message's fields for a hospital that holds the facts of digest `holds` (None:
    none): their facts replaced by `{"facts": digest}` where it holds these; and the
    facts' digest (None: the message states none)."""
    facts = {k: fields[k] for k in FACTS if k in fields}
    if "silos" not in facts:
        return dict(fields), None
    sent = digest(facts)
    if sent != holds:
        return dict(fields), sent
    return {**{k: v for k, v in fields.items() if k not in facts}, "facts": sent}, sent


def held(fields: Mapping[str, Any], state: RecordDict) -> dict[str, Any] | None:
    """A message's fields with the run's public facts: facts referred to by digest are
    the ones the hospital keeps (`keep`); None where it keeps none of that digest (its
    SuperNode restarted: it answers `UNHELD` and the server sends them in full).
    DeploymentError for facts that differ from those it keeps for the same run instance
    (a run instance's facts never change, except that calibration adds σ), or that are
    stated beside their digest."""
    kept = dict(state.config_records.get(HELD, {}))
    if "facts" in fields:
        if not kept or digest(kept) != fields["facts"]:
            return None
        beside = [k for k in FACTS if k in fields]
        if beside:  # they would replace the held ones unchecked
            raise DeploymentError(
                f"the server sent the run's {', '.join(beside)} beside their digest"
            )
        return {**kept, **{k: v for k, v in fields.items() if k != "facts"}}
    facts = {k: fields[k] for k in FACTS if k in fields}
    if "silos" in facts and kept.get("instance") == facts["instance"]:
        changed = sorted(k for k in facts.keys() & kept.keys() if facts[k] != kept[k])
        if changed:
            raise DeploymentError(f"the server changed the run's {', '.join(changed)} mid-run")
    return dict(fields)


def keep(fields: Mapping[str, Any], state: RecordDict) -> None:
    """Keep the public facts a message stated, once the hospital answered it (its checks
    passed): later messages may refer to them by digest. One run's at a time."""
    facts = {k: fields[k] for k in FACTS if k in fields}
    if "silos" in facts:
        state.config_records[HELD] = ConfigRecord(facts)


UNHELD = "unheld"
"""A hospital's answer to a message that refers to facts it does not hold."""


def silos_of(fields: Mapping[str, Any]) -> list[SiloInfo]:
    """The run's silos as the server declares them (names and public sizes)."""
    return [SiloInfo(str(n), int(s)) for n, s in zip(fields["silos"], fields["sizes"], strict=True)]


@dataclass(frozen=True)
class Exchange:
    """What the server opens one exchange's sum with."""

    ask: Ask
    """Ask the cohort; with `missing="continue"`, hospitals that fail are left out."""
    ask_all: Ask
    """Ask hospitals that must all answer."""
    roster: Roster
    names: list[str]
    """The hospitals instructed, in order."""
    length: int
    """The length of a reply's vector."""
    fewest: int
    """The fewest replies the algorithm's charged events assume in a sum."""
    counter: int
    """The exchange's number in the run (each exchange is one sum)."""


Ask = Callable[[str, Mapping[str, Mapping[str, Any]]], dict[str, dict[str, Any]]]
"""Send each named hospital its fields as a message of a kind; their replies by name."""


def exchange_number(round_: int, exchange: int, exchanges: int) -> int:
    """An exchange's number in the run (each exchange is one sum), as the server and each
    hospital count it: what a secure sum's session is keyed by."""
    return round_ * exchanges + exchange


SCORE_BINS = 10_000
"""Bins of [0, 1] in which a hospital counts its model's test scores, by label, for the
union of the test sets: 0.5, the decision threshold, is a bin edge."""
TIME_BINS = 100
"""Bins per unit of log(1 + time) in which a survival hospital counts its test records'
times (about 1% of a time wide), a public rule that reads nothing from the records."""
RISK_BINS = 1_000
"""Bins per unit of asinh(risk) in which it counts its model's risk scores (about 0.1%
of a risk wide; any monotone map keeps the concordance's order)."""
RISK_SPAN = 1 << 21
"""Risk bins a survival cell spans: every finite float's (|asinh| < 711)."""


def score_counts(labels: np.ndarray, scores: np.ndarray) -> dict[str, list[int]]:
    """A hospital's test scores (binary probabilities) counted by (label, bin), the
    nonzero cells only: what the server combines into metrics of the union of the test
    sets (`union_metrics`), instead of the scores themselves. A score's bin keeps its
    side of the threshold, so the thresholded metrics of the union are exact."""
    cells = labels.astype(np.int64) * SCORE_BINS + _score_bins(scores)
    return _counted(cells)


def _score_bins(scores: np.ndarray, bins: int = SCORE_BINS) -> np.ndarray:
    """Each score's bin of [0, 1] in `bins` (even): 0.5 is an edge."""
    index = np.minimum((scores * bins).astype(np.int64), bins - 1)
    half = bins // 2
    return np.where(scores >= 0.5, np.maximum(index, half), np.minimum(index, half - 1))


def _counted(cells: np.ndarray) -> dict[str, list[int]]:
    """The nonzero cells of a histogram and their counts."""
    cells, counts = np.unique(cells, return_counts=True)
    return {"cells": cells.tolist(), "counts": counts.tolist()}


def union_counts(labels: np.ndarray, predicted: np.ndarray, loss: Loss | None) -> dict[str, Any]:
    """What a hospital sends for the union of the test sets (`union_metrics`), never its
    scores: a binary model's `score_counts`; a multi-class model's confusion matrix and,
    per class, its one-vs-rest scores counted as a binary model's (class c's cells offset
    by 2·c·SCORE_BINS); a survival model's Harrell pair counts within its own test set
    (concordant, discordant, tied risk) and its records counted by (time bin, event, risk
    bin) on the public `TIME_BINS` and `RISK_BINS`, for the pairs across hospitals."""
    if labels.ndim == 2:
        return _survival_counts(
            labels, risk_scores(predicted, None if loss is None else time_cuts(loss))
        )
    if predicted.ndim == 1:
        return score_counts(labels, predicted)
    classes = predicted.shape[1]
    confusion = labels.astype(np.int64) * classes + predicted.argmax(axis=1)
    per_class = [
        2 * c * SCORE_BINS + (labels == c) * SCORE_BINS + _score_bins(predicted[:, c])
        for c in range(classes)
    ]
    matrix = np.bincount(confusion, minlength=classes * classes)
    return {"confusion": matrix.tolist(), **_counted(np.concatenate(per_class))}


def _survival_counts(labels: np.ndarray, risk: np.ndarray) -> dict[str, Any]:
    time, event = labels[:, 0], labels[:, 1].astype(bool)
    times = np.floor(np.log1p(np.maximum(time, 0.0)) * TIME_BINS).astype(np.int64)
    risks = np.floor(np.arcsinh(risk) * RISK_BINS).astype(np.int64)
    cells = (times * 2 + event) * RISK_SPAN + risks + RISK_SPAN // 2
    return {"pairs": _harrell(time, event, risk), **_counted(cells)}


def _harrell(time: np.ndarray, event: np.ndarray, risk: np.ndarray) -> list[int]:
    """Harrell's (concordant, discordant, tied risk) pair counts; zeros where no pair is
    comparable."""
    from sksurv.metrics import concordance_index_censored

    if not event.any():
        return [0, 0, 0]
    _, concordant, discordant, tied, _ = concordance_index_censored(event, time, risk)
    return [int(concordant), int(discordant), int(tied)]


def union_metrics(
    counted: Sequence[Mapping[str, Any]], losses: Sequence[tuple[float, int]]
) -> dict[str, float]:
    """Metrics of the union of the hospitals' test sets from their `union_counts` and
    their (mean loss, test records), named as the simulator's union metrics.

    Binary: counts and accuracy-like metrics exactly as the simulator's union, AUROC and
    AUPRC on the binned scores (ties within a bin of width 1/SCORE_BINS). Multi-class:
    accuracy, balanced accuracy, macro precision and recall exactly (the confusion
    matrix), macro one-vs-rest AUROC and AUPRC on the binned scores. The loss: the
    records' mean (none without `losses`). Survival: `c_index` only, Harrell's
    concordance of the union, its pairs within each hospital exact and the pairs across
    hospitals counted on the binned (time, risk): a pair in one time bin or one risk bin
    counts as tied there (`_cross_pairs`). Uno's C, td-AUC and the IBS need the union's
    censoring distribution: they stay per hospital."""
    if "pairs" in counted[0]:
        return _union_c_index(counted)
    if "confusion" in counted[0]:
        union = _union_multiclass(counted)
    else:
        labels, scores = _binned_scores(counted, 0)
        union = metrics(labels, scores, None)
    union.pop("loss", None)  # the binned scores' log loss: not the model's
    if losses:  # none from noisy counts (`Evaluation.counted`)
        union["loss"] = sum(loss * n for loss, n in losses) / sum(n for _, n in losses)
    return union


def _binned_scores(counted: Sequence[Mapping[str, Any]], column: int) -> tuple[np.ndarray, ...]:
    """One score column's (labels, bin centres) over every hospital's cells."""
    cells = np.concatenate([np.asarray(c["cells"], dtype=np.int64) for c in counted])
    counts = np.concatenate([np.asarray(c["counts"], dtype=np.int64) for c in counted])
    mine = cells // (2 * SCORE_BINS) == column
    cells, counts = cells[mine] % (2 * SCORE_BINS), counts[mine]
    labels = np.repeat(cells // SCORE_BINS, counts)
    return labels, np.repeat((cells % SCORE_BINS + 0.5) / SCORE_BINS, counts)


def _union_multiclass(counted: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    matrix = np.sum([np.asarray(c["confusion"], dtype=np.int64) for c in counted], axis=0)
    classes = math.isqrt(len(matrix))
    cells = np.arange(len(matrix))
    labels, predicted = np.repeat(cells // classes, matrix), np.repeat(cells % classes, matrix)
    present = len(np.unique(labels)) == classes
    columns = [_binned_scores(counted, c) for c in range(classes)]
    with sklearn.config_context(skip_parameter_validation=True):
        auroc = [skm.roc_auc_score(y, s) for y, s in columns] if present else [math.nan]
        auprc = [skm.average_precision_score(y, s) for y, s in columns] if present else [math.nan]
        return {
            "accuracy": float(skm.accuracy_score(labels, predicted)),
            "balanced_accuracy": balanced_accuracy(labels, predicted),
            "auroc": float(np.mean(auroc)),
            "auprc": float(np.mean(auprc)),
            "precision": float(
                skm.precision_score(labels, predicted, average="macro", zero_division=0)
            ),
            "recall": float(skm.recall_score(labels, predicted, average="macro", zero_division=0)),
        }


def _union_c_index(counted: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    within = np.sum([c["pairs"] for c in counted], axis=0)
    concordant, discordant, tied = within + _cross_pairs(counted)
    comparable = concordant + discordant + tied
    return {"c_index": (concordant + tied / 2) / comparable if comparable else math.nan}


def _cross_pairs(counted: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """Harrell's pair counts over pairs of records of different hospitals, on bin
    centres: the binned union's counts less each hospital's binned counts (a pair's count
    depends on its two records only)."""
    records = [_centres(c) for c in counted]
    union = _harrell(*(np.concatenate(parts) for parts in zip(*records, strict=True)))
    cross: np.ndarray = np.asarray(union) - np.sum([_harrell(*r) for r in records], axis=0)
    return cross


def _centres(counted: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A hospital's (time, event, risk) records at the centres of their bins."""
    cells = np.repeat(np.asarray(counted["cells"], np.int64), counted["counts"])
    risks, rest = cells % RISK_SPAN - RISK_SPAN // 2, cells // RISK_SPAN
    time = np.expm1((rest // 2 + 0.5) / TIME_BINS)
    return time, (rest % 2).astype(bool), np.sinh((risks + 0.5) / RISK_BINS)
