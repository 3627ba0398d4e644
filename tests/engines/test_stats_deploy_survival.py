"""A survival table study's statistics released by a deployment, in process: consistent
counts (a text column's categories among them), a Kaplan–Meier curve, survival compared
between the sexes (log-rank, Cox hazard ratio) and a Table 1 by sex, on 900 people of
scikit-survival's FLCHAIN at three hospitals, are the simulator's `dpfl stats` figures
for the same seed, each hospital's ledger charged with the simulator's events once."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sksurv.datasets import load_flchain

from dpfl.analytics import Figure
from dpfl.engines.flower.analytics import serve_stats
from dpfl.experiments.study.analytics import STATS_JSON, StatsRun, stats
from dpfl.experiments.study.deployment import deployment_of, study_point

from .test_flower import InProcessGrid, entries
from .test_flower import study as flower_study  # noqa: F401 (the fixture)
from .test_flower_table import table_hospitals, write
from .test_stats_deploy import _charged

SITES = ("east", "north", "south")
HEADER = ["patient", "hospital", "age", "sex", "mgus", "futime", "death"]
YEARS = "[0, 730, 1460, 2190, 2920, 3650, 4380, 5110]"
"""Two-year bins in days; a follow-up past the last edge (to 5215) is censored there."""
STUDY = f"""
name = "flchain"
seed = 5
rounds = 1
[data]
dataset = "table"
path = "flchain.csv"
time = "futime"
event = "death"
site = "hospital"
features = ["age", "sex", "mgus"]
sites = {{ east = 300, north = 300, south = 300 }}
[data.columns.age]
range = [50, 100]
[data.columns.sex]
categories = ["F", "M"]
[data.columns.mgus]
categories = ["no", "yes"]
[model]
time_bins = [730, 1460, 2190, 2920, 3650]
[algorithm]
name = "fedavg"
learning_rate = 1.0
expected_batch_size = 32
local_epochs = 1.0
[privacy]
noise_multiplier = 1.0
epsilon = 10.0
[evaluation]
queries = 0
[analytics]
noise_multiplier = 3.0
consistent = true
categories = [{{ column = "sex" }}]
kaplan_meier = {YEARS}
survival = [{{ column = "sex", bins = {YEARS} }}]
[[analytics.quantiles]]
column = "age"
bins = [50, 100]
method = "exponential"
epsilon = 0.5
probabilities = [0.25, 0.5, 0.75]
[analytics.table_one]
by = "sex"
categorical = ["mgus"]
continuous = [{{ column = "age", range = [50, 100] }}]
"""


def flchain(people: int = 900, seed: int = 3) -> list[list[Any]]:
    """`people` of FLCHAIN, drawn with `seed`, dealt to the hospitals in turn."""
    features, outcome = load_flchain()
    chosen = np.sort(np.random.default_rng(seed).choice(len(features), people, replace=False))
    age, sex, mgus = (features[c].astype(str).to_numpy() for c in ("age", "sex", "mgus"))
    return [
        [100_000 + i, SITES[k % 3], age[i], sex[i], mgus[i], outcome["futime"][i],
         int(outcome["death"][i])]
        for k, i in enumerate(chosen)
    ]  # fmt: skip


def _words(figures: list[Figure]) -> list[dict[str, Any]]:
    """The figures as plain values, which `np.testing.assert_equal` compares exactly, a
    NaN (the log-rank's std) equal to a NaN (a NaN read back from JSON is no NaN's `==`)."""
    return [dataclasses.asdict(f) for f in figures]


@pytest.fixture
def survival_study(flower_study: Path) -> Path:  # noqa: F811 (the fixture)
    """The survival study beside the whole subsample, which only the simulator reads."""
    write(flower_study.parent / "flchain.csv", flchain(), HEADER)
    flower_study.write_text(STUDY, encoding="utf-8")
    return flower_study


@pytest.mark.parametrize("summing", ["none", "masking"])
def test_deployed_survival_and_table_one_are_the_simulators_and_charge_each_ledger_once(
    survival_study: Path, tmp_path: Path, summing: str
) -> None:
    text = survival_study.read_text(encoding="utf-8")
    survival_study.write_text(
        text.replace("seed = 5\n", f'seed = 5\nsecure_aggregation = "{summing}"\n'),
        encoding="utf-8",
    )
    rows = flchain()
    own = {site: [r for r in rows if r[1] == site] for site in SITES}
    nodes = table_hospitals(survival_study, tmp_path / "hospitals", own, HEADER)
    served = serve_stats(InProcessGrid(nodes.values()), deployment_of(survival_study))
    simulated = stats(study_point(survival_study), tmp_path / "simulated")
    assert served.hospitals == simulated.hospitals == list(SITES)
    assert served.released.noise == simulated.noise
    np.testing.assert_equal(_words(served.released.figures), _words(simulated.figures))
    again = StatsRun.read(tmp_path / "simulated" / STATS_JSON)  # every field written
    np.testing.assert_equal(_words(again.figures), _words(served.released.figures))
    names = {(f.statistic, f.name) for f in simulated.figures}
    assert {("counts", "sex = M"), ("Kaplan–Meier", "S(5110)"), ("survival by sex", "log-rank p"),
            ("survival by sex", "hazard ratio M vs F")} <= names  # fmt: skip
    assert {f.cell for f in simulated.figures if f.name == "mgus = yes (%)"} == {
        (site, sex) for site in (*SITES, "pooled") for sex in ("F", "M", "other", "all")
    }
    assert any(np.isnan(f.std) for f in simulated.figures)  # the log-rank's, by design
    book = _charged(tmp_path / "simulated" / "ledger.sqlite")
    for name, node in nodes.items():
        mine = entries(Path(node["ledger"]), f"{name}/trial-0")
        assert len(mine) == 5 and mine == book[f"{name}/trial-0"]
        ages = np.array([float(r[HEADER.index("age")]) for r in own[name]])
        median = next(f for f in simulated.figures if f.name == f"hospital {name}: quantile 0.5")
        assert abs(median.value - np.median(ages)) < 3  # its own, by the exponential mechanism
        assert 0 < served.epsilon[name] <= 10.0
