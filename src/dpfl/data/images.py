"""Images: a consortium's own files, or MedMNIST `.npz` archives (RetinaMNIST, BreastMNIST
and PneumoniaMNIST are presets of the one reader).

`read_images` takes a folder with a `labels.csv` (columns `file`, `label`, and optionally
`site`, one silo per value, and `split`, an official train/val/test assignment) beside
the image files (PNG, JPEG, anything Pillow reads), or an `.npz` with MedMNIST's keys
(`train_images`, `train_labels`, `val_*`, `test_*`). Everything that shapes the pixels is
declared, never computed from them: the classes, the mode ("L" or "RGB") images are
converted to, the size they are resized to, and a per-channel mean/std. Pixels are scaled
by the public range 0-255 to [0, 1], then normalised if a mean/std is declared, and laid
out (n, channels, h, w) for torch.
"""

from __future__ import annotations

import dataclasses
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from PIL import Image

from dpfl.data.dataset import DataFormatError, Dataset, require_file, require_records

SPLITS = ("train", "val", "test")
LABELS = "labels.csv"
COLUMNS = ("file", "label", "site", "split")
"""labels.csv's columns: `file` and `label` required, `site` and `split` optional."""
MODES = {"L": 1, "RGB": 3}
"""The modes images are read in, and their channels."""
RESAMPLING = Image.Resampling.BILINEAR
"""How an image is resized to a declared size (a fixed map of its own pixels)."""


@dataclass(frozen=True)
class ImageFormat:
    """What a study declares about its images, all public.

    `classes`: the class names; label k is `classes[k]` (labels.csv names the class, an
    `.npz` holds k). `mode`: "L" or "RGB", images converted to it (None: as stored, all
    alike). `size`: (h, w), images resized to it (None: as stored, all alike). `mean`,
    `std`: per channel, on the [0, 1] scale (None: no normalisation). `min_site_records`:
    the fewest records a site of labels.csv may have."""

    classes: tuple[str, ...]
    mode: str | None = None
    size: tuple[int, int] | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    min_site_records: int = 2

    def converts(self, image: Image.Image) -> bool:
        """Whether `image` must be converted or resized to this format."""
        resized = self.size is not None and image.size != (self.size[1], self.size[0])
        return resized or (self.mode is not None and image.mode != self.mode)

    def convert(self, image: Image.Image) -> Image.Image:
        """`image` in the declared mode and size."""
        if self.mode is not None and image.mode != self.mode:
            image = image.convert(self.mode)
        if self.size is not None and image.size != (self.size[1], self.size[0]):
            image = image.resize((self.size[1], self.size[0]), RESAMPLING)
        return image

    def notes(self) -> tuple[str, ...]:
        """The declared transforms, for the dataset's preprocessing record (the scaling by
        0-255, always done, is in its description)."""
        notes = []
        if self.mode is not None:
            notes.append(f"converted to the declared mode {self.mode}")
        if self.size is not None:
            notes.append(f"resized to the declared {self.size[0]}x{self.size[1]} (bilinear)")
        if self.mean is not None:
            notes.append(f"normalised by the declared mean {self.mean} and std {self.std}")
        return tuple(notes)


@dataclass(frozen=True)
class Preset:
    """A published image set: its file in the dataset's folder, format and source."""

    file: str
    format: ImageFormat
    description: str


PRESETS = {
    "retinamnist": Preset(
        "retinamnist.npz",
        ImageFormat(("none", "mild", "moderate", "severe", "proliferative")),
        "RetinaMNIST (MedMNIST v2, from DeepDRiD), official file: DR grade 0-4.",
    ),
    "breastmnist": Preset(
        "breastmnist.npz",
        ImageFormat(("malignant", "normal/benign")),
        "BreastMNIST (MedMNIST v2, Al-Dhabyani et al. 2020), re-packed copy (labels "
        "flattened; not byte-identical to the official file).",
    ),
    "pneumoniamnist": Preset(
        "pneumoniamnist.npz",
        ImageFormat(("normal", "pneumonia")),
        "PneumoniaMNIST (MedMNIST v2, from Kermany et al. 2018), rebuilt from two public "
        "partial copies: the official split and class counts, not the official order.",
    ),
}
"""MedMNIST sets by dataset name: each is `read_images` of its `.npz` with its classes."""


def read_images(path: Path | str, image_format: ImageFormat, name: str = "images") -> Dataset:
    """The images of `path`: a folder with a labels.csv, or an `.npz` file."""
    path = Path(path)
    if path.is_dir():
        pixels, labels, sites, split = _folder(path / LABELS, image_format)
        where = f"{len(labels)} images of {path}"
    else:
        pixels, labels, split = _npz(path, image_format)
        sites, where = None, f"{len(labels)} images of {path.name}"
    channels = pixels.shape[3]
    features = pixels.transpose(0, 3, 1, 2).astype(np.float32) / np.float32(255)
    if image_format.mean is not None and image_format.std is not None:
        if len(image_format.mean) != channels:
            raise DataFormatError(
                path, f"{len(image_format.mean)} declared means for {channels} channels"
            )
        shape = (1, channels, 1, 1)
        mean = np.asarray(image_format.mean, np.float32).reshape(shape)
        features = (features - mean) / np.asarray(image_format.std, np.float32).reshape(shape)
    site_names = () if sites is None else tuple(sorted(set(sites)))
    return Dataset(
        name=name,
        features=features,
        labels=labels,
        feature_names=(),
        class_names=image_format.classes,
        site_ids=None if sites is None else np.searchsorted(site_names, sites).astype(np.int64),
        site_names=site_names,
        split=split,
        description=f"Images ({where}, {channels}x{pixels.shape[1]}x{pixels.shape[2]}); "
        f"pixels scaled by the public range 0-255.",
        preprocessing=image_format.notes(),
    )


def read_preset(name: str, directory: Path | str, **declared: Any) -> Dataset:
    """The preset `name`'s file in `directory`, in its format (`declared` may set the
    mode, size, mean and std, not the classes), described as today's loaders did."""
    preset = PRESETS[name]
    image_format = dataclasses.replace(preset.format, **declared)
    data = read_images(Path(directory) / preset.file, image_format, name)
    note = " Pixels scaled by the public range 0-255; official split."
    return dataclasses.replace(data, description=preset.description + note)


def retinamnist(directory: Path | str) -> Dataset:
    """RetinaMNIST 28x28x3: diabetic-retinopathy grade 0-4 (1,600 fundus images)."""
    return read_preset("retinamnist", directory)


def breastmnist(directory: Path | str) -> Dataset:
    """BreastMNIST 28x28: breast ultrasound, 0 = malignant, 1 = normal/benign (780 images)."""
    return read_preset("breastmnist", directory)


def pneumoniamnist(directory: Path | str) -> Dataset:
    """PneumoniaMNIST 28x28: pediatric chest X-ray, 0 = normal, 1 = pneumonia (5,856)."""
    return read_preset("pneumoniamnist", directory)


def _npz(path: Path, image_format: ImageFormat) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pixels (n, h, w, c) uint8, labels, split) of a MedMNIST-style archive."""
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
        x, y = arrays[f"{split}_images"], arrays[f"{split}_labels"].reshape(-1)
        if (
            x.dtype != np.uint8
            or x.ndim not in (3, 4)
            or (x.ndim == 4 and x.shape[3] not in (1, 3))
        ):
            raise DataFormatError(
                path, f"{split}_images must be uint8 (n, h, w[, 1 or 3]), got {x.shape}"
            )
        if len(y) != len(x):
            raise DataFormatError(path, f"{split}: {len(x)} images but {len(y)} labels")
        if len(y) and not 0 <= y.min() <= y.max() < len(image_format.classes):
            raise DataFormatError(
                path, f"{split}_labels outside 0..{len(image_format.classes) - 1}"
            )
        x = x if x.ndim == 4 else x[..., None]
        if len(x) and image_format.converts(_image(x[0])):
            x = np.stack([_array(image_format.convert(_image(one))) for one in x])
        images.append(x)
        labels.append(y.astype(np.int64))
        splits.append(np.full(len(y), split))
    first = images[0].shape[1:]
    for split, x in zip(SPLITS, images, strict=True):
        if len(x) and x.shape[1:] != first:
            raise DataFormatError(
                path,
                f"{split}_images are {_shape(x.shape[1:])}, train_images {_shape(first)}: "
                "declare data.images.size (and mode) to read them alike",
            )
    return np.concatenate(images), np.concatenate(labels), np.concatenate(splits)


def _folder(
    table: Path, image_format: ImageFormat
) -> tuple[np.ndarray, np.ndarray, list[str] | None, np.ndarray | None]:
    """(pixels, labels, sites, split) of a labels.csv and the images it names; the
    table is checked before any image is read."""
    rows = _rows(table)
    sites = _sites(table, rows, image_format.min_site_records)
    split = _split(table, rows)
    classes = {name: k for k, name in enumerate(image_format.classes)}
    for line, label in enumerate(rows["label"], start=2):
        if label not in classes:
            raise DataFormatError(
                table,
                f"label {label!r} is not a declared class ({', '.join(classes)})",
                line=line,
                column="label",
            )
    pixels = []
    first: tuple[int, str, tuple[int, ...]] | None = None  # line, mode, shape
    for line, file in enumerate(rows["file"], start=2):
        image = _open(table.parent, file, table, line)
        if image.mode not in MODES and image_format.mode is None:
            raise DataFormatError(
                table,
                f"{file}: mode {image.mode!r}; declare data.images.mode ('L' or 'RGB')",
                line=line,
                column="file",
            )
        array = _array(image_format.convert(image))
        if first is None:
            first = (line, image.mode, array.shape)
        elif array.shape != first[2]:
            raise DataFormatError(
                table,
                f"{file} is {_shape(array.shape)} ({image.mode}), line {first[0]}'s image "
                f"{_shape(first[2])} ({first[1]}): declare data.images.size and mode to "
                "read them alike",
                line=line,
                column="file",
            )
        pixels.append(array)
    labels = np.asarray([classes[label] for label in rows["label"]], np.int64)
    return np.stack(pixels), labels, sites, split


def _rows(table: Path) -> dict[str, list[str]]:
    """labels.csv's columns, as text (an empty line is a row of empty cells, so that a
    row's line is its index + 2)."""
    try:
        read = pacsv.read_csv(
            require_file(table),
            parse_options=pacsv.ParseOptions(ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(
                column_types=dict.fromkeys(COLUMNS, pa.string()), strings_can_be_null=False
            ),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
        raise DataFormatError(table, f"not a readable CSV: {exc}") from exc
    unknown = [c for c in read.column_names if c not in COLUMNS]
    missing = [c for c in COLUMNS[:2] if c not in read.column_names]
    if unknown or missing:
        raise DataFormatError(
            table,
            f"columns {read.column_names}: needs 'file' and 'label', may have 'site' and "
            "'split', and nothing else",
            line=1,
        )
    require_records(table, read.num_rows, "rows after the header")
    return {
        column: [str(v).strip() for v in read.column(column).to_pylist()]
        for column in read.column_names
    }


def _open(folder: Path, file: str, table: Path, line: int) -> Image.Image:
    """The image `file` of `folder`, decoded, or a refusal naming it and its row."""
    path = folder / file
    if not file or not path.is_file():
        raise DataFormatError(table, f"image {file!r} not found", line=line, column="file")
    try:
        with Image.open(path) as image:
            image.load()
            return image
    except (OSError, Image.DecompressionBombError, ValueError) as exc:
        raise DataFormatError(
            table, f"{file}: not a readable image ({exc})", line=line, column="file"
        ) from exc


def _sites(table: Path, rows: dict[str, list[str]], least: int) -> list[str] | None:
    """Each row's site, every site with at least `least` records."""
    if "site" not in rows:
        return None
    sites = rows["site"]
    for line, site in enumerate(sites, start=2):
        if not site:
            raise DataFormatError(table, "no site", line=line, column="site")
    for site in sorted(set(sites)):
        count = sites.count(site)
        if count < least:
            raise DataFormatError(
                table,
                f"site {site!r} has {count} records, fewer than data.images.min_site_records "
                f"({least})",
                line=sites.index(site) + 2,
                column="site",
            )
    return sites


def _split(table: Path, rows: dict[str, list[str]]) -> np.ndarray | None:
    if "split" not in rows:
        return None
    for line, split in enumerate(rows["split"], start=2):
        if split not in SPLITS:
            raise DataFormatError(
                table, f"split {split!r}: one of {', '.join(SPLITS)}", line=line, column="split"
            )
    return np.asarray(rows["split"])


def _image(array: np.ndarray) -> Image.Image:
    """One (h, w, c) uint8 array as a Pillow image (L for one channel, RGB for three)."""
    return Image.fromarray(array[..., 0] if array.shape[2] == 1 else array)


def _array(image: Image.Image) -> np.ndarray:
    """A Pillow image as (h, w, c) uint8."""
    array = np.asarray(image, dtype=np.uint8)
    return array[..., None] if array.ndim == 2 else array


def _shape(shape: Sequence[int]) -> str:
    return "x".join(str(s) for s in shape)
