"""The balanced threshold: exact histograms, the noise its event declares, the
sensitivity of one record (or person), and a choice that is the best balanced accuracy
the bins can tell (checked against scikit-learn over every candidate)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import balanced_accuracy_score

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


def test_sensitivity_of_a_person_in_several_records_is_the_worst_replacement() -> None:
    """Replacing a person of S = 3 records, all in one bin, by one whose 3 records sit in
    another: the histogram moves by √2·3, which the node-level event is scaled to."""
    cut = BalancedThreshold(bins=4, logit_range=2.0)
    rest_p, rest_y = _scores(200, 1)
    old = cut.counts(np.append(rest_p, [0.01] * 3), np.append(rest_y, [0] * 3))
    new = cut.counts(np.append(rest_p, [0.99] * 3), np.append(rest_y, [1] * 3))
    person = SiloInfo("h", 1000, appearances=3)
    assert np.linalg.norm(new - old) == pytest.approx(sensitivity(person))
    assert sensitivity(SiloInfo("h", 1000)) == 1.0
    event = cut.event(person)
    assert event.neighbouring is Neighbouring.REPLACE_ONE
    assert (
        event.to_json()
        == events.gaussian(
            cut.noise / (3 * math.sqrt(2)), neighbouring=Neighbouring.REPLACE_ONE
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
