"""A deployed hospital seals its ledger at each release and the server keeps its signed
receipts: every hospital's ledger verifies against them, and one cut back after the run
(its last round removed, tables and chain alike, which the chain alone cannot show)
does not. In process."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.engines.flower import serve
from dpfl.experiments.study.deployment import deployment_of
from dpfl.privacy import Ledger
from dpfl.privacy.chain import Receipt
from dpfl.privacy.statement import EVALUATION, TRAINING, read

from .test_flower import InProcessGrid, hospitals, study

__all__ = ["study"]  # the fixture, used by name


def _verified(ledger: str, receipts: Path) -> tuple[int, dict[str, object]]:
    command = ["privacy", "verify", ledger, "--receipts", str(receipts), "--json"]
    shown = CliRunner().invoke(app, command)
    return shown.exit_code, json.loads(shown.stdout)


def test_the_servers_receipts_verify_each_ledger_and_show_one_cut_back(
    study: Path, tmp_path: Path
) -> None:
    nodes = hospitals(study, tmp_path / "hospitals")
    receipts = tmp_path / "receipts"
    result = serve(InProcessGrid(nodes.values()), deployment_of(study), receipts=receipts)
    assert result.rounds_completed == 3
    for name, node in nodes.items():
        kept = sorted((receipts / name).glob("*.json"))
        assert len(kept) == 4, name  # three rounds and the DP evaluation
        made = [Receipt.from_json(path.read_text(encoding="utf-8")) for path in kept]
        assert all(r.hospital == name and r.problems() == [] for r in made)
        assert [len(r.entries) for r in made] == [1, 1, 1, 1]
        code, shown = _verified(node["ledger"], receipts)
        assert code == 0 and shown["receipts"] == 4 and shown["other_receipts"] == 8, shown
        with Ledger(Path(node["ledger"]), create=False) as book:  # as the engines label them
            (mine,) = [a for a in read(book).accounts if a.account == f"{name}/trial-0"]
        assert (mine.kinds[TRAINING], mine.kinds[EVALUATION], mine.rounds_trained) == (3, 1, 3)
    ledger = nodes["hospital-1"]["ledger"]
    last = Receipt.from_json(sorted((receipts / "hospital-1").glob("*.json"))[-1].read_text())
    cut = last.entries[0].seq
    db = sqlite3.connect(ledger)
    db.execute("DELETE FROM events WHERE id = (SELECT MAX(id) FROM events)")  # its evaluation
    db.execute("DELETE FROM facts WHERE key LIKE 'evaluation %'")  # and the note of it
    db.execute(f"DELETE FROM chain WHERE seq >= {cut}")
    db.commit()
    db.close()
    assert CliRunner().invoke(app, ["privacy", "verify", ledger]).exit_code == 0
    code, shown = _verified(ledger, receipts)
    assert code == 1
    assert any("entries were removed" in p for p in shown["problems"])  # type: ignore[union-attr]
