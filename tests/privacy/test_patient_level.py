"""Patient-level privacy within a hospital (user-level sampling): patients are sampled,
each one's records clipped as one; events, public sizes and the datasheet say so; the
record-level datasheet of data with patients shows the group-privacy figure."""

from __future__ import annotations

import csv
import html
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.data.sampling import PatientPoissonSampler
from dpfl.experiments.results.datasheet import group_privacy
from dpfl.experiments.results.store import ResultsStore
from dpfl.federation.algorithms.aop import AOP
from dpfl.federation.silo import Silo, SiloInfo
from dpfl.local.clipping import ClippedGradientSum
from dpfl.local.losses import bce
from dpfl.local.output_perturbation import AOPConfig
from dpfl.models import logistic_regression
from dpfl.privacy import Neighbouring, events
from dpfl.privacy.events import PrivacyEvent


def test_a_patients_clipped_sum_is_bounded_by_c_whatever_their_record_count() -> None:
    torch.manual_seed(0)
    model = nn.Linear(5, 1)
    params = {"weight": torch.ones(1, 5), "bias": torch.zeros(1)}
    clipped = ClippedGradientSum(model, bce)
    for records in (1, 40):
        x = 50 * torch.rand(records, 5)  # confident and wrong: every gradient far above C
        y = torch.zeros(records)
        sums, norms = clipped.grouped(params, x, y, torch.zeros(records, dtype=torch.long), 0.5)
        total = torch.cat([g.flatten() for g in sums.values()]).norm()
        assert norms.shape == (1,) and norms[0] > 0.5
        assert total <= 0.5 + 1e-5  # one unit of C, not 40


def test_patients_join_batches_binomially_with_all_their_records() -> None:
    rng = np.random.default_rng(1)
    counts = rng.integers(1, 41, size=200)  # 1 to 40 records a patient
    units = rng.permutation(np.repeat(np.arange(200), counts))
    sampler = PatientPoissonSampler(units, 0.1, np.random.default_rng(2), public_size=200)
    drawn = []
    for _ in range(2000):
        batch = sampler.sample()
        chosen = np.unique(units[batch])
        assert np.array_equal(np.sort(batch), np.flatnonzero(np.isin(units, chosen)))
        drawn.append(len(chosen))
    observed = np.bincount(drawn, minlength=201)
    expected = stats.binom.pmf(np.arange(201), 200, 0.1) * len(drawn)
    keep = expected >= 5  # pool the tails into one cell each
    cells = np.concatenate([observed[keep], [observed[~keep].sum()]])
    want = np.concatenate([expected[keep], [expected[~keep].sum()]])
    assert stats.chisquare(cells, want * cells.sum() / want.sum()).pvalue > 1e-3
    capped = PatientPoissonSampler(
        units, 1.0, np.random.default_rng(3), public_size=200, max_records=3
    )
    assert np.bincount(units[capped.sample()]).max() == 3


def test_adding_a_whole_patient_changes_no_declared_event() -> None:
    from dpfl.federation.algorithms.fedavg import FedAvg
    from dpfl.local.dpsgd import DPSGDConfig

    algorithm = FedAvg(
        model=nn.Linear(3, 1),
        loss=bce,
        dpsgd=DPSGDConfig(clip_norm=1.0, noise_multiplier=1.1, learning_rate=0.1),
        expected_batch_size=8.0,
    )
    rng = np.random.default_rng(4)
    units = np.repeat(np.arange(50), 3)
    x, y = rng.normal(size=(150, 3)), rng.integers(0, 2, 150)
    silo = Silo.from_arrays("a", x, y, public_size=40, units=units)
    bigger = Silo.from_arrays(
        "a",
        np.vstack([x, rng.normal(size=(40, 3))]),
        np.concatenate([y, np.ones(40)]),
        public_size=40,
        units=np.concatenate([units, np.full(40, 50)]),
    )
    event = algorithm.training_event(silo.info)
    assert event == algorithm.training_event(bigger.info)
    assert event.neighbouring is Neighbouring.ADD_REMOVE_PATIENT
    assert "one patient's records" in event.describe()
    assert PrivacyEvent.from_json(event.to_json()) == event
    samplers = [algorithm.sampler_of(s, np.random.default_rng(0)) for s in (silo, bigger)]
    assert {s.expected_batch_size for s in samplers} == {8.0}
    assert samplers[0].privacy_event(1.1, algorithm.local_steps(silo.info)) == event


def test_group_privacy_is_vadhans_bound() -> None:
    for epsilon, delta, k in [(1.0, 1e-5, 1), (1.0, 1e-5, 40), (0.3, 1e-6, 5)]:
        assert group_privacy(epsilon, delta, k) == pytest.approx(
            (k * epsilon, min(1.0, k * math.e ** ((k - 1) * epsilon) * delta))
        )
    assert group_privacy(0.5, 1e-5, 4) == pytest.approx((2.0, 4 * math.exp(1.5) * 1e-5))


def test_aop_takes_a_capped_patient_and_refuses_an_uncapped_one() -> None:
    aop = AOP(logistic_regression(3), bce, AOPConfig(2.0, 1e-5, 1.0, 1e-4, 1.0), epochs=2)
    capped = SiloInfo("a", 100, patient_level=True, max_records=4)
    assert aop.participation_event(capped, [capped]) == events.approximate_dp(
        1.0, 5e-6, neighbouring=Neighbouring.ADD_REMOVE_PATIENT
    )
    record = SiloInfo("b", 100)
    assert aop.participation_event(record, [record]) == events.approximate_dp(1.0, 5e-6)
    with pytest.raises(ValueError, match=r"^aop: silo 'a' .*no declared cap .*max_records"):
        aop.participation_event(SiloInfo("a", 100, patient_level=True), [capped])
    with pytest.raises(ValueError, match="node-level"):
        aop.participation_event(SiloInfo("c", 100, appearances=3), [record])


STUDY = """
name = "patients"
rounds = 2
eval_every = "end"
metrics = ["accuracy"]

[data]
dataset = "table"
path = "cohort.csv"
label = "readmitted"
site = "hospital"
features = ["age"]
sites = {{ north = 60, south = 60 }}
{unit}

[data.columns.age]
range = [0, 100]

[algorithm]
{algorithm}

[privacy]
epsilon = 2.0
delta = 1e-5
"""


def _cohort(folder: Path) -> None:
    """Two hospitals, 80 patients each with 1 to 5 encounters."""
    rng = np.random.default_rng(5)
    with (folder / "cohort.csv").open("w", newline="") as file:
        out = csv.writer(file)
        out.writerow(["patient_nbr", "hospital", "age", "readmitted"])
        for patient in range(160):
            age = int(rng.integers(18, 96))
            for _ in range(int(rng.integers(1, 6))):
                out.writerow([9000 + patient, ["north", "south"][patient % 2], age, int(age > 60)])


FEDAVG = 'name = "fedavg"\nlearning_rate = 1.0\nexpected_batch_size = 8'
PATIENTS = 'unit = "patient_nbr"\nmax_records = 4'


@pytest.mark.parametrize(
    ("unit", "algorithm", "patient_level"),
    [
        (PATIENTS, FEDAVG, True),
        ("max_records = 5", FEDAVG, False),
        (PATIENTS, 'name = "aop"\nregularization = 1.0', True),
    ],
)
def test_a_patient_level_study_runs_end_to_end(
    tmp_path: Path, unit: str, algorithm: str, patient_level: bool
) -> None:
    """Patient-level and record-level runs, and the ledger and report say which."""
    _cohort(tmp_path)
    (tmp_path / "study.toml").write_text(STUDY.format(unit=unit, algorithm=algorithm))
    runs = tmp_path / "runs"
    result = CliRunner().invoke(
        app, ["sweep", str(tmp_path / "study.toml"), "--out", str(runs), "-j", "1", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["failed"] == 0
    with ResultsStore(runs / "results.sqlite", create=False) as store:
        sheet = store.runs()[0].datasheet
    silos = sheet["silos"]
    _says_its_unit(runs, patient_level)
    if patient_level:
        assert sheet["unit"].startswith("one patient with all their records")
        assert all("one patient's records" in e for s in silos.values() for e in s["events"])
    else:
        figure = next(iter(silos.values()))["patient_group_privacy"]
        eps = figure["record_epsilon"]
        assert figure["records"] == 5 and 0 < eps <= 2.0
        assert figure["epsilon"] == pytest.approx(5 * eps)
        assert figure["delta"] == pytest.approx(min(1, 5 * math.exp(4 * eps) * 1e-5))


def _says_its_unit(runs: Path, patient_level: bool) -> None:
    """`dpfl privacy ledger` (table and JSON) and `dpfl report` name the run's relation."""
    said, unsaid = ("one patient's records", "add/remove one record")
    if not patient_level:
        said, unsaid = unsaid, said
    (ledger,) = (runs / "ledgers").iterdir()
    table = CliRunner().invoke(app, ["privacy", "ledger", str(ledger)])
    assert table.exit_code == 0, table.output
    assert said in table.output and unsaid not in table.output
    listed = CliRunner().invoke(app, ["privacy", "ledger", str(ledger), "--json"])
    relation = "add_remove_patient" if patient_level else "add_remove"
    assert {a["neighbouring"] for a in json.loads(listed.stdout)} == {relation}
    report = CliRunner().invoke(app, ["report", str(runs), "--json"])
    assert report.exit_code == 0, report.output
    page = html.unescape(Path(json.loads(report.stdout)["report"]).read_text())
    unit = "one patient with all their records" if patient_level else "one patient record:"
    assert unit in page and said in page and unsaid not in page
