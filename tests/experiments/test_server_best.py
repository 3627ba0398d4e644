"""docs/studies/server_best.py: the choice per server optimiser of a sweep, with its
difference from plain averaging's (docs/reproductions/server-optimisers.md's tables)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from dpfl.cli import app
from studies import breast_cancer_study

SCRIPT = Path(__file__).parents[2] / "docs" / "studies" / "server_best.py"


def test_each_optimiser_gets_its_best_run_and_its_gain_over_averaging(tmp_path: Path) -> None:
    servers = ["averaging", {"optimizer": "fedadam", "learning_rate": [0.01, 0.3]}]
    study = tmp_path / "study.toml"
    for n, server in enumerate(servers):
        study.write_text(
            breast_cancer_study(
                "servers",
                rounds=3,
                metrics=["accuracy", "auroc"],
                algorithm={"server": server},
                privacy={"epsilon": 2.0},
            ),
            encoding="utf-8",
        )
        added = ["--add"] if n else []
        swept = CliRunner().invoke(app, ["sweep", str(study), "--out", str(tmp_path / "r"), *added])
        assert swept.exit_code == 0, swept.output
    printed = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "r"), "--metric", "accuracy"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    header, _, *rows = printed.strip().splitlines()
    assert header.startswith("| ε | server | chosen | σ | accuracy (chosen on) | auroc |")
    assert [row.split(" | ")[1] for row in rows] == ["averaging", "fedadam"]
    assert rows[0].split(" | ")[-2] == "+0.000"
    assert "η=0.01" in rows[1] or "η=0.3" in rows[1]
