"""Published gene signatures: choose genes without reading (or spending budget on) the data.

The lists in `gene_signatures/` date from about 2009; a dataset may name a gene by its
old symbol, a newer one, or a probe id. Matching tries, in order: the symbol, the
source's alternative symbols, a caller-supplied map of renamings (old -> new symbol; none
is built in, because none here is verified), and the probe ids. The report says how
many genes of the signature were found and through which route.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dpfl.data import preprocess
from dpfl.data.dataset import DataFormatError, Dataset, require_file

SIGNATURES = ("citbcmst", "gene76", "gene70", "pam50", "oncotypedx")


@dataclass(frozen=True)
class SignatureEntry:
    """One gene (gene-level list, `key` = symbol) or one probe (probe-level, `key` =
    probe id) of a signature."""

    key: str
    symbol: str
    alt_symbols: tuple[str, ...]
    probe_ids: tuple[str, ...]


@dataclass(frozen=True)
class Signature:
    name: str
    entries: tuple[SignatureEntry, ...]


@dataclass(frozen=True)
class SignatureMatch:
    """Which entries of a signature a dataset has, the column each maps to, and how."""

    signature: str
    columns: dict[str, str]
    via: dict[str, str]
    missing: tuple[str, ...]

    @property
    def n_found(self) -> int:
        return len(self.columns)

    def report(self) -> str:
        total = self.n_found + len(self.missing)
        routes: dict[str, int] = {}
        for route in self.via.values():
            routes[route] = routes.get(route, 0) + 1
        how = ", ".join(f"{n} by {r}" for r, n in sorted(routes.items()))
        return f"{self.signature}: {self.n_found} of {total} found ({how or 'none'})"


def load_signature(directory: Path | str, name: str, *, probe_level: bool = False) -> Signature:
    """Read `<name>.tsv` (one entry per gene) or `<name>_probes.tsv` (one per probe)."""
    if name not in SIGNATURES:
        raise ValueError(f"unknown signature {name!r}; known: {SIGNATURES}")
    path = require_file(Path(directory) / f"{name}{'_probes' if probe_level else ''}.tsv")
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t")
        if reader.fieldnames is None or "gene_symbol" not in reader.fieldnames:
            raise DataFormatError(path, "header must have a gene_symbol column", line=1)
        entries = []
        for line_no, row in enumerate(reader, start=2):
            if None in row or None in row.values():
                raise DataFormatError(path, "wrong number of columns", line=line_no)
            key = row.get("probe_id", "") if probe_level else row["gene_symbol"]
            if not key:
                raise DataFormatError(path, "entry without its identifier", line=line_no)
            # a probe of several genes lists them all (`A;B`): the first is its symbol
            symbols = _split(row["gene_symbol"])
            entries.append(
                SignatureEntry(
                    key=key,
                    symbol=symbols[0] if symbols else "",
                    alt_symbols=symbols[1:] + _split(row.get("alt_symbols", "")),
                    probe_ids=_split(row.get("probe_id", "")),
                )
            )
        keys = [e.key for e in entries]
        if len(set(keys)) != len(keys):
            raise DataFormatError(path, "repeated gene/probe identifiers")
    return Signature(name, tuple(entries))


def _split(cell: str) -> tuple[str, ...]:
    return tuple(part for part in cell.split(";") if part)


def match_signature(
    signature: Signature, feature_names: tuple[str, ...], renames: Mapping[str, str] | None = None
) -> SignatureMatch:
    """Map each signature entry to a dataset column, trying symbol, alternatives, renames,
    then probe ids."""
    available = set(feature_names)
    renames = renames or {}
    columns: dict[str, str] = {}
    via: dict[str, str] = {}
    missing = []
    for entry in signature.entries:
        routes = (
            ("symbol", (entry.symbol,)),
            ("alternative symbol", entry.alt_symbols),
            ("renaming", (renames.get(entry.symbol, ""),)),
            ("probe id", entry.probe_ids),
        )
        for route, candidates in routes:
            hit = next((c for c in candidates if c and c in available), None)
            if hit is not None:
                columns[entry.key] = hit
                via[entry.key] = route
                break
        else:
            missing.append(entry.key)
    return SignatureMatch(signature.name, columns, via, tuple(missing))


def select_signature(
    dataset: Dataset, signature: Signature, renames: Mapping[str, str] | None = None
) -> tuple[Dataset, SignatureMatch]:
    """Keep the columns of `signature` found in `dataset` (public selection, free)."""
    match = match_signature(signature, dataset.feature_names, renames)
    if not match.columns:
        raise ValueError(f"no gene of {signature.name} found in {dataset.name}")
    names = list(dict.fromkeys(match.columns.values()))
    return preprocess.select_features(dataset, names, match.report()), match
