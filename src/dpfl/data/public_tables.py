"""Loaders of the tabular medical datasets (scikit-learn's breast cancer, UCI heart disease,
FLamby Fed-TCGA-BRCA, Diabetes 130-US hospitals).

Each reads a directory given by the caller, keeps declared-missing values as NaN (imputing
is a preprocessing choice), and says in `description` where the records come from and
which documented rule, if any, removed records.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dpfl.data.dataset import DataFormatError, Dataset, require_file, require_records

if TYPE_CHECKING:
    from dpfl.data.table import Column


def parse_float(text: str, path: Path, line: int, column: str, missing: str | None = None) -> float:
    """`text` as a float (NaN for the declared missing marker), or an error naming the cell."""
    if missing is not None and text == missing:
        return math.nan
    try:
        value = float(text)
    except ValueError:
        raise DataFormatError(
            path, f"cannot parse {text!r} as a number", line=line, column=column
        ) from None
    if not math.isfinite(value):
        raise DataFormatError(path, f"non-finite value {text!r}", line=line, column=column)
    return value


def breast_cancer_wisconsin() -> Dataset:
    """The default dataset that needs no files: scikit-learn's embedded WDBC table."""
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    return Dataset(
        name="breast_cancer_wisconsin",
        features=np.asarray(bunch.data, dtype=np.float32),
        labels=np.asarray(bunch.target, dtype=np.int64),
        feature_names=tuple(str(n) for n in bunch.feature_names),
        class_names=("malignant", "benign"),
        description=(
            "Wisconsin Diagnostic Breast Cancer (UCI), as embedded in scikit-learn: 569 "
            "fine-needle aspirates x 30 nuclear features; label 0 = malignant, 1 = benign."
        ),
    )


WDBC_RANGES: dict[str, tuple[float, float]] = {
    "mean radius": (6.9, 29),
    "mean texture": (9.7, 40),
    "mean perimeter": (43, 190),
    "mean area": (140, 2600),
    "mean smoothness": (0.052, 0.17),
    "mean compactness": (0.019, 0.35),
    "mean concavity": (0, 0.43),
    "mean concave points": (0, 0.21),
    "mean symmetry": (0.1, 0.31),
    "mean fractal dimension": (0.049, 0.098),
    "radius error": (0.11, 2.9),
    "texture error": (0.36, 4.9),
    "perimeter error": (0.75, 22),
    "area error": (6.8, 550),
    "smoothness error": (0.0017, 0.032),
    "compactness error": (0.0022, 0.14),
    "concavity error": (0, 0.4),
    "concave points error": (0, 0.053),
    "symmetry error": (0.0078, 0.079),
    "fractal dimension error": (0.00089, 0.03),
    "worst radius": (7.9, 37),
    "worst texture": (12, 50),
    "worst perimeter": (50, 260),
    "worst area": (180, 4300),
    "worst smoothness": (0.071, 0.23),
    "worst compactness": (0.027, 1.1),
    "worst concavity": (0, 1.3),
    "worst concave points": (0, 0.3),
    "worst symmetry": (0.15, 0.67),
    "worst fractal dimension": (0.055, 0.21),
}
"""Declared bounds of the 30 WDBC features, for `preprocess.scale_to_ranges`: the published
table's range of each feature rounded outward to two significant digits. A study declares
such constants in advance (here the whole table is public), so scaling reads no record."""


HEART_COLUMNS = (
    "age", "sex", "cp", "trestbps", "chol", "fbs", "restecg",
    "thalach", "exang", "oldpeak", "slope", "ca", "thal",
)  # fmt: skip
HEART_SITES = (
    ("processed.cleveland.data", "Cleveland"),
    ("processed.hungarian.data", "Hungary"),
    ("processed.switzerland.data", "Switzerland"),
    ("processed.va.data", "VA Long Beach"),
)
HEART_CATEGORIES: dict[str, tuple[float, ...]] = {
    "cp": (1, 2, 3, 4),
    "restecg": (0, 1, 2),
    "slope": (1, 2, 3),
    "thal": (3, 6, 7),
}
"""Category codes declared in heart-disease.names (public, so one-hot costs nothing)."""

HEART_RANGES: dict[str, tuple[float, float]] = {
    "age": (20, 90),
    "sex": (0, 1),
    "trestbps": (80, 200),
    "chol": (0, 600),
    "fbs": (0, 1),
    "thalach": (60, 220),
    "exang": (0, 1),
    "oldpeak": (-3, 7),
    "ca": (0, 3),
}
"""Public clinical bounds for scaling, chosen from physiology, not read from the data."""


def heart_disease(directory: Path | str) -> Dataset:
    """UCI heart disease: four real hospitals, the natural cross-silo split (FLamby).

    Target: presence of disease, `num > 0`; `num` itself is kept in `extra`. `?` -> NaN.
    """
    directory = Path(directory)
    rows: list[list[float]] = []
    sites: list[int] = []
    for site, (filename, hospital) in enumerate(HEART_SITES):
        path = require_file(directory / filename)
        lines = path.read_text(encoding="ascii").splitlines()
        require_records(path, len(lines), f"records of {hospital}")
        for line_no, line in enumerate(lines, start=1):
            cells = line.strip().split(",")
            if len(cells) != len(HEART_COLUMNS) + 1:
                raise DataFormatError(
                    path,
                    f"expected {len(HEART_COLUMNS) + 1} columns, got {len(cells)}",
                    line=line_no,
                )
            names = (*HEART_COLUMNS, "num")
            rows.append(
                [parse_float(c, path, line_no, n, "?") for c, n in zip(cells, names, strict=True)]
            )
            if math.isnan(rows[-1][-1]) or rows[-1][-1] not in (0, 1, 2, 3, 4):
                raise DataFormatError(
                    path, f"num must be 0..4, got {cells[-1]!r}", line=line_no, column="num"
                )
            sites.append(site)
    table = np.asarray(rows, dtype=np.float32)
    num = table[:, -1].astype(np.int64)
    return Dataset(
        name="heart_disease",
        features=table[:, :-1],
        labels=(num > 0).astype(np.int64),
        feature_names=HEART_COLUMNS,
        class_names=("no disease", "disease"),
        site_ids=np.asarray(sites, dtype=np.int64),
        site_names=tuple(name for _, name in HEART_SITES),
        extra={"num": num},
        description=(
            "UCI Heart Disease (id 45), processed 14-attribute files of four hospitals "
            "(Cleveland, Hungary, Switzerland, VA Long Beach); label = num > 0; '?' -> NaN. "
            "Note: Switzerland records chol = 0 where cholesterol was not measured."
        ),
    )


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    with require_file(path).open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise DataFormatError(path, "empty file") from None
        rows = list(reader)
    require_records(path, len(rows), "rows after the header")
    for line_no, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise DataFormatError(
                path, f"expected {len(header)} columns, got {len(row)}", line=line_no
            )
    return header, rows


TCGA_CENTRES = ("Northeast", "South", "West", "Midwest", "Europe", "Canada")
"""FLamby's centre order (centre k of `fold2` = `train_k`/`test_k`)."""


def tcga_brca_clinical(directory: Path | str) -> Dataset:
    """FLamby Fed-TCGA-BRCA: 39 clinical features, 6 regional centres, FLamby's split.

    The task is survival (E, T in `extra`). `labels` is the derived binary task
    "death observed during follow-up" (E = 1); a censored patient (E = 0) is not known
    to survive, so this label conflates short follow-up with survival — use E/T for
    survival models. Centres and split come from FLamby's `train_test_split.csv` and are
    checked against the TSS code -> region table `centers.csv`; patients of region
    "Other" (8) have no fold and are dropped, as FLamby does (reported in description).
    """
    directory = Path(directory)
    brca_path = directory / "brca.csv"
    header, rows = _read_csv(brca_path)
    if header[0] != "pid" or header[-2:] != ["E", "T"] or len(header) != 42:
        raise DataFormatError(
            brca_path, f"header must be pid, 39 features, E, T; got {len(header)} columns", line=1
        )
    split_path = directory / "train_test_split.csv"
    split_header, split_rows = _read_csv(split_path)
    if split_header != ["pid", "fold", "fold2"]:
        raise DataFormatError(split_path, "header must be pid,fold,fold2", line=1)
    assignment: dict[str, tuple[str, int]] = {}
    for line_no, (pid, fold, fold2) in enumerate(split_rows, start=2):
        prefix, _, centre = fold2.partition("_")
        if fold not in ("train", "test") or prefix != fold or not centre.isdigit():
            raise DataFormatError(split_path, f"bad fold {fold!r}/{fold2!r}", line=line_no)
        if int(centre) >= len(TCGA_CENTRES):
            raise DataFormatError(
                split_path, f"centre {centre} out of range", line=line_no, column="fold2"
            )
        assignment[pid] = (fold, int(centre))
    centres_path = directory / "centers.csv"
    centres_header, centres_rows = _read_csv(centres_path)
    if centres_header[0] != "TSS Code" or centres_header[-1] != "Region":
        raise DataFormatError(centres_path, "header must start 'TSS Code' and end 'Region'", line=1)
    region = {row[0]: row[-1] for row in centres_rows}
    features: list[list[float]] = []
    events: list[int] = []
    times: list[float] = []
    sites: list[int] = []
    splits: list[str] = []
    for line_no, row in enumerate(rows, start=2):
        tss = row[0][5:7]
        if tss not in region:
            raise DataFormatError(centres_path, f"no TSS code {tss!r} (patient {row[0]})")
        if row[0] not in assignment:
            if region[tss] != "Other":
                raise DataFormatError(
                    split_path, f"patient {row[0]} of region {region[tss]} has no fold"
                )
            continue
        split_name, site = assignment.pop(row[0])
        if TCGA_CENTRES[site] != region[tss]:
            raise DataFormatError(
                split_path,
                f"patient {row[0]}: fold centre {TCGA_CENTRES[site]} but TSS "
                f"{tss} is in region {region[tss]}",
            )
        features.append(
            [
                parse_float(c, brca_path, line_no, n)
                for c, n in zip(row[1:-2], header[1:-2], strict=True)
            ]
        )
        event = parse_float(row[-2], brca_path, line_no, "E")
        if event not in (0, 1):
            raise DataFormatError(
                brca_path, f"E must be 0 or 1, got {row[-2]!r}", line=line_no, column="E"
            )
        events.append(int(event))
        times.append(parse_float(row[-1], brca_path, line_no, "T"))
        sites.append(site)
        splits.append(split_name)
    if assignment:
        raise DataFormatError(
            split_path, f"{len(assignment)} patients not in brca.csv, e.g. {next(iter(assignment))}"
        )
    dropped = len(rows) - len(features)
    return Dataset(
        name="tcga_brca_clinical",
        features=np.asarray(features, dtype=np.float32),
        labels=np.asarray(events, dtype=np.int64),
        feature_names=tuple(header[1:-2]),
        class_names=("censored", "death observed"),
        site_ids=np.asarray(sites, dtype=np.int64),
        site_names=TCGA_CENTRES,
        split=np.asarray(splits),
        extra={"E": np.asarray(events, dtype=np.int64), "T": np.asarray(times, dtype=np.float32)},
        description=(
            "FLamby Fed-TCGA-BRCA (TCGA-BRCA clinical data, Liu et al. 2018): survival E/T "
            f"with 6 regional centres and FLamby's train/test split; {dropped} patients of "
            "region 'Other' dropped as in FLamby. Binary label derived as E (death observed "
            "during follow-up, 1) vs censored (0): not a survival status."
        ),
    )


DIABETES_NUMERIC = (
    "time_in_hospital", "num_lab_procedures", "num_procedures", "num_medications",
    "number_outpatient", "number_emergency", "number_inpatient", "number_diagnoses",
)  # fmt: skip
DIABETES_DRUGS = (
    "metformin", "repaglinide", "nateglinide", "chlorpropamide", "glimepiride",
    "acetohexamide", "glipizide", "glyburide", "tolbutamide", "pioglitazone",
    "rosiglitazone", "acarbose", "miglitol", "troglitazone", "tolazamide", "examide",
    "citoglipton", "insulin", "glyburide-metformin", "glipizide-metformin",
    "glimepiride-pioglitazone", "metformin-rosiglitazone", "metformin-pioglitazone",
)  # fmt: skip
DIABETES_CATEGORIES: dict[str, tuple[str, ...]] = {
    "race": ("Caucasian", "AfricanAmerican", "Hispanic", "Asian", "Other"),
    "gender": ("Female", "Male"),
    "admission_type_id": tuple(str(i) for i in range(1, 9)),
    "max_glu_serum": ("Norm", ">200", ">300"),
    "A1Cresult": ("Norm", ">7", ">8"),
    "change": ("Ch",),
    "diabetesMed": ("Yes",),
    **{drug: ("Steady", "Up", "Down") for drug in DIABETES_DRUGS},
}
"""Declared categories from the UCI data dictionary; any other value (`?`, "None", "No",
"Unknown/Invalid") encodes as all-zero, i.e. missing or absent."""
DIABETES_RANGES: dict[str, tuple[float, float]] = {
    "age": (0, 100),
    "time_in_hospital": (1, 14),
    "num_lab_procedures": (0, 150),
    "num_procedures": (0, 10),
    "num_medications": (0, 100),
    "number_outpatient": (0, 50),
    "number_emergency": (0, 50),
    "number_inpatient": (0, 25),
    "number_diagnoses": (0, 20),
}
"""Declared public ranges of the numeric columns (scaled and clipped to them): age in
decades, the UCI dictionary's 1-14 days in hospital, and counts capped at plausible
clinical bounds chosen without reading the records."""
DIABETES_ADMISSION_GROUPS = {
    "emergency": ("7",),
    "referral": ("1", "2", "3"),
    "transfer": ("4", "5", "6", "10", "18", "19", "22", "25", "26"),
}
"""`admission_source_group`: IDs_mapping.csv's admission sources in 4 declared groups
(every other code, births, court and the unknown ones, is "other")."""
DIABETES_PROXY_SITES = (
    "admission_source_id",
    "payer_code",
    "medical_specialty",
    "admission_source_group",
)
DIABETES_MEMBER = "dataset_diabetes/diabetic_data.csv"


def diabetes130(
    directory: Path | str,
    *,
    one_encounter_per_patient: bool = True,
    proxy_site_column: str | None = None,
    max_records: int | None = None,
    patient_unit: bool = False,
    patients_fraction: float = 1.0,
    patients_from: float = 0.0,
    columns: Mapping[str, Column] | None = None,
) -> Dataset:
    """Diabetes 130-US hospitals: 30-day readmission (`readmitted == "<30"`).

    Age is the midpoint of its decade and the counts are scaled by `DIABETES_RANGES` (by
    the caller). The text columns are `DIABETES_CATEGORIES` (one-hot over declared
    categories, any other value all zero; ICD-9 diagnosis codes not encoded) or, where
    `columns` declares them, those columns as a table's are read (`dpfl.data.table`):
    declared categories or groups of codes (an ICD-9 chapter, `dpfl.data.codes`), one-hot
    with an "other" indicator, in place of the built-in ones. By default only the first encounter
    of each patient (file order) is kept, so that one record is one patient — the unit
    of the privacy guarantee; the count removed is in `description`. The data have no
    hospital id: `proxy_site_column` makes a PROXY site split by that column, and any
    other site split of this dataset is synthetic.

    `max_records` (with `one_encounter_per_patient=False`): a declared cap, each
    patient's first `max_records` encounters in file order kept and the rest dropped (a
    rule reading no other patient), every record of a patient at the proxy site of their
    first; `patient_unit`: the patient is the unit of privacy (`Dataset.units`).
    `patients_fraction`: keep a patient where a hash of their patient_nbr falls below it
    (a public rule reading no record), to subsample patients reproducibly;
    `patients_from`: and at or above it, so that [from, fraction) is a share of patients
    disjoint from [0, from) (settings chosen on other patients than a run's).
    """
    if proxy_site_column is not None and proxy_site_column not in DIABETES_PROXY_SITES:
        raise ValueError(f"proxy_site_column must be one of {DIABETES_PROXY_SITES}")
    if (max_records is not None or patient_unit) and one_encounter_per_patient:
        raise ValueError("max_records and patient_unit need one_encounter_per_patient=False")
    if patient_unit and max_records is None:
        raise ValueError("patient_unit needs a declared max_records")
    if not 0 <= patients_from < patients_fraction <= 1:
        raise ValueError(
            f"0 ≤ patients_from < patients_fraction ≤ 1, got {patients_from}, {patients_fraction}"
        )
    _check_declared(columns)
    path = require_file(Path(directory) / "dataset_diabetes.zip")
    where = Path(f"{path}:{DIABETES_MEMBER}")
    column, n_raw = _diabetes_columns(path, where, proxy_site_column, columns)
    lines = np.arange(2, n_raw + 2)
    keep = np.arange(n_raw)
    if patients_fraction < 1 or patients_from > 0:
        hashed = _hashed(column["patient_nbr"])
        keep = keep[(patients_from <= hashed) & (hashed < patients_fraction)]
    if one_encounter_per_patient or max_records is not None:
        cap = 1 if one_encounter_per_patient else max_records
        keep = keep[_encounter_index(column["patient_nbr"][keep]) < cap]
    column = {name: values[keep] for name, values in column.items()}
    lines = lines[keep]
    patients, first, units = np.unique(
        column["patient_nbr"], return_index=True, return_inverse=True
    )
    if max_records is not None and proxy_site_column is not None:
        column[proxy_site_column] = column[proxy_site_column][first][units]
    readmitted = column["readmitted"]
    _check_values(readmitted, ("NO", ">30", "<30"), where, "readmitted", lines)
    features, names = _diabetes_features(column, where, lines, columns)
    site_ids, site_names, site_note = _diabetes_sites(column, proxy_site_column)
    removed = n_raw - len(readmitted)
    unit = (
        f"{removed} repeat encounters of a patient removed (first in file order kept)"
        if one_encounter_per_patient
        else "all encounters kept: a patient may be several records"
        if max_records is None
        else f"{len(patients)} patients' first {max_records} encounters in file order kept "
        f"({removed} removed), each patient at their first encounter's site"
    )
    if patients_fraction < 1 or patients_from > 0:
        unit += f"; patients subsampled by a hash of patient_nbr < {patients_fraction:g}"
        unit += f", ≥ {patients_from:g}" if patients_from > 0 else ""
    return Dataset(
        name="diabetes130",
        features=features,
        labels=(readmitted == "<30").astype(np.int64),
        feature_names=names,
        class_names=("not readmitted <30d", "readmitted <30d"),
        site_ids=site_ids,
        site_names=site_names,
        description=(
            f"Diabetes 130-US hospitals 1999-2008 (UCI 296): {n_raw} encounters; {unit}; "
            f"label readmitted '<30'; age = decade midpoint. {site_note}"
        ),
        units=units.astype(np.int64) if patient_unit else None,
        max_records=max_records if patient_unit else None,
    )


def _check_declared(columns: Mapping[str, Column] | None) -> None:
    """Declared columns are text ones (categories or groups), none of them the label,
    the patient, age or a count (which keep their declared ranges)."""
    fixed = ("patient_nbr", "readmitted", "age", *DIABETES_NUMERIC)
    for name, declared in (columns or {}).items():
        if name in fixed:
            raise ValueError(f"columns: {name!r} is read as declared by diabetes130 itself")
        if declared.range is not None:
            raise ValueError(
                f"columns.{name}: declare `categories` or `groups`; the counts keep DIABETES_RANGES"
            )


def _diabetes_columns(
    path: Path,
    where: Path,
    proxy_site_column: str | None,
    columns: Mapping[str, Column] | None = None,
) -> tuple[dict[str, np.ndarray], int]:
    """The columns diabetes130 reads (and the proxy site's), by name, checked for shape;
    and the number of encounters in the file."""
    try:
        with zipfile.ZipFile(path) as archive, archive.open(DIABETES_MEMBER) as raw:
            reader = csv.reader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
            header = next(reader, [])
            rows = list(reader)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise DataFormatError(path, f"cannot read {DIABETES_MEMBER}: {exc}") from exc
    require_records(where, len(rows), "encounters")
    text = columns or DIABETES_CATEGORIES
    needed = ("patient_nbr", "age", "readmitted", *DIABETES_NUMERIC, *text)
    absent = [c for c in needed if c not in header]
    if absent:
        raise DataFormatError(where, f"missing columns {absent}", line=1)
    for line_no, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise DataFormatError(
                where, f"expected {len(header)} columns, got {len(row)}", line=line_no
            )
    column = {
        name: np.asarray(values)
        for name, values in zip(header, zip(*rows, strict=True), strict=True)
        if name in needed or name == _source_column(proxy_site_column)
    }
    if proxy_site_column == "admission_source_group":
        column[proxy_site_column] = _admission_group(column["admission_source_id"])
    return column, len(rows)


def _diabetes_features(
    column: dict[str, np.ndarray],
    where: Path,
    lines: np.ndarray,
    columns: Mapping[str, Column] | None = None,
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Age (its decade's midpoint), the numeric columns and the declared categories'
    one-hot columns (`columns`' where given), every cell checked, and their names."""
    ages = column["age"]
    _check_values(ages, tuple(f"[{10 * i}-{10 * i + 10})" for i in range(10)), where, "age", lines)
    blocks = [np.char.partition(np.char.lstrip(ages, "["), "-")[:, 0].astype(np.float32) + 5]
    for name in DIABETES_NUMERIC:
        blocks.append(_parse_column(column[name], where, name, lines))
    names = ["age", *DIABETES_NUMERIC]
    if columns:
        from dpfl.data import table

        declared = [
            table.declared_feature(column[name], name, spec, where)
            for name, spec in columns.items()
        ]
        names += [n for _, block_names in declared for n in block_names]
        return np.column_stack([*blocks, *(b for b, _ in declared)]), tuple(names)
    for name, categories in DIABETES_CATEGORIES.items():
        blocks += [(column[name] == v).astype(np.float32) for v in categories]
    names += [f"{c}={v}" for c, values in DIABETES_CATEGORIES.items() for v in values]
    return np.stack(blocks, axis=1), tuple(names)


def _diabetes_sites(
    column: dict[str, np.ndarray], proxy_site_column: str | None
) -> tuple[np.ndarray | None, tuple[str, ...], str]:
    """The proxy site of every record, the sites' names and what the split is (the data
    have no hospital id)."""
    if proxy_site_column is None:
        return None, (), "No hospital id: any site split of these records is synthetic."
    values, inverse = np.unique(column[proxy_site_column], return_inverse=True)
    names = tuple(f"{proxy_site_column}={v}" for v in values)
    note = (
        f"PROXY site split by {proxy_site_column} ({len(names)} groups): not real "
        "hospitals (the data have no hospital id)."
    )
    return inverse.astype(np.int64), names, note


def _source_column(proxy_site_column: str | None) -> str | None:
    """The file's column a proxy site split reads."""
    if proxy_site_column == "admission_source_group":
        return "admission_source_id"
    return proxy_site_column


def _admission_group(codes: np.ndarray) -> np.ndarray:
    """Each admission source code's declared group (`DIABETES_ADMISSION_GROUPS`)."""
    group = np.full(codes.shape, "other", dtype=object)
    for name, members in DIABETES_ADMISSION_GROUPS.items():
        group[np.isin(codes, members)] = name
    return group.astype(str)


def _hashed(patients: np.ndarray) -> np.ndarray:
    """A uniform number in [0, 1) for each patient_nbr, from its text alone (BLAKE2b)."""
    return np.asarray(
        [
            int.from_bytes(hashlib.blake2b(p.encode(), digest_size=8).digest(), "big") / 2**64
            for p in patients
        ]
    )


def _encounter_index(patients: np.ndarray) -> np.ndarray:
    """Each record's rank among its patient's records, in file order (0 for the first)."""
    order = np.argsort(patients, kind="stable")
    ranks = np.empty(len(patients), dtype=np.int64)
    sorted_ids = patients[order]
    starts = np.r_[0, np.flatnonzero(sorted_ids[1:] != sorted_ids[:-1]) + 1]
    ranks[order] = np.arange(len(patients)) - np.repeat(
        starts, np.diff(np.r_[starts, len(patients)])
    )
    return ranks


def _check_values(
    values: np.ndarray, allowed: Sequence[str], path: Path, name: str, lines: np.ndarray
) -> None:
    bad = np.flatnonzero(~np.isin(values, allowed))
    if bad.size:
        raise DataFormatError(
            path, f"unexpected value {values[bad[0]]!r}", line=int(lines[bad[0]]), column=name
        )


def _parse_column(values: np.ndarray, path: Path, name: str, lines: np.ndarray) -> np.ndarray:
    """A column of numbers, or an error naming its first bad cell: numpy reads "nan" and
    "inf" as numbers, `parse_float` refuses them."""
    try:
        parsed = values.astype(np.float32)
    except ValueError:
        cells = zip(values, lines, strict=True)
        parsed = np.asarray([parse_float(str(t), path, int(n), name) for t, n in cells])
    for at in np.flatnonzero(~np.isfinite(parsed)):
        parse_float(str(values[at]), path, int(lines[at]), name)
    return parsed
