"""`dpfl stats`: a study's [analytics] charged to every hospital's ledger before release,
refused past a budget, summed by the study's secure sum; a KM curve on FLamby
TCGA-BRCA within its stated band of the exact pooled curve."""

from __future__ import annotations

import json
import math
import runpy
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dpfl.analytics import Figure, KaplanMeier, Records, SurvivalComparison, curve
from dpfl.cli import app
from dpfl.experiments.study.analytics import (
    STATS_JSON,
    StatsRun,
    cohort,
    queries,
    stats,
    text_columns,
    write,
)
from dpfl.experiments.study.config import StudyConfig, load
from dpfl.experiments.study.stats_page import render
from dpfl.privacy import Ledger
from dpfl.privacy.errors import BudgetExceededError
from dpfl.privacy.events import Neighbouring
from studies import breast_cancer_study

ANALYTICS = {
    "noise_multiplier": 8.0,
    "histograms": [{"column": "mean radius", "bins": [0.0, 0.25, 0.5, 0.75, 1.0]}],
    "means": [{"column": "mean radius", "range": [0.0, 1.0]}],
}


def _study(tmp_path: Path, **rest: object) -> StudyConfig:
    path = tmp_path / "study.toml"
    path.write_text(breast_cancer_study("s", rounds=1, **rest), encoding="utf-8")
    return load(path).points[0][1]


def _events(ledger: Path) -> dict[str, int]:
    with Ledger(ledger, create=False) as book:
        return {a.silo: a.events for a in book.accounts()}


def test_a_stats_run_charges_every_hospitals_ledger_and_refuses_past_its_budget(
    tmp_path: Path,
) -> None:
    config = _study(
        tmp_path,
        secure_aggregation="masking",
        privacy={"epsilon": 1.0},
        analytics=ANALYTICS,
    )
    run = stats(config, tmp_path / "out")
    assert run.summing == "masking"
    assert _events(tmp_path / "out" / "ledger.sqlite") == {
        f"hospital-{k}/trial-0": 3 for k in range(3)
    }
    with pytest.raises(BudgetExceededError, match="before any release"):
        stats(config, tmp_path / "out")  # 6 releases at σ = 8: ε 1.16 > 1
    assert set(_events(tmp_path / "out" / "ledger.sqlite").values()) == {3}
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["figures"]
    assert "<img" in (tmp_path / "out" / "stats.html").read_text()


def test_analytics_enter_no_run_key_unless_set(tmp_path: Path) -> None:
    plain = _study(tmp_path, privacy={"epsilon": 1.0})
    with_stats = _study(tmp_path, privacy={"epsilon": 1.0}, analytics=ANALYTICS)
    assert plain.key() != with_stats.key()
    (tmp_path / "again").mkdir()
    assert plain.key() == _study(tmp_path / "again", privacy={"epsilon": 1.0}).key()
    assert "analytics" not in plain.model_dump(exclude_defaults=True)


def test_dpfl_stats_prints_each_figure_with_its_noise(tmp_path: Path) -> None:
    path = tmp_path / "study.toml"
    path.write_text(
        breast_cancer_study("s", rounds=1, privacy={"epsilon": 1.0}, analytics=ANALYTICS),
        encoding="utf-8",
    )
    result = CliRunner().invoke(app, ["stats", str(path), "--out", str(tmp_path / "o"), "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)["figures"]
    assert {"statistic", "name", "value", "std"} <= set(figures[0])
    assert all(f["std"] > 0 for f in figures)
    refused = CliRunner().invoke(app, ["stats", str(tmp_path / "none.toml")])
    assert refused.exit_code == 2 and "Traceback" not in refused.output


def test_kaplan_meier_on_tcga_brca_is_within_its_band_of_the_exact_curve(
    tmp_path: Path, shared_data: Path
) -> None:
    edges = [0.0, 365.0, 730.0, 1095.0, 1460.0, 1825.0, 2555.0, 3650.0, 7300.0]
    config = StudyConfig.model_validate(
        {
            "rounds": 1,
            "data": {
                "dataset": "tcga_brca",
                "path": str(shared_data / "fed_tcga_brca"),
                "partition": {"kind": "natural"},
                "split": "official",
            },
            "algorithm": {"name": "fedavg"},
            "privacy": {"epsilon": 2.0},
            "secure_aggregation": "masking",
            "analytics": {"epsilon": 1.0, "counts": False, "kaplan_meier": edges},
        }
    )
    run = stats(config, tmp_path)
    records, _ = cohort(config)
    query = KaplanMeier(tuple(edges))
    exact = curve(sum(query.vector(r, 0, 1) for r in records.values()))[0]
    assert len(run.figures) == len(edges) - 1
    covered = [
        f.interval is not None and f.interval[0] <= truth <= f.interval[1]
        for f, truth in zip(run.figures, exact[0], strict=True)
    ]
    assert sum(covered) >= len(covered) - 1  # pointwise 95% bands (coverage: test_coverage)
    assert max(abs(f.value - t) for f, t in zip(run.figures, exact[0], strict=True)) < 0.25
    assert np.all(np.diff([f.value for f in run.figures]) <= 1e-12)  # a survival curve


def test_a_patient_level_table_is_charged_per_patient_in_its_own_units(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    rows = ["patient_nbr,hospital,age,readmitted"]
    for patient in range(300):
        age = int(rng.integers(18, 96))
        rows += [f"{patient},{['north', 'south'][patient % 2]},{age},{int(age > 60)}"] * int(
            rng.integers(1, 6)
        )
    (tmp_path / "cohort.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    config = StudyConfig.model_validate(
        {
            "rounds": 1,
            "data": {
                "dataset": "table",
                "path": str(tmp_path / "cohort.csv"),
                "label": "readmitted",
                "site": "hospital",
                "features": ["age"],
                "columns": {"age": {"range": [0, 100]}},
                "sites": {"north": 100, "south": 100},
                "unit": "patient_nbr",
                "max_records": 2,
            },
            "algorithm": {"name": "fedavg"},
            "privacy": {"epsilon": 3.0},
            "analytics": {"noise_multiplier": 5.0, "means": [{"column": "age", "range": [0, 100]}]},
        }
    )
    run = stats(config, tmp_path / "out")
    with Ledger(tmp_path / "out" / "ledger.sqlite", create=False) as book:
        charged = [e for silo in book.silos() for e in book.entries(silo)]
    assert len(charged) == 4  # two hospitals, counts and the mean
    assert {e.event.neighbouring for e in charged} == {Neighbouring.ADD_REMOVE_PATIENT}
    mean = next(f for f in run.figures if f.statistic == "mean of age" and f.name == "mean")
    assert mean.std > 0
    assert run.noise["mean of age"] == pytest.approx(5.0 * 1.5 * 2 * np.sqrt(2))
    ages = np.array([float(r.split(",")[2]) for r in rows[1:]])
    assert 30 < mean.value < 80 and abs(mean.value - ages.mean()) < 5 * mean.std + 2


def test_a_shared_ledgers_dataset_cap_binds_the_stats_too(tmp_path: Path) -> None:
    shared = tmp_path / "hospital.sqlite"
    with Ledger(shared) as book:
        book.cap_dataset("hospital-0", epsilon=0.3, delta=1e-5)
    config = _study(tmp_path, privacy={"epsilon": 5.0}, analytics=ANALYTICS)
    with pytest.raises(BudgetExceededError, match="hospital-0"):
        stats(config, tmp_path / "out", shared)
    with Ledger(shared, create=False) as book:
        assert all(a.events == 0 for a in book.accounts())


def test_an_unknown_column_is_one_line_and_charges_nothing(tmp_path: Path) -> None:
    path = tmp_path / "study.toml"
    bad = {**ANALYTICS, "histograms": [{"column": "nope", "bins": [0.0, 1.0]}]}
    path.write_text(
        breast_cancer_study("s", rounds=1, privacy={"epsilon": 1.0}, analytics=bad),
        encoding="utf-8",
    )
    result = CliRunner().invoke(app, ["stats", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "no column 'nope'" in result.output and "Traceback" not in result.output
    assert set(_events(tmp_path / "o" / "ledger.sqlite").values()) == {0}


def test_a_ledger_given_beside_a_study_that_names_another_is_refused(tmp_path: Path) -> None:
    config = _study(
        tmp_path,
        privacy={"epsilon": 5.0, "ledger": "hospitals.sqlite"},
        analytics=ANALYTICS,
    )
    with pytest.raises(ValueError, match=r"is charged to its privacy\.ledger"):
        stats(config, tmp_path / "out", tmp_path / "other.sqlite")
    assert not (tmp_path / "other.sqlite").exists()
    assert not (tmp_path / "hospitals.sqlite").exists()


def _text_study(tmp_path: Path, **analytics: object) -> StudyConfig:
    """A 2-site table with a text column: no one is 'Asian', some are 'Martian' (not
    declared) and some have no race at all."""
    rng = np.random.default_rng(9)
    races = rng.choice(
        ["Caucasian", "AfricanAmerican", "Martian", ""], 400, p=[0.6, 0.3, 0.05, 0.05]
    )
    rows = ["hospital,age,race,readmitted"]
    rows += [
        f"{['north', 'south'][i % 2]},{30 + i % 60},{r},{i % 3 == 0:d}" for i, r in enumerate(races)
    ]
    (tmp_path / "cohort.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return StudyConfig.model_validate(
        {
            "rounds": 1,
            "data": {
                "dataset": "table",
                "path": str(tmp_path / "cohort.csv"),
                "label": "readmitted",
                "site": "hospital",
                "features": ["age", "race"],
                "columns": {
                    "age": {"range": [0, 100]},
                    "race": {"categories": ["Caucasian", "AfricanAmerican", "Asian"]},
                },
                "sites": {"north": 200, "south": 200},
            },
            "algorithm": {"name": "fedavg"},
            "privacy": {"epsilon": 3.0},
            "analytics": {"categories": [{"column": "race"}]} | analytics,
        }
    ), races


def test_a_text_column_is_counted_by_its_name_and_declared_categories(tmp_path: Path) -> None:
    config, races = _text_study(tmp_path, noise_multiplier=3.0)
    records, classes = cohort(config)
    (count,) = queries(config.analytics, classes, text_columns(config))
    exact = sum(count.vector(r, k, 2) for k, r in enumerate(records.values()))
    figures = count.figures(exact, 0.0, list(records), np.random.default_rng(0))
    counted = {f.name: f.value for f in figures if f.name.startswith("race = ")}
    declared = ("Caucasian", "AfricanAmerican", "Asian", "other")
    assert list(counted) == [f"race = {r}" for r in declared]
    assert counted["race = Caucasian"] == np.sum(races == "Caucasian")
    assert counted["race = Asian"] == 0
    assert counted["race = other"] == np.sum((races == "Martian") | (races == ""))
    assert stats(config, tmp_path / "out").figures[-1].name == "race = other"


def test_a_number_column_counted_without_values_is_one_line(tmp_path: Path) -> None:
    config, _ = _text_study(tmp_path, noise_multiplier=1.0, categories=[{"column": "age"}])
    with pytest.raises(ValueError, match="list its `values`"):
        stats(config, tmp_path / "out")


@pytest.mark.parametrize("consistent", [False, True])
def test_consistent_counts_are_non_negative_integers_that_add_up(
    tmp_path: Path, consistent: bool
) -> None:
    config, races = _text_study(tmp_path, noise_multiplier=20.0, consistent=consistent)
    figures = stats(config, tmp_path / "out").figures
    value = {f.name: f.value for f in figures}
    parts = [value[f"race = {r}"] for r in ("Caucasian", "AfricanAmerican", "Asian", "other")]
    hospitals = [value["hospital north"], value["hospital south"]]
    labels = [value["label 0"], value["label 1"]]
    if not consistent:  # the raw noisy counts: fractional, one negative, not adding up
        assert min(parts) < 0 and abs(sum(parts) - value["pooled"]) > 1
        assert all(f.raw for f in figures)
        return
    assert all(not f.raw for f in figures)
    for group in (parts, hospitals, labels):
        assert sum(group) == value["pooled"]
        assert all(v >= 0 and v == int(v) for v in group)
    assert value["pooled"] == pytest.approx(len(races), abs=60)


def test_table_one_is_written_as_html_and_csv_with_each_cells_noise(tmp_path: Path) -> None:
    table = {
        "by": "race",
        "categorical": [],
        "continuous": [{"column": "age", "range": [0, 100], "bins": [0, 25, 50, 75, 100]}],
    }
    config, races = _text_study(tmp_path, noise_multiplier=8.0, table_one=table)
    run = stats(config, tmp_path / "out")
    cells = [f for f in run.figures if f.cell is not None]
    sites = {f.cell[0] for f in cells}
    groups = {f.cell[1] for f in cells}
    assert sites == {"north", "south", "pooled"}
    assert groups == {"Caucasian", "AfricanAmerican", "Asian", "other", "all"}
    rows = (tmp_path / "out" / "table_one.csv").read_text(encoding="utf-8").splitlines()
    assert rows[0].startswith("site,group,figure,value,noise_std,low,high,covers,raw")
    assert len(rows) == 1 + len(cells)
    page = (tmp_path / "out" / "stats.html").read_text(encoding="utf-8")
    assert "age, median [IQR]" in page and "noise std" in page
    assert f"The whole table costs each hospital ε {run.epsilon['Table 1']:.3g}" in page
    n = next(f for f in cells if f.name == "n" and f.cell == ("pooled", "all"))
    assert abs(n.value - len(races)) < 5 * n.std


def test_a_value_not_among_a_text_columns_categories_is_one_line(tmp_path: Path) -> None:
    config, _ = _text_study(
        tmp_path, noise_multiplier=3.0, categories=[{"column": "race", "values": ["Asain"]}]
    )
    with pytest.raises(ValueError, match=r"\['Asain'\] are not among its declared categories"):
        stats(config, tmp_path / "out")


def test_stats_json_is_strict_json_and_reads_back(tmp_path: Path) -> None:
    figures = [
        Figure("survival by sex", "log-rank p", 0.03, math.nan, covers="population", raw=False),
        Figure("survival by sex", "hazard ratio M vs F", 2.0, 1.5, (0.0, math.inf)),
        Figure("Table 1", "n", 120.4, 9.1, cell=("east", "F")),
    ]
    run = StatsRun("s", ["east"], 3.0, {"Table 1": 9.1}, "none", "ledger", figures, {"x": 1.0})
    write(run, tmp_path)
    text = (tmp_path / STATS_JSON).read_text(encoding="utf-8")

    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    json.loads(text, parse_constant=refuse)
    back = StatsRun.read(tmp_path / STATS_JSON)
    assert math.isnan(back.figures[0].std) and back.figures[0].value == 0.03
    assert back.figures[1].interval is not None and math.isnan(back.figures[1].interval[1])
    assert back.figures[2] == figures[2] and back.epsilon == {"x": 1.0}


def test_the_page_draws_each_groups_curve_of_a_survival_comparison() -> None:
    """Its figures are the groups' curves (each point `at` a time) and then the log-rank
    and the hazard ratio, which are no curve's points."""
    query = SurvivalComparison("sex", ("F", "M"), (0.0, 1.0, 2.0))
    records = Records(
        {"sex": np.array(["F", "M", "F", "M", "F"], dtype=object)},
        time=np.array([0.5, 1.5, 2.5, 0.7, 1.2]),
        event=np.array([1, 1, 0, 1, 0]),
    )
    figures = query.figures(query.vector(records, 0, 1), 1.0, ["a"], np.random.default_rng(0))
    run = StatsRun("s", ["a"], 1.0, {query.title: 1.0}, "none", "ledger", figures)
    page = render(run)
    assert page.count("<img") == 1 and "log-rank p" in page and "hazard ratio M vs F" in page
    assert "nan" not in page  # a test's figure has no noise std or interval of its own: —


def test_exponential_quantiles_fit_in_the_runs_epsilon_with_the_gaussian_ones(
    tmp_path: Path,
) -> None:
    exponential = {"column": "age", "bins": [0, 100], "method": "exponential", "epsilon": 0.5}
    config, _ = _text_study(tmp_path, epsilon=2.0, quantiles=[exponential])
    run = stats(config, tmp_path / "out")
    assert run.epsilon["exponential quantiles of age"] == pytest.approx(0.5)
    assert run.epsilon["the whole run"] == pytest.approx(2.0, abs=0.01)  # σ calibrated to it
    medians = [f for f in run.figures if f.name.endswith("quantile 0.5")]
    assert [f.name for f in medians] == [
        "hospital north: quantile 0.5",
        "hospital south: quantile 0.5",
    ]
    assert all(40 < f.value < 80 for f in medians)  # ages 30–89, uniform


@pytest.mark.parametrize(
    "quantile",
    [
        {"column": "age", "bins": [0, 100], "method": "exponential"},
        {"column": "age", "bins": [0, 100], "epsilon": 0.5},
    ],
)
def test_epsilon_is_the_exponential_methods_own(tmp_path: Path, quantile: dict) -> None:
    with pytest.raises(ValueError, match="`epsilon` is the exponential method's own"):
        _text_study(tmp_path, epsilon=2.0, quantiles=[quantile])


def test_a_run_of_exponential_quantiles_alone_spends_their_epsilon_only(tmp_path: Path) -> None:
    exponential = {"column": "age", "bins": [0, 100], "method": "exponential", "epsilon": 0.5}
    config, _ = _text_study(
        tmp_path, epsilon=1.0, counts=False, categories=[], quantiles=[exponential] * 2
    )
    run = stats(config, tmp_path / "out")
    assert run.epsilon["the whole run"] == pytest.approx(1.0)  # no Gaussian release charged
    with Ledger(tmp_path / "out" / "ledger.sqlite", create=False) as book:
        assert book.spent("north/trial-0").epsilon == pytest.approx(1.0)
    over, _ = _text_study(
        tmp_path, epsilon=0.9, counts=False, categories=[], quantiles=[exponential] * 2
    )
    with pytest.raises(ValueError, match=r"add up to 1, over the run's epsilon 0\.9"):
        stats(over, tmp_path / "again")


def test_the_worked_example_runs_on_flchain_as_the_docs_show(tmp_path: Path) -> None:
    """docs/studies/flchain-stats.toml on the CSV docs/studies/flchain_csv.py writes."""
    studies = Path(__file__).parents[2] / "docs" / "studies"
    writer = runpy.run_path(str(studies / "flchain_csv.py"))
    writer["write"](tmp_path / "flchain.csv")
    (tmp_path / "study.toml").write_text(
        (studies / "flchain-stats.toml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    run = stats(load(tmp_path / "study.toml").points[0][1], tmp_path / "out")
    value = {f.name: f for f in run.figures if f.cell is None}
    assert value["S(4380)"].value == pytest.approx(0.7174, abs=0.02)  # Kaplan–Meier's 0.7174
    ratio = value["hazard ratio M vs F"]
    assert ratio.band is not None and ratio.band[0] < 1.088 < ratio.band[1]  # Cox's, exact
    assert run.epsilon["the whole run"] == pytest.approx(1.0, abs=0.01)
    assert (tmp_path / "out" / "table_one.csv").exists()
