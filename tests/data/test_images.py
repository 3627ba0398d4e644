"""MedMNIST loaders: split sizes and class counts equal PROVENANCE.md."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpfl.data import images
from dpfl.data.dataset import DataFormatError


def test_retinamnist_matches_provenance(shared_data: Path) -> None:
    data = images.retinamnist(shared_data / "retinamnist")
    assert data.features.shape == (1600, 3, 28, 28)
    assert data.features.min() >= 0 and data.features.max() <= 1
    expected = {
        "train": [486, 128, 206, 194, 66],
        "val": [54, 12, 28, 20, 6],
        "test": [174, 46, 92, 68, 20],
    }
    for split, counts in expected.items():
        assert data.official_split(split).class_counts().tolist() == counts


def test_breastmnist_matches_provenance(shared_data: Path) -> None:
    data = images.breastmnist(shared_data / "breastmnist")
    assert data.features.shape == (780, 1, 28, 28)
    expected = {"train": [147, 399], "val": [21, 57], "test": [42, 114]}
    for split, counts in expected.items():
        assert data.official_split(split).class_counts().tolist() == counts
    assert "not byte-identical" in data.description


def test_bad_npz_is_named(tmp_path: Path) -> None:
    arrays = {f"{s}_images": np.zeros((2, 28, 28), np.uint8) for s in images.SPLITS}
    arrays |= {f"{s}_labels": np.zeros(2, np.int64) for s in images.SPLITS}
    np.savez(tmp_path / "breastmnist.npz", **{**arrays, "val_labels": np.array([0, 5])})
    with pytest.raises(DataFormatError, match=r"breastmnist\.npz: val_labels outside 0\.\.1"):
        images.breastmnist(tmp_path)
    del arrays["test_images"]
    np.savez(tmp_path / "breastmnist.npz", **arrays)
    with pytest.raises(DataFormatError, match="missing array 'test_images'"):
        images.breastmnist(tmp_path)
    (tmp_path / "retinamnist.npz").write_text("not an archive")
    with pytest.raises(DataFormatError, match=r"retinamnist\.npz: not a readable npz"):
        images.retinamnist(tmp_path)
