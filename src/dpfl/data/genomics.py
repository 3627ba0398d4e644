"""Gene-expression datasets: GSE7390 (real, 76 probesets) and the BC-TCGA file format.

BC-TCGA (the Owkin and A*STAR seeds' data) is not available here; `bc_tcga` reads the
format they used so that a user who has the files runs the seeds' exact experiments,
and `write_bc_tcga` writes it (for tests and for the synthetic stand-in).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.io import arff

from dpfl.data.dataset import DataFormatError, Dataset, require_file, require_records
from dpfl.data.public_tables import parse_float

GSE7390_FILE = "breast_cancer_GSE7390-metastasis.arff"
GRADES = ("well differentiated", "intermediate", "poorly differentiated")


def gse7390(directory: Path | str) -> Dataset:
    """GSE7390 (TRANSBIG): 198 node-negative patients, label = distant metastasis observed.

    Features: age, size, grade (1-3, `unkown` -> NaN), er (1 = positive) and 76
    expression values named by probe id (the ARFF's `X` prefix removed). Time to distant
    metastasis (`t.tdm`, days) is in `extra`: the label is a censored event, not a
    fixed-horizon outcome.
    """
    path = require_file(Path(directory) / GSE7390_FILE)
    try:
        records, meta = arff.loadarff(path)
    except StopIteration:  # scipy's answer to an empty file
        raise DataFormatError(path, "not a readable ARFF file: empty file") from None
    except (ValueError, arff.ArffError) as exc:
        raise DataFormatError(path, f"not a readable ARFF file: {exc}") from exc
    require_records(path, len(records))
    names = list(meta.names())
    required = ("age", "size", "grade", "er", "t.tdm", "e.tdm")
    absent = [n for n in required if n not in names]
    if absent:
        raise DataFormatError(path, f"missing attributes {absent}")
    probes = [n for n in names if n not in required]
    grade = np.asarray([_decode(g) for g in records["grade"]])
    grade_code = np.asarray(
        [GRADES.index(g) + 1 if g in GRADES else np.nan for g in grade], dtype=np.float32
    )
    er = np.asarray([_decode(v) == "positive" for v in records["er"]], dtype=np.float32)
    columns = [records["age"], records["size"], grade_code, er] + [records[p] for p in probes]
    features = np.stack([np.asarray(c, dtype=np.float32) for c in columns], axis=1)
    if np.isnan(features[:, [0, 1, *range(4, features.shape[1])]]).any():
        raise DataFormatError(path, "missing numeric values where none are declared")
    events = [_decode(e) for e in records["e.tdm"]]
    bad = [i for i, e in enumerate(events) if e not in ("0", "1")]
    if bad:
        raise DataFormatError(path, f"record {bad[0]}: e.tdm must be 0 or 1", column="e.tdm")
    observed = np.asarray([int(e) for e in events], dtype=np.int64)
    return Dataset(
        name="gse7390",
        features=features,
        labels=observed,
        feature_names=("age", "size", "grade", "er", *(p.removeprefix("X") for p in probes)),
        class_names=("no distant metastasis observed", "distant metastasis"),
        extra={"t.tdm": np.asarray(records["t.tdm"], dtype=np.float32), "e.tdm": observed},
        description=(
            "GSE7390 (TRANSBIG, Desmedt et al. 2007) via scikit-survival: 198 node-negative "
            "breast cancers, 76 Wang-signature probesets (HG-U133A) + age, size, grade, ER; "
            "label e.tdm (distant metastasis observed); grade 'unkown' -> NaN "
            f"({int(np.isnan(grade_code).sum())} patients)."
        ),
    )


def _decode(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


BC_TCGA_FILES = (("BC-TCGA-Normal.txt", "normal"), ("BC-TCGA-Tumor.txt", "tumour"))


def bc_tcga(directory: Path | str) -> Dataset:
    """BC-TCGA as distributed for iDASH 2020: two tab-separated genes x samples tables.

    Each file: header row (first cell any label, then sample ids), then one row per gene
    (gene symbol, then one value per sample); `null` = missing -> NaN. Both files must
    list the same genes in the same order. Label 0 = normal, 1 = tumour.
    """
    directory = Path(directory)
    tables, genes_seen, samples = [], None, []
    for filename, _ in BC_TCGA_FILES:
        path = require_file(directory / filename)
        genes, sample_ids, values = _read_genes_by_samples(path)
        if genes_seen is not None and genes != genes_seen:
            raise DataFormatError(path, f"gene list differs from {BC_TCGA_FILES[0][0]}")
        genes_seen = genes
        tables.append(values.T)
        samples.append(sample_ids)
    assert genes_seen is not None
    return Dataset(
        name="bc_tcga",
        features=np.concatenate(tables).astype(np.float32),
        labels=np.repeat([0, 1], [len(t) for t in tables]).astype(np.int64),
        feature_names=tuple(genes_seen),
        class_names=tuple(label for _, label in BC_TCGA_FILES),
        extra={"sample_id": np.asarray(samples[0] + samples[1])},
        description=(
            f"BC-TCGA format (iDASH 2020) read from {directory}: {len(samples[0])} normal, "
            f"{len(samples[1])} tumour samples x {len(genes_seen)} genes; null -> NaN."
        ),
    )


def _read_genes_by_samples(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    with path.open(encoding="utf-8") as handle:
        header = handle.readline().rstrip("\n").split("\t")
        if len(header) < 2:
            raise DataFormatError(path, "header must be a label then sample ids", line=1)
        genes: list[str] = []
        rows: list[list[float]] = []
        for line_no, line in enumerate(handle, start=2):
            cells = line.rstrip("\n").split("\t")
            if len(cells) != len(header):
                raise DataFormatError(
                    path, f"expected {len(header)} columns, got {len(cells)}", line=line_no
                )
            genes.append(cells[0])
            rows.append(
                [
                    parse_float(cell, path, line_no, sample, missing="null")
                    for sample, cell in zip(header[1:], cells[1:], strict=True)
                ]
            )
    require_records(path, len(rows), "gene rows")
    return genes, header[1:], np.asarray(rows, dtype=np.float32)


def write_bc_tcga(directory: Path | str, dataset: Dataset, sample_ids: Sequence[str] = ()) -> None:
    """Write `dataset` (label 0 normal, 1 tumour) in the BC-TCGA format; NaN -> `null`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    features: np.ndarray = np.asarray(dataset.features)
    ids = list(sample_ids) or [f"SAMPLE-{i:04d}" for i in range(len(dataset))]
    for label, (filename, _) in enumerate(BC_TCGA_FILES):
        rows = np.flatnonzero(dataset.labels == label)
        with (directory / filename).open("w", encoding="utf-8") as handle:
            handle.write("\t".join(["Hybridization REF", *(ids[i] for i in rows)]) + "\n")
            for j, gene in enumerate(dataset.feature_names):
                cells = ["null" if np.isnan(v) else f"{v:.6g}" for v in features[rows, j]]
                handle.write("\t".join([gene, *cells]) + "\n")
