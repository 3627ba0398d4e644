"""A decision threshold chosen from DP-released facts, for binary classifiers whose
scores rank well but sit on the wrong side of 0.5.

Per-example clipping undoes a weighted loss's class weights (every gradient is cut to
the same norm), so a DP model of a rare outcome can rank patients well (AUROC 0.76) yet
put nearly every one of them under 0.5: balanced accuracy 0.50. No public threshold
cures that (the model's scores are not calibrated to anything public). Here each
hospital releases, with Gaussian noise, a histogram of its model's scores on its own
training records, per class, over bins fixed in advance (logits in [−r, r]); the server
sums the hospitals' histograms and takes the bin edge that maximises TPR − FPR on the
sum, which is the threshold of the best balanced accuracy the histograms can tell.

One record is in one bin of one class: adding or removing it moves one count by 1, so
the release is a Gaussian mechanism of L2 sensitivity 1 (√2·(2S − 1) when one person,
in up to S records, is replaced: that changes up to 2S − 1 records; √2·max_records for
a patient-level silo, whose histogram counts each patient's first max_records records
only (`Silo.capped`), refused without that cap; `sensitivity`), charged to the
hospital's ledger like any step.
Everything after the noise (clamping, summing, choosing) is post-processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from dpfl.federation.silo import SiloInfo
from dpfl.local.noise import NoiseSource
from dpfl.privacy import Neighbouring, events

FIXED = 0.5
"""The threshold of a model whose probabilities are taken at face value."""


@dataclass(frozen=True)
class BalancedThreshold:
    """The DP release (`noise`: std of each count's noise, in records) and the choice."""

    noise: float = 10.0
    bins: int = 16
    logit_range: float = 8.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise) and self.noise >= 0):
            raise ValueError(f"threshold noise must be finite and ≥ 0, got {self.noise}")
        if not (isinstance(self.bins, int) and self.bins >= 2):
            raise ValueError(f"threshold bins must be an integer ≥ 2, got {self.bins}")
        if not (math.isfinite(self.logit_range) and self.logit_range > 0):
            raise ValueError(f"threshold logit_range must be > 0, got {self.logit_range}")

    @property
    def edges(self) -> np.ndarray:
        """The bins' inner edges, in logits: the candidate thresholds."""
        return np.linspace(-self.logit_range, self.logit_range, self.bins + 1)[1:-1]

    def event(self, silo: SiloInfo) -> events.PrivacyEvent:
        """What one release of `silo`'s histogram costs it."""
        if not self.noise > 0:
            raise ValueError("a private run's threshold needs noise > 0 (threshold.noise)")
        return events.gaussian(self.noise / sensitivity(silo), neighbouring=silo.neighbouring)

    def counts(self, probabilities: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """[2, bins]: how many records of each class score in each bin (exact)."""
        labels = np.asarray(labels)
        if labels.ndim != 1 or not np.isin(labels, (0, 1)).all():
            raise ValueError(
                "a balanced threshold is for binary classifiers: labels must be 0 or 1"
            )
        p = np.asarray(probabilities, dtype=np.float64)
        with np.errstate(divide="ignore"):  # 0 and 1 are logits ∓∞: the end bins
            logits = np.log(p) - np.log1p(-p)
        bin_of = np.searchsorted(self.edges, logits, side="right")
        out = np.zeros((2, self.bins))
        np.add.at(out, (labels.astype(int), bin_of), 1.0)
        return out

    def release(
        self, probabilities: np.ndarray, labels: np.ndarray, noise: NoiseSource | None
    ) -> np.ndarray:
        """The histogram with N(0, noise²) on every count (`noise` None: exact, for a
        non-private reference run, which protects no one)."""
        exact = self.counts(probabilities, labels)
        if noise is None:
            return exact
        noisy: np.ndarray = exact + noise.normal(exact.shape, self.noise, torch.float64).numpy()
        return noisy

    def choose(self, released: np.ndarray) -> float:
        """The probability threshold at the inner edge of the largest TPR − FPR on
        `released` (summed over hospitals; negative counts read as 0). Without a record of
        either class left, 0.5."""
        negatives, positives = np.clip(released, 0.0, None)
        if positives.sum() <= 0 or negatives.sum() <= 0:
            return FIXED
        # predicted positive from edge j on: bins j+1.. of `counts`
        tpr = np.cumsum(positives[::-1])[::-1][1:] / positives.sum()
        fpr = np.cumsum(negatives[::-1])[::-1][1:] / negatives.sum()
        best = int(np.argmax(tpr - fpr))
        return float(1.0 / (1.0 + math.exp(-self.edges[best])))


def sensitivity(silo: SiloInfo) -> float:
    """L2 change of a histogram when one unit of privacy changes: add/remove one record
    moves one count by 1; a patient's first max_records records (all the histogram
    counts of them, `Silo.capped`) move up to max_records counts, taken as
    √2·max_records (the replacement bound of as many records, which covers adding or
    removing them), and without a declared cap nothing bounds it: refused; replacing a
    person in up to S records changes up to 2S − 1 records (`events.replacement_rows`),
    each of which can leave one bin (of its class) for another: all out of the same bin
    into the same other, √2·(2S − 1) at worst."""
    if silo.neighbouring is Neighbouring.ADD_REMOVE:
        return float(silo.appearances)
    if silo.neighbouring is Neighbouring.ADD_REMOVE_PATIENT:
        if silo.max_records is None:
            raise ValueError(
                f"silo {silo.name!r}: a balanced threshold on a patient-level silo needs a "
                "declared cap on a patient's records (data.max_records)"
            )
        return math.sqrt(2.0) * silo.max_records
    return math.sqrt(2.0) * events.replacement_rows(silo.appearances)
