"""Image studies through the runner: a two-class image task gets one logit, as its loss
reads it (BreastMNIST with small_cnn used to fail on its first batch); a consortium's own
image files (`dataset = "images"`) through `dpfl sweep` and `dpfl best`."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.data import images
from dpfl.experiments.results.store import ResultsStore
from dpfl.experiments.study.config import ConfigError, Study
from dpfl.experiments.study.point import STORE
from dpfl.experiments.study.runner import run_study
from per_example import ghost_calls


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


def _own_images(folder: Path) -> Path:
    """Two hospitals' 8x8 PNGs and JPEGs of two classes, the class shown as brightness,
    with the labels.csv a consortium writes."""
    folder.mkdir()
    rng = np.random.default_rng(1)
    rows = ["file,label,site"]
    for k in range(64):
        label = k % 2
        pixels = rng.integers(0, 128, (8, 8)) + 100 * label
        file = f"scan-{k}.{'png' if k % 3 else 'jpg'}"
        Image.fromarray(pixels.astype(np.uint8)).save(folder / file)
        rows.append(f"{file},{('clear', 'opaque')[label]},{('Leeds', 'York')[k // 32]}")
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")
    return folder


def test_a_study_of_ones_own_images_sweeps_and_picks_the_best(
    tmp_path: Path, study_text: Callable[[Mapping[str, Any]], str]
) -> None:
    study = {
        "name": "own-images",
        "rounds": 3,
        "eval_every": "end",
        "data": {
            "dataset": "images",
            "path": str(_own_images(tmp_path / "scans")),
            "images": {"classes": ["clear", "opaque"], "size": [8, 8], "mean": [0.5], "std": [0.5]},
        },
        "model": {"kind": "small_cnn"},
        "algorithm": {"name": "fedavg", "learning_rate": [0.05, 0.1], "expected_batch_size": 8},
        "privacy": {"epsilon": 8.0},
    }
    config = tmp_path / "study.toml"
    config.write_text(study_text(study))
    out = str(tmp_path / "out")
    swept = CliRunner().invoke(app, ["sweep", str(config), "--out", out, "-j", "1", "--json"])
    assert swept.exit_code == 0, swept.output
    best = CliRunner().invoke(app, ["best", out, "-e", "8", "-d", "1e-5", "--json"])
    assert best.exit_code == 0, best.output
    chosen = json.loads(best.stdout)
    assert chosen["finished"] == 2 and chosen["qualifying"] == 2
    assert chosen["best"]["epsilon"] <= 8.0
    with ResultsStore(Path(out) / STORE) as store:
        run = store.run(chosen["best"]["run"])
        assert {row["silo"] for row in store.rows("metrics", run.id)} == {None, "leeds", "york"}


def test_image_keys_are_checked_with_the_study(tmp_path: Path) -> None:
    archive = tmp_path / "scans.npz"
    archive.write_bytes(b"")  # an .npz is a path `images` takes; its reader checks it

    def refusal(data: dict[str, Any]) -> str:
        study = {"rounds": 1, "algorithm": {"name": "fedavg"}, "privacy": {"private": False}}
        try:
            Study({**study, "data": {"partition": {"kind": "iid", "silos": 2}, **data}})
        except ConfigError as exc:
            return str(exc)
        return ""

    assert refusal({"dataset": "images", "path": str(archive), "images": {"classes": ["a"]}}) == ""
    assert "data.images.classes: declare the class names" in refusal(
        {"dataset": "images", "path": str(archive)}
    )
    assert "breastmnist has its own classes" in refusal(
        {"dataset": "breastmnist", "path": str(tmp_path), "images": {"classes": ["a", "b"]}}
    )
    not_images = refusal({"dataset": "breast_cancer", "images": {"size": [8, 8]}})
    assert "data.images: unknown key (check its spelling and section); breast_cancer" in not_images
    assert "mean and std need 3 value(s), one per channel" in refusal(
        {
            "dataset": "images",
            "path": str(archive),
            "images": {"classes": ["a"], "mode": "RGB", "mean": [0.5], "std": [0.5]},
        }
    )
    assert "is not a folder" in refusal({"dataset": "breastmnist", "path": str(archive)})


def test_declared_image_keys_enter_the_run_key_only_when_set(tmp_path: Path) -> None:
    def key(images: dict[str, Any]) -> str:
        data = {"dataset": "breastmnist", "path": str(tmp_path), "images": images}
        study = {"rounds": 1, "data": data, "algorithm": {"name": "fedavg"}}
        ((_, point),) = Study({**study, "privacy": {"private": False}}).points
        return point.key()

    assert key({}) == key({"min_site_records": 2})
    assert key({}) != key({"size": [32, 32]})


def test_a_private_study_of_the_vit_kind_runs_by_ghost_clipping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`model.kind = "vit"` through the runner with DP: the simulator's DP-SGD clips the
    ViT (not an nn.Sequential) by ghost clipping, and the run finishes."""
    calls = ghost_calls(monkeypatch)
    rng = np.random.default_rng(2)
    arrays = {}
    for split, n in (("train", 16), ("val", 4), ("test", 8)):
        labels = rng.integers(0, 2, n)
        pixels = rng.integers(0, 128, (n, 28, 28)) + 100 * labels[:, None, None]
        arrays[f"{split}_images"] = pixels.astype(np.uint8)
        arrays[f"{split}_labels"] = labels
    np.savez(tmp_path / "breastmnist.npz", **arrays)
    study = {
        "name": "vit-images",
        "rounds": 1,
        "eval_every": "end",
        "metrics": ["accuracy"],
        "data": {
            "dataset": "breastmnist",
            "path": str(tmp_path),
            "partition": {"kind": "iid", "silos": 2},
        },
        "model": {"kind": "vit"},
        "algorithm": {
            "name": "fedavg",
            "learning_rate": 0.1,
            "expected_batch_size": 4,
            "clip_norm": 1.0,
        },
        "privacy": {"noise_multiplier": 1.0},
    }
    (run,) = run_study(Study(study), tmp_path / "out")
    assert run.status == "finished", run.error
    assert calls
