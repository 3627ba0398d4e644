"""MedMNIST images (RetinaMNIST: Dopamine's task on real data; BreastMNIST).

Pixels are scaled by the public range 0-255 to [0, 1] and laid out (n, channels, 28, 28)
for torch; the official train/val/test split is kept in `split`.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from dpfl.data.dataset import DataFormatError, Dataset, require_file

SPLITS = ("train", "val", "test")


def _medmnist(path: Path, name: str, class_names: tuple[str, ...], description: str) -> Dataset:
    try:
        with np.load(require_file(path)) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DataFormatError(path, f"not a readable npz archive: {exc}") from exc
    images, labels, splits = [], [], []
    for split in SPLITS:
        for key in (f"{split}_images", f"{split}_labels"):
            if key not in arrays:
                raise DataFormatError(path, f"missing array {key!r}")
        x, y = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if x.dtype != np.uint8 or x.ndim not in (3, 4) or x.shape[1:3] != (28, 28):
            raise DataFormatError(
                path, f"{split}_images must be uint8 (n, 28, 28[, c]), got {x.shape}"
            )
        y = y.reshape(-1)
        if len(y) != len(x):
            raise DataFormatError(path, f"{split}: {len(x)} images but {len(y)} labels")
        if len(y) and not 0 <= y.min() <= y.max() < len(class_names):
            raise DataFormatError(path, f"{split}_labels outside 0..{len(class_names) - 1}")
        images.append(x if x.ndim == 4 else x[..., None])
        labels.append(y.astype(np.int64))
        splits.append(np.full(len(y), split))
    pixels = np.concatenate(images).transpose(0, 3, 1, 2)
    return Dataset(
        name=name,
        features=pixels.astype(np.float32) / np.float32(255),
        labels=np.concatenate(labels),
        feature_names=(),
        class_names=class_names,
        split=np.concatenate(splits),
        description=description + " Pixels scaled by the public range 0-255; official split.",
    )


def retinamnist(directory: Path | str) -> Dataset:
    """RetinaMNIST 28x28x3: diabetic-retinopathy grade 0-4 (1,600 fundus images)."""
    return _medmnist(
        Path(directory) / "retinamnist.npz",
        "retinamnist",
        ("none", "mild", "moderate", "severe", "proliferative"),
        "RetinaMNIST (MedMNIST v2, from DeepDRiD), official file: DR grade 0-4.",
    )


def breastmnist(directory: Path | str) -> Dataset:
    """BreastMNIST 28x28: breast ultrasound, 0 = malignant, 1 = normal/benign (780 images)."""
    return _medmnist(
        Path(directory) / "breastmnist.npz",
        "breastmnist",
        ("malignant", "normal/benign"),
        "BreastMNIST (MedMNIST v2, Al-Dhabyani et al. 2020), re-packed copy (labels "
        "flattened; not byte-identical to the official file).",
    )
