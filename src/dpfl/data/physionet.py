"""PhysioNet/CinC Challenge 2012: in-hospital mortality of ICU stays (sets a and b).

The real counterpart of Kerkouche's task. Each stay's first 48 h of measurements become
fixed-length features: per time-series variable its first, last, min, max, mean and
count; plus the descriptors age, gender, height and weight at admission. A variable never
measured gives NaN statistics and count 0; a descriptor of -1 (the declared missing
marker) gives NaN. Sites: the natural 4-way split by ICUType.

Parsing 8,000 files (3.5 M rows) takes seconds, so the features can be cached in a
directory of the caller's choice, keyed by the sha256 of the input files.
"""

from __future__ import annotations

import hashlib
import io
import math
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpfl.data.dataset import DataFormatError, Dataset, require_file, require_records
from dpfl.data.public_tables import parse_float

DESCRIPTORS = ("RecordID", "Age", "Gender", "Height", "ICUType", "Weight")
TIME_SERIES = (
    "Albumin", "ALP", "ALT", "AST", "Bilirubin", "BUN", "Cholesterol", "Creatinine",
    "DiasABP", "FiO2", "GCS", "Glucose", "HCO3", "HCT", "HR", "K", "Lactate", "Mg", "MAP",
    "MechVent", "Na", "NIDiasABP", "NIMAP", "NISysABP", "PaCO2", "PaO2", "pH", "Platelets",
    "RespRate", "SaO2", "SysABP", "Temp", "TroponinI", "TroponinT", "Urine", "WBC", "Weight",
)  # fmt: skip
STATISTICS = ("first", "last", "min", "max", "mean", "count")
FEATURE_NAMES = (
    "Age",
    "Gender",
    "Height",
    "Weight",
    *(f"{v}_{s}" for v in TIME_SERIES for s in STATISTICS),
)
VARIABLE_RANGES: dict[str, tuple[float, float]] = {
    "Age": (15, 90), "Gender": (0, 1), "Height": (120, 220), "Albumin": (1, 6),
    "ALP": (10, 2000), "ALT": (1, 5000), "AST": (1, 5000), "Bilirubin": (0, 50),
    "BUN": (0, 200), "Cholesterol": (50, 400), "Creatinine": (0, 20), "DiasABP": (0, 200),
    "FiO2": (0.21, 1), "GCS": (3, 15), "Glucose": (10, 1000), "HCO3": (0, 60),
    "HCT": (10, 70), "HR": (0, 250), "K": (1, 10), "Lactate": (0, 30), "Mg": (0, 10),
    "MAP": (0, 250), "MechVent": (0, 1), "Na": (100, 180), "NIDiasABP": (0, 200),
    "NIMAP": (0, 250), "NISysABP": (0, 300), "PaCO2": (0, 150), "PaO2": (0, 600),
    "pH": (6.5, 8), "Platelets": (0, 1500), "RespRate": (0, 80), "SaO2": (0, 100),
    "SysABP": (0, 300), "Temp": (25, 45), "TroponinI": (0, 50), "TroponinT": (0, 30),
    "Urine": (0, 3000), "WBC": (0, 200), "Weight": (30, 250),
}  # fmt: skip
"""Declared physiological bounds (units as in the challenge), chosen without the data."""
COUNT_RANGE = (0.0, 150.0)
"""Declared cap on measurements of one variable in 48 h (about one every 20 minutes)."""


def public_ranges() -> dict[str, tuple[float, float]]:
    """Bounds for every feature, for `preprocess.scale_to_ranges` or `dp_preprocess`: each
    variable's statistics share its bounds, counts share `COUNT_RANGE`. Values outside
    (the data hold some, e.g. pH 94, Temp -17.8) are clipped by those functions."""
    ranges = {name: VARIABLE_RANGES[name] for name in FEATURE_NAMES[:4]}
    for variable in TIME_SERIES:
        for statistic in STATISTICS:
            bounds = COUNT_RANGE if statistic == "count" else VARIABLE_RANGES[variable]
            ranges[f"{variable}_{statistic}"] = bounds
    return ranges


ICU_TYPES = ("Coronary Care", "Cardiac Surgery Recovery", "Medical ICU", "Surgical ICU")
CACHE_VERSION = "1"
_SLOT = {name: i for i, name in enumerate(TIME_SERIES)}


def _parse_stay(text: str, where: str) -> tuple[int, int, list[float]]:
    """(RecordID, ICUType, features) of one stay file."""
    lines = text.splitlines()
    if not lines or lines[0] != "Time,Parameter,Value":
        raise DataFormatError(where, "header must be 'Time,Parameter,Value'", line=1)
    descriptors: dict[str, float] = {}
    first: list[float] = [math.nan] * len(TIME_SERIES)
    last = first.copy()
    low = first.copy()
    high = first.copy()
    total = [0.0] * len(TIME_SERIES)
    count = [0] * len(TIME_SERIES)
    for line_no, line in enumerate(lines[1:], start=2):
        cells = line.split(",")
        if len(cells) != 3:
            raise DataFormatError(where, f"expected 3 columns, got {len(cells)}", line=line_no)
        try:  # the fast path; parse_float names the cell when it is bad
            value = float(cells[2])
        except ValueError:
            value = parse_float(cells[2], Path(where), line_no, "Value")
        if not math.isfinite(value):
            parse_float(cells[2], Path(where), line_no, "Value")
        name = cells[1]
        if name in DESCRIPTORS and name not in descriptors:
            if cells[0] != "00:00":
                raise DataFormatError(where, f"descriptor {name} not at 00:00", line=line_no)
            descriptors[name] = value
            continue
        slot = _SLOT.get(name)
        if slot is None:
            raise DataFormatError(where, f"unknown or repeated parameter {name!r}", line=line_no)
        if count[slot] == 0:
            first[slot] = low[slot] = high[slot] = value
        else:
            low[slot] = min(low[slot], value)
            high[slot] = max(high[slot], value)
        last[slot] = value
        total[slot] += value
        count[slot] += 1
    absent = [n for n in DESCRIPTORS if n not in descriptors]
    if absent:
        raise DataFormatError(where, f"missing descriptor(s) {absent}")
    features = [descriptors[n] if descriptors[n] != -1 else math.nan for n in DESCRIPTORS[1:4]]
    features.append(descriptors["Weight"] if descriptors["Weight"] != -1 else math.nan)
    for slot in range(len(TIME_SERIES)):
        mean = total[slot] / count[slot] if count[slot] else math.nan
        features += [first[slot], last[slot], low[slot], high[slot], mean, float(count[slot])]
    icu_type = descriptors["ICUType"]
    if icu_type not in (1, 2, 3, 4):
        raise DataFormatError(where, f"ICUType must be 1..4, got {icu_type:g}", line=6)
    return int(descriptors["RecordID"]), int(icu_type), features


def _parse_outcomes(path: Path) -> dict[int, int]:
    lines = require_file(path).read_text(encoding="ascii").splitlines()
    require_records(path, len(lines[1:]), "outcomes")
    header = lines[0].split(",")
    if "RecordID" not in header or "In-hospital_death" not in header:
        raise DataFormatError(path, "header must name RecordID and In-hospital_death", line=1)
    id_col, label_col = header.index("RecordID"), header.index("In-hospital_death")
    outcomes = {}
    for line_no, line in enumerate(lines[1:], start=2):
        cells = line.split(",")
        if len(cells) != len(header):
            raise DataFormatError(path, f"expected {len(header)} columns", line=line_no)
        label = cells[label_col]
        if label not in ("0", "1"):
            raise DataFormatError(
                path,
                f"label must be 0 or 1, got {label!r}",
                line=line_no,
                column="In-hospital_death",
            )
        outcomes[int(parse_float(cells[id_col], path, line_no, "RecordID"))] = int(label)
    return outcomes


def _parse_set(directory: Path, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Features, labels, ICU types and record ids of `set-<name>`, in RecordID order."""
    outcomes_path = directory / f"Outcomes-{name}.txt"
    outcomes = _parse_outcomes(outcomes_path)
    archive_path = require_file(directory / f"set-{name}.tar.gz")
    stays: dict[int, tuple[int, list[float]]] = {}
    try:
        with tarfile.open(archive_path, "r:gz") as archive:
            for member in archive:
                if not member.isfile() or not member.name.endswith(".txt"):
                    continue
                where = f"{archive_path}:{member.name}"
                handle = archive.extractfile(member)
                if handle is None:
                    raise DataFormatError(where, "cannot read archive member")
                text = io.TextIOWrapper(handle, encoding="ascii").read()
                record_id, icu_type, features = _parse_stay(text, where)
                if record_id in stays:
                    raise DataFormatError(where, f"RecordID {record_id} appears twice")
                stays[record_id] = (icu_type, features)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DataFormatError(archive_path, f"unreadable archive: {exc}") from exc
    require_records(archive_path, len(stays), "stay files (*.txt)")
    if set(stays) != set(outcomes):
        unmatched = sorted(set(stays) ^ set(outcomes))
        raise DataFormatError(
            outcomes_path,
            f"{len(unmatched)} RecordIDs do not match set-{name} files, e.g. {unmatched[0]}",
        )
    ids = np.asarray(sorted(stays), dtype=np.int64)
    return (
        np.asarray([stays[i][1] for i in ids], dtype=np.float32),
        np.asarray([outcomes[i] for i in ids], dtype=np.int64),
        np.asarray([stays[i][0] - 1 for i in ids], dtype=np.int64),
        ids,
    )


def _cache_key(directory: Path, sets: Sequence[str]) -> str:
    digest = hashlib.sha256(CACHE_VERSION.encode())
    for name in sets:
        for filename in (f"set-{name}.tar.gz", f"Outcomes-{name}.txt"):
            digest.update(require_file(directory / filename).read_bytes())
    return digest.hexdigest()[:16]


def physionet2012(
    directory: Path | str, *, sets: Sequence[str] = ("a", "b"), cache_dir: Path | str | None = None
) -> Dataset:
    """Load the challenge sets (`split` holds "set-a"/"set-b"); label In-hospital_death.

    With `cache_dir`, parsed features are stored there as `.npz` and reused while the
    input files are byte-identical.
    """
    directory = Path(directory)
    if not sets or any(s not in ("a", "b") for s in sets) or len(set(sets)) != len(sets):
        raise ValueError(f"sets must be distinct names among 'a', 'b', got {sets!r}")
    cache = None
    if cache_dir is not None:
        cache = Path(cache_dir) / f"physionet2012-{''.join(sets)}-{_cache_key(directory, sets)}.npz"
    if cache is not None and cache.is_file():
        with np.load(cache) as stored:
            parts = [tuple(stored[f"{k}_{s}"] for k in ("x", "y", "site", "id")) for s in sets]
    else:
        parts = [_parse_set(directory, s) for s in sets]
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            arrays = {
                f"{key}_{s}": array
                for s, part in zip(sets, parts, strict=True)
                for key, array in zip(("x", "y", "site", "id"), part, strict=True)
            }
            partial = cache.with_name(cache.name + ".partial.npz")
            np.savez(partial, **arrays)
            partial.replace(cache)  # atomic: a reader never sees half a cache
    return Dataset(
        name="physionet2012",
        features=np.concatenate([p[0] for p in parts]),
        labels=np.concatenate([p[1] for p in parts]),
        feature_names=FEATURE_NAMES,
        class_names=("survived", "in-hospital death"),
        site_ids=np.concatenate([p[2] for p in parts]),
        site_names=ICU_TYPES,
        split=np.concatenate(
            [np.full(len(p[1]), f"set-{s}") for s, p in zip(sets, parts, strict=True)]
        ),
        extra={"record_id": np.concatenate([p[3] for p in parts])},
        description=(
            f"PhysioNet/CinC Challenge 2012 (MIMIC-II), set(s) {', '.join(sets)}: per-stay "
            "features of the first 48 h (first/last/min/max/mean/count of 37 variables; "
            "age, gender, height, weight; -1 and unmeasured -> NaN, count 0); label "
            "In-hospital_death; sites = ICUType."
        ),
    )
