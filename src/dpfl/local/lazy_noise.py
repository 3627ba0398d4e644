"""DP-SGD noise of a sparse first layer's untouched rows, drawn once instead of each step.

With plain SGD (no momentum, no Adam, no weight decay), row j of a first `nn.Linear`'s
weight — the column W[:, j] of input feature j — gets at each step t the update
−η(Σ_i clip(δ_i x_ijᵀ) + N_t)/B, with N_t ~ N(0, σ²C²I). A batch whose records all have
x_ij = 0 adds nothing but the noise there, and its forward pass, losses and clip factors
do not read W[:, j]. So the noise of the steps between two batches that touch row j
(and after the last one) can be added at once, as one draw of variance
(steps)·(ησC/B)², just before the next touching batch's forward pass or at the end of
the local training: the released parameters have the same law, with at most
touches + 1 draws a row instead of one a step (docs/privacy.md, "Deferred noise").
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dpfl.local.noise import NoiseSource

__all__ = ["DeferredRows"]


class DeferredRows:
    """The pending noise of the rows of weight `name`, seen as `rows` (features × out, a
    view of the weight held column-major, updated in place), for records `x` (sparse COO,
    records × features), each step's of std `step_std` (ησC/B) in the parameters:
    `materialise` before each step's forward pass, `flush` after the last step."""

    def __init__(
        self, name: str, rows: Tensor, x: Tensor, source: NoiseSource, step_std: float
    ) -> None:
        self.name, self.rows, self.source, self.step_std = name, rows, source, step_std
        records, self._columns = x.detach().cpu().coalesce().indices().numpy()  # row-sorted
        counts = np.bincount(records, minlength=x.shape[0])
        self._starts = np.concatenate([[0], np.cumsum(counts)])  # each record's first entry
        self._drawn = np.zeros(rows.shape[0], np.int64)  # steps whose noise each row holds

    def touched(self, records: np.ndarray) -> np.ndarray:
        """The features stored (nonzero) in any of `records`, in increasing order."""
        starts, ends = self._starts[records], self._starts[records + 1]
        lengths = ends - starts
        firsts = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
        return np.unique(self._columns[firsts + np.arange(lengths.sum())])

    def materialise(self, records: np.ndarray, done: int) -> None:
        """Before the forward pass of the step after `done` steps: add to the rows that
        `records` touch the noise of the steps they have not got yet."""
        self._draw(self.touched(records), done)

    def flush(self, done: int) -> None:
        """After the last of `done` steps: every row gets the noise it has not got yet."""
        self._draw(np.arange(self.rows.shape[0]), done)

    def _draw(self, features: np.ndarray, done: int) -> None:
        pending = done - self._drawn[features]
        owed = pending > 0
        features, pending = features[owed], pending[owed]
        if not len(features):
            return
        noise = torch.empty(len(features), self.rows.shape[1], dtype=self.rows.dtype)
        self.source.normal_into(noise, 1.0)
        stds = torch.from_numpy(np.sqrt(pending) * self.step_std).to(noise.dtype)
        noise = noise.mul_(stds.unsqueeze(1)).to(self.rows.device)
        if len(features) == self.rows.shape[0]:  # all rows, in order
            self.rows.add_(noise)
        else:
            self.rows.index_add_(0, torch.from_numpy(features).to(self.rows.device), noise)
        self._drawn[features] = done
