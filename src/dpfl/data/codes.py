"""Text codes grouped by declared ranges: a diagnosis column's ICD-9-CM codes in their
chapters, say, declared in the study (`[data.columns.NAME.groups]`), never read off the
records.

A group lists its members, each an exact value as written in the file (`"?"`) or a
range `"low-high"` of codes: an optional capital letter (ICD-9's `V` and `E` codes) then
a number, both bounds with the same letter. A code is in a range when its letter is the
range's and its number lies between the bounds, where a bound written without decimals
covers its whole category: `"001-139"` holds `"139.8"`, `"250-250"` every `250.xx`, and
`"250.00-250.03"` only those four. The ranges of one column may not overlap, and no exact
value may repeat or fall in a range: each value is in one group or none. A value in no
group is the column's "other"; an empty cell is missing (every indicator 0), as for
declared categories (`dpfl.data.table`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

_CODE = re.compile(r"([A-Z]?)(\d+(?:\.\d+)?)")
"""A code: an optional capital letter, then digits with optional decimals."""

ICD9_CM_CHAPTERS: dict[str, list[str]] = {
    "infectious": ["001-139"],
    "neoplasms": ["140-239"],
    "endocrine": ["240-279"],
    "blood": ["280-289"],
    "mental": ["290-319"],
    "nervous": ["320-389"],
    "circulatory": ["390-459"],
    "respiratory": ["460-519"],
    "digestive": ["520-579"],
    "genitourinary": ["580-629"],
    "pregnancy": ["630-679"],
    "skin": ["680-709"],
    "musculoskeletal": ["710-739"],
    "congenital": ["740-759"],
    "perinatal": ["760-779"],
    "ill_defined": ["780-799"],
    "injury": ["800-999"],
    "supplementary": ["V01-V91"],
    "external": ["E000-E999"],
}
"""The 17 chapters of ICD-9-CM's tabular list and its two supplementary classifications
(V codes, factors influencing health status; E codes, external causes of injury), by
their published code ranges (CDC/NCHS, ICD-9-CM, 2011 release)."""


@dataclass(frozen=True)
class CodeRange:
    """`low-high` of codes with the letter `prefix`: numbers in [low, end)."""

    prefix: str
    low: float
    end: float
    text: str

    def holds(self, prefix: str, number: float) -> bool:
        return prefix == self.prefix and self.low <= number < self.end

    def meets(self, other: CodeRange) -> bool:
        return self.prefix == other.prefix and self.low < other.end and other.low < self.end


def parse_code(text: str) -> tuple[str, float] | None:
    """(letter, number) of a code as written (`"V57"` → ("V", 57.0), `"250.83"` →
    ("", 250.83)); None for a value that is no code (`"?"`)."""
    match = _CODE.fullmatch(text)
    return None if match is None else (match[1], float(match[2]))


def parse_range(text: str) -> CodeRange:
    """The range `"low-high"`; a clear ValueError for anything else."""
    bounds = text.split("-")
    parsed = [parse_code(b.strip()) for b in bounds]
    first, last = (parsed[0], parsed[-1]) if len(parsed) == 2 else (None, None)
    if first is None or last is None:
        raise ValueError(
            f"{text!r} is no code range: write 'low-high', two codes such as '001-139', "
            "'V01-V91' or '250.00-250.03' (a letter, then a number)"
        )
    (prefix, low), (high_prefix, high) = first, last
    if prefix != high_prefix:
        raise ValueError(f"code range {text!r}: both bounds need the same letter")
    if low > high:
        raise ValueError(f"code range {text!r}: low must not be above high")
    whole = "." not in bounds[1]  # a category: all its sub-codes
    end = high + 1 if whole else math.nextafter(high, math.inf)
    return CodeRange(prefix, low, end, text)


@dataclass(frozen=True)
class Grouping:
    """A column's declared groups, checked: each group's exact values and ranges."""

    names: tuple[str, ...]
    exact: dict[str, int]
    ranges: tuple[tuple[CodeRange, int], ...]

    def group_of(self, value: str) -> int:
        """The index of `value`'s group in `names`; -1 for none (the column's "other")."""
        if value in self.exact:
            return self.exact[value]
        code = parse_code(value)
        if code is None:
            return -1
        return next((k for r, k in self.ranges if r.holds(*code)), -1)

    def one_hot(self, cells: np.ndarray) -> np.ndarray:
        """(n, groups + 1) indicators: each cell's group, then "other"; all 0 for an
        empty cell (missing). Each distinct value is looked up once."""
        values, inverse = np.unique(np.asarray(cells, dtype=str), return_inverse=True)
        index = np.asarray([self.group_of(v) if v != "" else -2 for v in values], np.int64)
        index = index[inverse.reshape(-1)]
        block = np.zeros((len(index), len(self.names) + 1), np.float32)
        rows = np.flatnonzero(index != -2)
        block[rows, index[rows]] = 1.0  # -1: the last column, "other"
        return block


def grouping(groups: Mapping[str, Sequence[str]], reserved: str = "other") -> Grouping:
    """`groups` checked and compiled: a clear ValueError naming what is wrong (an empty
    group, a group named `reserved`, a malformed range, two ranges that overlap, an exact
    value repeated or inside a range)."""
    if not groups:
        raise ValueError("groups: declare at least one group")
    exact: dict[str, int] = {}
    ranges: list[tuple[CodeRange, int]] = []
    for k, (name, members) in enumerate(groups.items()):
        if name == reserved:
            raise ValueError(f"groups: {reserved!r} is the column's undeclared values: rename it")
        if not members:
            raise ValueError(f"groups.{name}: no members (list its codes or ranges)")
        for member in members:
            if "-" in member:
                ranges.append((parse_range(member), k))
            elif member in exact:
                raise ValueError(f"groups: {member!r} is listed twice")
            else:
                exact[member] = k
    names = tuple(groups)
    for i, (one, k) in enumerate(ranges):
        for other, j in ranges[i + 1 :]:
            if one.meets(other):
                raise ValueError(
                    f"groups: {one.text!r} ({names[k]}) and {other.text!r} ({names[j]}) "
                    "overlap: each code must be in one group"
                )
    for value, k in exact.items():
        code = parse_code(value)
        inside = [(r, j) for r, j in ranges if code is not None and r.holds(*code)]
        if inside:
            r, j = inside[0]
            raise ValueError(
                f"groups: {value!r} ({names[k]}) is also in {r.text!r} ({names[j]}): "
                "each code must be in one group"
            )
    return Grouping(names, exact, tuple(ranges))
