"""Image studies through the runner: a two-class image task gets one logit, as its loss
reads it (BreastMNIST with small_cnn used to fail on its first batch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpfl.data import images
from dpfl.experiments.config import Study
from dpfl.experiments.runner import STORE, run_study
from dpfl.experiments.store import ResultsStore


def test_a_two_class_image_study_trains_one_logit_and_is_scored(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 48), ("val", 8), ("test", 24)):
        labels = rng.integers(0, 2, n)
        # the class shows as brightness, so a trained model ranks above chance
        pixels = rng.integers(0, 128, (n, 28, 28)) + 100 * labels[:, None, None]
        arrays[f"{split}_images"] = pixels.astype(np.uint8)
        arrays[f"{split}_labels"] = labels
    np.savez(tmp_path / "breastmnist.npz", **arrays)
    assert images.breastmnist(tmp_path).features.shape[1:] == (1, 28, 28)
    study = {
        "name": "two-class-images",
        "rounds": 3,
        "eval_every": "end",
        "metrics": ["accuracy", "auroc"],
        "data": {
            "dataset": "breastmnist",
            "path": str(tmp_path),
            "partition": {"kind": "iid", "silos": 2},
        },
        "model": {"kind": "small_cnn"},
        "algorithm": {"name": "fedavg", "learning_rate": 0.1, "expected_batch_size": 8},
        "privacy": {"private": False},
    }
    (run,) = run_study(Study(study), tmp_path / "out")
    assert run.status == "finished", run.error
    with ResultsStore(tmp_path / "out" / STORE) as store:
        (auroc,) = store.final_metric(run, "auroc")
    assert 0.5 < auroc <= 1.0
