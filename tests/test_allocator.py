"""`keep_freed_memory`: what it claims, page faults of a CNN's DP-SGD step, measured."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

_STEPS = """
import json, resource, sys, torch
from dpfl import keep_freed_memory
from dpfl.local.clipping import ClippedGradientSum
from dpfl.local.dpsgd import parameters_of
from dpfl.local.losses import cross_entropy
from dpfl.models import small_cnn

torch.set_num_threads(1)
taken = keep_freed_memory() if sys.argv[1] == "kept" else None
torch.manual_seed(0)
model = small_cnn(3, 28, 2)
clipped, params = ClippedGradientSum(model, cross_entropy), parameters_of(model)
x, y = torch.randn(64, 3, 28, 28), torch.randint(0, 2, (64,))
mask = torch.ones(64)
for _ in range(4):
    clipped(params, x, y, mask, 1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    clipped(params, x, y, mask, 1.0)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"taken": taken, "faults_per_step": faults / 10}))
"""


def _run(mode: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _STEPS, mode], capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_kept_freed_memory_spares_a_cnn_step_its_page_faults() -> None:
    default, kept = _run("default"), _run("kept")
    assert kept["taken"] is True
    # 64 images of 28×28×3: about 5,000 fresh pages a step with glibc's defaults
    assert default["faults_per_step"] > 1000
    assert kept["faults_per_step"] < default["faults_per_step"] / 5
