"""The image reader: a folder of files and labels.csv reads as its .npz; declared
formats; bad files refused by name and row; the MedMNIST presets' split sizes and class
counts equal PROVENANCE.md, and their arrays today's."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from dpfl.data import images
from dpfl.data.dataset import DataFormatError, Dataset


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


# The presets' arrays as HEAD's MedMNIST loader (before issue 38) read them: SHA-256 of
# the features, labels and split (dtype, shape and bytes of each); PneumoniaMNIST's by
# that loader's reading of its file with its two classes.
PRESET_DIGESTS = {
    "retinamnist": "1207d3a0dc38d96f19a960f23abe22576f3eee79dcb241e81060eb86f52b14f5",
    "breastmnist": "cb1bdec4172ce59b211a357059bf05a69d8a2dae7c093aefba85bc0744b5f35f",
    "pneumoniamnist": "6bcacd49984a3e99035ad361744b914087a79b13429d233db3d82f6c7df1e5a0",
}
DESCRIPTIONS = {
    "retinamnist": "RetinaMNIST (MedMNIST v2, from DeepDRiD), official file: DR grade 0-4. "
    "Pixels scaled by the public range 0-255; official split.",
    "breastmnist": "BreastMNIST (MedMNIST v2, Al-Dhabyani et al. 2020), re-packed copy "
    "(labels flattened; not byte-identical to the official file). Pixels scaled by the "
    "public range 0-255; official split.",
}


def _digest(data: Dataset) -> str:
    digest = hashlib.sha256()
    assert data.split is not None
    for array in (data.features, data.labels, data.split.astype("U5")):
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("name", sorted(PRESET_DIGESTS))
def test_presets_read_todays_arrays(shared_data: Path, name: str) -> None:
    data = images.read_preset(name, shared_data / name)
    assert _digest(data) == PRESET_DIGESTS[name]
    assert data.name == name and data.preprocessing == ()
    if name in DESCRIPTIONS:
        assert data.description == DESCRIPTIONS[name]


def test_pneumoniamnist_matches_provenance(shared_data: Path) -> None:
    data = images.pneumoniamnist(shared_data / "pneumoniamnist")
    assert data.features.shape == (5856, 1, 28, 28)
    assert data.class_names == ("normal", "pneumonia")
    expected = {"train": [1214, 3494], "val": [135, 389], "test": [234, 390]}
    for split, counts in expected.items():
        assert data.official_split(split).class_counts().tolist() == counts


CLASSES = ("cat", "dog")


def _folder(tmp_path: Path) -> Path:
    """Twelve 6x5 grayscale images, PNGs and JPEGs by turns, in the train/val/test order
    of an .npz, with labels.csv (file, label, site, split)."""
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    rows = ["file,label,site,split"]
    splits = ["train"] * 6 + ["val"] * 2 + ["test"] * 4
    for k, (site, split) in enumerate(zip(["north", "south"] * 6, splits, strict=True)):
        file = f"{k}.png" if k % 2 else f"{k}.jpg"
        Image.fromarray(rng.integers(0, 256, (6, 5), np.uint8)).save(folder / file)
        rows.append(f"{file},{CLASSES[k % 3 % 2]},{site},{split}")
    (folder / images.LABELS).write_text("\n".join(rows) + "\n")
    return folder


def _as_npz(folder: Path, path: Path) -> Path:
    """The folder's images as decoded, labels and split in MedMNIST's keys."""
    table = (folder / images.LABELS).read_text().split()[1:]
    arrays: dict[str, list[Any]] = {}
    for row in table:
        file, label, _, split = row.split(",")
        pixels = np.asarray(Image.open(folder / file))
        arrays.setdefault(f"{split}_images", []).append(pixels)
        arrays.setdefault(f"{split}_labels", []).append([CLASSES.index(label)])
    np.savez(path, **{key: np.asarray(value, np.uint8) for key, value in arrays.items()})
    return path


def test_a_folder_reads_as_its_npz(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    declared = images.ImageFormat(CLASSES)
    from_folder = images.read_images(folder, declared)
    from_npz = images.read_images(_as_npz(folder, tmp_path / "same.npz"), declared)
    assert from_folder.features.shape == (12, 1, 6, 5)
    for field in ("features", "labels", "split"):
        np.testing.assert_array_equal(getattr(from_folder, field), getattr(from_npz, field))
    assert from_folder.class_names == from_npz.class_names == CLASSES
    assert from_folder.site_names == ("north", "south")
    assert from_folder.site_ids.tolist() == [0, 1] * 6  # type: ignore[union-attr]
    assert from_npz.site_ids is None


def test_declared_mode_size_and_normalisation(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    plain = images.read_images(folder, images.ImageFormat(CLASSES, mode="RGB", size=(4, 4)))
    assert plain.features.shape == (12, 3, 4, 4)
    np.testing.assert_array_equal(plain.features[:, 0], plain.features[:, 2])  # gray as RGB
    mean, std = (0.5, 0.4, 0.3), (0.25, 0.5, 1.0)
    normed = images.read_images(
        folder, images.ImageFormat(CLASSES, mode="RGB", size=(4, 4), mean=mean, std=std)
    )
    for c in range(3):
        np.testing.assert_allclose(
            normed.features[:, c], (plain.features[:, c] - mean[c]) / std[c], rtol=1e-6
        )
    assert any("normalised by the declared mean" in note for note in normed.preprocessing)


def _rewrite(folder: Path, line: int, row: str) -> None:
    lines = (folder / images.LABELS).read_text().splitlines()
    lines[line - 1] = row
    (folder / images.LABELS).write_text("\n".join(lines) + "\n")


def test_bad_folders_are_refused_naming_file_and_row(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    declared = images.ImageFormat(CLASSES)
    where = f"{folder / images.LABELS}, line 4, column"

    def refused(match: str, image_format: images.ImageFormat = declared) -> None:
        with pytest.raises(DataFormatError, match=re.escape(f"{where} {match}")):
            images.read_images(folder, image_format)

    _rewrite(folder, 4, "gone.png,cat,north,train")
    refused("'file': image 'gone.png' not found")
    (folder / "broken.png").write_bytes(b"not a png")
    _rewrite(folder, 4, "broken.png,cat,north,train")
    refused("'file': broken.png: not a readable image")
    _rewrite(folder, 4, "2.jpg,bird,north,train")
    refused("'label': label 'bird' is not a declared class (cat, dog)")
    Image.fromarray(np.zeros((7, 5), np.uint8)).save(folder / "tall.png")
    _rewrite(folder, 4, "tall.png,cat,north,train")
    refused("'file': tall.png is 7x5x1 (L), line 2's image 6x5x1 (L)")
    resized = images.read_images(folder, images.ImageFormat(CLASSES, size=(6, 5)))
    assert resized.features.shape == (12, 1, 6, 5)
    _rewrite(folder, 4, "2.jpg,cat,east,train")
    refused("'site': site 'east' has 1 records, fewer than data.images.min_site_records (2)")
    images.read_images(folder, images.ImageFormat(CLASSES, min_site_records=1))
    _rewrite(folder, 4, "2.jpg,cat,north,validation")
    refused("'split': split 'validation': one of train, val, test")


def test_npz_images_of_two_sizes_are_refused(tmp_path: Path) -> None:
    arrays = {f"{s}_images": np.zeros((2, 28, 28), np.uint8) for s in images.SPLITS}
    arrays |= {f"{s}_labels": np.zeros(2, np.int64) for s in images.SPLITS}
    np.savez(tmp_path / "sizes.npz", **{**arrays, "test_images": np.zeros((2, 32, 32), np.uint8)})
    with pytest.raises(DataFormatError, match=r"sizes\.npz: test_images are 32x32x1, train_"):
        images.read_images(tmp_path / "sizes.npz", images.ImageFormat(CLASSES))
    resized = images.read_images(tmp_path / "sizes.npz", images.ImageFormat(CLASSES, size=(8, 8)))
    assert resized.features.shape == (6, 1, 8, 8)
