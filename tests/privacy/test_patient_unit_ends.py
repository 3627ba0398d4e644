"""Loose ends of the patient unit (issue 40): the balanced threshold's sensitivity for a
patient-level silo, a table's declared site sizes counted in patients, and a deployed
hospital's own table split by patient as the simulator splits its silo."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from dpfl.data import DataFormatError
from dpfl.data.table import Column, read_table
from dpfl.experiments.study.datasets import build_silos, data_config
from dpfl.federation.silo import SiloInfo
from dpfl.federation.threshold import BalancedThreshold, sensitivity
from dpfl.privacy import events

HEADER = "patient,hospital,age,readmitted"


def _cohort(path: Path, patients: int = 60, seed: int = 3) -> Path:
    """Two sites, each patient at one site in 1 to 3 records."""
    rng = np.random.default_rng(seed)
    rows = [HEADER]
    for p in range(patients):
        for _ in range(int(rng.integers(1, 4))):
            age = int(rng.integers(20, 90))
            rows.append(f"{7000 + p},{'north' if p % 2 else 'south'},{age},{int(age > 60)}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_a_patient_level_threshold_counts_a_patients_records() -> None:
    silo = SiloInfo("north", 100, patient_level=True, max_records=3)
    assert sensitivity(silo) == pytest.approx(math.sqrt(2.0) * 3)
    cut = BalancedThreshold(noise=10.0)
    expected = events.gaussian(10.0 / (math.sqrt(2.0) * 3), neighbouring=silo.neighbouring)
    assert cut.event(silo).to_json() == expected.to_json()
    with pytest.raises(ValueError, match=r"'south'.*data.max_records"):
        sensitivity(SiloInfo("south", 100, patient_level=True))


def test_a_patient_level_sites_declared_size_counts_patients(tmp_path: Path) -> None:
    path = _cohort(tmp_path / "cohort.csv")
    kwargs = {
        "columns": {"age": Column(range=(0, 100))},
        "features": ["age"],
        "label": "readmitted",
        "site": "hospital",
        "unit": "patient",
    }
    read_table(path, sites={"south": 30, "north": 30}, **kwargs)  # 30 patients each
    with pytest.raises(DataFormatError, match="site 'south' holds 30 patients, fewer than"):
        read_table(path, sites={"south": 31, "north": 30}, **kwargs)


def test_a_hospitals_own_table_splits_by_patient_as_the_simulator(tmp_path: Path) -> None:
    whole = _cohort(tmp_path / "cohort.csv")
    lines = whole.read_text(encoding="utf-8").splitlines()
    own = tmp_path / "north.csv"
    own.write_text("\n".join([HEADER, *(r for r in lines[1:] if ",north," in r)]) + "\n")
    config = data_config(
        {
            "dataset": "table",
            "path": whole,
            "label": "readmitted",
            "site": "hospital",
            "unit": "patient",
            "max_records": 3,
            "features": ["age"],
            "sites": {"south": 30, "north": 30},
            "columns": {"age": {"range": [0, 100]}},
        }
    )
    simulated = build_silos(config, seed=4)[1]
    deployed = config.own_silo(4, ["south", "north"], "north", own)
    assert simulated.name == deployed.name == "north"
    assert deployed.units is not None and deployed.max_records == 3
    assert deployed.x.tolist() == simulated.x.tolist()
    assert deployed.x_test is not None and simulated.x_test is not None
    assert deployed.x_test.tolist() == simulated.x_test.tolist()
    train = set(deployed.units.tolist())
    assert len(train) < 30  # some patients are held out, each with all their records
