"""The ledger's hash chain shows tampering: an edited ε, an edited budget, a deleted round,
a reordered entry, a chain recomputed whole, a truncated file and a ledger cut back after a
receipt was given are each found by `dpfl privacy verify`, which says where; an older
ledger is read, and upgraded only with consent."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.privacy import Ledger, LedgerError, events
from dpfl.privacy.chain import Receipt, digest
from dpfl.privacy.governance import Approval
from dpfl.privacy.ledger import DamagedLedgerError

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
STEP = events.poisson_gaussian(0.05, 1.2, steps=20)
ACCOUNT = "north/trial-0"


def charged(path: Path, rounds: int = 3) -> list[Receipt]:
    """A hospital's ledger charged `rounds` rounds, each sealed, and the receipts it gave."""
    receipts = []
    with Ledger(path, study="a1b2") as book:
        book.register_silo(ACCOUNT, epsilon=8.0, delta=1e-5, size=300)
        for round_ in range(rounds):
            head = book.head()
            book.record(ACCOUNT, STEP, label="fedavg deployment", round=round_)
            after = 0 if head is None else head.seq
            receipts.append(book.receipt(KEY, hospital="north", after=after))
    return receipts


def tamper(path: Path, *statements: str) -> None:
    db = sqlite3.connect(path)
    for statement in statements:
        db.execute(statement)
    db.commit()
    db.close()


def verified(path: Path, *options: str) -> tuple[int, dict[str, object]]:
    shown = CliRunner().invoke(app, ["privacy", "verify", str(path), "--json", *options])
    return shown.exit_code, json.loads(shown.stdout)


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    path = tmp_path / "hospital.sqlite"
    charged(path)
    return path


def test_an_untouched_ledger_verifies(ledger: Path) -> None:
    code, shown = verified(ledger)
    assert code == 0 and shown["ok"] is True and shown["problems"] == []
    assert shown["seals"] == 3


def test_an_edited_epsilon_is_found(ledger: Path) -> None:
    smaller = events.poisson_gaussian(0.05, 12.0, steps=20).to_json()  # 10x the noise
    with Ledger(ledger, create=False, study="a1b2") as book:
        before = book.spent(ACCOUNT).epsilon
    tamper(ledger, f"UPDATE events SET event = '{smaller}' WHERE id = 2")
    with Ledger(ledger, create=False, study="a1b2") as book:
        assert book.spent(ACCOUNT).epsilon < before  # what the edit was for
    code, shown = verified(ledger)
    assert code == 1 and shown["ok"] is False
    assert any("events row 2 was changed: event" in p for p in shown["problems"])  # type: ignore[union-attr]


def test_an_edited_budget_is_found(ledger: Path) -> None:
    tamper(ledger, "UPDATE silos SET epsilon = 80.0")
    code, shown = verified(ledger)
    assert code == 1
    assert any("silos row" in p and "epsilon 8.0 → 80.0" in p for p in shown["problems"])  # type: ignore[union-attr]


def test_a_deleted_round_is_found(ledger: Path) -> None:
    tamper(ledger, "DELETE FROM events WHERE round = 1")
    code, shown = verified(ledger)
    assert code == 1
    assert any("events row 2 was deleted" in p for p in shown["problems"])  # type: ignore[union-attr]


def test_a_round_deleted_from_the_chain_too_is_found(ledger: Path) -> None:
    db = sqlite3.connect(ledger)
    charges = [s for (s,) in db.execute("SELECT seq FROM chain WHERE kind = 'events' ORDER BY seq")]
    db.close()
    tamper(
        ledger, "DELETE FROM events WHERE round = 1", f"DELETE FROM chain WHERE seq = {charges[1]}"
    )
    code, shown = verified(ledger)
    assert code == 1
    assert any(f"entry {charges[1]} is missing" in p for p in shown["problems"])  # type: ignore[union-attr]


def test_a_reordered_entry_is_found(ledger: Path) -> None:
    tamper(
        ledger,
        "UPDATE chain SET seq = -1 WHERE seq = 4",
        "UPDATE chain SET seq = 4 WHERE seq = 6",
        "UPDATE chain SET seq = 6 WHERE seq = -1",
    )
    code, shown = verified(ledger)
    assert code == 1
    assert any("entry 4 does not follow entry 3" in p for p in shown["problems"])  # type: ignore[union-attr]


def test_a_chain_recomputed_whole_is_found_by_its_seals(ledger: Path) -> None:
    """Whoever edits the event and recomputes every hash after it cannot re-sign the
    hospital's seals."""
    smaller = events.poisson_gaussian(0.05, 12.0, steps=20).to_json()
    db = sqlite3.connect(ledger)
    db.execute(f"UPDATE events SET event = '{smaller}' WHERE id = 1")
    rows = db.execute("SELECT seq, kind, body FROM chain ORDER BY seq").fetchall()
    prev = "0" * 64
    for seq, kind, body in rows:
        data = json.loads(body)
        if kind == "events" and data["rows"][0][0] == 1:
            data["rows"][0][4] = smaller
        if kind == "seal":  # the attacker points the seal at the new head it cannot sign
            data["head"] = prev
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        new = digest(seq, kind, text, prev)
        db.execute(
            "UPDATE chain SET body = ?, prev = ?, hash = ? WHERE seq = ?", (text, prev, new, seq)
        )
        prev = new
    db.commit()
    db.close()
    code, shown = verified(ledger)
    assert code == 1
    problems = shown["problems"]
    assert not any("changed" in p or "follow" in p for p in problems)  # type: ignore[union-attr]
    assert any("seal does not verify" in p for p in problems)  # type: ignore[union-attr]


def test_a_truncated_file_is_refused_by_name(ledger: Path) -> None:
    data = ledger.read_bytes()
    ledger.write_bytes(data[: len(data) // 2 + 100])
    shown = CliRunner().invoke(app, ["privacy", "verify", str(ledger)])
    assert shown.exit_code == 1
    assert "is damaged" in " ".join(shown.stderr.split())
    with pytest.raises(DamagedLedgerError):
        Ledger(ledger, create=False)


def test_a_ledger_cut_back_after_a_receipt_disagrees_with_it(tmp_path: Path) -> None:
    """The last round removed from the tables and the chain alike leaves a whole chain;
    the server's receipt of it shows the cut."""
    path = tmp_path / "hospital.sqlite"
    receipts = charged(path)
    folder = tmp_path / "receipts" / "north"
    folder.mkdir(parents=True)
    for receipt in receipts:
        (folder / f"{receipt.seal.seq}.json").write_text(receipt.to_json(), encoding="utf-8")
    assert verified(path, "--receipts", str(folder.parent))[0] == 0
    last = receipts[-1].entries[0].seq
    tamper(path, "DELETE FROM events WHERE round = 2", f"DELETE FROM chain WHERE seq >= {last}")
    assert verified(path)[0] == 0  # the chain alone cannot tell
    code, shown = verified(path, "--receipts", str(folder.parent))
    assert code == 1 and shown["receipts"] == 3
    assert any(f"ends at entry {last - 1}: entries were removed" in p for p in shown["problems"])  # type: ignore[union-attr]


def test_a_forged_receipt_is_found(tmp_path: Path) -> None:
    path = tmp_path / "hospital.sqlite"
    receipt = charged(path, rounds=1)[0]
    data = json.loads(receipt.to_json())
    data["seal"]["signature"] = "00" * 64
    folder = tmp_path / "receipts"
    folder.mkdir()
    (folder / "1.json").write_text(json.dumps(data), encoding="utf-8")
    code, shown = verified(path, "--receipts", str(folder))
    assert code == 1
    assert any("is forged" in p for p in shown["problems"])  # type: ignore[union-attr]


def test_an_edited_approval_is_found(tmp_path: Path) -> None:
    path = tmp_path / "hospital.sqlite"
    approval = Approval("s", "s", "k", "a" * 64, None, "b" * 64, "0.7", 2.0, 1e-5, None)
    with Ledger(path) as book:
        book.approve(approval, KEY)
    db = sqlite3.connect(path)
    (seq, body, prev) = db.execute(
        "SELECT seq, body, prev FROM chain WHERE kind = 'approval'"
    ).fetchone()
    text = body.replace('"epsilon":2.0', '"epsilon":20.0')
    db.execute(
        "UPDATE chain SET body = ?, hash = ? WHERE seq = ?",
        (text, digest(seq, "approval", text, prev), seq),
    )
    db.commit()
    db.close()
    code, shown = verified(path)
    assert code == 1
    assert any("the approval of 's' is not signed" in p for p in shown["problems"])  # type: ignore[union-attr]


def test_an_older_ledger_is_read_and_upgraded_only_with_consent(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    charged(path, rounds=2)
    tamper(path, "DROP TABLE chain", "PRAGMA user_version = 3")  # as dpfl 0.6 wrote it
    stamp = hashlib.sha256(path.read_bytes()).hexdigest()
    with Ledger(path, create=False, study="a1b2") as reader:  # read as it is
        spent = reader.spent(ACCOUNT).epsilon
        assert not reader.chained
    with pytest.raises(LedgerError, match="dpfl privacy upgrade"):
        Ledger(path)
    code, shown = verified(path)
    assert code == 1 and "written before the hash chain" in shown["problems"][0]  # type: ignore[index]
    refused = CliRunner().invoke(app, ["privacy", "upgrade", str(path)], input="n\n")
    assert refused.exit_code == 1
    assert hashlib.sha256(path.read_bytes()).hexdigest() == stamp  # nothing written
    upgraded = CliRunner().invoke(app, ["privacy", "upgrade", str(path), "--yes"])
    assert upgraded.exit_code == 0, upgraded.output
    assert verified(path)[0] == 0
    with Ledger(path, study="a1b2") as book:
        assert book.spent(ACCOUNT).epsilon == spent
        book.record(ACCOUNT, STEP, round=2)
    assert verified(path)[0] == 0
