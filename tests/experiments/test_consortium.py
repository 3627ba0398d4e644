"""A patient seen by several hospitals (issue 40): the consortium-level ε of a study with
`privacy.hospitals_per_patient`, its budget `privacy.consortium_epsilon`, and the figure
in the datasheet and the report, which say what it covers at each hospital (issue 46)."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pytest
from dp_accounting import dp_event as dpe
from dp_accounting import pld

from dpfl.experiments.results.report import write_report
from dpfl.experiments.results.store import ResultsStore
from dpfl.experiments.study.config import ConfigError, Study
from dpfl.experiments.study.point import STORE
from dpfl.experiments.study.runner import run_study
from dpfl.privacy import Ledger
from dpfl.privacy.accounting import PLD_DISCRETISATION
from dpfl.privacy.accounts import account

DELTA = 1e-5
RECORD_AT_EACH = (
    "one record at each of up to {h} hospitals (record-level: a patient with several "
    "records at a hospital is not covered by it)"
)
PATIENT_AT_EACH = "one patient, with all their records, at each of up to {h} hospitals"
STUDY = {
    "name": "consortium",
    "rounds": 3,
    "data": {"dataset": "breast_cancer", "partition": {"kind": "dirichlet", "silos": 3}},
    "algorithm": {"name": "fedavg", "learning_rate": 1.0},
}


def test_the_consortium_budget_sets_sigma_and_the_figure_is_the_ledgers(tmp_path: Path) -> None:
    privacy = {"consortium_epsilon": 2.0, "hospitals_per_patient": 2, "delta": DELTA}
    (run,) = run_study(Study({**STUDY, "privacy": privacy}), tmp_path)
    figure = run.datasheet["consortium"]
    assert figure["declared"] == 2 and len(figure["silos"]) == 2
    assert 1.9 < figure["epsilon"] <= 2.0  # calibrated to it: the least σ that meets it
    with ResultsStore(tmp_path / STORE) as store, Ledger(store.ledger_of(run)) as book:
        worst = [
            book.entries(account(silo, 0))[i].event.dp_event
            for silo in figure["silos"]
            for i in range(len(book.entries(account(silo, 0))))
        ]
        independent = pld.PLDAccountant(value_discretization_interval=PLD_DISCRETISATION)
        independent.compose(dpe.ComposedDpEvent(worst))
        assert figure["epsilon"] == pytest.approx(independent.get_epsilon(DELTA), rel=1e-6)
        assert max(store.epsilon_by_silo(run).by_silo.values()) < figure["epsilon"]
    page = write_report(tmp_path).read_text()
    assert f"{RECORD_AT_EACH.format(h=2)}: ε ≤ {figure['epsilon']:.3g}" in page


def test_the_figure_is_shown_beside_a_record_budget(tmp_path: Path) -> None:
    privacy = {"epsilon": 1.0, "hospitals_per_patient": 3, "delta": DELTA}
    (run,) = run_study(Study({**STUDY, "privacy": privacy}), tmp_path)
    with ResultsStore(tmp_path / STORE) as store:
        per_silo = store.epsilon_by_silo(run).by_silo
    assert max(per_silo.values()) <= 1.0 < run.datasheet["consortium"]["epsilon"]
    assert (
        "consortium"
        not in run_study(Study({**STUDY, "privacy": {"epsilon": 1.0}}), tmp_path / "b")[0].datasheet
    )


@pytest.mark.parametrize("unit", [None, "patient"])
def test_the_figure_says_what_it_covers_at_each_hospital(tmp_path: Path, unit: str | None) -> None:
    """One record at each of h hospitals where the unit is the record (the figure of a
    patient's several records there is each silo's group-privacy one), one patient with
    all their records where the study declares its unit."""
    rng = np.random.default_rng(2)
    rows = ["patient,hospital,age,readmitted"]
    for patient in range(80):
        age = int(rng.integers(18, 96))
        for _ in range(int(rng.integers(1, 4))):
            rows.append(f"{patient},{['north', 'south'][patient % 2]},{age},{int(age > 60)}")
    (tmp_path / "cohort.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    data = {
        "dataset": "table",
        "path": str(tmp_path / "cohort.csv"),
        "label": "readmitted",
        "site": "hospital",
        "features": ["age"],
        "sites": {"north": 30, "south": 30},
        "columns": {"age": {"range": [0, 100]}},
        "max_records": 3,
        **({} if unit is None else {"unit": unit}),
    }
    privacy = {"noise_multiplier": 1.0, "hospitals_per_patient": 2, "delta": DELTA}
    study = Study({**STUDY, "rounds": 1, "data": data, "privacy": privacy})
    (run,) = run_study(study, tmp_path / "runs")
    figure = run.datasheet["consortium"]
    said, unsaid = (RECORD_AT_EACH, PATIENT_AT_EACH)[:: 1 if unit is None else -1]
    page = html.unescape(write_report(tmp_path / "runs").read_text())
    assert f"{said.format(h=2)}: ε ≤ {figure['epsilon']:.3g}" in page
    assert unsaid.format(h=2) not in page and "a patient seen by up to" not in page


@pytest.mark.parametrize(
    ("privacy", "says"),
    [
        ({"consortium_epsilon": 2.0}, "needs hospitals_per_patient"),
        (
            {"consortium_epsilon": 2.0, "hospitals_per_patient": 2, "noise_multiplier": 1.0},
            "give no noise_multiplier",
        ),
        (
            {"consortium_epsilon": 2.0, "hospitals_per_patient": 2, "calibration": "per-silo"},
            "calibration = 'common'",
        ),
        ({"hospitals_per_patient": 0, "epsilon": 1.0}, "greater than or equal to 1"),
    ],
)
def test_bad_consortium_keys_are_refused(privacy: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Study({**STUDY, "privacy": privacy})
