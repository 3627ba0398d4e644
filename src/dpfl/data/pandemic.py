"""Seeded synthetic pandemic data shaped like the US/UK PETs challenge's (a synthetic
Virginia population we do not have), and its tabularised neighbourhoods (puffle, Part 2).

`pandemic_population` draws people, a contact graph and a 63-day outbreak;
`prune_contacts` keeps each person in at most S neighbourhoods; `pandemic_dataset` turns
both into one train and one test row per person for node-level DP training per region.

Modelling choices (a stand-in, not an epidemiological model):

* Regions (the silos): sizes in a geometric progression, the largest `region_spread`
  (default 20) times the smallest, region 0 the largest; each region a run of ids.
* Households: sizes 1-6 with US-census-like shares (`HOUSEHOLD_SHARES`), within a
  region. The first member is an adult, the second an adult of similar age, the others
  mostly children. Sex is a fair coin.
* Activities (flags): work (ages 18-66, 65 %), school (5-18, 95 %), shop (12+, 75 %),
  other (church, leisure: 35 %). Each activity is done at one venue, in the home region
  or, with probability `VENUES[kind].travel`, in a neighbouring one (regions form a
  ring): the only source of cross-region contacts. Venues never straddle regions.
  Workplace sizes are heavy-tailed (log-normal); school classes are formed by age.
* Contacts: all pairs within a household; at a venue each member meets a Poisson
  number of other members (mean scaled by a personal log-normal sociability and
  capped), never all pairs, so degrees are mostly 5-40 with a tail. The graph is
  undirected and the same every day (as in the challenge); a pair met in several
  places is one contact, of the kind met first in `CONTACT_KINDS` order, with the
  hours summed (at most 24).
* Outbreak: discrete-time SIR, iterated over days. On day 0 a fraction
  `initial_infected` is infected. An infectious person infects each susceptible
  contact on a day with probability 1 - exp(-h), h = `transmission` x
  `BASE_HAZARD_PER_HOUR` x kind weight x hours x the contact's age susceptibility, and
  the infected become infectious the next day for 3 + Poisson(4) days, then recover
  for good. A fraction `asymptomatic` is infectious but observed S throughout (the
  truth is kept in `infection_day`, `recovery_day`, `asymptomatic`); the others are
  observed I while infectious, then R. The defaults give a slow, near-critical
  outbreak: about 3.5 % ever observed infected by day 63 and 0.3-1 % (0.5 % at 1M
  people) newly observed infected in days 56-62, as in the challenge (< 5 %, ~0.3 %);
  raise `transmission` for a faster one (at 1.5, ~30 % are observed infected). Being
  near-critical, small populations fluctuate: from about 30k people the rates are
  steady, at 10k an outbreak can fade out for some seeds.
* No daily imports: after day 0 everyone infected had an infectious contact the day
  before.

Privacy unit and pruning: a record is a person's neighbourhood, so one person influences
their own row and the rows of everyone who keeps them as a neighbour. A region (silo)
sees only its residents and the contacts among them; cross-region contacts are cut
first. The within-region graph is then pruned deterministically: each person orders
their contacts by a fixed public hash of the unordered pair, and a contact is kept iff
it is among the first S - 1 of both endpoints. So everyone keeps at most S - 1
neighbours and, the graph being undirected, appears in at most S rows (their own and
S - 1 others): `Dataset.appearances` = S, for the node-level accountant, which charges
the 2S - 1 rows that replacing a person changes (theirs, those of the S - 1 who kept
them, those of the S - 1 who keep their replacement: `events.replacement_rows`). The
guarantee is node-level *with respect to the pruned graph*, as in the seed: the pruning
reads the private graph and is not analysed for stability (replacing one person can
change which other contacts survive, and so other people's rows); this is declared in
the dataset's preprocessing notes as outside ε.

Rows and features: a row is a person's neighbourhood over one observation window:
their own block (`INDIVIDUAL_FEATURES`) then S - 1 neighbour slots (`CONTACT_FEATURES`,
in hash order), all over the same window, as in the seed. The seed concatenates one-hot
S/I/R per window day (63 values per person for 21 days); here the window is summarised
in 5 values (`HISTORY_FEATURES`): states being monotone, the window reads S..S I..I
R..R, and the fractions of I and R days give back every day's state. So 1M people x
S = 10 fit in 1.4 GB of features. Everything is scaled by fixed public ranges only (age
/ 100, household size / 6, hours / 24, history as fractions of the window), so no
scaling reads private data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpfl.data.dataset import NONPRIVATE_MARK, Dataset

SUSCEPTIBLE, INFECTED, RECOVERED = 0, 1, 2
"""Observed health states in `Population.states`."""
CONTACT_KINDS = ("household", "work", "school", "shop", "other")
"""Where a contact happens; `Population.contact_kind` indexes this tuple."""
ACTIVITIES = ("work", "school", "shop", "other")
"""Columns of `Population.activities`; each is also the contact kind at its venue."""
HOUSEHOLD_SHARES = (0.28, 0.35, 0.15, 0.12, 0.06, 0.04)
"""Share of households of size 1..6 (US Census 2020, sizes 6+ folded into 6)."""
BASE_HAZARD_PER_HOUR = 0.0028
"""Daily infection hazard per hour of contact at `transmission` = 1, calibrated so the
defaults give the challenge's regime (a slow outbreak, see the module docstring)."""
KIND_WEIGHT = np.array([1.0, 1.0, 1.0, 0.5, 0.8])
"""Hazard multiplier per contact kind: shops are brief and distanced."""
SENTINEL_DAY = np.iinfo(np.int16).max
"""'Never', in day arrays used internally."""

STATIC_FEATURES = ("age", "female", "household_size", *ACTIVITIES)
"""A person's fixed features: age / 100, sex, household size / 6, activity flags."""
HISTORY_FEATURES = ("last_S", "last_I", "last_R", "days_I", "days_R")
"""A person's observation window: the state on its last day one-hot, and the fractions
of its days spent in I and in R (with monotone states, these recover the onset and
recovery days inside the window)."""
INDIVIDUAL_FEATURES = (*STATIC_FEATURES, *HISTORY_FEATURES)
"""One person's block: the first columns of a row, and the tail of each neighbour slot."""
CONTACT_FEATURES = ("present", *CONTACT_KINDS, "hours", *INDIVIDUAL_FEATURES)
"""One neighbour slot: 1 if a neighbour fills it, the contact's kind one-hot, its hours /
24, then the neighbour's own block over the same window; an empty slot is all zero."""
EXPOSURE_FEATURES = ("hours_with_infected", "hours_times_days_infected")
"""With `contacts="summary"`: the mean over the S - 1 slots of contact hours / 24 × (the
neighbour I on the window's last day), and × (the fraction of the window it was I)."""
_CHUNK_ROWS = 8192  # rows tabularised at a time: the chunk stays in cache
_KIND_ONE_HOT = np.vstack([np.eye(len(CONTACT_KINDS)), np.zeros(len(CONTACT_KINDS))]).astype(
    np.float32
)
"""Contact kind -> one-hot; kind -1 (an empty slot) -> the last row, zeros."""


@dataclass(frozen=True)
class Venue:
    """How one activity's venues are drawn and how people meet there."""

    mean_size: float
    contacts: float  # mean number of members each member picks to meet
    max_contacts: int
    hours: tuple[float, float]  # uniform range of one contact's duration
    travel: float  # probability of going to a neighbouring region for it
    heavy_tail: bool = False  # log-normal venue sizes (workplaces) instead of Poisson


VENUES = {
    "work": Venue(15.0, 6.0, 16, (1.0, 8.0), 0.12, heavy_tail=True),
    "school": Venue(25.0, 8.0, 20, (2.0, 7.0), 0.02),
    "shop": Venue(150.0, 4.0, 12, (0.1, 1.0), 0.10),
    "other": Venue(60.0, 4.0, 12, (0.5, 3.0), 0.05),
}
HOUSEHOLD_HOURS = (6.0, 12.0)


@dataclass(frozen=True)
class Population:
    """A synthetic population, its fixed daily contact graph and an observed outbreak.

    Per person (n): `age` uint8 years; `female` bool; `household` int32 id and
    `household_size` uint8 (1-6); `activities` bool (n, 4) in `ACTIVITIES` order;
    `region` int16 index into `region_names`. Contacts (m, undirected, one per pair):
    `contact_a` < `contact_b` int32 person ids, sorted by (a, b); `contact_kind` int8
    index into `CONTACT_KINDS`; `contact_hours` float32 per day. `states` int8 (n, days):
    observed S/I/R per day. Hidden truth: `infection_day` and `recovery_day` int16 (-1:
    never infected), `asymptomatic` bool (drawn for everyone; matters if infected).
    """

    age: np.ndarray
    female: np.ndarray
    household: np.ndarray
    household_size: np.ndarray
    activities: np.ndarray
    region: np.ndarray
    region_names: tuple[str, ...]
    contact_a: np.ndarray
    contact_b: np.ndarray
    contact_kind: np.ndarray
    contact_hours: np.ndarray
    states: np.ndarray
    infection_day: np.ndarray
    recovery_day: np.ndarray
    asymptomatic: np.ndarray
    seed: int
    transmission: float

    def __post_init__(self) -> None:
        n = len(self.age)
        for name in ("female", "household", "household_size", "region", "infection_day"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"Population.{name} must have length {n}")
        if self.states.ndim != 2 or self.states.shape[0] != n:
            raise ValueError(f"Population.states must be (people={n}, days)")
        if np.any(np.diff(self.states, axis=1) < 0):
            raise ValueError("Population.states must only move S -> I -> R")

    @property
    def people(self) -> int:
        return len(self.age)

    @property
    def days(self) -> int:
        return int(self.states.shape[1])

    @property
    def contacts(self) -> int:
        return len(self.contact_a)

    def degrees(self) -> np.ndarray:
        """Contacts per person (int64)."""
        both = np.concatenate([self.contact_a, self.contact_b])
        return np.bincount(both, minlength=self.people)

    def observed_onset(self) -> np.ndarray:
        """First day each person is observed not S (int16; `days` if never)."""
        return _first_day(self.states >= INFECTED)

    def observed_recovery(self) -> np.ndarray:
        """First day each person is observed R (int16; `days` if never)."""
        return _first_day(self.states == RECOVERED)

    def newly_infected(self, start: int, horizon: int) -> np.ndarray:
        """Whether each person is first observed infected in days [start, start + horizon)."""
        onset = self.observed_onset()
        return (onset >= start) & (onset < start + horizon)

    def describe(self) -> str:
        ever = float((self.states[:, -1] != SUSCEPTIBLE).mean())
        return (
            f"SYNTHETIC PETs-challenge-shaped pandemic (seed {self.seed}, transmission "
            f"{self.transmission}): {self.people} people in {len(self.region_names)} regions, "
            f"{self.contacts} daily contacts (undirected, the same every day), {self.days} "
            f"days of observed S/I/R, {ever:.2%} observed infected by the last day."
        )


@dataclass(frozen=True)
class Neighbourhoods:
    """The pruned within-region graph as fixed-width tables (n, S - 1), slots in hash order,
    padded with -1 (`neighbours`, `kinds`) and 0 (`hours`)."""

    neighbours: np.ndarray  # int32 person ids
    kinds: np.ndarray  # int8 index into CONTACT_KINDS
    hours: np.ndarray  # float32 contact hours
    max_appearances: int


def pandemic_population(
    people: int,
    *,
    seed: int,
    regions: int = 10,
    days: int = 63,
    transmission: float = 1.0,
    initial_infected: float = 0.002,
    asymptomatic: float = 0.3,
    region_spread: float = 20.0,
    heterogeneity: float = 0.0,
) -> Population:
    """People, their daily contacts and a seeded SIR outbreak (see the module docstring).

    `transmission` scales every contact's infection hazard; `initial_infected` is the
    fraction infected on day 0 (at least one person); `asymptomatic` the fraction of
    infections never observed; `region_spread` the largest region's size over the
    smallest's; `heterogeneity` the spread (log-normal σ) of a factor per region and
    contact kind on the hazard of a contact with a resident of that region (0: one
    infection model everywhere; 1: in one region schools may spread 5x what shops do,
    in another the reverse), what personalised models can learn. Its time and memory at
    1M people are in benchmarks/README.md.
    """
    _require_int("people", people, 1)
    _require_int("regions", regions, 1)
    _require_int("days", days, 2)
    if days >= SENTINEL_DAY:
        raise ValueError(f"days must be below {SENTINEL_DAY}, got {days}")
    if people < regions:
        raise ValueError(f"people ({people}) must be at least regions ({regions})")
    if people >= 2**31:
        raise ValueError(f"people ({people}) must fit int32 ids")
    if not transmission >= 0:
        raise ValueError(f"transmission must be ≥ 0, got {transmission}")
    if not 0 <= initial_infected <= 1:
        raise ValueError(f"initial_infected must be in [0, 1], got {initial_infected}")
    if not 0 <= asymptomatic <= 1:
        raise ValueError(f"asymptomatic must be in [0, 1], got {asymptomatic}")
    if not region_spread >= 1:
        raise ValueError(f"region_spread must be ≥ 1, got {region_spread}")
    if not heterogeneity >= 0:
        raise ValueError(f"heterogeneity must be ≥ 0, got {heterogeneity}")
    rng = np.random.default_rng(seed)
    region = np.repeat(
        np.arange(regions, dtype=np.int16), _region_sizes(people, regions, region_spread)
    )
    household, household_size, rank = _households(region, rng)
    age = _ages(household, rank, rng)
    activities = _activities(age, rng)
    sociability = rng.lognormal(-0.125, 0.5, people)  # mean 1: a heavier degree tail
    a, b, kind, hours = _contacts(
        region, household_size, rank, activities, age, sociability, regions, rng
    )
    # drawn apart from `rng`, so that heterogeneity = 0 leaves every other draw as it was
    factors = np.random.default_rng([seed, 1]).lognormal(
        0.0, heterogeneity, (regions, len(CONTACT_KINDS))
    )
    infection_day, recovery_day, hidden = _outbreak(
        a,
        b,
        kind,
        hours,
        age,
        factors[region[np.concatenate([b, a])], np.tile(kind, 2)],
        days,
        transmission,
        initial_infected,
        asymptomatic,
        rng,
    )
    return Population(
        age=age,
        female=rng.random(people) < 0.5,
        household=household,
        household_size=household_size,
        activities=activities,
        region=region,
        region_names=tuple(f"region{k}" for k in range(regions)),
        contact_a=a,
        contact_b=b,
        contact_kind=kind,
        contact_hours=hours,
        states=_observed_states(infection_day, recovery_day, hidden, days),
        infection_day=infection_day,
        recovery_day=recovery_day,
        asymptomatic=hidden,
        seed=seed,
        transmission=transmission,
    )


def prune_contacts(population: Population, max_appearances: int) -> Neighbourhoods:
    """Each region's contact graph pruned so that everyone is in at most S neighbourhoods.

    Cross-region contacts are dropped. Each person ranks their contacts by `pair_hash`
    (fixed, public, no per-run randomness); a contact survives iff it is among the first
    S - 1 of both endpoints. Deterministic: a function of the graph alone.
    """
    _require_int("max_appearances", max_appearances, 1)
    n, slots = population.people, max_appearances - 1
    neighbours = np.full((n, slots), -1, dtype=np.int32)
    kinds = np.full((n, slots), -1, dtype=np.int8)
    hours = np.zeros((n, slots), dtype=np.float32)
    a, b = population.contact_a, population.contact_b
    local = np.flatnonzero(population.region[a] == population.region[b])
    if slots == 0 or len(local) == 0:
        return Neighbourhoods(neighbours, kinds, hours, max_appearances)
    rank_key = (pair_hash(a[local], b[local]) >> np.uint64(32)).astype(np.uint64)
    src = np.concatenate([a[local], b[local]])
    dst = np.concatenate([b[local], a[local]])
    edge = np.concatenate([local, local])
    order = np.argsort(
        (src.astype(np.uint64) << np.uint64(32)) | np.concatenate([rank_key, rank_key]),
        kind="stable",
    )
    del rank_key
    src, dst, edge = src[order], dst[order], edge[order]
    del order
    starts = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=n))[:-1]])
    wanted = np.arange(len(src)) - starts[src] < slots
    kept_by_both = np.bincount(edge[wanted], minlength=population.contacts)[edge] == 2
    src, dst, edge = src[kept_by_both], dst[kept_by_both], edge[kept_by_both]
    starts = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=n))[:-1]])
    slot = np.arange(len(src)) - starts[src]
    neighbours[src, slot] = dst
    kinds[src, slot] = population.contact_kind[edge]
    hours[src, slot] = population.contact_hours[edge]
    return Neighbourhoods(neighbours, kinds, hours, max_appearances)


def pair_hash(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A fixed public hash (splitmix64's finaliser) of each unordered pair {a, b}, uint64."""
    low, high = np.minimum(a, b).astype(np.uint64), np.maximum(a, b).astype(np.uint64)
    x: np.ndarray = (low << np.uint64(32)) | high
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def pandemic_dataset(
    population: Population,
    *,
    max_appearances: int = 10,
    window: int = 21,
    horizon: int = 7,
    train_days: int = 56,
    contacts: str = "slots",
    seed: int,
) -> Dataset:
    """Tabularised neighbourhoods: one train and one test row per person.

    A row is the person's block (`INDIVIDUAL_FEATURES`) and S - 1 neighbour slots
    (`CONTACT_FEATURES`) from `prune_contacts`, all over one observation window of
    `window` days ending before day t'; the label is 1 iff the person is first observed
    infected in days [t', t' + `horizon`). Train rows (`split` "train", persons in id
    order) draw t' uniformly from [window, train_days - horizon] with `seed`; test rows
    take t' = train_days. `extra`: "person" (int64), "window_end" (t', int64), "members"
    (int64 (rows, S): the person, then their kept neighbours, -1 padded).

    `contacts`: "slots" concatenates the S - 1 neighbour slots (the seed's layout);
    "summary" averages them over the S - 1 slots instead (SGC's one step of aggregation:
    neighbours present, contact kinds and hours, the neighbours' blocks; empty slots count
    as zero) and adds the hours of contact with neighbours infected on the window's last
    day and over it (`EXPOSURE_FEATURES`): 33 features whatever S, and a better linear
    signal (the same rows, so the same appearances).

    S defaults to 10 rather than the seed's 20: ε grows with S, and memory too (S = 10
    gives 183 features, S = 20 373; time and memory: benchmarks/README.md).
    """
    _check_dataset_arguments(population, max_appearances, window, horizon, train_days, contacts)
    n, slots = population.people, max_appearances - 1
    hood = prune_contacts(population, max_appearances)
    person, window_end = _window_ends(n, window, horizon, train_days, seed)
    onset, recovery = population.observed_onset(), population.observed_recovery()
    labels = ((onset[person] >= window_end) & (onset[person] < window_end + horizon)).astype(
        np.int64
    )
    summary = contacts == "summary"
    features, members = _neighbourhood_features(
        population, hood, person, window_end, onset, recovery, window=window, summary=summary
    )
    test_positive = float(labels[n:].mean()) if n else 0.0
    return Dataset(
        name="pandemic",
        features=features,
        labels=labels,
        feature_names=(*INDIVIDUAL_FEATURES, *_slot_names(summary, max_appearances)),
        class_names=("not infected", "infected"),
        site_ids=np.tile(population.region.astype(np.int64), 2),
        site_names=population.region_names,
        split=np.repeat(np.array(["train", "test"]), n),
        extra={"person": person, "window_end": window_end, "members": members},
        preprocessing=_preprocessing(population, hood, slots),
        appearances=max_appearances,
        description=(
            f"{population.describe()} Tabularised neighbourhoods: per person one train row "
            f"(random window end t' in [{window}, {train_days - horizon}], seed {seed}) and "
            f"one test row (t' = {train_days}); features are the person's demographics, "
            f"activities and {window}-day S/I/R history summary, and up to {slots} kept "
            f"neighbours with their contact's kind and hours over the same window "
            f"({'averaged, with exposure hours' if summary else 'one slot each'}); label: "
            f"first observed infected in [t', t' + {horizon}). Test positive rate "
            f"{test_positive:.2%}. Each person is in at most {max_appearances} rows of a split."
        ),
    )


def _check_dataset_arguments(
    population: Population,
    max_appearances: int,
    window: int,
    horizon: int,
    train_days: int,
    contacts: str,
) -> None:
    """Refuse `pandemic_dataset`'s arguments before any work: windows must fit the days."""
    _require_int("max_appearances", max_appearances, 1)
    _require_int("window", window, 1)
    _require_int("horizon", horizon, 1)
    _require_int("train_days", train_days, 2)
    if window + horizon > train_days:
        raise ValueError(
            f"window ({window}) + horizon ({horizon}) must be at most train_days ({train_days})"
        )
    if train_days + horizon > population.days:
        raise ValueError(
            f"train_days ({train_days}) + horizon ({horizon}) must be at most the "
            f"population's days ({population.days})"
        )
    if contacts not in ("slots", "summary"):
        raise ValueError(f"contacts must be 'slots' or 'summary', got {contacts!r}")


def _window_ends(
    n: int, window: int, horizon: int, train_days: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's person and t': n train rows drawn with `seed`, then n test rows at train_days."""
    rng = np.random.default_rng(seed)
    person = np.tile(np.arange(n, dtype=np.int64), 2)
    window_end = np.concatenate(
        [rng.integers(window, train_days - horizon + 1, n), np.full(n, train_days)]
    ).astype(np.int64)
    return person, window_end


def _neighbourhood_features(
    population: Population,
    hood: Neighbourhoods,
    person: np.ndarray,
    window_end: np.ndarray,
    onset: np.ndarray,
    recovery: np.ndarray,
    *,
    window: int,
    summary: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """The feature matrix and "members", built in chunks of rows so each chunk stays in cache."""
    slots = hood.max_appearances - 1
    individual = _individual_table(population)
    onset_padded = np.append(onset, SENTINEL_DAY)  # index -1 (an empty slot): never infected
    recovery_padded = np.append(recovery, SENTINEL_DAY)
    static, own = len(STATIC_FEATURES), len(INDIVIDUAL_FEATURES)
    slot_width = len(CONTACT_FEATURES)
    width = own + slot_width + len(EXPOSURE_FEATURES) if summary else own + slots * slot_width
    total = len(person)
    features = np.empty((total, width), dtype=np.float32)
    members = np.empty((total, hood.max_appearances), dtype=np.int64)
    for lo in range(0, total, _CHUNK_ROWS):
        rows = slice(lo, min(lo + _CHUNK_ROWS, total))
        who, end = person[rows], window_end[rows].astype(np.int32)
        out = features[rows]  # a contiguous view: written in place
        out[:, :static] = np.take(individual, who, axis=0)
        _history(onset[who], recovery[who], end, window, out[:, static:own])
        members[rows, 0] = who
        if slots:
            members[rows, 1:] = _neighbour_slots(
                out, hood, who, end, individual, onset_padded, recovery_padded, window, summary
            )
        elif summary:
            out[:, own:] = 0.0
    return features, members


def _neighbour_slots(
    out: np.ndarray,
    hood: Neighbourhoods,
    who: np.ndarray,
    end: np.ndarray,
    individual: np.ndarray,
    onset_padded: np.ndarray,
    recovery_padded: np.ndarray,
    window: int,
    summary: bool,
) -> np.ndarray:
    """Write a chunk's neighbour slots (or their mean and exposure hours) into `out`; the
    neighbours' ids are returned for "members"."""
    slots = hood.max_appearances - 1
    static, own = len(STATIC_FEATURES), len(INDIVIDUAL_FEATURES)
    kinds_at, hours_at = 1, 1 + len(CONTACT_KINDS)  # offsets in a slot, after "present"
    neighbour_at = hours_at + 1
    slot_width = len(CONTACT_FEATURES)
    nb = np.take(hood.neighbours, who, axis=0)
    present = nb >= 0
    block = (
        np.empty((len(who), slots, slot_width), dtype=np.float32)
        if summary
        else out[:, own:].reshape(len(who), slots, slot_width, copy=False)
    )
    block[:, :, 0] = present
    kinds = np.take(hood.kinds, who, axis=0)
    block[:, :, kinds_at:hours_at] = np.take(_KIND_ONE_HOT, kinds, axis=0)
    block[:, :, hours_at] = np.take(hood.hours, who, axis=0) / 24.0
    block[:, :, neighbour_at : neighbour_at + static] = np.take(individual, nb, axis=0)
    history = block[:, :, neighbour_at + static :]
    neighbour_onset = np.take(onset_padded, nb)
    neighbour_recovery = np.take(recovery_padded, nb)
    _history(neighbour_onset, neighbour_recovery, end[:, None], window, history)
    history[:, :, 0] *= present  # an empty slot's history reads "never infected"
    if summary:
        out[:, own : own + slot_width] = block.mean(axis=1)
        hours = block[:, :, hours_at]
        for j, state in enumerate(("last_I", "days_I")):
            column = neighbour_at + INDIVIDUAL_FEATURES.index(state)
            out[:, own + slot_width + j] = (hours * block[:, :, column]).mean(axis=1)
    return nb


def _slot_names(summary: bool, max_appearances: int) -> list[str]:
    """The names of the columns after the person's block: the summary's, or each slot's."""
    if summary:
        return [f"sum.{name}" for name in CONTACT_FEATURES] + list(EXPOSURE_FEATURES)
    return [f"n{j}.{name}" for j in range(1, max_appearances) for name in CONTACT_FEATURES]


def _preprocessing(population: Population, hood: Neighbourhoods, slots: int) -> tuple[str, str]:
    """The dataset's preprocessing notes: the public scalings, and the pruning that reads
    the private graph (how many within-region contacts it kept)."""
    kept = int((hood.neighbours >= 0).sum()) // 2
    local = int(
        (population.region[population.contact_a] == population.region[population.contact_b]).sum()
    )
    return (
        "age / 100 (public range 0-100 years), household size / 6, contact hours / 24; "
        "window history as fractions of the window length",
        f"{NONPRIVATE_MARK}: cross-region contacts cut, then each region's contact "
        f"graph pruned deterministically (a contact is kept iff among the first "
        f"{slots} of both endpoints in a fixed public hash order): {kept} of {local} "
        "within-region contacts kept. Node-level DP holds for the pruned graph; the "
        "pruning reads the private graph and its stability is not analysed",
    )


def _require_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer ≥ {minimum}, got {value!r}")


def _first_day(flags: np.ndarray) -> np.ndarray:
    """Index of the first True per row (int16), or the row length if none."""
    first: np.ndarray = flags.argmax(axis=1).astype(np.int16)
    first[~flags[np.arange(len(flags)), first]] = flags.shape[1]
    return first


def _region_sizes(people: int, regions: int, spread: float) -> np.ndarray:
    """Geometric sizes, largest first, each at least 1, summing to `people`."""
    weights = spread ** -(np.arange(regions) / max(regions - 1, 1))
    share = (people - regions) * weights / weights.sum()
    sizes: np.ndarray = 1 + np.floor(share).astype(np.int64)
    sizes[np.argsort(share - np.floor(share))[::-1][: people - int(sizes.sum())]] += 1
    return sizes


def _group_starts(total: int, draw: np.ndarray, boundaries: np.ndarray) -> np.ndarray:
    """Starts of consecutive groups of the drawn sizes over `total` sorted members, also
    cut at `boundaries` (region starts), so that no group straddles two regions."""
    cuts = np.cumsum(draw)
    cuts = cuts[cuts < total]
    return np.union1d(np.concatenate([[0], cuts]), boundaries[boundaries < total])


def _draw_sizes(total: int, mean: float, heavy: bool, rng: np.random.Generator) -> np.ndarray:
    """Group sizes (≥ 1) adding up to at least `total`."""
    count = int(total / mean * 1.5) + 16
    while True:
        if heavy:
            sizes = np.rint(rng.lognormal(np.log(mean) - 0.5, 1.0, count))
        else:
            sizes = 1 + rng.poisson(mean - 1, count)
        sizes = np.maximum(sizes, 1).astype(np.int64)
        if sizes.sum() >= total:
            return sizes
        count *= 2


def _households(
    region: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Household id (int32), size (uint8) and rank within the household per person."""
    n = len(region)
    shares = np.array(HOUSEHOLD_SHARES)
    draw = 1 + rng.choice(len(shares), n, p=shares)  # n households of ≥ 1 cover n people
    region_starts = np.flatnonzero(np.diff(region, prepend=-1))
    starts = _group_starts(n, draw, region_starts)
    sizes = np.diff(np.append(starts, n))
    household = np.repeat(np.arange(len(starts), dtype=np.int32), sizes)
    rank = np.arange(n) - starts[household]
    return household, sizes[household].astype(np.uint8), rank


def _ages(household: np.ndarray, rank: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Householder 18-89; the second member an adult of similar age; others mostly children."""
    n = len(rank)
    head = rng.integers(18, 90, n)
    partner = np.clip(head[np.flatnonzero(rank == 0)][household] + rng.normal(0, 5, n), 18, 95)
    child = rng.random(n) < 0.8
    other = np.where(child, rng.integers(0, 18, n), rng.integers(18, 96, n))
    age = np.where(rank == 0, head, np.where(rank == 1, np.rint(partner), other))
    return age.astype(np.uint8)


def _activities(age: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    n = len(age)
    school = (age >= 5) & (age <= 18) & (rng.random(n) < 0.95)
    work = (age >= 18) & (age <= 66) & ~school & (rng.random(n) < 0.65)
    shop = (age >= 12) & (rng.random(n) < 0.75)
    other = rng.random(n) < 0.35
    return np.column_stack([work, school, shop, other])


def _contacts(
    region: np.ndarray,
    household_size: np.ndarray,
    rank: np.ndarray,
    activities: np.ndarray,
    age: np.ndarray,
    sociability: np.ndarray,
    regions: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Deduplicated undirected contacts (a < b, sorted), their kind and daily hours."""
    n = len(region)
    # Households: every member meets every later member (ids are contiguous per household).
    later = household_size.astype(np.int64) - rank - 1
    first = np.repeat(np.arange(n, dtype=np.int64), later)
    offset = np.arange(len(first)) - np.repeat(np.cumsum(later) - later, later)
    pairs = [(first, first + 1 + offset)]
    kinds = [np.zeros(len(first), dtype=np.int8)]
    hours = [rng.uniform(*HOUSEHOLD_HOURS, len(first))]
    for column, name in enumerate(ACTIVITIES):
        venue = VENUES[name]
        members = np.flatnonzero(activities[:, column])
        dest = region[members].astype(np.int64)
        if regions > 1:
            away = rng.random(len(members)) < venue.travel
            step = np.where(rng.random(len(members)) < 0.5, 1, -1)
            dest = np.where(away, (dest + step) % regions, dest)
        grade = age[members] if name == "school" else np.zeros(len(members), np.uint8)
        order = np.lexsort((rng.random(len(members)), grade, dest))
        members, dest = members[order], dest[order]
        boundaries = np.flatnonzero(np.diff(dest, prepend=-1))
        draw = _draw_sizes(len(members), venue.mean_size, venue.heavy_tail, rng)
        starts = _group_starts(len(members), draw, boundaries)
        sizes = np.diff(np.append(starts, len(members)))
        group = np.repeat(np.arange(len(starts)), sizes)
        size = sizes[group]
        wanted = rng.poisson(venue.contacts * sociability[members])
        picks = np.minimum(np.minimum(wanted, venue.max_contacts), size - 1)
        who = np.repeat(np.arange(len(members)), picks)
        own_pos = who - starts[group[who]]
        other_pos = (own_pos + 1 + rng.integers(0, size[who] - 1)) % size[who]
        pairs.append((members[who], members[starts[group[who]] + other_pos]))
        kinds.append(np.full(len(who), CONTACT_KINDS.index(name), dtype=np.int8))
        hours.append(rng.uniform(*venue.hours, len(who)))
    a = np.concatenate([p[0] for p in pairs])
    b = np.concatenate([p[1] for p in pairs])
    key = np.minimum(a, b) * n + np.maximum(a, b)
    del a, b
    order = np.argsort(key, kind="stable")  # stable: the first of a pair's kinds comes first
    key = key[order]
    first_of_pair = np.flatnonzero(np.diff(key, prepend=-1))
    kind = np.concatenate(kinds)[order][first_of_pair]
    total_hours = np.add.reduceat(np.concatenate(hours)[order], first_of_pair)
    key = key[first_of_pair]
    return (
        (key // n).astype(np.int32),
        (key % n).astype(np.int32),
        kind,
        np.minimum(total_hours, 24.0).astype(np.float32),
    )


def _outbreak(
    a: np.ndarray,
    b: np.ndarray,
    kind: np.ndarray,
    hours: np.ndarray,
    age: np.ndarray,
    target_factor: np.ndarray,
    days: int,
    transmission: float,
    initial_infected: float,
    asymptomatic: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Discrete-time SIR over the fixed graph: infection and recovery days (int16, -1 never)
    and the hidden asymptomatic flags. `target_factor` multiplies the hazard of each
    directed contact (a→b, then b→a) by the factor of its target's region and kind."""
    n = len(age)
    hazard_per_contact = transmission * BASE_HAZARD_PER_HOUR * KIND_WEIGHT[kind] * hours
    both_ways = (np.concatenate([a, b]), np.concatenate([b, a]))
    hazard = (np.tile(hazard_per_contact, 2) * target_factor).astype(np.float32)
    graph = sp.csr_matrix((hazard, both_ways), shape=(n, n))
    del hazard_per_contact, hazard
    susceptibility = np.select([age < 18, age >= 65], [0.7, 1.4], 1.0)
    period = 3 + rng.poisson(4, n)
    hidden = rng.random(n) < asymptomatic
    infection = np.full(n, SENTINEL_DAY, dtype=np.int64)
    seeds = rng.choice(n, max(1, round(initial_infected * n)), replace=False)
    infection[seeds] = 0
    recovery = infection + period
    for day in range(days - 1):
        infectious = np.flatnonzero((infection <= day) & (day < recovery))
        if len(infectious) == 0:
            break
        rows = graph[infectious]
        pressure = np.bincount(rows.indices, weights=rows.data, minlength=n)
        exposed = np.flatnonzero((pressure > 0) & (infection == SENTINEL_DAY))
        risk = -np.expm1(-pressure[exposed] * susceptibility[exposed])
        new = exposed[rng.random(len(exposed)) < risk]
        infection[new] = day + 1
        recovery[new] = day + 1 + period[new]
    never = infection == SENTINEL_DAY
    infection[never], recovery[never] = -1, -1
    return infection.astype(np.int16), recovery.astype(np.int16), hidden


def _observed_states(
    infection: np.ndarray, recovery: np.ndarray, hidden: np.ndarray, days: int
) -> np.ndarray:
    """Observed S/I/R (people, days) int8: asymptomatic and never-infected people stay S."""
    seen = (infection >= 0) & ~hidden
    onset = np.where(seen, infection, SENTINEL_DAY)[:, None]
    recovered = np.where(seen, recovery, SENTINEL_DAY)[:, None]
    day = np.arange(days, dtype=np.int16)
    states = (day >= onset).astype(np.int8)
    states += day >= recovered
    return states


def _individual_table(population: Population) -> np.ndarray:
    """`STATIC_FEATURES` per person (n + 1, 7) float32; the last row, zeros, is for -1."""
    table = np.zeros((population.people + 1, len(STATIC_FEATURES)), dtype=np.float32)
    table[:-1, 0] = population.age / 100.0
    table[:-1, 1] = population.female
    table[:-1, 2] = population.household_size / 6.0
    table[:-1, 3:] = population.activities
    return table


def _history(
    onset: np.ndarray, recovery: np.ndarray, end: np.ndarray, window: int, out: np.ndarray
) -> None:
    """Write the history of the window [end - window, end) into `out` (..., 5), from
    monotone states: last-day state one-hot, then the fractions of its days in I and R."""
    last, start = end - 1, end - window
    onset, recovery = onset.astype(np.int32), recovery.astype(np.int32)
    infected = (onset <= last) & (last < recovery)
    recovered = recovery <= last
    out[..., 0] = ~(infected | recovered)
    out[..., 1] = infected
    out[..., 2] = recovered
    out[..., 3] = np.clip(np.minimum(recovery, end) - np.maximum(onset, start), 0, None)
    out[..., 4] = np.clip(end - np.maximum(recovery, start), 0, None)
    out[..., 3:] /= window
