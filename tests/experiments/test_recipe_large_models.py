"""`dpfl reproduce large-models`: ResNet-18-GN and the ViT at 64×64 against the small CNN
in Dopamine's pooled private arm, each tuned alike; the CNN's 28×28 arm is `dopamine`'s
own study."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from dpfl.experiments.recipes import Tuning, recipe
from dpfl.experiments.recipes.dopamine import LEARNING_RATES
from dpfl.experiments.study.config import StudyConfig


def _first(tuning: Tuning) -> StudyConfig:
    return tuning.study.points[0][1]


def _side(config: StudyConfig) -> int | None:
    size = config.data.images.size  # type: ignore[union-attr]
    return None if size is None else size[0]


def _data(tmp_path: Path) -> Path:
    (tmp_path / "pneumoniamnist").mkdir()
    return tmp_path


def test_every_model_in_the_pooled_arm_at_epsilon_3_tuned_alike(tmp_path: Path) -> None:
    plan = recipe("large-models").studies(_data(tmp_path), "default")
    assert not plan.studies and not plan.notes
    configs = [_first(t) for t in plan.tuned]
    assert Counter((c.model.kind, _side(c)) for c in configs) == {
        ("small_cnn", None): 3,
        ("small_cnn", 64): 3,
        ("resnet18_gn", 64): 3,
        ("vit", 64): 3,
    }
    assert [c.seed for c in configs] == [0] * 4 + [1] * 4 + [2] * 4  # seeds outermost
    assert len({t.study.name for t in plan.tuned}) == len(plan.tuned)
    for tuning, config in zip(plan.tuned, configs, strict=True):
        assert (tuning.metric, tuning.mean, tuning.shape) == ("accuracy", 3.0, 1.0)
        assert sorted(c.algorithm.learning_rate for _, c in tuning.study.points) == LEARNING_RATES
        assert (config.algorithm.name, config.rounds) == ("centralized", 5)
        assert config.algorithm.expected_batch_size == 64.0
        assert (config.data.split, config.tune.validation) == ("official", "official")
        assert (config.privacy.epsilon, config.privacy.delta) == (3.0, 1e-4)


def test_the_native_cnn_arms_are_dopamines_own_studies(tmp_path: Path) -> None:
    data = _data(tmp_path)
    dopamine = {t.study.name: _first(t) for t in recipe("dopamine").studies(data, "default").tuned}
    native = [
        _first(t)
        for t in recipe("large-models").studies(data, "default").tuned
        if _side(_first(t)) is None
    ]
    assert len(native) == 3
    for config in native:
        assert config.key() == dopamine[config.name].key(), config.name


def test_the_smoke_scale_is_one_short_resnet_selection(tmp_path: Path) -> None:
    (tuning,) = recipe("large-models").studies(_data(tmp_path), "smoke").tuned
    config = _first(tuning)
    assert (config.model.kind, _side(config)) == ("resnet18_gn", 64)
    assert (config.rounds, config.algorithm.epochs_per_round, tuning.mean) == (1, 0.1, 1.0)


def test_without_the_data_nothing_runs_and_the_note_says_why(tmp_path: Path) -> None:
    plan = recipe("large-models").studies(tmp_path, "default")
    assert not plan.tuned
    assert plan.notes[-1] == "no PneumoniaMNIST: nothing to run"
