"""A deployed hospital's evaluation is a release (`flower_protocol.Evaluation`): by
default DP counts charged to its ledger before they leave and planned with its rounds;
clear figures only where the study says so, labelled outside ε. It scores only the final
model of a run it trained in, one model a run, and at most the study's `queries`: the
audit's crafted model (its score a monotone function of one feature, whose union counts
gave each test record's label and that feature) and its second query are refused."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, Message
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.engines.evaluation import metrics
from dpfl.engines.flower import DeploymentError, DeploymentResult, Evaluation, serve
from dpfl.engines.flower.protocol import fields_of, union_metrics
from dpfl.experiments.results.queries import open_results
from dpfl.experiments.study.deployment import deployment_of, serve_study, study_point
from dpfl.federation.algorithms.base import flat
from dpfl.federation.messages import Encoding, encode
from dpfl.federation.silo import SiloInfo
from dpfl.privacy import Ledger, events

from .conftest import server_message
from .test_deploy_results import run_config
from .test_flower import (
    CLEAR,
    STUDY,
    InProcessGrid,
    RecordingGrid,
    entries,
    evaluations,
    hospitals,
    simulated,
    study,
)
from .test_union_metrics import SURVIVAL_STUDY

__all__ = ["study"]  # the fixture, imported so that pytest finds it

DP = events.gaussian(Evaluation().noise_multiplier).to_json()
"""What the study's default evaluation charges each hospital once."""


def evaluate(grid: InProcessGrid, node: int, fields: dict[str, Any]) -> dict[str, Any]:
    """What the hospital at `node` answers a server's evaluate message."""
    return fields_of(grid.app(server_message("evaluate", fields, node), grid.contexts[node]))


def asked(
    study: Path, result: DeploymentResult, params: dict[str, torch.Tensor], instance: str = ""
) -> dict[str, Any]:
    """An evaluate message of the study's run `result` (or of another `instance`), as the
    server sends it, with `params` as the model to score."""
    run = deployment_of(study)
    return {
        "study": run.key,
        "instance": instance or result.instance,
        "silos": [s.name for s in result.silos],
        "sizes": [s.public_size for s in result.silos],
        "shape": [int(params["weight"].shape[1])],
        "classes": 2,
        "round": run.rounds - 1,
        "params": encode(Encoding.FLOAT32, flat(params)),
    }


def test_the_audits_crafted_model_and_a_second_query_are_refused(
    study: Path, tmp_path: Path
) -> None:
    """After the honest final model's evaluation, a model whose score is a monotone
    function of one feature is refused (not the run's final model), as it is in a run
    the hospital never trained in; the final model asked again gets the same reply,
    nothing charged; a second run of the study trains but is not evaluated again (the
    study's one query answered). One DP evaluation in each ledger."""
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    result = serve(grid, deployment_of(study))
    assert result.metrics.keys() == nodes.keys()  # the honest final model: scored
    weight = torch.zeros_like(result.params["weight"])
    weight[0, 0] = 10.0  # the score: sigmoid(10 · feature 0)
    crafted = {"weight": weight, "bias": torch.zeros_like(result.params["bias"])}
    for node, context in grid.contexts.items():
        name = str(context.node_config["name"])
        again = evaluate(grid, node, asked(study, result, result.params))
        assert "noisy" in again and "refused" not in again
        why = evaluate(grid, node, asked(study, result, crafted))["refused"]
        assert f"it scored run {result.instance}'s final model already" in why
        assert "it scores no other model" in why
        elsewhere = evaluate(grid, node, asked(study, result, crafted, "fedcba9876543210"))[
            "refused"
        ]
        assert "it trained in no round of run fedcba9876543210" in elsewhere
        assert evaluations(Path(nodes[name]["ledger"]), f"{name}/trial-0") == [DP]
    second = serve(InProcessGrid(nodes.values()), deployment_of(study))
    assert second.rounds_completed == 3 and second.metrics == {} and second.union == {}
    for name, node in nodes.items():
        assert len(entries(Path(node["ledger"]), f"{name}/trial-0")) == 6  # two runs
        assert evaluations(Path(node["ledger"]), f"{name}/trial-0") == [DP]


def test_a_second_run_is_refused_its_evaluation_past_the_studys_queries(
    study: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The bound is kept in the hospital's ledger, across runs: its refusal is one line."""
    nodes = hospitals(study, tmp_path / "hospitals")
    serve(InProcessGrid(nodes.values()), deployment_of(study))
    with caplog.at_level(logging.INFO, logger="flwr"):
        second = serve(InProcessGrid(nodes.values()), deployment_of(study))
    assert second.metrics == {}
    refused = [r.getMessage() for r in caplog.records if "evaluation refused" in r.getMessage()]
    assert len(refused) == 3
    assert all(
        "answered the study's 1 evaluations ([evaluation] queries = 1)" in r for r in refused
    )
    assert all("\n" not in r for r in refused)


def test_an_honest_dp_evaluation_is_charged_before_it_leaves_and_the_ledger_shows_it(
    study: Path, tmp_path: Path
) -> None:
    """The default: each hospital's reply holds its noisy counts, no clear figure; its
    ledger holds the evaluation's Gaussian event beside its rounds, in the ε it reports;
    `dpfl privacy ledger --events` lists it; the server reads every metric (and the
    union's) off the noisy counts."""
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = RecordingGrid(nodes.values())
    result = serve(grid, deployment_of(study))
    replies = [fields_of(m) for m in grid.seen]
    released = [r for r in replies if "noisy" in r]
    assert len(released) == 3
    assert all(r.keys() == {"metrics", "noisy", "union", "epsilon", "receipt"} for r in released)
    assert len(released[0]["noisy"]) == 2 * Evaluation().bins  # (label, score bin)
    for name, node in nodes.items():
        ledger = Path(node["ledger"])
        assert evaluations(ledger, f"{name}/trial-0") == [DP]
        with Ledger(ledger, create=False) as book:
            assert result.epsilon[name] == book.spent(f"{name}/trial-0").epsilon
            (entry,) = [e for e in book.entries(f"{name}/trial-0") if "evaluation" in e.label]
        assert entry.label.startswith("evaluation of the final model: fedavg deployment")
        shown = CliRunner().invoke(app, ["privacy", "ledger", str(ledger), "--events"])
        assert shown.exit_code == 0, shown.output
        assert "evaluation of the final model" in shown.output
        assert "Gaussian(σ=5)" in shown.output
        assert {"accuracy", "auroc"} <= result.metrics[name].keys()
        assert "loss" not in result.metrics[name]  # not in the counts
    assert {"accuracy", "auroc"} <= result.union.keys()


def test_a_hospital_whose_budget_affords_the_rounds_but_not_the_evaluation_refuses_first(
    study: Path, tmp_path: Path
) -> None:
    """The plan checked before round 0 holds the study's DP evaluation: a budget that
    affords exactly the rounds is refused, nothing charged."""
    _, book = simulated(study, tmp_path)
    rounds_only = book.spent("hospital-1/trial-0").epsilon * 1.001
    book.close()
    nodes = hospitals(study, tmp_path / "hospitals", {"hospital-1": rounds_only})
    result = serve(InProcessGrid(nodes.values()), deployment_of(study))
    assert result.rounds_completed == 0 and list(result.refused) == ["hospital-1"]
    assert "3 more rounds of" in result.refused["hospital-1"]
    assert "and Gaussian(σ=5)" in result.refused["hospital-1"]
    for name, node in nodes.items():
        assert entries(Path(node["ledger"]), f"{name}/trial-0") == []
        assert evaluations(Path(node["ledger"]), f"{name}/trial-0") == []


@pytest.mark.parametrize("release", ["dp", "clear"])
def test_the_evaluations_kind_is_said_at_each_hospital_and_in_the_datasheet(
    study: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, release: str
) -> None:
    """Clear figures are labelled OUTSIDE ε where a hospital accepts its plan, where it
    releases them, and in the stored run's datasheet; DP ones are said to be charged."""
    study.write_text(STUDY + (CLEAR if release == "clear" else ""), encoding="utf-8")
    nodes = hospitals(study, tmp_path / "hospitals")
    out = tmp_path / "results"
    with caplog.at_level(logging.INFO, logger="flwr"):
        serve_study(InProcessGrid(nodes.values()), run_config(study, out))
    lines = [r.getMessage() for r in caplog.records]
    accepted = [line for line in lines if "accepts rounds 0 to 2" in line]
    outside = [r for r in caplog.records if "OUTSIDE ε" in r.getMessage()]
    with open_results(out) as store:
        (run,) = store.runs()
        sheet = run.datasheet["evaluation"]
    if release == "clear":
        assert len(accepted) == 3 and all("OUTSIDE ε" in line for line in accepted)
        released = [r for r in outside if "released its metrics" in r.getMessage()]
        assert len(released) == 3 and all(r.levelno == logging.WARNING for r in released)
        assert sheet.startswith("Deployed metrics in the clear, OUTSIDE ε")
    else:
        assert outside == []
        assert len(accepted) == 3 and all("charged to its ledger" in line for line in accepted)
        assert sheet.startswith("Deployed DP metrics")
        assert "charges that release to its ledger" in sheet


def test_a_dp_evaluation_is_refused_where_it_cannot_be_released(tmp_path: Path) -> None:
    """A survival study's, and an algorithm's that spends its whole budget on its own
    noise: each must declare its evaluation clear (or none), in one line."""
    path = tmp_path / "study.toml"
    survival = SURVIVAL_STUDY.replace('[evaluation]\nrelease = "clear"\n', "")
    path.write_text(survival.format(path=tmp_path), encoding="utf-8")
    with pytest.raises(ValueError, match="a DP evaluation counts a classifier's scores"):
        study_point(path)
    path.write_text(
        STUDY.replace('name = "fedavg"', 'name = "aop"').replace("noise_multiplier = 1.0\n", ""),
        encoding="utf-8",
    )
    with pytest.raises(ValueError, match="aop spends its whole budget"):
        study_point(path)
    path.write_text(path.read_text(encoding="utf-8") + CLEAR, encoding="utf-8")
    study_point(path)  # declared clear: deployable


@pytest.mark.parametrize("classes", [2, 3])
def test_the_noisy_counts_give_the_exact_thresholded_metrics_before_noise(classes: int) -> None:
    """The counts' post-processing (`Evaluation.counted`, `union_metrics`) reads the
    exact thresholded metrics off noise-free counts: 0.5 is a bin edge, the confusion
    matrix is exact; the sensitivity is a record's cells' √ (1, or 1 + C)."""
    generator = np.random.default_rng(4)
    labels = generator.integers(0, classes, 300)
    if classes == 2:
        scores = generator.random(300)
    else:
        raw = generator.random((300, classes))
        scores = raw / raw.sum(axis=1, keepdims=True)
    plan = Evaluation()
    exact = plan.histogram(labels, scores)
    read = union_metrics([plan.counted(exact.astype(float).tolist())], [])
    truth = metrics(labels, scores, None)
    for metric in ("accuracy", "balanced_accuracy", "precision", "recall"):
        assert read[metric] == truth[metric]
    assert abs(read["auroc"] - truth["auroc"]) < 0.05  # on 10 bins
    silo = SiloInfo("h", 300)
    assert plan.sensitivity(silo, len(exact)) == pytest.approx(np.sqrt(1 if classes == 2 else 4))


def test_a_dp_evaluation_its_budget_no_longer_affords_is_refused_nothing_charged(
    study: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its ledger spent meanwhile (another release, e.g. another study over a capped
    dataset): the evaluation is refused in one line before anything is charged or
    counted against the study's queries."""
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    ledger, account = Path(nodes["hospital-1"]["ledger"]), "hospital-1/trial-0"

    def spending(message: Message, context: Context) -> Message:
        if message.metadata.message_type == "evaluate" and context.node_config["name"] == (
            "hospital-1"
        ):
            with Ledger(ledger) as book:  # the costliest Gaussian that fits, to 1%
                low, high = 0.5, 50.0  # σ: refused, fits
                while high > 1.01 * low:
                    middle = (low * high) ** 0.5
                    if book.refusal([(account, events.gaussian(middle))]) is None:
                        high = middle
                    else:
                        low = middle
                book.record(account, events.gaussian(high), label="another release")
        return grid.app(message, context)

    grid.apps = dict.fromkeys(grid.contexts, spending)
    with caplog.at_level(logging.INFO, logger="flwr"):
        result = serve(grid, deployment_of(study))
    assert result.metrics.keys() == {"hospital-0", "hospital-2"}
    (refused,) = [r.getMessage() for r in caplog.records if "evaluation refused" in r.getMessage()]
    assert refused.startswith("hospital-1: evaluation refused: ") and "\n" not in refused
    assert "would bring ε to" in refused
    assert evaluations(ledger, account) == []
    with Ledger(ledger, create=False) as book:
        assert not book.noted(f"evaluation 0 of study {deployment_of(study).key} by hospital-1")


def test_a_dp_evaluation_of_patient_level_records_is_refused() -> None:
    """A patient's test records are counted unbounded (the silo knows no test patient):
    refused (at load too: `deploy.check_deployable`), never released with a sensitivity
    that does not hold."""
    with pytest.raises(DeploymentError, match="patient-level records is not implemented"):
        Evaluation().sensitivity(SiloInfo("h", 60, patient_level=True, max_records=2), 20)
