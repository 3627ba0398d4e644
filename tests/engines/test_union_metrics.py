"""The union of the hospitals' test sets in a deployment: each hospital sends counts
(`flower_protocol.union_counts`), never its scores, and the server's metrics of the union
(`union_metrics`) are the simulator's (`evaluation.evaluate`) on the same model and test
sets: counts exactly, ranking metrics to their bins' error."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, Message
from flwr.common.config import parse_config_args
from torch import nn
from typer.testing import CliRunner

from dpfl.cli import app, deploy
from dpfl.engines.evaluation import evaluate, metrics, predictions
from dpfl.engines.flower import HospitalConfig, serve
from dpfl.engines.flower.protocol import fields_of, union_counts, union_metrics
from dpfl.experiments.study.deployment import deployment_of
from dpfl.federation.silo import Silo
from dpfl.local.losses import Loss, logistic_hazard
from dpfl.privacy import events

from .test_flower import (
    CLEAR,
    STUDY,
    InProcessGrid,
    approve_node,
    evaluations,
    hospitals,
    simulated,
    study,
)

__all__ = ["study"]  # the fixture, imported so that pytest finds it

SIZES = (150, 200, 250)


def silos(labels: str) -> list[Silo]:
    """Three hospitals' test sets of 5 features, seeded, each shifted from the others:
    `labels` "classes" (3 classes) or "survival" ((time, event), times scaled by
    hospital, so the pairs across hospitals weigh in the union's concordance)."""
    generator = torch.Generator().manual_seed(5)
    out = []
    for k, n in enumerate(SIZES):
        x = torch.randn(n, 5, generator=generator) + 0.3 * k
        if labels == "classes":
            y = torch.randint(0, 3, (n,), generator=generator)
        else:
            scale = torch.exp(-x[:, 0]) * (1.0 + k)
            time = -torch.log(torch.rand(n, generator=generator)) * scale * 100
            event = (torch.rand(n, generator=generator) < 0.7).float()
            y = torch.stack([time, event], dim=1)
        out.append(Silo(f"hospital-{k}", x[:10], y[:10], x_test=x, y_test=y))
    return out


def deployed(model: nn.Module, tested: list[Silo], loss: Loss | None) -> dict[str, float]:
    """The deployment's union: each hospital's counts and its own loss, combined."""
    params = dict(model.named_parameters())
    counted, losses = [], []
    for silo in tested:
        assert silo.x_test is not None and silo.y_test is not None
        labels = silo.y_test.numpy()
        scores = predictions(model, params, silo.x_test, silo.survival)
        counted.append(union_counts(labels, scores, loss))
        own = metrics(labels, scores, loss)
        losses += [(own["loss"], len(labels))] if "loss" in own else []
    return union_metrics(counted, losses)


def simulator_union(model: nn.Module, tested: list[Silo], loss: Loss | None) -> dict[str, float]:
    params = dict(model.named_parameters())
    (row,) = evaluate(model, [[params]] * len(tested), tested, 0, loss)
    union: dict[str, float] = row["metrics"]
    return union


def test_a_multiclass_union_is_the_simulators() -> None:
    torch.manual_seed(0)
    model, tested = nn.Linear(5, 3), silos("classes")
    union, simulator = deployed(model, tested, None), simulator_union(model, tested, None)
    assert union.keys() == simulator.keys()
    for metric in ("accuracy", "balanced_accuracy", "precision", "recall"):
        assert union[metric] == simulator[metric]  # the confusion matrix: exact
    assert union["loss"] == pytest.approx(simulator["loss"], rel=1e-12)
    for metric in ("auroc", "auprc"):  # one-vs-rest on scores binned to 1e-4
        assert union[metric] == pytest.approx(simulator[metric], abs=1e-3)
        assert not math.isnan(union[metric])


@pytest.mark.parametrize("outputs", [1, 4], ids=["risk-score", "hazard-logits"])
def test_a_survival_union_c_index_is_the_simulators_to_its_bins(outputs: int) -> None:
    """The pairs within a hospital exactly, those across hospitals on bins of about 1% of
    a time and 0.1% of a risk: within 1e-3 of the union's, where the within-hospital
    pairs alone (the stratified concordance) are not."""
    torch.manual_seed(0)
    model, tested = nn.Linear(5, outputs), silos("survival")
    loss = logistic_hazard([50.0, 100.0, 200.0]) if outputs > 1 else None
    union, simulator = deployed(model, tested, loss), simulator_union(model, tested, loss)
    assert union.keys() == {"c_index"}
    assert union["c_index"] == pytest.approx(simulator["c_index"], abs=1e-3)
    pairs = np.sum([_pairs(silo, model, loss) for silo in tested], axis=0)
    stratified = (pairs[0] + pairs[2] / 2) / pairs.sum()
    assert abs(stratified - simulator["c_index"]) > 5e-3  # the cross pairs matter here


def _pairs(silo: Silo, model: nn.Module, loss: Loss | None) -> list[int]:
    assert silo.x_test is not None and silo.y_test is not None
    params = dict(model.named_parameters())
    scores = predictions(model, params, silo.x_test, True)
    pairs: list[int] = union_counts(silo.y_test.numpy(), scores, loss)["pairs"]
    return pairs


SURVIVAL_STUDY = """
name = "deployed-survival"
seed = 3
rounds = 2
[data]
dataset = "gse7390"
path = "{path}"
options = {{ task = "survival" }}
partition = {{ kind = "iid", silos = 3 }}
[model]
time_bins = [365.0, 730.0, 1095.0, 1825.0, 2555.0, 3650.0]
[algorithm]
name = "fedavg"
learning_rate = 0.5
expected_batch_size = 16
[privacy]
noise_multiplier = 1.0
epsilon = 10.0
[evaluation]
release = "clear"
"""


def test_in_process_a_deployed_survival_study_scores_the_simulators_union(
    study: Path, tmp_path: Path, shared_data: Path
) -> None:
    """The hospital half counts, the server half combines: a deployed survival study's
    union `c_index` is the simulator's to its bins'."""
    study.write_text(SURVIVAL_STUDY.format(path=shared_data / "gse7390"), encoding="utf-8")
    nodes = hospitals(study, tmp_path / "hospitals")
    result = serve(InProcessGrid(nodes.values()), deployment_of(study))
    simulation, book = simulated(study, tmp_path)
    book.close()
    assert result.rounds_completed == 2 and result.union.keys() == {"c_index"}
    union = simulation.final_metrics()["c_index"]
    assert result.union["c_index"] == pytest.approx(union, abs=1e-3)


@pytest.mark.parametrize("release", ["dp", "clear"])
def test_in_process_a_hospital_deployed_with_no_union_sends_its_own_metrics_only(
    study: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, release: str
) -> None:
    """`--no-union` (node config union=false): the server reports no union and names who
    withheld it, and that hospital's own metrics follow the study's rule: DP, its noisy
    counts only (no clear figure), charged to its ledger, the server reading its metrics
    off them; clear, its metrics and no counts, logged OUTSIDE ε."""
    study.write_text(STUDY + (CLEAR if release == "clear" else ""), encoding="utf-8")
    nodes = hospitals(study, tmp_path / "hospitals")
    nodes["hospital-1"]["union"] = False
    grid = InProcessGrid(nodes.values())
    sent: dict[str, dict[str, Any]] = {}

    def recording(message: Message, context: Context) -> Message:
        reply = grid.app(message, context)
        if message.metadata.message_type.endswith("evaluate"):
            sent[str(context.node_config["name"])] = fields_of(reply)
        return reply

    grid.apps = dict.fromkeys(grid.contexts, recording)
    with caplog.at_level(logging.INFO, logger="flwr"):
        result = serve(grid, deployment_of(study))
    assert result.union == {} and result.metrics.keys() == nodes.keys()
    messages = [r.getMessage() for r in caplog.records]
    assert "no union of the test sets: hospital-1 withheld its counts" in messages
    charged = evaluations(Path(nodes["hospital-1"]["ledger"]), "hospital-1/trial-0")
    if release == "dp":
        assert sent["hospital-1"].keys() == {"metrics", "noisy", "union", "epsilon", "receipt"}
        assert sent["hospital-1"]["union"] is False and sent["hospital-0"]["union"] is True
        assert charged == [events.gaussian(5.0).to_json()]
    else:
        assert set(sent["hospital-1"]) == {"metrics", "names", "values"}
        assert {"cells", "records"} <= set(sent["hospital-0"])
        assert charged == []
        (withheld,) = [m for m in messages if m.startswith("hospital-1: released")]
        assert "OUTSIDE ε" in withheld and "(no union: --no-union)" in withheld


def test_a_union_switch_that_is_not_a_boolean_is_refused() -> None:
    """A string "false" in the node config must not read as true (counts sent)."""
    node = {k: "x" for k in HospitalConfig.KEYS} | {"epsilon": 1.0, "delta": 1e-5}
    with pytest.raises(ValueError, match="union must be true or false, got 'false'"):
        HospitalConfig.from_node_config(node | {"union": "false"})


def test_dpfl_deploy_hospital_no_union_reaches_the_node_config(
    study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dpfl deploy hospital --no-union` starts its SuperNode with union=false, which
    Flower parses to False (the hospital's `HospitalConfig.union`)."""
    node = hospitals(study, tmp_path / "hospitals")["hospital-1"]
    approve_node(node)
    started: list[list[str]] = []
    monkeypatch.setattr(deploy, "_run_supernode", lambda command, **_: started.append(command))
    options = ["data", "epsilon", "delta", "ledger", "identity", "public-size"]
    args = [a for k in options for a in (f"--{k}", str(node[k]))]
    base = ["deploy", "hospital", str(study), "--name", "hospital-1", *args, "--insecure"]
    for flag, union in [([], True), (["--no-union"], False)]:
        result = CliRunner().invoke(app, [*base, "--superlink", "127.0.0.1:1", *flag])
        assert result.exit_code == 0, result.output
        config = parse_config_args([started[-1][started[-1].index("--node-config") + 1]])
        assert HospitalConfig.from_node_config(config).union is union
