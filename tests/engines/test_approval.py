"""A hospital runs only what its officer approved (`dpfl deploy approve`): an unapproved
study, a changed study file, model file, schema, dpfl or budget is refused by `dpfl deploy
hospital` in one line naming what differs, before it connects, and by the hospital itself
at the server's first message, kept in its ledger; approvals are listed, superseded and
revoked, each signed with the hospital's identity key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dpfl.cli import app, deploy
from dpfl.engines.flower import DeploymentError, approval, serve
from dpfl.engines.flower.roster import make_identity
from dpfl.experiments.study.deployment import deployment_of
from dpfl.privacy import Ledger

from .test_flower import InProcessGrid, approve_node, hospitals, study

__all__ = ["study"]  # the fixture, used by name

MODEL = """
from torch import nn


def build(n_features, n_outputs):
    return nn.Linear(n_features, n_outputs)
"""


def _hospital(node: dict[str, Any], *extra: str) -> tuple[int, str]:
    """`dpfl deploy hospital` for `node`, its SuperNode not started: (status, what it said)."""
    options = ["data", "epsilon", "delta", "ledger", "identity", "public-size"]
    args = [a for k in options for a in (f"--{k}", str(node[k]))]
    command = ["deploy", "hospital", node["study"], "--name", node["name"], *args]
    shown = CliRunner().invoke(app, [*command, "--insecure", "--superlink", "127.0.0.1:1", *extra])
    return shown.exit_code, " ".join(shown.output.split())


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The SuperNode commands `dpfl deploy hospital` would have run."""
    commands: list[list[str]] = []
    monkeypatch.setattr(deploy, "_run_supernode", lambda command, **_: commands.append(command))
    return commands


def test_an_unapproved_study_is_refused_before_the_hospital_connects(
    study: Path, tmp_path: Path, started: list[list[str]]
) -> None:
    node = hospitals(study, tmp_path / "hospitals")["hospital-0"]
    code, said = _hospital(node)
    assert code == 2 and started == []
    assert "study 'deployed' is not approved in this hospital's ledger" in said
    assert "dpfl deploy approve" in said
    approve_node(node)
    assert _hospital(node)[0] == 0 and len(started) == 1


def test_a_changed_study_budget_or_dpfl_is_refused_naming_what_differs(
    study: Path, tmp_path: Path, started: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = hospitals(study, tmp_path / "hospitals")["hospital-0"]
    approve_node(node)
    approved = study.read_bytes()
    study.write_text(study.read_text(encoding="utf-8").replace("rounds = 3", "rounds = 30"))
    code, said = _hospital(node)
    assert code == 2 and "differs from its approval 'deployed': the study file: approved" in said
    study.write_bytes(approved)
    code, said = _hospital({**node, "epsilon": 20.0})
    assert code == 2 and "the ε budget: approved 10.0, now 20.0" in said
    code, said = _hospital(node, "--dataset-budget", "30")
    assert code == 2 and "the dataset's cap: approved none, now 30.0" in said
    monkeypatch.setattr(approval, "dpfl_version", lambda: "9.9.9+0123456789abcdef")
    code, said = _hospital(node)
    assert code == 2 and "dpfl's version: approved " in said and "now 9.9.9+" in said
    assert started == []


def test_a_new_model_file_needs_a_new_approval(
    study: Path, tmp_path: Path, started: list[list[str]]
) -> None:
    (study.parent / "my_model.py").write_text(MODEL, encoding="utf-8")
    text = study.read_text(encoding="utf-8")
    study.write_text(
        text.replace("[algorithm]", '[model]\nfactory = "my_model.py:build"\n[algorithm]')
    )
    node = hospitals(study, tmp_path / "hospitals")["hospital-0"]
    approve_node(node)
    assert _hospital(node)[0] == 0
    (study.parent / "my_model.py").write_text(MODEL.replace("n_outputs)", "n_outputs, bias=False)"))
    code, said = _hospital(node)
    assert code == 2 and "the model file: approved" in said and "the study file" not in said
    approve_node(node)  # the officer approves the new model: it supersedes the first
    assert _hospital(node)[0] == 0 and len(started) == 2
    with Ledger(Path(node["ledger"]), create=False) as book:
        kept = book.approvals()
    assert [a.active for a in kept] == [False, True] and kept[0].superseded_by == kept[1].seq
    assert kept[0].model_digest != kept[1].model_digest


def test_approvals_are_listed_revoked_and_signed_by_the_hospitals_key(
    study: Path, tmp_path: Path, started: list[list[str]]
) -> None:
    node = hospitals(study, tmp_path / "hospitals")["hospital-0"]
    runner = CliRunner()
    approve = ["deploy", "approve", node["study"], "--ledger", node["ledger"], "--identity"]
    budget = ["--epsilon", "10", "--delta", "1e-05"]
    stranger = tmp_path / "stranger.pem"
    make_identity(stranger)
    refused = runner.invoke(app, [*approve, str(stranger), *budget])
    assert refused.exit_code == 2 and "roster does not list the identity key" in refused.output
    made = runner.invoke(app, [*approve, node["identity"], *budget, "--name", "trial-2026"])
    assert made.exit_code == 0, made.output
    assert "approved 'trial-2026': study 'deployed'" in made.output
    assert _hospital(node)[0] == 0
    listed = runner.invoke(app, ["deploy", "approvals", "--ledger", node["ledger"], "--json"])
    (shown,) = json.loads(listed.stdout)
    assert (
        shown["name"] == "trial-2026" and shown["epsilon"] == 10.0 and shown["revoked_at"] is None
    )
    wrong = runner.invoke(
        app,
        ["deploy", "revoke", "trial-2026", "--ledger", node["ledger"], "--identity", str(stranger)],
    )
    assert wrong.exit_code == 2 and "was signed by" in " ".join(wrong.output.split())
    revoked = runner.invoke(
        app,
        [
            "deploy",
            "revoke",
            "trial-2026",
            "--ledger",
            node["ledger"],
            "--identity",
            node["identity"],
        ],
    )
    assert revoked.exit_code == 0, revoked.output
    code, said = _hospital(node)
    assert code == 2 and "is not approved" in said and len(started) == 1
    listed = runner.invoke(app, ["deploy", "approvals", "--ledger", node["ledger"]])
    assert "revoked" in listed.stdout
    assert runner.invoke(app, ["privacy", "verify", node["ledger"]]).exit_code == 0


def test_an_approval_signed_with_another_key_does_not_count(study: Path, tmp_path: Path) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    mine, theirs = nodes["hospital-0"], nodes["hospital-1"]
    run = deployment_of(study)
    needed = approval.wanted(run, epsilon=10.0, delta=1e-5, dataset_cap=None)
    approval.approve(Path(mine["ledger"]), needed, Path(theirs["identity"]))
    with pytest.raises(approval.NotApprovedError, match="is not approved"):
        approval.check(Path(mine["ledger"]), needed, Path(mine["identity"]))


def test_an_unapproved_hospital_refuses_the_servers_first_message_and_keeps_the_refusal(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    unapproved = nodes["hospital-2"]
    for name, node in nodes.items():
        if name != "hospital-2":
            approve_node(node)
    approval.approve(  # an approval at another budget than the one it runs with
        Path(unapproved["ledger"]),
        approval.wanted(deployment_of(study), epsilon=5.0, delta=1e-5, dataset_cap=None),
        Path(unapproved["identity"]),
    )
    grid = InProcessGrid(nodes.values(), approved=False)
    why = "hospital-2 refused: .*the ε budget: approved 5.0, now 10.0"
    with pytest.raises(DeploymentError, match=why):
        serve(grid, deployment_of(study), wait=5, timeout=30)
    with Ledger(Path(unapproved["ledger"]), create=False) as book:
        (kept,) = book.refusals()
        assert "the ε budget: approved 5.0, now 10.0" in kept.reason
        assert book.silos() == []  # nothing opened, nothing charged


def test_a_damaged_ledger_is_refused_before_the_hospital_connects(
    study: Path, tmp_path: Path, started: list[list[str]]
) -> None:
    node = hospitals(study, tmp_path / "hospitals")["hospital-0"]
    approve_node(node)
    ledger = Path(node["ledger"])
    ledger.write_bytes(ledger.read_bytes()[:5000])
    code, said = _hospital(node)
    assert code == 1 and f"ledger {ledger} is damaged" in said and started == []
