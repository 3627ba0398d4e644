"""The Owkin and A*STAR reproductions at smoke scale: the rows compare the papers'
settings, every ε read from the store is within its budget, the models learn, real data
that is absent is skipped with a note, and the genomics builders refuse bad input. The
smoke runs are shared with test_recipe_golden.py, which compares their rows with the
golden ones."""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from dpfl.data import DataFormatError, genomics, signatures, synthetic
from dpfl.experiments.recipes import (
    Reproduction,
    astar,
    owkin,
    reproduce,
)
from dpfl.experiments.recipes.genomics_common import majority
from dpfl.experiments.results.store import ResultsStore, RunRow
from dpfl.experiments.study.datasets import build_silos, data_config
from dpfl.experiments.study.point import STORE

from .test_recipe_golden import recipe_lock, smoke


@pytest.fixture(scope="module")
def owkin_smoke(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return smoke(owkin.NAME, shared_data, tmp_path_factory)[1]


@pytest.fixture(scope="module")
def astar_smoke(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return smoke(astar.NAME, shared_data, tmp_path_factory)[1]


def _again(name: str, out: Path, data_dir: Path | None) -> Reproduction:
    """The finished reproduction in `out` (nothing runs twice: every point is done)."""
    with recipe_lock(out):  # another worker may be reading the same shared directory
        return reproduce(name, out, data_dir=data_dir, scale="smoke")


def _mean(store: ResultsStore, runs: list[RunRow], metric: str = "accuracy") -> float:
    return statistics.fmean(v for run in runs for v in store.final_metric(run, metric))


def _runs(store: ResultsStore, dataset: str, epsilon: float | None) -> list[RunRow]:
    return [
        run
        for run in store.runs()
        if run.config["data"]["dataset"] == dataset
        and (run.config["privacy"]["epsilon"] if run.config["privacy"]["private"] else None)
        == epsilon
    ]


def test_owkin_rows_compare_the_papers_points(owkin_smoke: Path, shared_data: Path) -> None:
    result = _again(owkin.NAME, owkin_smoke, shared_data)
    assert [(row.setting.split(" · ")[0], row.paper) for row in result.rows] == [
        ("GSE7390", "93.5 % (BC-TCGA, ε = 1, δ = 1e-5)"),
        ("GSE7390", "99.5 % (BC-TCGA, large ε)"),
        ("synthetic BC-TCGA", "93.5 % (BC-TCGA, ε = 1, δ = 1e-5)"),
        ("synthetic BC-TCGA", "99.5 % (BC-TCGA, large ε)"),
    ]
    assert result.rows[0].setting.endswith("ε = 1, δ = 1e-05")
    assert "N = 2, E = 7" in result.rows[0].setting  # Owkin's published ε≈1 setting
    assert "N = 10, E = 3" in result.rows[1].setting  # and their large-ε one
    assert "not BC-TCGA" in result.rows[0].note and "SYNTHETIC" in result.rows[2].note
    assert result.notes == [
        f"skipped real BC-TCGA: {(shared_data / 'bc_tcga').resolve()} not found "
        "(real data, not shipped with dpfl)"
    ]
    assert all(run.algorithm == "cyclic" and run.status == "finished" for run in result.runs)


def test_astar_rows_compare_aop_and_the_non_private_reference(
    astar_smoke: Path, shared_data: Path
) -> None:
    rows = _again(astar.NAME, astar_smoke, shared_data).rows
    assert [(row.setting.split(" · ")[0], row.paper) for row in rows] == [
        ("GSE7390", "92.1 % (BC-TCGA, ε = 1, δ ≈ 1e-6)"),
        ("GSE7390", "96.6 % (their AOP without noise)"),
        ("synthetic BC-TCGA", "92.1 % (BC-TCGA, ε = 1, δ ≈ 1e-6)"),
        ("synthetic BC-TCGA", "96.6 % (their AOP without noise)"),
    ]
    assert rows[0].setting.startswith("GSE7390 · AOP, T = 1, Λ = 1000")
    assert rows[1].setting.endswith("non-private") and "ε ≤" not in rows[1].ours


@pytest.mark.parametrize("fixture", ["owkin_smoke", "astar_smoke"])
def test_every_epsilon_in_the_store_is_within_its_budget(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    out: Path = request.getfixturevalue(fixture)
    with ResultsStore(out / STORE) as store:
        for run in store.runs():
            privacy = run.config["privacy"]
            spent = store.epsilon_by_silo(run).max
            if privacy["private"]:
                assert 0.9 * privacy["epsilon"] < spent <= privacy["epsilon"] + 1e-9
            else:
                assert spent == math.inf


def test_private_models_learn(owkin_smoke: Path) -> None:
    """At large ε the synthetic task beats always saying 'tumour'; GSE7390's metastasis
    label is too hard for accuracy to beat its 75 % majority even without noise (about
    77 %), so there the AUROC must beat chance."""
    with ResultsStore(owkin_smoke / STORE) as store:
        synthetic_runs = _runs(store, "synthetic_bc_tcga", 22.0)
        share = statistics.fmean(majority(run.config) for run in synthetic_runs)
        assert _mean(store, synthetic_runs) > share + 0.1
        assert _mean(store, _runs(store, "gse7390", 22.0), "auroc") > 0.6


def test_the_non_private_reference_is_at_least_as_good_as_epsilon_one(astar_smoke: Path) -> None:
    with ResultsStore(astar_smoke / STORE) as store:
        for dataset in ("gse7390", "synthetic_bc_tcga"):
            assert _mean(store, _runs(store, dataset, None)) >= _mean(
                store, _runs(store, dataset, 1.0)
            )


def test_without_real_data_only_the_synthetic_study_runs(tmp_path: Path) -> None:
    first = reproduce(astar.NAME, tmp_path / "a", data_dir=None, scale="smoke")
    assert {run.config["data"]["dataset"] for run in first.runs} == {"synthetic_bc_tcga"}
    assert first.notes == [
        "skipped GSE7390: no data folder given (real data, not shipped with dpfl)",
        "skipped real BC-TCGA: no data folder given (real data, not shipped with dpfl)",
    ]
    second = reproduce(astar.NAME, tmp_path / "b", data_dir=None, scale="smoke")
    assert second.rows == first.rows  # seeded: the same numbers again
    plan = owkin.studies(None, "smoke")
    assert plan.notes == first.notes
    assert {s.points[0][1].data.dataset for s in plan.studies} == {"synthetic_bc_tcga"}


def test_real_bc_tcga_runs_with_each_profiles_signature(shared_data: Path, tmp_path: Path) -> None:
    """A user's BC-TCGA folder (written here from the generator under the signatures'
    gene symbols) is planned and builds with Owkin's signature for each profile."""
    lists = shared_data / "gene_signatures"
    genes = [
        entry.symbol
        for name in ("gene76", "citbcmst")
        for entry in signatures.load_signature(lists, name).entries
    ]
    fake = synthetic.synthetic_bc_tcga(
        seed=3, n_normal=10, n_tumour=30, n_genes=400, signal_genes=genes
    )
    genomics.write_bc_tcga(tmp_path / "bc_tcga", fake)
    (tmp_path / "gene_signatures").symlink_to(lists)
    plan = owkin.studies(tmp_path, "smoke")
    assert plan.notes == [
        f"skipped GSE7390: {(tmp_path / 'gse7390').resolve()} not found "
        "(real data, not shipped with dpfl)"
    ]
    real = [s.points[0][1] for s in plan.studies if s.points[0][1].data.dataset == "bc_tcga"]
    options = [c.data.model_dump()["options"] for c in real]
    assert options == [{"signature": "gene76"}, {"signature": "citbcmst"}]
    widths = [build_silos(c.data, c.seed)[0].x.shape[1] for c in real]
    assert widths == [60, 263]


def test_builders_use_public_preprocessing_only(shared_data: Path) -> None:
    data = data_config({"dataset": "gse7390", "path": shared_data / "gse7390"}).load(0)
    assert data.features.shape == (198, 76) and data.feature_names[0] == "219340_s_at"
    assert data.privacy_caveats == ()  # nothing was fitted on the records
    holes = data_config(
        {
            "dataset": "synthetic_bc_tcga",
            "n_normal": 5,
            "n_tumour": 15,
            "n_genes": 30,
            "n_signal": 10,
            "missing_gene_fraction": 1.0,
            "missing_rate": 0.5,
        }
    ).load(0)
    assert holes.features.shape == (20, 10) and np.isfinite(holes.features).all()
    assert holes.preprocessing[-1] == "zero imputation of missing values (public)"
    assert holes.privacy_caveats == ()


def test_builders_refuse_bad_input(shared_data: Path, tmp_path: Path) -> None:
    text = (shared_data / "gse7390" / genomics.GSE7390_FILE).read_text()
    broken = tmp_path / "gse7390"
    broken.mkdir()
    first = text.index("\n57,3,poorly differentiated,negative,723,1,") + 1
    last_value = text.rindex(",", first, text.index("\n", first)) + 1
    end = text.index("\n", first)
    (broken / genomics.GSE7390_FILE).write_text(text[:last_value] + "?" + text[end:])
    with pytest.raises(DataFormatError, match="missing numeric values"):
        data_config({"dataset": "gse7390", "path": broken}).load(0)
    with pytest.raises(ValueError, match="signatures_dir"):
        data_config({"dataset": "gse7390", "path": broken, "signatures_dir": "x"})

    fake = synthetic.synthetic_bc_tcga(
        seed=0, n_normal=4, n_tumour=8, n_genes=80, signal_genes=["ESR1", "ERBB2"]
    )
    features = fake.features.copy()
    features[3, fake.feature_names.index("ESR1")] = np.inf
    genomics.write_bc_tcga(tmp_path / "bc_tcga", dataclasses.replace(fake, features=features))
    config = data_config(
        {
            "dataset": "bc_tcga",
            "path": str(tmp_path / "bc_tcga"),
            "options": {"signature": "pam50", "signatures": str(shared_data / "gene_signatures")},
            "partition": {"kind": "iid", "silos": 2},
        }
    )
    with pytest.raises(DataFormatError, match=r"Normal\.txt, line \d+, .*: non-finite value 'inf'"):
        build_silos(config, seed=0)
