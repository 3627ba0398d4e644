"""A table study deployed: each hospital reads its own CSV through the study's schema and
splits it as the simulator splits its silo; the server reads no record, its model's input
the schema's, and a hospital that announces another is refused."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dpfl.data.dataset import DataFormatError
from dpfl.engines.flower import DeploymentError, HospitalConfig, loopback, serve
from dpfl.experiments.study.datasets import build_silos
from dpfl.experiments.study.deployment import deployment_of, study_point

from .test_flower import CLEAR, DELTA, EPSILON, InProcessGrid, entries, simulated
from .test_flower import study as flower_study  # noqa: F401 (the fixture)

SITES = {"east": 150, "north": 150, "south": 150}
"""In the deployment's order of its hospitals (by name), which the simulator's then is."""
STUDY = """
name = "readmission"
seed = 5
rounds = 2
[data]
dataset = "table"
path = "cohort.csv"
label = "readmitted"
site = "hospital"
features = ["age", "race", "medications"]
sites = { east = 150, north = 150, south = 150 }
[data.columns.age]
range = [0, 100]
[data.columns.race]
categories = ["Caucasian", "AfricanAmerican", "Asian"]
[data.columns.medications]
range = [0, 80]
missing = "zero"
[algorithm]
name = "fedavg"
learning_rate = 1.0
expected_batch_size = 32
local_epochs = 1.0
[privacy]
noise_multiplier = 1.0
epsilon = 10.0
"""
HEADER = ["patient", "hospital", "age", "race", "medications", "readmitted"]


def cohort(rows: int = 540, seed: int = 11) -> list[list[Any]]:
    """A 3-site readmission cohort, with empty cells and a race outside the list."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(rows):
        age, medications = int(rng.integers(18, 96)), int(rng.integers(1, 60))
        risk = 0.04 * (age - 60) + 0.06 * (medications - 25)
        race = rng.choice(["Caucasian", "AfricanAmerican", "Asian", "Martian", ""])
        out.append(
            [
                900_000 + i,
                list(SITES)[i % 3],
                age,
                race,
                "" if i % 40 == 0 else medications,
                int(rng.random() < 1 / (1 + np.exp(-risk))),
            ]
        )
    return out


def write(path: Path, rows: list[list[Any]], header: Sequence[str] = HEADER) -> Path:
    with path.open("w", newline="", encoding="utf-8") as file:
        csv.writer(file).writerows([header, *rows])
    return path


def table_hospitals(
    path: Path,
    root: Path,
    rows: dict[str, list[list[Any]]] | None = None,
    header: Sequence[str] = HEADER,
) -> dict[str, Any]:
    """Each site's hospital with only its own rows (or `rows`', under `header`), as its
    own CSV."""
    config = study_point(path)
    everyone = cohort()
    root.mkdir(parents=True)
    nodes = {}
    for silo in build_silos(config.data, config.seed):
        mine = (rows or {}).get(silo.name, [r for r in everyone if r[1] == silo.name])
        own = write(root / f"{silo.name}.csv", mine, header)
        node = loopback.hospital_node(
            silo, path, root / silo.name, epsilon=EPSILON, delta=DELTA, table=own
        )
        nodes[silo.name] = node
    loopback.pin_roster(path, nodes)
    return nodes


@pytest.fixture
def table_study(flower_study: Path) -> Path:  # noqa: F811 (the fixture)
    """The table study beside the whole cohort, which only the simulator reads."""
    write(flower_study.parent / "cohort.csv", cohort())
    flower_study.write_text(STUDY + CLEAR, encoding="utf-8")  # the simulator's figures
    return flower_study


def test_in_process_each_hospital_reads_its_own_csv_and_ends_with_the_simulators_model(
    table_study: Path, tmp_path: Path
) -> None:
    nodes = table_hospitals(table_study, tmp_path / "hospitals")
    assert all(Path(n["data"]).suffix == ".csv" for n in nodes.values())
    run = deployment_of(table_study)
    assert run.schema == ((6,), 2)  # age, race (3 + other), medications; two classes
    result = serve(InProcessGrid(nodes.values()), run)
    simulation, book = simulated(table_study, tmp_path)
    assert result.rounds_completed == 2 and not result.refused
    assert result.metrics == simulation.silo_metrics[0]  # on each hospital's own test set
    for name, value in simulation.params.items():
        assert torch.equal(result.params[name], value[0])  # bit for bit
    for name, node in nodes.items():
        assert result.silos[[s.name for s in result.silos].index(name)].public_size == 120
        mine = entries(Path(node["ledger"]), f"{name}/trial-0")
        assert mine == [e.event.to_json() for e in book.entries(f"{name}/trial-0")]
        assert 0 < result.epsilon[name] <= EPSILON
    book.close()


def test_a_hospital_file_with_another_sites_row_is_refused_naming_the_row(
    table_study: Path, tmp_path: Path
) -> None:
    rows = [r for r in cohort() if r[1] == "south"]
    rows[4][1] = "north"
    nodes = table_hospitals(table_study, tmp_path / "hospitals", {"south": rows})
    south = nodes["south"]
    run = deployment_of(table_study)
    me = HospitalConfig.from_node_config(south)
    with pytest.raises(DataFormatError, match=r"south\.csv.*line 6.*hospital.*'north'"):
        me.silo(run)


def test_a_hospital_whose_records_have_another_width_is_refused_naming_it(
    table_study: Path, tmp_path: Path
) -> None:
    nodes = table_hospitals(table_study, tmp_path / "hospitals")
    east = Path(nodes["east"]["data"]).parent
    np.savez(east / "train.npz", x=np.zeros((130, 5), np.float32), y=np.arange(130) % 2)
    nodes["east"]["data"] = str(east)
    with pytest.raises(DeploymentError, match=r"^east's records have shape \[5\] and 2 "):
        serve(InProcessGrid(nodes.values()), deployment_of(table_study))
