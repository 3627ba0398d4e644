"""`dpfl reproduce scatternet`: ScatterNet + linear against the end-to-end CNN in
Dopamine's private arms, each tuned alike; the CNN's PneumoniaMNIST arms are `dopamine`'s
own studies."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from dpfl.experiments.recipes import Tuning, recipe
from dpfl.experiments.recipes.dopamine import LEARNING_RATES
from dpfl.experiments.study.config import StudyConfig


def _first(tuning: Tuning) -> StudyConfig:
    return tuning.study.points[0][1]


def _data(tmp_path: Path) -> Path:
    for name in ("pneumoniamnist", "retinamnist"):
        (tmp_path / name).mkdir()
    return tmp_path


def test_both_models_in_both_private_arms_on_both_sets_tuned_alike(tmp_path: Path) -> None:
    plan = recipe("scatternet").studies(_data(tmp_path), "default")
    assert not plan.studies and not plan.notes
    configs = [_first(t) for t in plan.tuned]
    arms = Counter(
        (c.data.dataset, c.model.kind, c.algorithm.name, c.privacy.epsilon) for c in configs
    )
    assert arms == {
        (data, model, algorithm, epsilon): 3
        for data in ("pneumoniamnist", "retinamnist")
        for model in ("scatternet_linear", "small_cnn", "scatternet_cnn")
        for algorithm in ("centralized", "fedsgd_secure")
        for epsilon in (3.0, 1.0)
    }
    assert [c.privacy.epsilon for c in configs[:36]] == [3.0] * 36  # ε = 3 first
    assert len({t.study.name for t in plan.tuned}) == len(plan.tuned)
    for tuning, config in zip(plan.tuned, configs, strict=True):
        assert (tuning.metric, tuning.mean, tuning.shape) == ("accuracy", 3.0, 1.0)
        assert sorted(c.algorithm.learning_rate for _, c in tuning.study.points) == LEARNING_RATES
        assert (config.data.split, config.tune.validation) == ("official", "official")
        assert config.privacy.delta == 1e-4


def test_the_pneumonia_cnn_arms_are_dopamines_own_studies(tmp_path: Path) -> None:
    data = _data(tmp_path)
    dopamine = {t.study.name: _first(t) for t in recipe("dopamine").studies(data, "default").tuned}
    ours = [
        _first(t)
        for t in recipe("scatternet").studies(data, "default").tuned
        if _first(t).data.dataset == "pneumoniamnist" and _first(t).model.kind == "small_cnn"
    ]
    assert len(ours) == 12
    for config in ours:
        assert config.key() == dopamine[config.name].key(), config.name


def test_the_smoke_scale_is_one_scatternet_selection(tmp_path: Path) -> None:
    (tuning,) = recipe("scatternet").studies(_data(tmp_path), "smoke").tuned
    config = _first(tuning)
    assert (config.data.dataset, config.model.kind, config.algorithm.name) == (
        "pneumoniamnist",
        "scatternet_linear",
        "centralized",
    )
    assert (config.rounds, tuning.mean) == (1, 1.0)
