"""A cohort dpfl has never seen, as a CSV of one's own, through the whole command line:
`dpfl sweep`, `best`, `report`, `tune` and `audit`, every ε within its budget by the
ledgers; bad input one line; the study's keys checked before any record is read."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.experiments.study.config import ConfigError, Study, load
from dpfl.experiments.study.tune import LEDGER
from dpfl.privacy import Ledger

runner = CliRunner()
SITES = {"north": 190, "south": 190, "east": 190}
EPSILONS = [1.0, 4.0]
STUDY = f"""
name = "readmission"
rounds = 2
eval_every = "end"
metrics = ["auroc", "accuracy"]

[data]
dataset = "table"
path = "cohort.csv"
label = "readmitted_30d"
site = "hospital"
features = ["age", "race", "num_medications", "creatinine"]
sites = {json.dumps(SITES).replace(":", " =").replace('"', "")}

[data.columns.age]
range = [0, 100]
[data.columns.race]
categories = ["Caucasian", "AfricanAmerican", "Hispanic", "Asian", "Other"]
[data.columns.num_medications]
range = [0, 80]
missing = "zero"
[data.columns.creatinine]
range = [-2, 2]
log = true

[algorithm]
name = "fedavg"
learning_rate = 1.0
expected_batch_size = 32

[privacy]
epsilon = {EPSILONS}
delta = 1e-5
"""


def write_cohort(folder: Path, rows: int = 600, seed: int = 7) -> Path:
    """A 30-day readmission cohort of three hospitals, with a patient number (not a
    feature), empty cells and a race outside the declared list."""
    rng = np.random.default_rng(seed)
    path = folder / "cohort.csv"
    with path.open("w", newline="", encoding="utf-8") as file:
        out = csv.writer(file)
        out.writerow(
            [
                "patient_nbr",
                "hospital",
                "age",
                "race",
                "num_medications",
                "creatinine",
                "readmitted_30d",
            ]
        )
        for i in range(rows):
            age, medications = int(rng.integers(18, 96)), int(rng.integers(1, 60))
            risk = 0.04 * (age - 60) + 0.06 * (medications - 25)
            out.writerow(
                [
                    700_000 + 13 * i,
                    list(SITES)[i % 3],
                    age,
                    rng.choice(
                        ["Caucasian", "AfricanAmerican", "Hispanic", "Asian", "Martian", ""]
                    ),
                    "" if i % 50 == 0 else medications,
                    round(float(rng.lognormal(0, 0.4)), 3),
                    int(rng.random() < 1 / (1 + np.exp(-risk))),
                ]
            )
    return path


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The study swept once (two budgets), for the commands that read its results."""
    folder = tmp_path_factory.mktemp("table")
    write_cohort(folder)
    (folder / "study.toml").write_text(STUDY, encoding="utf-8")
    result = runner.invoke(
        app,
        ["sweep", str(folder / "study.toml"), "--out", str(folder / "runs"), "-j", "1", "--json"],
    )
    assert result.exit_code == 0, result.output
    return folder, json.loads(result.stdout)


def test_a_table_of_ones_own_runs_through_sweep_best_and_report(
    swept: tuple[Path, dict[str, Any]],
) -> None:
    folder, output = swept
    assert output["failed"] == 0 and len(output["runs"]) == len(EPSILONS)
    for summary in output["runs"]:
        budget = summary["grid"]["privacy.epsilon"]
        with Ledger(folder / "runs" / "ledgers" / f"{summary['id']}.sqlite", create=False) as book:
            spent = {silo: book.spent(silo, delta=1e-5).epsilon for silo in book.silos()}
        assert sorted(s.split("/")[0] for s in spent) == sorted(SITES)
        assert 0 < max(spent.values()) <= budget
        assert summary["metrics"]["auroc"]["mean"] > 0.5
    best = runner.invoke(
        app, ["best", str(folder / "runs"), "-e", "4", "-d", "1e-5", "--metric", "auroc", "--json"]
    )
    assert best.exit_code == 0, best.output
    assert json.loads(best.stdout)["best"]["epsilon"] <= 4
    report = runner.invoke(app, ["report", str(folder / "runs")])
    assert report.exit_code == 0, report.output
    assert (folder / "runs" / "report" / "index.html").is_file()


def test_audit_bounds_the_tables_runs_below_their_ledgers(
    swept: tuple[Path, dict[str, Any]],
) -> None:
    folder, output = swept
    run = output["runs"][0]["id"]
    result = runner.invoke(
        app,
        ["audit", str(folder / "runs"), "--run", run, "--trials", "20", "--no-record", "--json"],
    )
    assert result.exit_code == 0, result.output
    (bound,) = json.loads(result.stdout)
    assert bound["epsilon_lower"] <= bound["epsilon_ledger"] <= EPSILONS[0]


def test_tune_selects_privately_within_the_budget(tmp_path: Path) -> None:
    write_cohort(tmp_path)
    (tmp_path / "study.toml").write_text(STUDY.replace(f"{EPSILONS}", "4.0"), encoding="utf-8")
    study = tmp_path / "study.toml"
    text = study.read_text().replace("learning_rate = 1.0", "learning_rate = [0.5, 1.0]")
    study.write_text(text, encoding="utf-8")
    out = tmp_path / "tuned"
    result = runner.invoke(app, ["tune", str(study), "--out", str(out), "--mean", "2", "--json"])
    assert result.exit_code == 0, result.output
    with Ledger(out / LEDGER, create=False) as book:
        assert max(book.spent(silo, delta=1e-5).epsilon for silo in book.silos()) <= 4


def test_an_edited_table_is_refused_and_a_bad_cell_is_one_line(
    swept: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    folder, _ = swept
    copy = tmp_path / "runs"
    copy.mkdir()
    (copy / "study.json").write_bytes((folder / "runs" / "study.json").read_bytes())
    write_cohort(tmp_path, seed=8)
    (tmp_path / "study.toml").write_text(STUDY, encoding="utf-8")
    record = json.loads((copy / "study.json").read_text())  # as if run on the old file
    record["data"] = {str((tmp_path / "cohort.csv").resolve()): v for v in record["data"].values()}
    (copy / "study.json").write_text(json.dumps(record))
    refused = runner.invoke(app, ["sweep", str(tmp_path / "study.toml"), "--out", str(copy)])
    assert refused.exit_code == 2
    assert "holds results computed from other data" in refused.output
    assert "cohort.csv:" in refused.output

    lines = (tmp_path / "cohort.csv").read_text().splitlines()
    lines[5] = lines[5].rsplit(",", 1)[0] + ",yes"
    (tmp_path / "cohort.csv").write_text("\n".join(lines) + "\n")
    failed = runner.invoke(
        app, ["sweep", str(tmp_path / "study.toml"), "--out", str(tmp_path / "bad")]
    )
    assert failed.exit_code == 1
    message = "cohort.csv, line 6, column 'readmitted_30d': label 'yes' is not one of the declared"
    assert message in " ".join(failed.output.split())
    assert "Traceback" not in failed.output


def _raw(**data: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "rounds": 1,
        "data": {
            "dataset": "table",
            "path": "PATH",
            "label": "readmitted_30d",
            "features": ["age"],
            "columns": {"age": {"range": [0, 100]}},
        },
        "algorithm": {"name": "fedavg"},
        "privacy": {"epsilon": 1.0},
    }
    base["data"] |= data
    return base


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"site": "hospital"}, "data.site: each silo's public size must come from the study"),
        ({"sites": {"a": 10}}, "data.sites: public sizes of sites, which need data.site"),
        (
            {"site": "hospital", "sites": {"a": 10}, "public_sizes": "dp-count"},
            "declared or a DP count, not both",
        ),
        ({"features": ["age", "race"]}, "data.features: 'race' has no [data.columns.race]"),
        ({"classes": ["?"]}, "data.classes: the label's classes as written in the file"),
        ({"label": None, "time": "t"}, "a table needs data.label (classes) or data.time"),
        ({"path": "FOLDER"}, "data.path: a table is one CSV or Parquet file"),
    ],
)
def test_a_tables_keys_are_checked_before_any_record(
    tmp_path: Path, data: dict[str, Any], message: str
) -> None:
    write_cohort(tmp_path, rows=6)
    raw = _raw(**{k: v for k, v in data.items() if v is not None})
    if data.get("label", "") is None:
        del raw["data"]["label"]
    raw["data"]["path"] = str(tmp_path if data.get("path") else tmp_path / "cohort.csv")
    with pytest.raises(ConfigError) as caught:
        Study(raw)
    assert message in str(caught.value)


def test_list_valued_keys_are_values_and_a_list_of_lists_is_an_axis(tmp_path: Path) -> None:
    write_cohort(tmp_path, rows=6)
    raw = _raw(path=str(tmp_path / "cohort.csv"), features=["age", "num_medications"])
    raw["data"]["columns"] |= {"num_medications": {"range": [0, 80]}}
    assert Study(raw).axes == {}  # features, range: one value each
    raw["data"]["columns"]["age"]["range"] = [[0, 100], [0, 120]]
    study = Study(raw)
    assert study.axes == {"data.columns.age.range": [[0, 100], [0, 120]]}
    assert [c.data.columns["age"].range for _, c in study.points] == [(0, 100), (0, 120)]
    assert len({c.key() for _, c in study.points}) == 2


def test_a_columns_groups_are_one_value_and_widen_the_declared_input(tmp_path: Path) -> None:
    """`[data.columns.NAME.groups]`: each group's list of codes is one value (a list of
    lists an axis), checked on validation, and the model's input counts its groups."""
    write_cohort(tmp_path, rows=6)
    raw = _raw(path=str(tmp_path / "cohort.csv"), features=["age", "race"])
    groups = {"asian": ["Asian"], "caucasian": ["Caucasian"]}
    raw["data"]["columns"]["race"] = {"groups": groups}
    study = Study(raw)
    assert study.axes == {}
    ((_, config),) = study.points[:1]
    assert config.data.declared_input() == (1 + len(groups) + 1, 2)
    raw["data"]["columns"]["race"]["groups"] = {"asian": [["Asian"], ["Asian", "Other"]]}
    assert Study(raw).axes == {"data.columns.race.groups.asian": [["Asian"], ["Asian", "Other"]]}
    raw["data"]["columns"]["race"]["groups"] = {"a": ["001-139"], "b": ["100-200"]}
    with pytest.raises(ConfigError, match="overlap: each code must be in one group"):
        Study(raw)


def test_a_relative_table_path_is_read_beside_the_study_file(tmp_path: Path) -> None:
    write_cohort(tmp_path, rows=6)
    (tmp_path / "study.toml").write_text(STUDY, encoding="utf-8")
    ((_, config),) = load(tmp_path / "study.toml").points[:1]
    assert config.data.path == (tmp_path / "cohort.csv").resolve()
