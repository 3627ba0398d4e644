"""Values a hostile server sends a deployed hospital, checked before anything is built or
charged (issue 46's items 3 and 5): a model holding ∞ or NaN, a feature shape, class
count or public size that is not the study's. The hospital refuses in one line, charges
nothing, and answers the next honest message. In process."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from dpfl.experiments.study import deployment
from dpfl.federation.algorithms.base import Algorithm, Reply
from dpfl.federation.messages import Encoding, encode

from .conftest import public_fields
from .test_flower import InProcessGrid, entries, hospitals, study, untouched
from .test_flower_calibration import CALIBRATED
from .test_flower_table import flower_study, table_hospitals, table_study
from .test_roster import asked

__all__ = ["flower_study", "study", "table_study"]  # the fixtures, used by name

WIDTH = 31
"""The breast-cancer study's logistic regression: 30 weights and a bias."""


def _model(**at: float) -> bytes:
    """A model of zeros, with the values `at` ("i": value) at those indices."""
    vector = torch.zeros(WIDTH)
    for index, value in at.items():
        vector[int(index.removeprefix("w"))] = value
    return encode(Encoding.FLOAT32, vector)


@pytest.mark.parametrize("value", [torch.inf, -torch.inf, torch.nan])
def test_a_model_holding_infinity_or_nan_is_refused_charging_nothing(
    study: Path, tmp_path: Path, value: float, caplog: pytest.LogCaptureFixture
) -> None:
    """The audit's attack: ∞ in one input weight, which a record with an exact 0 in that
    feature turns into a NaN reply whatever the noise."""
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    fields = public_fields(study)
    train = {**fields, "cohort": list(fields["silos"])}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        reply = asked(grid, 2, "train", {**train, "params": _model(w3=value)})
    assert reply == {"refused": "the server's model holds NaN or infinity (in 'weight'): refused"}
    (line,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert "\n" not in line and line.startswith("hospital-0: round 0: refused: ")
    assert entries(Path(nodes["hospital-0"]["ledger"]), "hospital-0/trial-0") == []
    evaluated = asked(grid, 2, "evaluate", {**fields, "params": _model(w30=value)})
    assert "the server's model holds NaN or infinity (in 'bias')" in evaluated["error"]
    # it stays up: the same hospital answers an honest model, and pays for that round only
    assert "epsilon" in asked(grid, 2, "train", {**train, "params": _model()})
    assert len(entries(Path(nodes["hospital-0"]["ledger"]), "hospital-0/trial-0")) == 1


def test_a_reply_that_is_not_finite_is_not_sent(
    study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should anything after the noise overflow (post-processing of what was charged),
    the reply is refused, never sent."""
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    fields = public_fields(study)
    real = Algorithm.client_update

    def overflowing(self: Algorithm, *args: Any) -> tuple[Reply, Any]:
        reply, local = real(self, *args)
        assert reply is not None
        return Reply(reply.vector * torch.inf), local

    monkeypatch.setattr(Algorithm, "client_update", overflowing)
    reply = asked(grid, 2, "train", {**fields, "cohort": list(fields["silos"]), "params": _model()})
    assert reply == {"refused": "its reply holds NaN or infinity: charged, not sent"}
    assert len(entries(Path(nodes["hospital-0"]["ledger"]), "hospital-0/trial-0")) == 1


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The study's algorithm built only at the study's shape and classes: a hospital that
    built one at the server's word fails here, before it allocates it."""
    real = deployment.algorithm_for

    def built(config: Any, silos: Any, shape: list[int], classes: int) -> Any:
        assert list(shape) in ([30], [6]) and classes == 2, f"built at {shape}, {classes}"
        return real(config, silos, shape, classes)

    monkeypatch.setattr(deployment, "algorithm_for", built)


def _refused_everywhere(grid: InProcessGrid, fields: dict[str, Any], why: str) -> None:
    """The plan and the train message are refused, in one line saying `why`."""
    plan = asked(grid, 2, "query.plan", fields)
    assert why in plan["error"] and "\n" not in plan["error"].strip(), plan
    train = asked(grid, 2, "train", {**fields, "cohort": list(fields["silos"])})
    assert why in train["error"], train


@pytest.mark.parametrize(
    ("facts", "why"),
    [
        ({"shape": [10**9]}, "shape [1000000000] and 2 classes; hospital-0's are [30] and 2"),
        ({"shape": [30, 10**6]}, "shape [30, 1000000] and 2 classes"),
        ({"shape": "30"}, "shape '30' and 2 classes"),
        ({"classes": 10**9}, "[30] and 1000000000 classes; hospital-0's are [30] and 2 (or up"),
        ({"classes": 1}, "[30] and 1 classes; hospital-0's are [30] and 2 (or up to 1024"),
        ({"sizes": [120, -150, 120]}, "public sizes below 1 or not the study's"),
    ],
)
def test_a_server_stated_shape_class_count_or_size_is_refused_before_anything_is_built(
    study: Path, tmp_path: Path, guarded: None, facts: dict[str, Any], why: str
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    fields = public_fields(study)
    if "sizes" in facts:  # this hospital's own size stays its own: another's is the lie
        facts = {"sizes": [fields["sizes"][0], *facts["sizes"][1:]]}
    _refused_everywhere(grid, {**fields, **facts}, why)
    assert untouched(nodes["hospital-0"])  # nothing charged, or opened
    assert asked(grid, 2, "query.plan", fields)["accepted"]  # it stays up


def test_a_table_studys_classes_and_declared_sizes_are_the_studys(
    table_study: Path, tmp_path: Path, guarded: None
) -> None:
    """A schema fixes the classes exactly, and declared sites fix every public size."""
    nodes = table_hospitals(table_study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    fields = {**public_fields(table_study), "shape": [6]}
    _refused_everywhere(grid, {**fields, "classes": 3}, "[6] and 3 classes; east's are [6] and 2")
    lied = [fields["sizes"][0], fields["sizes"][1] + 1, fields["sizes"][2]]
    _refused_everywhere(grid, {**fields, "sizes": lied}, "public sizes below 1 or not the study's")
    assert asked(grid, 2, "query.plan", fields)["accepted"]


@pytest.mark.parametrize("sigma", [torch.inf, torch.nan, 0.0])
def test_a_calibrated_studys_sigma_must_be_finite_and_positive(
    study: Path, tmp_path: Path, sigma: float
) -> None:
    """Refused where the server's σ is read, before the accountant sees it (σ = ∞ used to
    reach it, and come back as its PrivacyParameterError)."""
    study.write_text(CALIBRATED, encoding="utf-8")
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    fields = {**public_fields(study), "noise": [sigma] * 3}
    _refused_everywhere(grid, fields, "the server states no finite σ > 0 for each silo")
    assert asked(grid, 2, "query.plan", {**fields, "noise": [1.0] * 3})["accepted"]
