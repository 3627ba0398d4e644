"""The balanced threshold: exact histograms, the noise its event declares, the
sensitivity of one record (or of one person replaced in a pruned contact graph), and a
choice that is the best balanced accuracy the bins can tell (checked against
scikit-learn over every candidate)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import balanced_accuracy_score

from dpfl.data.pandemic import Population, pandemic_dataset
from dpfl.federation.silo import SiloInfo
from dpfl.federation.threshold import FIXED, BalancedThreshold, sensitivity
from dpfl.local.noise import SeededNoise
from dpfl.privacy import Neighbouring, epsilon, events


def _scores(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A rare positive class whose logits sit 1.5 above the negatives', all below 0: a
    model that ranks well but predicts "negative" for everyone at 0.5."""
    rng = np.random.default_rng(seed)
    labels = (rng.random(n) < 0.14).astype(int)
    logits = rng.normal(-4.0 + 1.5 * labels, 1.0)
    return 1 / (1 + np.exp(-logits)), labels


def test_counts_put_each_record_in_its_bin_and_class() -> None:
    cut = BalancedThreshold(bins=4, logit_range=2.0)  # inner edges −1, 0, 1
    assert cut.edges.tolist() == [-1.0, 0.0, 1.0]
    logits = np.array([-9.0, -1.0, -0.5, 0.0, 0.5, 1.0, 9.0])
    p = np.append(1 / (1 + np.exp(-logits)), [0.0, 1.0])
    labels = np.array([0, 1, 0, 1, 0, 1, 0, 1, 0])
    counts = cut.counts(p, labels)
    # bins (-inf, -1), [-1, 0), [0, 1), [1, inf); p = 0 and 1 land in the end bins
    assert counts.tolist() == [[1, 1, 1, 2], [1, 1, 1, 1]]
    assert counts.sum() == len(labels)


def test_one_more_record_moves_one_count_by_one() -> None:
    cut = BalancedThreshold()
    p, y = _scores(500, 0)
    before = cut.counts(p[:-1], y[:-1])
    after = cut.counts(p, y)
    assert np.linalg.norm(after - before) == 1.0


def _graph(s: int, replaced: bool) -> Population:
    """A region already pruned for S = `s` (nobody has more than S − 1 contacts), and the
    neighbouring one where person 0 is replaced. Before: person 0 (aged 20) with contacts
    1..S − 1 (aged 20). After: person 0 (aged 70) with contacts S..2S − 2 (aged 70) instead.
    Two more people, a contact of each other, are the same in both. Nobody is infected."""
    n, days = 2 * s + 1, 63
    partners = np.arange(s, 2 * s - 1) if replaced else np.arange(1, s)
    a = np.append(np.zeros(s - 1, dtype=np.int32), 2 * s - 1)
    b = np.append(partners.astype(np.int32), 2 * s)
    age = np.full(n, 40, dtype=np.uint8)
    age[1:s], age[s : 2 * s - 1], age[0] = 20, 70, 70 if replaced else 20
    return Population(
        age=age,
        female=np.zeros(n, dtype=bool),
        household=np.arange(n, dtype=np.int32),
        household_size=np.ones(n, dtype=np.uint8),
        activities=np.zeros((n, 4), dtype=bool),
        region=np.zeros(n, dtype=np.int16),
        region_names=("region0",),
        contact_a=a,
        contact_b=b,
        contact_kind=np.ones(len(a), dtype=np.int8),
        contact_hours=np.full(len(a), 8.0, dtype=np.float32),
        states=np.zeros((n, days), dtype=np.int8),
        infection_day=np.full(n, -1, dtype=np.int16),
        recovery_day=np.full(n, -1, dtype=np.int16),
        asymptomatic=np.zeros(n, dtype=bool),
        seed=0,
        transmission=1.0,
    )


@pytest.mark.parametrize("s", [2, 3, 5])
def test_a_replacement_in_a_pruned_graph_moves_the_histogram_by_the_sensitivity(s: int) -> None:
    """Replacing person 0 changes 2S − 1 training rows: theirs, their old contacts' (who
    lose them), their new contacts' (who gain them). A scorer that puts each of those
    rows in the low bin before and the high bin after (high iff "has a contact" agrees
    with "aged 50 or more") moves the histogram by √2·(2S − 1), more than the √2·S
    charged before, and exactly the sensitivity the event is scaled to."""
    cut = BalancedThreshold(bins=4, logit_range=2.0)
    hists, rows = [], []
    for replaced in (False, True):
        data = pandemic_dataset(_graph(s, replaced), max_appearances=s, seed=0)
        train = data.split == "train"
        x = np.asarray(data.features)[train]
        rows.append(x)
        old, contact = x[:, 0] >= 0.5, x[:, data.feature_names.index("n1.present")] > 0
        hists.append(cut.counts(np.where(old == contact, 0.99, 0.01), data.labels[train]))
    assert int((rows[0] != rows[1]).any(axis=1).sum()) == 2 * s - 1
    person = SiloInfo("h", 2 * s + 1, appearances=s)
    assert np.linalg.norm(hists[1] - hists[0]) == pytest.approx(sensitivity(person))
    assert sensitivity(person) == pytest.approx(math.sqrt(2) * (2 * s - 1))
    assert sensitivity(SiloInfo("h", 1000)) == 1.0
    event = cut.event(person)
    assert event.neighbouring is Neighbouring.REPLACE_ONE
    assert (
        event.to_json()
        == events.gaussian(
            cut.noise / ((2 * s - 1) * math.sqrt(2)), neighbouring=Neighbouring.REPLACE_ONE
        ).to_json()
    )
    assert cut.event(SiloInfo("h", 1000)).to_json() == events.gaussian(cut.noise).to_json()


def test_the_release_adds_the_declared_gaussian_noise_to_every_count() -> None:
    """The noise on the counts is N(0, noise²), the event's σ times its sensitivity 1:
    Kolmogorov–Smirnov over 40 releases of 32 counts."""
    cut = BalancedThreshold(noise=7.0)
    p, y = _scores(2000, 2)
    exact = cut.counts(p, y)
    errors = np.concatenate(
        [(cut.release(p, y, SeededNoise(seed)) - exact).ravel() for seed in range(40)]
    )
    assert stats.kstest(errors, "norm", args=(0.0, 7.0)).pvalue > 0.01
    assert stats.kstest(errors, "norm", args=(0.0, 9.0)).pvalue < 1e-3  # the test can fail
    assert np.array_equal(cut.release(p, y, None), exact)


def test_the_choice_is_the_best_balanced_accuracy_over_the_candidate_edges() -> None:
    p, y = _scores(3000, 3)
    cut = BalancedThreshold(bins=32, logit_range=8.0)
    chosen = cut.choose(cut.counts(p, y))
    candidates = 1 / (1 + np.exp(-cut.edges))
    best = max(balanced_accuracy_score(y, p >= t) for t in candidates)
    assert balanced_accuracy_score(y, p >= chosen) == pytest.approx(best, abs=1e-12)
    assert chosen in candidates
    assert balanced_accuracy_score(y, p >= FIXED) < 0.51  # what 0.5 gives this model
    assert best > 0.72


def test_noisy_releases_summed_over_hospitals_still_find_a_good_threshold() -> None:
    """Four hospitals' releases at noise 10 a count: the threshold chosen on their sum
    is within 0.03 of the best balanced accuracy, over 20 draws."""
    cut = BalancedThreshold(noise=10.0)
    hospitals = [_scores(1600, 10 + k) for k in range(4)]
    p = np.concatenate([h[0] for h in hospitals])
    y = np.concatenate([h[1] for h in hospitals])
    best = balanced_accuracy_score(y, p >= cut.choose(cut.counts(p, y)))
    for draw in range(20):
        summed = sum(
            cut.release(hp, hy, SeededNoise(100 * draw + k)) for k, (hp, hy) in enumerate(hospitals)
        )
        assert balanced_accuracy_score(y, p >= cut.choose(summed)) > best - 0.03


def test_without_records_of_a_class_the_threshold_stays_at_one_half() -> None:
    cut = BalancedThreshold(bins=4)
    assert cut.choose(np.array([[3.0, 1.0, 0.0, 0.0], [-2.0, -1.0, 0.0, -0.5]])) == FIXED


def test_one_release_costs_what_its_gaussian_costs() -> None:
    cut = BalancedThreshold(noise=10.0)
    spent = epsilon(cut.event(SiloInfo("h", 100)), 1e-5).epsilon
    assert spent == pytest.approx(epsilon(events.gaussian(10.0), 1e-5).epsilon)
    assert 0.3 < spent < 0.6


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"noise": -1.0}, "noise"),
        ({"noise": math.nan}, "noise"),
        ({"bins": 1}, "bins"),
        ({"logit_range": 0.0}, "logit_range"),
    ],
)
def test_impossible_settings_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BalancedThreshold(**kwargs)  # type: ignore[arg-type]


def test_labels_other_than_zero_and_one_are_refused() -> None:
    with pytest.raises(ValueError, match="binary"):
        BalancedThreshold().counts(np.array([0.2, 0.8]), np.array([0, 2]))
    with pytest.raises(ValueError, match="noise > 0"):
        BalancedThreshold(noise=0.0).event(SiloInfo("h", 10))
