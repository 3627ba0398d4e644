"""The federation's roster, pinned in the study file: a deployed hospital takes no count,
party or identity key from the server (second audit, defect 1).

Before the roster, a server that padded a Dopamine cohort of 4 real hospitals with 12
names of its own got replies whose noise share was σ/√16 = 0.25σ while each hospital
charged σ: holding the invented parties' mask shares, it could unmask one reply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ConfigRecord, Context, Message, RecordDict

from dpfl.engines.flower import DeploymentError, masking, serve
from dpfl.engines.flower.protocol import PROTOCOL
from dpfl.engines.flower.roster import (
    Roster,
    RosterError,
    make_identity,
    public_text,
    read_identity,
    roster_table,
)
from dpfl.experiments.study.datasets import build_silos
from dpfl.experiments.study.deployment import client_app, deployment_of, study_point
from dpfl.federation.messages import Encoding, encode
from dpfl.secure.he import HomomorphicError, KeyHolder
from dpfl.secure.masking import SecureAggregationError

from .conftest import public_fields, server_message
from .test_flower import STUDY, InProcessGrid, entries, hospitals, study, untouched
from .test_flower_secure import DOPAMINE

__all__ = ["study"]  # the fixture, used by name

INVENTED = [f"invented-{k}" for k in range(12)]


def asked(grid: InProcessGrid, node: int, kind: str, fields: dict[str, Any]) -> dict[str, Any]:
    """One message from a (malicious) server to `node`, and its reply's fields or error."""
    (reply,) = grid.pull_messages(grid.push_messages([server_message(kind, fields, node)]))
    if reply.has_error():
        return {"error": reply.error.reason}
    return dict(reply.content.config_records["dpfl"])


def test_a_padded_dopamine_cohort_is_refused_and_charges_nothing(
    study: Path, tmp_path: Path
) -> None:
    study.write_text(DOPAMINE.replace("silos = 3", "silos = 4"), encoding="utf-8")
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    silos = build_silos(study_point(study).data, 3)
    names = [s.name for s in silos] + INVENTED
    sizes = [s.declared_size for s in silos] + [150] * len(INVENTED)
    fields = public_fields(study, names, sizes)
    plan = asked(grid, 2, "query.plan", fields)
    assert "the server's list of silos names" in plan["error"] and "invented-0" in plan["error"]
    reply = asked(grid, 2, "train", {**fields, "cohort": names})
    assert "invented-0" in reply["error"] and "words" not in reply
    # the true silos, but a masking session with invented parties: refused too
    real = public_fields(study, names[:4], sizes[:4])
    session = {"session": b"0" * 16, "names": names, "server-public": b"1" * 32}
    keys = asked(grid, 2, "query.secagg_keys", {**real, **session})
    assert "the masking session names" in keys["error"]
    assert untouched(nodes["hospital-0"])  # nothing charged, or opened


def test_a_cohort_naming_an_outsider_is_refused_before_training(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    fields = public_fields(study)
    reply = asked(grid, 2, "train", {**fields, "cohort": ["hospital-0", "invented-0"]})
    assert "the cohort names ['invented-0']" in reply["refused"]
    twice = asked(grid, 2, "train", {**fields, "cohort": ["hospital-0", "hospital-0"]})
    assert "the cohort names ['hospital-0']" in twice["refused"]
    assert entries(Path(nodes["hospital-0"]["ledger"]), "hospital-0/trial-0") == []


def test_a_hospital_refuses_an_exchange_its_algorithm_does_not_have(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    grid = InProcessGrid(nodes.values())
    fields = public_fields(study)
    cohort = list(fields["silos"])
    fields["params"] = encode(Encoding.FLOAT32, torch.zeros(31))
    assert "epsilon" in asked(grid, 2, "train", {**fields, "round": 2, "cohort": cohort})
    # FedAvg has one exchange a round: the "already paid" shortcut must not let this by
    reply = asked(grid, 2, "train", {**fields, "round": 2, "exchange": 1, "cohort": cohort})
    assert reply["refused"] == "exchange 1 is not one of fedavg's 1 a round"
    assert len(entries(Path(nodes["hospital-0"]["ledger"]), "hospital-0/trial-0")) == 1


def test_the_masking_session_takes_identity_keys_from_the_roster_not_the_server() -> None:
    keys = {n: Ed25519PrivateKey.generate() for n in ("a", "b", "c")}
    roster = Roster.parse({n: public_text(k) for n, k in keys.items()})
    forged = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    announced = {
        "session": b"s" * 16,
        "names": ["a", "b", "c"],
        "identities": [forged] * 3,  # what a server once relayed: now ignored
        "server-public": b"k" * 32,
    }
    setup = masking.session_setup(announced, roster, length=4, fewest=3)
    assert setup.identities == roster.identities
    with pytest.raises(SecureAggregationError, match="names \\['d'\\]"):
        masking.session_setup({**announced, "names": ["a", "d"]}, roster, 4, 1)


def test_the_server_waits_for_the_roster_and_refuses_a_hello_with_another_key(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    # hospital-1 replaced by a node with a key of its own: its study's roster is forged
    impostor = tmp_path / "impostor"
    impostor.mkdir()
    make_identity(impostor / "identity.pem")
    forged = tmp_path / "forged.toml"
    lines = {n: public_text(read_identity(Path(node["identity"]))) for n, node in nodes.items()}
    lines["hospital-1"] = public_text(read_identity(impostor / "identity.pem"))
    forged.write_text(STUDY + "\n" + roster_table(lines), encoding="utf-8")
    nodes["hospital-1"] = {
        **nodes["hospital-1"],
        "identity": str(impostor / "identity.pem"),
        "study": str(forged),
    }
    with pytest.raises(DeploymentError, match=f"runs protocol {PROTOCOL} of study"):
        serve(InProcessGrid(nodes.values()), deployment_of(study), wait=1)


def test_a_hospital_whose_key_the_roster_does_not_list_refuses_to_start(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    other = tmp_path / "other.pem"
    make_identity(other)
    node = {**nodes["hospital-0"], "identity": str(other)}
    context = Context(run_id=7, node_id=2, node_config=node, state=RecordDict(), run_config={})
    message = Message(
        RecordDict({"dpfl": ConfigRecord({"protocol": PROTOCOL})}),
        dst_node_id=2,
        message_type="query.hello",
    )
    message.metadata.__dict__["_message_id"] = "m0"
    with pytest.raises(RosterError, match="does not list hospital-0 with the identity key"):
        client_app()(message, context)


def test_a_study_without_a_roster_cannot_be_deployed(study: Path) -> None:
    with pytest.raises(RosterError, match="\\[roster\\] is empty"):
        deployment_of(study)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"a": "ed25519:00"}, "is not an identity key"),
        ({"a": "rsa:" + "0" * 64}, "is not an identity key"),
        ({"a": "ed25519:" + "0" * 64, "b": "ed25519:" + "0" * 64}, "share one identity key"),
    ],
)
def test_a_malformed_roster_is_refused_by_entry(table: dict[str, str], message: str) -> None:
    with pytest.raises(RosterError, match=message):
        Roster.parse(table)


def test_an_identity_key_file_is_private_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "hospital.pem"
    text = make_identity(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert public_text(read_identity(path)) == text
    with pytest.raises(RosterError, match="never overwritten"):
        make_identity(path)
    assert public_text(read_identity(path)) == text
    (tmp_path / "bad.pem").write_text("not a key", encoding="utf-8")
    with pytest.raises(RosterError, match="not an identity key file"):
        read_identity(tmp_path / "bad.pem")


def test_the_loopback_roster_replaces_the_one_before(study: Path, tmp_path: Path) -> None:
    first = hospitals(study, tmp_path / "first")
    second = hospitals(study, tmp_path / "second")
    roster = deployment_of(study).roster
    assert roster.identities["hospital-0"] == (
        read_identity(Path(second["hospital-0"]["identity"])).public_key().public_bytes_raw()
    )
    assert roster.identities["hospital-0"] != (
        read_identity(Path(first["hospital-0"]["identity"])).public_key().public_bytes_raw()
    )


def test_the_key_holder_refuses_a_sum_that_claims_a_party_outside_the_roster() -> None:
    holder = KeyHolder(mac_key=b"m" * 32, session=b"s" * 16)
    aggregator = holder.aggregator()
    aggregator.open_round(0)
    for name in ("hospital-0", "invented-0"):
        aggregator.add(name, holder.hospital(name).encrypt(torch.ones(3), 0))
    summed = aggregator.close()
    with pytest.raises(HomomorphicError, match="claims replies of \\['invented-0'\\]"):
        holder.decrypt_sum(summed, 0, among={"hospital-0", "hospital-1"})
    total, included = holder.decrypt_sum(summed, 0, among={"hospital-0", "invented-0"})
    assert included == ("hospital-0", "invented-0") and total.tolist() == [2.0, 2.0, 2.0]
