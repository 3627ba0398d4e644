"""A study's [analytics] released on loopback (`dpfl deploy server --stats`): a SuperLink
and three SuperNodes as separate processes, TLS and registered keys, each hospital
reading its own CSV; the server's table and OUT/stats.json are the simulator's `dpfl
stats`, each hospital's ledger charged with the simulator's events. Marked `loopback`
(`make test-loopback`), about a minute."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dpfl.engines.flower import loopback
from dpfl.experiments.study.analytics import STATS_JSON, StatsRun, stats
from dpfl.experiments.study.deployment import study_point
from dpfl.privacy import Ledger

from .test_flower import entries, flower_installed
from .test_flower_table import STUDY, flower_study, table_hospitals, table_study

__all__ = ["flower_installed", "flower_study", "table_study"]  # fixtures, by name
pytestmark = pytest.mark.loopback
ANALYTICS = """
[analytics]
noise_multiplier = 6.0
means = [{ column = "age", range = [0, 100] }]
"""


@pytest.mark.slow
@pytest.mark.usefixtures("flower_installed")
def test_on_loopback_a_count_and_a_mean_are_the_simulators(
    table_study: Path, tmp_path: Path
) -> None:
    table_study.write_text(STUDY + ANALYTICS, encoding="utf-8")
    nodes = table_hospitals(table_study, tmp_path / "hospitals")
    out = tmp_path / "server-out"
    with loopback.cluster(nodes, tmp_path) as running:
        command = running.server(table_study, out, "--wait", "60", "--timeout", "60", "--stats")
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, env=running.env, timeout=300
            )
        except subprocess.TimeoutExpired as exc:
            raise loopback.LoopbackError(f"no statistics in 300 s\n{running.tails()}") from exc
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "mean of age" in done.stdout and "statistics pooled from east, north, south" in output
    simulated = stats(study_point(table_study), tmp_path / "simulated")
    assert StatsRun.read(out / STATS_JSON).figures == simulated.figures
    with Ledger(tmp_path / "simulated" / "ledger.sqlite", create=False) as book:
        for name, node in nodes.items():
            mine = entries(Path(node["ledger"]), f"{name}/trial-0")
            assert mine == [e.event.to_json() for e in book.entries(f"{name}/trial-0")]
            assert len(mine) == 2
