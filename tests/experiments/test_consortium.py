"""A patient seen by several hospitals (issue 40): the consortium-level ε of a study with
`privacy.hospitals_per_patient`, its budget `privacy.consortium_epsilon`, and the figure
in the datasheet and the report."""

from __future__ import annotations

from pathlib import Path

import pytest
from dp_accounting import dp_event as dpe
from dp_accounting import pld

from dpfl.engines.simulation import account
from dpfl.experiments.config import ConfigError, Study
from dpfl.experiments.report import write_report
from dpfl.experiments.runner import STORE, run_study
from dpfl.experiments.store import ResultsStore
from dpfl.privacy import Ledger
from dpfl.privacy.accounting import PLD_DISCRETISATION

DELTA = 1e-5
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
    assert "a patient seen by up to 2 hospitals: ε ≤ " + f"{figure['epsilon']:.3g}" in page


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
