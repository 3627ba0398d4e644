"""Secure aggregation across machines: a deployed study whose replies are masked
(`dpfl.engines.flower.masking`) or encrypted (`dpfl.engines.flower.he`) ends as the
simulator's run with `PairwiseMasking` or `HomomorphicSum`, and the server never holds a
reply in the clear. In process (the grid hands each message to the ClientApp, keeping
each node's context state between messages as a SuperNode does)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dpfl.engines.flower import serve
from dpfl.engines.flower.he import KeyHolderSide, make_key_files
from dpfl.engines.flower.roster import Roster, public_text
from dpfl.experiments.study.deployment import deployment_of, study_point
from dpfl.secure.he import HomomorphicError, KeyFile

from .conftest import public_fields, server_message
from .test_flower import (
    STUDY,
    InProcessGrid,
    RecordingGrid,
    assert_the_simulators,
    entries,
    hospitals,
    simulated,
    study,
)

__all__ = ["study"]  # the fixture, used by name

DOPAMINE = (
    STUDY.replace('name = "fedavg"', 'name = "fedsgd_secure"')
    .replace("local_epochs = 1.0\n", "")
    .replace("learning_rate = 2.0", "learning_rate = 0.5\nmomentum = 0.5")
    .replace("seed = 3\n", 'seed = 3\nsecure_aggregation = "masking"\n')
)


@pytest.mark.parametrize(
    "text",
    [DOPAMINE, STUDY.replace("seed = 3\n", 'seed = 3\nsecure_aggregation = "masking"\n')],
    ids=["dopamine", "fedavg"],
)
def test_a_masked_deployment_ends_as_the_simulators_masked_run(
    study: Path, tmp_path: Path, text: str
) -> None:
    study.write_text(text, encoding="utf-8")
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = RecordingGrid(nodes.values())
    result = serve(grid, deployment_of(study))
    simulation, book = simulated(study, tmp_path)
    assert result.rounds_completed == 3 and not result.refused and not result.stopped
    for name, value in simulation.params.items():
        assert torch.equal(result.params[name], value[0])  # the masks cancel exactly
    assert result.metrics.keys() == simulation.silo_metrics[0].keys()  # DP, of the counts
    assert_the_simulators(result, nodes, simulation, book)
    book.close()
    kinds = [m.metadata.message_type for m in grid.seen]
    assert kinds.count("query.secagg_keys") == kinds.count("query.secagg_unmask") == 9
    trained = [m.content["dpfl"] for m in grid.seen if m.metadata.message_type == "train"]
    assert len(trained) == 9 and all("vector" not in r and "words" in r for r in trained)


def test_a_hospital_never_sends_a_masked_studys_reply_without_a_session(
    study: Path, tmp_path: Path
) -> None:
    study.write_text(DOPAMINE, encoding="utf-8")
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    fields = public_fields(study)
    message = server_message("train", {**fields, "cohort": fields["silos"]})
    (reply,) = grid.pull_messages(grid.push_messages([message]))
    refused = reply.content.config_records["dpfl"]["refused"]
    assert "no secure-aggregation session under way" in str(refused)
    assert entries(Path(nodes["hospital-0"]["ledger"]), "hospital-0/trial-0") == []


def test_an_encrypted_deployment_ends_as_the_simulators_encrypted_run(
    study: Path, tmp_path: Path
) -> None:
    """Dopamine under BFV: hospital-0 holds the secret key (its own file), the others and
    the server the public one; the server adds ciphertexts, the key holder decrypts."""
    study.write_text(DOPAMINE.replace('"masking"', '"he"'), encoding="utf-8")
    secret, public = make_key_files(tmp_path / "keys")
    nodes = hospitals(study, tmp_path / "hospitals")
    for name, node in nodes.items():
        node["he-keys"] = str(secret if name == "hospital-0" else public)
    grid = RecordingGrid(nodes.values())
    result = serve(grid, deployment_of(study), he_keys=public)
    simulation, book = simulated(study, tmp_path)
    assert result.rounds_completed == 3 and not result.refused and not result.stopped
    assert_the_simulators(result, nodes, simulation, book)
    book.close()
    trained = [m.content["dpfl"] for m in grid.seen if m.metadata.message_type == "train"]
    assert len(trained) == 9 and all(
        set(r) == {"epsilon", "ciphertext", "receipt"} for r in trained
    )
    kinds = [m.metadata.message_type for m in grid.seen]
    assert kinds.count("query.he_decrypt") == 3


def test_the_key_holder_decrypts_one_sum_a_round(tmp_path: Path) -> None:
    """Asked again for a round it decrypted: the same sum again, another sum never."""
    secret, public = make_key_files(tmp_path)
    roster = Roster.parse({f"h{k}": public_text(Ed25519PrivateKey.generate()) for k in range(3)})
    side = KeyHolderSide(secret, roster)
    keys = KeyFile.read(public.read_bytes())

    def encrypted(*values: float) -> dict[str, bytes]:
        return {
            f"h{k}": keys.hospital(f"h{k}").encrypt(torch.tensor([value]), 0)
            for k, value in enumerate(values)
        }

    def summed(replies: dict[str, bytes]) -> bytes:
        aggregator = keys.aggregator()
        aggregator.open_round(0)
        for name, reply in replies.items():
            aggregator.add(name, reply)
        return aggregator.close()

    replies = encrypted(1.0, 2.0)
    answer = side.decrypt({"sum": summed(replies), "counter": 0}, fewest=2)
    assert np.frombuffer(answer["total"], "<f8").tolist() == [3.0]
    # the same replies sent again (a restarted server): the same sum, nothing new
    assert side.decrypt({"sum": summed(replies), "counter": 0}, fewest=2) == answer
    for other in (encrypted(1.0, 2.0), encrypted(1.0, 5.0)):  # new ciphertexts: refused
        with pytest.raises(HomomorphicError, match="round 0 was already decrypted"):
            side.decrypt({"sum": summed(other), "counter": 0}, fewest=2)
    fresh = tmp_path / "fresh" / secret.name  # the same key, no round decrypted yet
    fresh.parent.mkdir()
    fresh.write_bytes(secret.read_bytes())
    with pytest.raises(HomomorphicError, match="fewer than the 3 it must hold"):
        KeyHolderSide(fresh, roster).decrypt({"sum": summed(replies), "counter": 0}, fewest=3)


def test_the_server_refuses_the_key_holders_file(tmp_path: Path) -> None:
    secret, _ = make_key_files(tmp_path)
    with pytest.raises(HomomorphicError, match="must not hold the key holder's file"):
        KeyFile.read(secret.read_bytes()).aggregator()


def test_ideal_secure_aggregation_cannot_be_deployed(study: Path) -> None:
    study.write_text(DOPAMINE.replace('"masking"', '"ideal"'), encoding="utf-8")
    with pytest.raises(ValueError, match="secure_aggregation 'ideal': across machines"):
        study_point(study)
