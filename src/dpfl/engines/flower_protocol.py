"""What both halves of a Flower deployment agree on: the study's public design
(`Deployment`), the protocol's version and message record, and its errors.

The hospital half is `dpfl.engines.flower_hospital` (a ClientApp at each hospital), the
server half `dpfl.engines.flower_server` (the ServerApp); `dpfl.engines.flower` gathers
what the rest of dpfl uses of them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode

from dpfl.engines.evaluation import metrics
from dpfl.engines.roster import Roster
from dpfl.federation.algorithms.base import Algorithm
from dpfl.federation.silo import Silo, SiloInfo

PROTOCOL = 1
"""Version of the messages below; a hospital on another version is refused."""
LOG = logging.getLogger("flwr")
"""Flower's logger: what the ServerApp logs, `flwr run --stream` shows."""
INSTANCE = re.compile(r"[0-9a-f]{16}")
"""A run instance's id (hex): it names files at the hospitals."""
RECORD = "dpfl"
"""The one ConfigRecord every message carries."""

SURVIVAL = 0
"""The "number of classes" a hospital with survival (time, event) labels announces."""


class DeploymentError(RuntimeError):
    """A deployment that cannot go on: a hospital that is not dpfl's, or that disagrees
    with the study, or no reply in time."""


class NodeUnavailable(DeploymentError):
    """The SuperLink gave up on a hospital's SuperNode: it missed its heartbeats (its
    machine died, or it is restarting and has not joined again yet)."""


@dataclass(frozen=True)
class Deployment:
    """The public design of one run, which the server and every hospital build from the
    same study file (`dpfl.experiments.deploy`): nothing in it is a private fact."""

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
    and every party of a cohort or a sum is one of them (`dpfl.engines.roster`)."""
    summing: str = "none"
    """How the server learns the replies' sum: "none", it sees each; "masking", they
    leave each hospital masked (`flower_masking`); "he", encrypted (`flower_he`)."""
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


SCORE_BINS = 10_000
"""Bins of [0, 1] in which a hospital counts its binary model's test scores, by label,
for the union of the test sets: 0.5, the decision threshold, is a bin edge."""


def score_counts(labels: np.ndarray, scores: np.ndarray) -> dict[str, list[int]]:
    """A hospital's test scores (binary probabilities) counted by (label, bin), the
    nonzero cells only: what the server combines into metrics of the union of the test
    sets (`union_metrics`), instead of the scores themselves. A score's bin keeps its
    side of the threshold, so the thresholded metrics of the union are exact."""
    index = np.minimum((scores * SCORE_BINS).astype(np.int64), SCORE_BINS - 1)
    half = SCORE_BINS // 2
    index = np.where(scores >= 0.5, np.maximum(index, half), np.minimum(index, half - 1))
    cells, counts = np.unique(labels.astype(np.int64) * SCORE_BINS + index, return_counts=True)
    return {"cells": cells.tolist(), "counts": counts.tolist()}


def union_metrics(
    counted: Sequence[Mapping[str, Sequence[int]]], losses: Sequence[tuple[float, int]]
) -> dict[str, float]:
    """Metrics of the union of the hospitals' test sets from their `score_counts` and
    their (mean loss, test records): counts and accuracy-like metrics exactly as the
    simulator's union, AUROC and AUPRC on the binned scores (ties within a bin of width
    1/SCORE_BINS), the loss as the records' mean."""
    cells = np.concatenate([np.asarray(c["cells"], dtype=np.int64) for c in counted])
    counts = np.concatenate([np.asarray(c["counts"], dtype=np.int64) for c in counted])
    labels = np.repeat(cells // SCORE_BINS, counts)
    scores = np.repeat((cells % SCORE_BINS + 0.5) / SCORE_BINS, counts)
    union = metrics(labels, scores, None)
    union["loss"] = sum(loss * n for loss, n in losses) / sum(n for _, n in losses)
    return union
