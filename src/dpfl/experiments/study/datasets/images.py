"""Image datasets (`dpfl.data.images`): `images`, a consortium's own image files in the
format its study declares, and the MedMNIST sets as presets of it."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from dpfl.data import Dataset, images
from dpfl.experiments.study.datasets.base import DataSettings, Files, Strict


class ImagesConfig(Strict):
    """The format of an image dataset's files (`dpfl.data.images`): public declarations,
    none computed from the pixels. Pixels are scaled by the public range 0-255."""

    classes: list[str] | None = Field(None, min_length=1)
    """The class names: a labels.csv `label` names one, an `.npz` label k is the k-th.
    Required by `dataset = "images"`; a MedMNIST preset has its own."""
    mode: Literal["L", "RGB"] | None = None
    """Every image converted to it (default: as stored, "L" or "RGB", all alike)."""
    size: tuple[PositiveInt, PositiveInt] | None = None
    """[h, w]: every image resized to it, bilinear (default: as stored, all alike)."""
    mean: list[float] | None = None
    """Per channel, on the [0, 1] scale: pixels become (x - mean) / std."""
    std: list[PositiveFloat] | None = None
    min_site_records: int = Field(2, ge=1)
    """The fewest records a site of labels.csv may have."""

    @model_validator(mode="after")
    def _normalisation(self) -> ImagesConfig:
        if (self.mean is None) != (self.std is None):
            raise ValueError("give both mean and std, per channel, or neither")
        if self.mean is not None and self.std is not None:
            channels = {"L": 1, "RGB": 3}.get(self.mode or "", len(self.mean))
            if len(self.mean) != channels or len(self.std) != channels:
                raise ValueError(f"mean and std need {channels} value(s), one per channel")
        if self.classes is not None and len(set(self.classes)) != len(self.classes):
            raise ValueError(f"classes must differ, got {self.classes}")
        return self

    def declared(self) -> dict[str, Any]:
        """The keys set, as `dpfl.data.images` takes them (lists as tuples)."""
        return {
            k: tuple(v) if isinstance(v, list) else v
            for k, v in self.model_dump(exclude_none=True).items()
        }


class ImageData(DataSettings):
    """An image dataset: its files' format is `[data.images]`."""

    OWN_KEYS_WERE_OPTIONS = False

    images: ImagesConfig = ImagesConfig()
    """`[data.images]`: the format of the image files."""


class OwnImages(ImageData):
    """The folder at `path` (labels.csv and its images) or an `.npz` file, in the format
    `[data.images]` declares, the class names among it."""

    FILES: ClassVar[Files] = "folder-or-npz"

    dataset: Literal["images"]

    @model_validator(mode="after")
    def _classes_declared(self) -> OwnImages:
        if self.images.classes is None:
            raise ValueError("data.images.classes: declare the class names")
        return self

    def load(self, seed: int) -> Dataset:
        return images.read_images(self.folder, images.ImageFormat(**self.images.declared()))


class ImagePreset(ImageData):
    """A MedMNIST set's official file in the folder `path`, in its preset's format, which
    `[data.images]` may change in all but the classes."""

    dataset: Literal["retinamnist", "breastmnist", "pneumoniamnist"]

    @model_validator(mode="after")
    def _own_classes(self) -> ImagePreset:
        if self.images.classes is not None:
            raise ValueError(f"data.images.classes: {self.dataset} has its own classes")
        return self

    def load(self, seed: int) -> Dataset:
        return images.read_preset(self.dataset, self.folder, **self.images.declared())
