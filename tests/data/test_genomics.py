"""Gene expression: GSE7390 counts, the BC-TCGA format round trip, signature matching and
the BC-TCGA-shaped generator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpfl.data import genomics, partition, preprocess, signatures, synthetic
from dpfl.data.dataset import DataFormatError, Dataset


def test_gse7390_matches_provenance(shared_data: Path) -> None:
    data = genomics.gse7390(shared_data / "gse7390")
    assert data.features.shape == (198, 4 + 76)
    assert data.class_counts().tolist() == [147, 51]
    assert data.features[:, data.feature_names.index("er")].sum() == 134
    assert np.isnan(data.features).sum() == 2  # grade 'unkown'
    times = data.extra["t.tdm"]
    assert (times.min(), times.max()) == (125, 9108)


def test_signature_report_on_gse7390(shared_data: Path) -> None:
    data = genomics.gse7390(shared_data / "gse7390")
    folder = shared_data / "gene_signatures"
    sizes = {"citbcmst": 263, "gene76": 60, "gene70": 52, "pam50": 50, "oncotypedx": 21}
    for name, size in sizes.items():
        assert len(signatures.load_signature(folder, name).entries) == size
    probe_sizes = {"citbcmst": 375, "gene76": 76, "gene70": 70}
    for name, size in probe_sizes.items():
        assert len(signatures.load_signature(folder, name, probe_level=True).entries) == size
    probes = signatures.load_signature(folder, "gene76", probe_level=True)
    selected, match = signatures.select_signature(data, probes)
    assert match.report() == "gene76: 76 of 76 found (76 by probe id)"
    assert selected.features.shape == (198, 76)
    assert selected.preprocessing[-1].startswith("selected 76 features by public list")
    genes = signatures.match_signature(
        signatures.load_signature(folder, "gene76"), data.feature_names
    )
    assert genes.n_found == 60  # 64 annotated probes of 60 genes
    pam50 = signatures.match_signature(
        signatures.load_signature(folder, "pam50"), data.feature_names
    )
    assert pam50.n_found == 0 and len(pam50.missing) == 50


def test_matching_routes_by_symbol_alternative_and_renaming(shared_data: Path) -> None:
    folder = shared_data / "gene_signatures"
    gene70 = signatures.load_signature(folder, "gene70")
    names = ("ALDH4", "FGF18", "ECI2", "UNRELATED")  # ALDH4A1 under an alias; PECI renamed
    match = signatures.match_signature(gene70, names, renames={"PECI": "ECI2"})
    assert match.columns == {"ALDH4A1": "ALDH4", "FGF18": "FGF18", "PECI": "ECI2"}
    assert match.via == {"ALDH4A1": "alternative symbol", "FGF18": "symbol", "PECI": "renaming"}
    assert (
        match.report()
        == "gene70: 3 of 52 found (1 by alternative symbol, 1 by renaming, 1 by symbol)"
    )
    with pytest.raises(ValueError, match="unknown signature"):
        signatures.load_signature(folder, "gene71")


@pytest.fixture(scope="module")
def synthetic_bc(shared_data: Path) -> Dataset:
    folder = shared_data / "gene_signatures"
    signal = [e.symbol for e in signatures.load_signature(folder, "citbcmst").entries]
    return synthetic.synthetic_bc_tcga(seed=0, signal_genes=signal)


def test_synthetic_bc_tcga_has_the_real_shape(synthetic_bc: Dataset) -> None:
    assert synthetic_bc.features.shape == (590, 17_814)
    assert synthetic_bc.class_counts().tolist() == [61, 529]
    missing = np.isnan(synthetic_bc.features)
    assert 0 < missing.mean() < 0.01
    assert 0.01 < missing.any(axis=0).mean() < 0.03
    assert synthetic_bc.description.startswith("SYNTHETIC")


def test_signature_genes_carry_the_signal(shared_data: Path, synthetic_bc: Dataset) -> None:
    """Logistic regression on the published signature beats the same number of null genes."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import balanced_accuracy_score

    folder = shared_data / "gene_signatures"
    data = preprocess.zero_impute(synthetic_bc)
    sig, match = signatures.select_signature(data, signatures.load_signature(folder, "citbcmst"))
    assert match.n_found == 263
    null_names = [n for n in data.feature_names if n.startswith("GENE")][: sig.n_features]
    null = preprocess.select_features(data, null_names, "control: null genes")
    train, test = partition.stratified_split(data.labels, [0.8, 0.2], seed=0)

    def score(d: Dataset) -> float:
        x = (d.features - 8.0) / 2.0  # public centring of log-expression, not fitted
        model = LogisticRegression(C=0.1, max_iter=500).fit(x[train], d.labels[train])
        return float(balanced_accuracy_score(d.labels[test], model.predict(x[test])))

    assert score(sig) > 0.9
    assert score(null) < 0.7


def test_bc_tcga_format_round_trip(tmp_path: Path) -> None:
    small = synthetic.synthetic_bc_tcga(
        seed=1,
        n_normal=3,
        n_tumour=5,
        n_genes=40,
        n_signal=4,
        missing_gene_fraction=0.5,
        missing_rate=0.5,
    )
    genomics.write_bc_tcga(tmp_path, small)
    text = (tmp_path / "BC-TCGA-Tumor.txt").read_text().splitlines()
    assert text[0].split("\t")[0] == "Hybridization REF" and len(text) == 41
    assert "null" in "".join(text)
    loaded = genomics.bc_tcga(tmp_path)
    assert loaded.features.shape == (8, 40)
    assert loaded.class_counts().tolist() == [3, 5]
    assert loaded.feature_names == small.feature_names
    np.testing.assert_allclose(loaded.features, small.features, rtol=1e-5, equal_nan=True)


def _small_bc_tcga(directory: Path) -> Dataset:
    """Two normal and two tumour samples of five genes, written as BC-TCGA's files."""
    small = synthetic.synthetic_bc_tcga(seed=2, n_normal=2, n_tumour=2, n_genes=5, n_signal=1)
    genomics.write_bc_tcga(directory, small)
    return small


def test_bc_tcga_bad_files_are_named(tmp_path: Path) -> None:
    small = _small_bc_tcga(tmp_path)
    tumour = tmp_path / "BC-TCGA-Tumor.txt"
    lines = tumour.read_text().splitlines()
    lines[3] = "\t".join([*lines[3].split("\t")[:2], "n/a"])
    tumour.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        DataFormatError, match=r"Tumor\.txt, line 4, column 'SAMPLE-0003': cannot parse 'n/a'"
    ):
        genomics.bc_tcga(tmp_path)
    tumour.write_text("\n".join([*lines[:3], "GENEX\t1.0"]) + "\n")
    with pytest.raises(DataFormatError, match=r"line 4: expected 3 columns, got 2"):
        genomics.bc_tcga(tmp_path)
    genomics.write_bc_tcga(tmp_path, small)
    normal = tmp_path / "BC-TCGA-Normal.txt"
    normal.write_text(normal.read_text().replace(small.feature_names[0], "OTHER"))
    with pytest.raises(DataFormatError, match="gene list differs"):
        genomics.bc_tcga(tmp_path)
    normal.unlink()
    with pytest.raises(DataFormatError, match=r"BC-TCGA-Normal\.txt: file not found"):
        genomics.bc_tcga(tmp_path)


def test_gse7390_bad_files_are_named(shared_data: Path, tmp_path: Path) -> None:
    text = (shared_data / "gse7390" / genomics.GSE7390_FILE).read_text()
    path = tmp_path / genomics.GSE7390_FILE
    first = text.index("\n57,3,poorly differentiated,negative,723,1,") + 1
    path.write_text(text[:first] + text[first:].replace(",723,1,", ",723,?,", 1))
    with pytest.raises(DataFormatError, match=r"record 0: e\.tdm must be 0 or 1"):
        genomics.gse7390(tmp_path)
    path.write_text(text.replace("@attribute e.tdm {0,1}\n", ""))
    with pytest.raises(DataFormatError, match=r"missing attributes \[.e\.tdm.\]"):
        genomics.gse7390(tmp_path)


def test_empty_and_non_finite_genomics_files_are_named(tmp_path: Path) -> None:
    path = tmp_path / genomics.GSE7390_FILE
    path.write_text("")
    with pytest.raises(DataFormatError, match="not a readable ARFF file: empty file"):
        genomics.gse7390(tmp_path)
    attributes = "".join(
        f"@attribute {name} numeric\n" for name in ("age", "size", "grade", "er", "t.tdm", "e.tdm")
    )
    path.write_text(f"@relation gse7390\n{attributes}@data\n")
    with pytest.raises(DataFormatError, match=r"metastasis\.arff: no records"):
        genomics.gse7390(tmp_path)
    _small_bc_tcga(tmp_path)
    normal = tmp_path / "BC-TCGA-Normal.txt"
    lines = normal.read_text().splitlines()
    lines[2] = "\t".join([*lines[2].split("\t")[:2], "NaN"])
    normal.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=r"line 3, column .*: non-finite value 'NaN'"):
        genomics.bc_tcga(tmp_path)
    normal.write_text(lines[0] + "\n")
    with pytest.raises(DataFormatError, match=r"Normal\.txt: no gene rows"):
        genomics.bc_tcga(tmp_path)
