"""The survival recipes (FLamby's Fed-TCGA-BRCA, GSE7390 time to metastasis) at smoke
scale, end to end on the shared real data (the runs of test_recipe_golden.py, which
compares their rows with the golden ones), and the C-index averaging of the FLamby
comparison: a client test set without a C-index (NaN) is left out of the mean, as the
recipe's note says."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from dpfl.experiments.recipes import Reproduction
from dpfl.experiments.recipes.flamby_tcga import CENTRES, client_average, client_scores

from .test_recipe_golden import smoke

NUMBER = re.compile(r"\d\.\d{3}")


@pytest.fixture(scope="module")
def tcga(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Reproduction:
    return smoke("flamby-tcga-brca", shared_data, tmp_path_factory)[0]


@pytest.fixture(scope="module")
def gse7390(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Reproduction:
    return smoke("gse7390-survival", shared_data, tmp_path_factory)[0]


def test_tcga_rows_have_ours_and_flambys_numbers(tcga: Reproduction) -> None:
    assert tcga.runs, tcga.notes
    for run in tcga.runs:
        assert run.status == "finished", (run.study, run.error)
    settings = [row.setting for row in tcga.rows]
    for model in ("Cox", "logistic hazard"):
        for method in ("pooled training", "FedAvg", "Cyclic", *(f"Local {k}" for k in range(6))):
            assert any(s.startswith(model) and f": {method}" in s for s in settings), method
    assert any("DP FedAvg" in s and "ε = 10" in s for s in settings)
    for row in tcga.rows:
        assert NUMBER.search(row.ours), row
        if "DP FedAvg" in row.setting:
            assert "ε = " in row.note and "cost vs non-private" in row.note
        else:  # FLamby's published figure, mean ± std over its 5 seeds
            assert re.search(r"clientavg \d\.\d{3} ± \d\.\d{3} \(5 seeds\)", row.paper), row
            assert "where defined" in row.note and "tcga_seed42..46.csv" in row.note
    pooled = next(
        r for r in tcga.rows if r.setting.startswith("Cox") and "pooled training" in r.setting
    )
    assert "pooled test" in pooled.paper and "pooled test" in pooled.ours


def test_gse7390_rows_report_the_cost_of_epsilon(gse7390: Reproduction) -> None:
    assert gse7390.runs, gse7390.notes
    for run in gse7390.runs:
        assert run.status == "finished", (run.study, run.error)
    settings = [row.setting for row in gse7390.rows]
    assert any("non-private" in s for s in settings)
    assert any("ε = 10" in s for s in settings)  # smoke scale: one private budget
    cost = next(row for row in gse7390.rows if "cost of ε" in row.setting)
    assert re.fullmatch(r"Harrell [+-]\d\.\d{3}; Uno [+-]\d\.\d{3}; IBS [+-]\d\.\d{3}", cost.ours)
    for row in gse7390.rows:
        for label in ("Harrell", "Uno", "IBS"):
            assert re.search(rf"{label} [+-]?\d\.\d{{3}}", row.ours), row


def test_client_average_leaves_out_a_test_set_without_a_c_index() -> None:
    values = {"northeast": 0.8, "south": 0.6, "canada": math.nan, "europe": None}
    assert client_average(values) == pytest.approx(0.7)
    assert math.isnan(client_average({"canada": math.nan}))


def test_client_scores_average_per_trial_and_count_the_undefined() -> None:
    rows = [
        {"trial": 0, "silo": "northeast", "value": 0.9},
        {"trial": 0, "silo": "canada", "value": math.nan},
        {"trial": 1, "silo": "northeast", "value": 0.7},
        {"trial": 1, "silo": "canada", "value": 0.5},
        {"trial": 2, "silo": "canada", "value": None},  # no defined test set: no trial
    ]
    scores = client_scores(rows)
    assert scores.clientavg == pytest.approx([0.9, 0.6])
    assert (scores.undefined, scores.scored) == (2, 5)
    assert len(CENTRES) == 6
