"""The synthetic pandemic: a seeded, plausible outbreak on a fixed contact graph, pruned so
that each person is in at most S neighbourhood rows, tabularised without leaks."""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict

import numpy as np
import pytest

from dpfl.data.dataset import NONPRIVATE_MARK, Dataset
from dpfl.data.pandemic import (
    CONTACT_FEATURES,
    CONTACT_KINDS,
    EXPOSURE_FEATURES,
    INDIVIDUAL_FEATURES,
    RECOVERED,
    SUSCEPTIBLE,
    Population,
    _outbreak,
    pair_hash,
    pandemic_dataset,
    pandemic_population,
    prune_contacts,
)

WINDOW, HORIZON, TRAIN_DAYS = 21, 7, 56


@pytest.fixture(scope="module")
def population() -> Population:
    return pandemic_population(30_000, seed=0)


@pytest.fixture(scope="module")
def small() -> Population:
    return pandemic_population(2_000, seed=3, regions=3)


@pytest.fixture(scope="module")
def dataset(population: Population) -> Dataset:
    return pandemic_dataset(population, max_appearances=10, seed=0)


def _same(x: Population, y: Population) -> bool:
    """Equal in every array and setting except the recorded seed."""
    return all(
        np.array_equal(getattr(x, f.name), getattr(y, f.name))
        if isinstance(getattr(x, f.name), np.ndarray)
        else getattr(x, f.name) == getattr(y, f.name)
        for f in dataclasses.fields(Population)
        if f.name != "seed"
    )


def test_same_seed_same_data_and_another_seed_differs() -> None:
    first, again = (pandemic_population(3_000, seed=5) for _ in range(2))
    assert _same(first, again)
    assert not _same(first, pandemic_population(3_000, seed=6))
    data, data_again = (pandemic_dataset(first, max_appearances=5, seed=1) for _ in range(2))
    assert np.array_equal(data.features, data_again.features)
    assert np.array_equal(data.labels, data_again.labels)
    other = pandemic_dataset(first, max_appearances=5, seed=2)
    assert not np.array_equal(other.extra["window_end"], data.extra["window_end"])
    assert not np.array_equal(other.features, data.features)
    # The pruning is public and fixed: a different window seed keeps the same neighbours.
    assert np.array_equal(other.extra["members"], data.extra["members"])


def test_regions_differ_in_size_and_cross_region_contacts_are_cut(
    population: Population, dataset: Dataset
) -> None:
    sizes = np.bincount(population.region)
    assert len(sizes) == len(population.region_names) == 10
    assert sizes.min() >= 1 and sizes.max() > 10 * sizes.min()
    cross = population.region[population.contact_a] != population.region[population.contact_b]
    assert 0.02 < cross.mean() < 0.3  # a minority, but some
    members = dataset.extra["members"]
    same_region = population.region[members] == dataset.site_ids[:, None]
    assert np.all(same_region | (members < 0))
    assert np.array_equal(dataset.site_ids, population.region[dataset.extra["person"]])


def test_contacts_are_undirected_pairs_with_plausible_degrees(population: Population) -> None:
    a, b = population.contact_a, population.contact_b
    assert np.all(a < b)
    key = a.astype(np.int64) * population.people + b
    assert np.all(np.diff(key) > 0)  # sorted, one contact per pair
    assert set(np.unique(population.contact_kind)) == set(range(len(CONTACT_KINDS)))
    assert np.all((population.contact_hours > 0) & (population.contact_hours <= 24))
    household = population.contact_kind == 0
    assert np.all(population.household[a[household]] == population.household[b[household]])
    degree = population.degrees()
    assert ((degree >= 5) & (degree <= 40)).mean() > 0.8
    assert degree.max() > 40  # a tail
    sizes = np.bincount(population.household)
    assert np.array_equal(sizes[population.household], population.household_size)
    assert sizes.max() <= 6


def _reference_kept(population: Population, slots: int) -> set[tuple[int, int]]:
    """The pruning rule, one person at a time."""
    ranked: defaultdict[int, list[tuple[int, int]]] = defaultdict(list)
    hashes = pair_hash(population.contact_a, population.contact_b)
    for a, b, h in zip(population.contact_a, population.contact_b, hashes, strict=True):
        if population.region[a] == population.region[b]:
            ranked[int(a)].append((int(h) >> 32, int(b)))
            ranked[int(b)].append((int(h) >> 32, int(a)))
    first = {u: {v for _, v in sorted(c)[:slots]} for u, c in ranked.items()}
    return {(u, v) for u, vs in first.items() for v in vs if u < v and u in first.get(v, ())}


@pytest.mark.parametrize("appearances", [1, 2, 4, 10, 20])
def test_pruning_follows_the_rule_and_bounds_appearances(
    small: Population, appearances: int
) -> None:
    hood = prune_contacts(small, appearances)
    slots = appearances - 1
    assert hood.neighbours.shape == (small.people, slots)
    kept = {(u, int(v)) for u, row in enumerate(hood.neighbours) for v in row[row >= 0] if u < v}
    assert kept == _reference_kept(small, slots)
    if slots:
        assert len(kept) > 0
    # Symmetric, so appearances = 1 + kept degree ≤ S; slots are filled from the left.
    nb = hood.neighbours
    for u, v in kept:
        assert u in nb[v]
    assert np.all(np.diff((nb >= 0).astype(int), axis=1) <= 0)
    again = prune_contacts(small, appearances)
    assert np.array_equal(again.neighbours, hood.neighbours)
    assert np.array_equal(again.hours, hood.hours)


@pytest.mark.parametrize("appearances", [1, 3, 10, 20])
def test_no_person_is_in_more_than_s_training_rows_of_a_region(
    population: Population, appearances: int
) -> None:
    data = pandemic_dataset(population, max_appearances=appearances, seed=4)
    assert data.appearances == appearances
    members = data.extra["members"]
    assert members.shape == (len(data), appearances)
    train = data.split == "train"
    worst = 0
    for region in range(len(population.region_names)):
        rows = members[train & (data.site_ids == region)]
        counts = np.bincount(rows[rows >= 0], minlength=population.people)
        worst = max(worst, int(counts.max()))
    assert worst <= appearances
    if appearances <= 10:
        assert worst == appearances  # the bound is reached, so the test can see a breach


def test_outbreak_is_a_plausible_observed_sir(population: Population) -> None:
    states, infected = population.states, population.infection_day >= 0
    assert states.dtype == np.int8 and set(np.unique(states)) == {0, 1, 2}
    assert np.all(np.diff(states, axis=1) >= 0)  # S -> I -> R only
    assert np.all(states[~infected] == SUSCEPTIBLE)
    hidden = infected & population.asymptomatic
    assert hidden.sum() > 0 and np.all(states[hidden] == SUSCEPTIBLE)
    seen = np.flatnonzero(infected & ~population.asymptomatic)
    day = np.arange(population.days)
    expected = (day >= population.infection_day[seen, None]).astype(np.int8)
    expected += day >= population.recovery_day[seen, None]
    assert np.array_equal(states[seen], expected)
    period = population.recovery_day[infected] - population.infection_day[infected]
    assert period.min() >= 3 and 5 < period.mean() < 9
    assert (population.infection_day == 0).sum() == round(0.002 * population.people)


def test_everyone_infected_after_day_0_had_an_infectious_contact(population: Population) -> None:
    infection, recovery = population.infection_day, population.recovery_day
    source = np.concatenate([population.contact_a, population.contact_b])
    target = np.concatenate([population.contact_b, population.contact_a])
    day_before = infection[target] - 1
    infectious = (
        (infection[source] >= 0)
        & (infection[source] <= day_before)
        & (day_before < recovery[source])
    )
    explained = np.bincount(target[infectious], minlength=population.people) > 0
    later = infection > 0
    assert later.sum() > 100
    assert np.all(explained[later])


def test_infection_rates_are_in_the_documented_regime(population: Population) -> None:
    ever = (population.states[:, -1] != SUSCEPTIBLE).mean()
    assert 0.01 < ever < 0.05
    assert 0.003 <= population.newly_infected(TRAIN_DAYS, HORIZON).mean() <= 0.01
    faster = pandemic_population(30_000, seed=0, transmission=1.5)
    assert (faster.states[:, -1] != SUSCEPTIBLE).mean() > 2 * ever


def test_labels_are_first_observed_infection_in_the_horizon(
    population: Population, dataset: Dataset
) -> None:
    n = population.people
    split = dataset.split
    assert (split == "train").sum() == (split == "test").sum() == n
    end = dataset.extra["window_end"]
    assert end[split == "train"].min() >= WINDOW
    assert end[split == "train"].max() <= TRAIN_DAYS - HORIZON
    assert np.all(end[split == "test"] == TRAIN_DAYS)
    assert 0.003 <= dataset.labels[split == "test"].mean() <= 0.01
    rng = np.random.default_rng(0)
    rows = np.concatenate([rng.choice(len(dataset), 300), np.flatnonzero(dataset.labels)[:100]])
    for row in rows:
        p, t = dataset.extra["person"][row], end[row]
        was_s = population.states[p, t - 1] == SUSCEPTIBLE
        becomes_i = np.any(population.states[p, t : t + HORIZON] == 1)
        assert dataset.labels[row] == int(was_s and becomes_i)


def _individual(population: Population, p: int, end: int) -> np.ndarray:
    window = population.states[p, end - WINDOW : end]
    return np.concatenate(
        [
            [population.age[p] / 100, population.female[p], population.household_size[p] / 6],
            population.activities[p],
            np.eye(3)[window[-1]],
            [(window == 1).mean(), (window == RECOVERED).mean()],
        ]
    )


def test_features_match_the_states_of_the_person_and_neighbours_in_the_window(
    population: Population, dataset: Dataset
) -> None:
    own, slot = len(INDIVIDUAL_FEATURES), len(CONTACT_FEATURES)
    assert dataset.features.shape[1] == own + 9 * slot == len(dataset.feature_names)
    contact = {
        (int(a), int(b)): (int(k), float(h))
        for a, b, k, h in zip(
            population.contact_a,
            population.contact_b,
            population.contact_kind,
            population.contact_hours,
            strict=True,
        )
    }
    members = dataset.extra["members"]
    end = dataset.extra["window_end"]
    # Rows whose neighbourhood saw an infection in its window, and some others.
    last_day = population.states[members, end[:, None] - 1]
    touched = np.flatnonzero(np.any((last_day > 0) & (members >= 0), axis=1))
    assert len(touched) > 20
    rng = np.random.default_rng(1)
    for row in np.concatenate([touched[:150], rng.choice(len(dataset), 50)]):
        x = dataset.features[row]
        p, t = members[row, 0], end[row]
        np.testing.assert_allclose(x[:own], _individual(population, p, t), atol=1e-6)
        for j, q in enumerate(members[row, 1:]):
            block = x[own + j * slot : own + (j + 1) * slot]
            if q < 0:
                assert not block.any()
                continue
            kind, hours = contact[(min(p, q), max(p, q))]
            assert block[0] == 1 and block[1 + kind] == 1 and block[1:6].sum() == 1
            assert block[6] == pytest.approx(hours / 24)
            np.testing.assert_allclose(block[7:], _individual(population, q, t), atol=1e-6)


def test_the_summary_averages_the_slots_and_adds_exposure_hours(
    population: Population, dataset: Dataset
) -> None:
    """contacts="summary" is the same rows (windows, labels, members) with the S - 1
    slots averaged, and hours with infected neighbours, from the slot layout's values."""
    summary = pandemic_dataset(population, max_appearances=10, seed=0, contacts="summary")
    own, slot = len(INDIVIDUAL_FEATURES), len(CONTACT_FEATURES)
    assert summary.features.shape[1] == own + slot + len(EXPOSURE_FEATURES)
    assert len(summary.feature_names) == summary.features.shape[1]
    np.testing.assert_array_equal(summary.labels, dataset.labels)
    np.testing.assert_array_equal(summary.extra["members"], dataset.extra["members"])
    assert summary.appearances == dataset.appearances
    slots = dataset.features[:, own:].reshape(len(dataset), 9, slot)
    np.testing.assert_array_equal(summary.features[:, :own], dataset.features[:, :own])
    np.testing.assert_allclose(summary.features[:, own : own + slot], slots.mean(1), atol=1e-6)
    hours = slots[:, :, CONTACT_FEATURES.index("hours")]
    for j, state in enumerate(("last_I", "days_I")):
        exposure = (hours * slots[:, :, CONTACT_FEATURES.index(state)]).mean(1)
        np.testing.assert_allclose(summary.features[:, own + slot + j], exposure, atol=1e-6)
    assert summary.features[:, -2].max() > 0  # someone was exposed
    with pytest.raises(ValueError, match="contacts"):
        pandemic_dataset(population, seed=0, contacts="graph")


def test_heterogeneity_changes_only_how_infection_spreads_by_region(small: Population) -> None:
    """Each region's own factors per contact kind: the same people and contacts, another
    outbreak; 0 is the homogeneous model. A factor applies to contacts *into* its region:
    zero for region 1 leaves only its day-0 cases infected, and the others infected."""
    plain = pandemic_population(20_000, seed=2)
    assert _same(plain, pandemic_population(20_000, seed=2, heterogeneity=0.0))
    mixed = pandemic_population(20_000, seed=2, heterogeneity=1.0)
    for name in ("age", "household", "region", "contact_a", "contact_b", "contact_hours"):
        np.testing.assert_array_equal(getattr(plain, name), getattr(mixed, name))
    assert not np.array_equal(plain.infection_day, mixed.infection_day)
    a, b = small.contact_a, small.contact_b
    into_region_1 = small.region[np.concatenate([b, a])] == 1
    infection, _, _ = _outbreak(
        a, b, small.contact_kind, small.contact_hours, small.age,
        np.where(into_region_1, 0.0, 1.0), 63, 3.0, 0.01, 0.3, np.random.default_rng(0),
    )  # fmt: skip
    region_1 = small.region == 1
    assert np.all(infection[region_1] <= 0)  # never, or a day-0 case
    assert np.sum(infection[~region_1] > 0) > 20
    with pytest.raises(ValueError, match="heterogeneity"):
        pandemic_population(1_000, seed=0, heterogeneity=-1.0)


def test_dataset_metadata_declares_the_pruning(dataset: Dataset) -> None:
    assert dataset.class_names == ("not infected", "infected")
    assert dataset.site_names == tuple(f"region{k}" for k in range(10))
    assert dataset.features.dtype == np.float32 and dataset.labels.dtype == np.int64
    assert dataset.extra["members"].dtype == np.int64
    assert len(dataset.privacy_caveats) == 1 and "pruned" in dataset.privacy_caveats[0]
    assert dataset.privacy_caveats[0].startswith(NONPRIVATE_MARK)
    assert "SYNTHETIC" in dataset.description
    assert dataset.feature_names[:3] == ("age", "female", "household_size")
    assert dataset.feature_names[len(INDIVIDUAL_FEATURES)] == "n1.present"


def test_ten_thousand_people_are_quick() -> None:
    start = time.perf_counter()
    pandemic_dataset(pandemic_population(10_000, seed=1), seed=1)
    assert time.perf_counter() - start < 3.0


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"people": 5, "regions": 10}, "people"),
        ({"people": 0}, "people"),
        ({"regions": 0}, "regions"),
        ({"days": 1}, "days"),
        ({"transmission": -1.0}, "transmission"),
        ({"initial_infected": 1.5}, "initial_infected"),
        ({"asymptomatic": -0.1}, "asymptomatic"),
        ({"region_spread": 0.5}, "region_spread"),
    ],
)
def test_bad_population_input_is_refused(kwargs: dict[str, float], word: str) -> None:
    args: dict[str, float] = {"people": 100, **kwargs}
    with pytest.raises(ValueError, match=word):
        pandemic_population(seed=0, **args)


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"max_appearances": 0}, "max_appearances"),
        ({"max_appearances": True}, "max_appearances"),
        ({"window": 0}, "window"),
        ({"window": 50}, "window"),
        ({"horizon": 0}, "horizon"),
        ({"train_days": 60}, "train_days"),
        ({"train_days": 70}, "train_days"),
    ],
)
def test_bad_dataset_input_is_refused(small: Population, kwargs: dict[str, int], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        pandemic_dataset(small, seed=0, **kwargs)
