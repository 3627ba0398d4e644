"""Table 1 of a clinical paper under DP: per hospital and pooled, by a grouping column,
each categorical variable's counts and percentages, each continuous variable's mean ± sd
and median [IQR], every cell with the std of its noise, in one Gaussian release.

The vector has one block per hospital and one pooled block; a hospital fills its own
block and the pooled one, zeros elsewhere, so the pooled sum of the hospitals' noisy
vectors shows each hospital's cells (and only noisy ones) without a separate release.
Within a block, one cell per group (each declared value of the grouping column, then
"other" for any other value or none): the count, each categorical variable's counts per
declared category (+ other), and each continuous variable's clipped sums (`Mean`'s,
without its count) and histogram (`Quantiles`'). A record moves one cell of its own
block and of the pooled block, so Δ = √2 × √(1 + C + Σ(1.25 + 1)) over C categorical
and the continuous variables. Post-processing: the pooled cells are the inverse-variance
mean of the pooled block and the sum of the hospitals' blocks (noise variance K/(K + 1)
of the block's alone), and the group "all" of each site is the sum of its cells.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from dpfl.analytics.consistency import consistent
from dpfl.analytics.mechanisms import (
    Figure,
    Mean,
    Quantiles,
    Records,
    matches,
    shown,
)

QUARTILES = (0.25, 0.5, 0.75)


@dataclass(frozen=True)
class Continuous:
    """A continuous variable: its public range (values clipped to it) and the bins its
    median and quartiles are searched over."""

    column: str
    range: tuple[float, float]
    bins: tuple[float, ...]

    @property
    def mean(self) -> Mean:
        return Mean(self.column, self.range)

    @property
    def quartiles(self) -> Quantiles:
        return Quantiles(self.column, self.bins, QUARTILES)

    @property
    def width(self) -> int:
        return 2 + len(self.bins) - 1


@dataclass(frozen=True)
class TableOne:
    """Table 1 by `by`'s declared `groups` (`by` None: one group), with `categorical`
    text or number columns and their declared values, and `continuous` variables."""

    by: str | None
    groups: tuple[str | float, ...]
    categorical: tuple[tuple[str, tuple[str | float, ...]], ...]
    continuous: tuple[Continuous, ...]
    title: str = "Table 1"
    consistent: bool = False
    """Each cell's counts as non-negative integers, each categorical column's adding up
    to the cell's n, and "all" the sum of the groups (`dpfl.analytics.consistency`;
    `raw = false`); the hospitals' cells are not made to add up to the pooled one."""

    @property
    def sensitivity(self) -> float:
        per_cell = 1 + len(self.categorical) + len(self.continuous) * (1.25 + 1)
        return math.sqrt(2 * per_cell)

    @property
    def cell(self) -> int:
        """The length of one group's cell."""
        categories = sum(len(values) + 1 for _, values in self.categorical)
        return 1 + categories + sum(c.width for c in self.continuous)

    @property
    def cells(self) -> int:
        """Cells per block: each declared group and "other" (or one, ungrouped)."""
        return len(self.groups) + 1 if self.by is not None else 1

    def length(self, hospitals: int) -> int:
        return (hospitals + 1) * self.cells * self.cell

    def _cell(self, records: Records) -> np.ndarray:
        parts: list[np.ndarray] = [np.array([len(records)], dtype=np.float64)]
        for column, values in self.categorical:
            x = records.values(column)
            listed = [float(np.sum(matches(x, v))) for v in values]
            parts.append(np.array([*listed, len(x) - sum(listed)]))
        for variable in self.continuous:
            parts.append(variable.mean.vector(records, 0, 1)[1:])
            parts.append(variable.quartiles.vector(records, 0, 1))
        return np.concatenate(parts)

    def vector(self, records: Records, hospital: int, hospitals: int) -> np.ndarray:
        if self.by is None:
            block = self._cell(records)
        else:
            x = records.values(self.by)
            member = [matches(x, g) for g in self.groups]
            other = ~np.any(member, axis=0) if member else np.ones(len(x), bool)
            block = np.concatenate(
                [self._cell(records.take(np.flatnonzero(m))) for m in [*member, other]]
            )
        out = np.zeros((hospitals + 1, len(block)))
        out[hospital] = out[hospitals] = block
        return out.ravel()

    def figures(
        self, pooled: np.ndarray, std: float, names: Sequence[str], rng: np.random.Generator
    ) -> list[Figure]:
        blocks = pooled.reshape(len(names) + 1, self.cells, self.cell).copy()
        hospitals = len(names)
        # the pooled block and the sum of the hospitals' blocks estimate the same sums,
        # with noise variances std² and K·std²: their inverse-variance mean has K/(K + 1)
        blocks[-1] = (hospitals * blocks[-1] + blocks[:-1].sum(axis=0)) / (hospitals + 1)
        labels = [*map(shown, self.groups), "other"]
        figures: list[Figure] = []
        for k, (site, block) in enumerate(zip([*names, "pooled"], blocks, strict=True)):
            noise = std * math.sqrt(hospitals / (hospitals + 1) if k == hospitals else 1.0)
            if self.consistent:
                block = np.array([self._counted(cell) for cell in block])
            cells = [("all", block[0], noise)]
            if self.by is not None:  # "all": the sum of the groups' cells
                cells = [(g, c, noise) for g, c in zip(labels, block, strict=True)]
                cells.append(("all", block.sum(axis=0), noise * math.sqrt(len(block))))
            for group, cell, spread in cells:
                figures += self._cell_figures(cell, spread, (site, group), rng)
        return figures

    def _counted(self, cell: np.ndarray) -> np.ndarray:
        """A cell with its counts (n, then each categorical column's) made consistent."""
        starts = np.cumsum([1, *(len(values) + 1 for _, values in self.categorical)])
        groups = [range(a, b) for a, b in itertools.pairwise(starts)]
        counts = consistent(cell[: starts[-1]], 0, groups)
        return np.concatenate([counts, cell[starts[-1] :]])

    def _cell_figures(
        self, cell: np.ndarray, std: float, where: tuple[str, str], rng: np.random.Generator
    ) -> list[Figure]:
        n, raw = float(cell[0]), not self.consistent
        out = [Figure(self.title, "n", n, std, raw=raw, cell=where)]
        at = 1
        for column, values in self.categorical:
            for level, count in zip([*map(shown, values), "other"], cell[at:], strict=False):
                name = f"{column} = {level}"
                out.append(Figure(self.title, name, float(count), std, raw=raw, cell=where))
                share = 100 * float(count) / max(n, 1.0)
                share_std = 100 * std * math.sqrt(1 + (share / 100) ** 2) / max(n, 1.0)
                out.append(
                    Figure(
                        self.title,
                        f"{column} = {level} (%)",
                        share,
                        share_std,
                        raw=False,
                        cell=where,
                    )
                )
            at += len(values) + 1
        for variable in self.continuous:
            sums = np.r_[n, cell[at : at + 2]]
            histogram = cell[at + 2 : at + variable.width]
            at += variable.width
            out += [
                replace(
                    figure,
                    statistic=self.title,
                    name=f"{variable.column}: {figure.name}",
                    cell=where,
                )
                for figure in [
                    *variable.mean.figures(sums, std, [], rng)[1:],
                    *variable.quartiles.figures(histogram, std, [], rng),
                ]
            ]
        return out
