"""Where local training runs (`device`): the CPU gives today's bits, "cuda" without CUDA is
refused with one line before any record is read, "auto" falls back to the CPU, and the
GPU benchmark runs its CUDA path with device "cpu"."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import simulate
from dpfl.experiments.study.build import build_algorithm
from dpfl.experiments.study.config import StudyConfig
from dpfl.experiments.study.datasets import build_silos
from dpfl.local.device import DeviceError, DeviceName, resolve

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
POINT = {
    "rounds": 2,
    "trials": 2,
    "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 2}},
    "model": {"kind": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg", "learning_rate": 0.5},
    "privacy": {"noise_multiplier": 1.0},
}


def _trained(device: DeviceName | None = None) -> dict[str, torch.Tensor]:
    """The models of POINT, trained by `simulate` (on its default device where None)."""
    config = StudyConfig.model_validate(POINT)
    silos = build_silos(config.data, config.seed)
    algorithm = build_algorithm(config, silos)
    plan = RunPlan(rounds=2, trials=2, progress=False)
    return simulate(
        algorithm, silos, plan if device is None else replace(plan, device=device)
    ).params


def test_device_cpu_gives_the_default_runs_bits() -> None:
    default = _trained()
    devices: list[DeviceName] = ["cpu"] if torch.cuda.is_available() else ["cpu", "auto"]
    for device in devices:
        on = _trained(device)
        assert all(torch.equal(default[k], on[k]) for k in default), device


@no_cuda
def test_cuda_without_cuda_is_refused_with_one_line_and_auto_falls_back() -> None:
    with pytest.raises(DeviceError, match=r"^device 'cuda': this machine has no CUDA") as no:
        simulate(object(), [], RunPlan(rounds=1, device="cuda"))  # type: ignore[arg-type]  # refused first
    assert "\n" not in str(no.value)
    assert resolve("auto") == torch.device("cpu")


@no_cuda
def test_a_cuda_study_is_refused_before_any_record_is_read(tmp_path: Path) -> None:
    study = tmp_path / "study.toml"
    study.write_text(
        'rounds = 1\ndevice = "cuda"\n[data]\ndataset = "breast_cancer"\n'
        'partition = { kind = "iid", silos = 2 }\n[algorithm]\nname = "fedavg"\n'
        "[privacy]\nnoise_multiplier = 1.0\n"
    )
    result = CliRunner().invoke(app, ["sweep", str(study), "-o", str(tmp_path / "out")])
    assert result.exit_code != 0
    assert "device 'cuda': this machine has no CUDA" in " ".join(result.output.split())
    assert "Traceback" not in result.output and not (tmp_path / "out" / "ledgers").exists()


def test_the_gpu_benchmark_runs_its_path_on_the_cpu() -> None:
    path = Path(__file__).parents[2] / "benchmarks" / "bench_gpu.py"
    spec = importlib.util.spec_from_file_location("bench_gpu", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = bench
    try:
        spec.loader.exec_module(bench)
        out = bench.figures("cpu", repeats=1, cases=("a",))
    finally:
        sys.modules.pop("bench_gpu", None)
    assert out["a_logreg_240.dpfl_cpu_examples_per_s"] > 0
    assert out["a_logreg_240.opacus_cpu_examples_per_s"] > 0
    assert out["round.cuda_over_cpu_speedup"] > 0
