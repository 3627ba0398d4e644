"""Generated populations that need no files: the Kerkouche-shaped EHR of many hospitals
and the PETs-challenge-shaped pandemic (a contact graph, node-level privacy)."""

from __future__ import annotations

import functools
import json
from typing import ClassVar, Literal

from pydantic import Field

from dpfl.data import Dataset
from dpfl.experiments.study.datasets.base import DataSettings, Files, Real


class SyntheticEhr(DataSettings):
    """Kerkouche-shaped sparse EHR of many hospitals (`dpfl.data.synthetic`)."""

    FILES: ClassVar[Files] = "nothing"

    dataset: Literal["synthetic_ehr"]
    n_hospitals: int = Field(314, ge=1)
    size_scale: Real = Field(1.0, gt=0)
    """Each hospital's admissions, as a share of the paper's."""
    positive_rate: Real = Field(0.0315, gt=0, lt=1)
    """The declared death rate."""
    codes_per_admission: Real = Field(12.0, gt=0)

    def load(self, seed: int) -> Dataset:
        from dpfl.data import synthetic

        return synthetic.synthetic_ehr(seed, **self.keywords())


POPULATION = (
    "people",
    "regions",
    "transmission",
    "initial_infected",
    "asymptomatic",
    "region_spread",
    "heterogeneity",
)
"""`Pandemic`'s keys that shape the population (the rest shape its table)."""


class Pandemic(DataSettings):
    """The PETs-challenge-shaped population, its contact graph pruned so a person is in
    at most `max_appearances` rows, and one train row (a random window) and one test row
    (the latest) per person, drawn from the study's seed. Node-level privacy: train with
    `data.split = "official"`, the natural partition (the regions) and
    `privacy.accountant = "rdp"`."""

    FILES: ClassVar[Files] = "nothing"

    dataset: Literal["pandemic"]
    people: int = Field(20_000, ge=1)
    regions: int = Field(10, ge=1)
    transmission: Real = Field(1.0, ge=0)
    initial_infected: Real = Field(0.002, ge=0, le=1)
    asymptomatic: Real = Field(0.3, ge=0, le=1)
    region_spread: Real = Field(20.0, ge=1)
    heterogeneity: Real = Field(0.0, ge=0)
    max_appearances: int = Field(10, ge=1)
    """The most rows a person appears in (their own and as a contact)."""
    window: int = Field(21, ge=1)
    horizon: int = Field(7, ge=1)
    train_days: int = Field(56, ge=2)
    contacts: Literal["slots", "summary"] = "slots"
    """A row's contacts: one slot each, or summed."""

    def load(self, seed: int) -> Dataset:
        return _pandemic(seed, json.dumps(self.keywords(), sort_keys=True))


@functools.lru_cache(maxsize=1)
def _pandemic(seed: int, options_json: str) -> Dataset:
    """Kept for the next point of a sweep in the same process (most share the data);
    one only, since at a million people it holds gigabytes."""
    from dpfl.data import pandemic

    options = json.loads(options_json)
    world = {k: options.pop(k) for k in POPULATION}
    population = pandemic.pandemic_population(world.pop("people"), seed=seed, **world)
    return pandemic.pandemic_dataset(population, seed=seed, **options)
