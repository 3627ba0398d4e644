"""ResNet-18 with GroupNorm and a small ViT trained with DP-SGD on PneumoniaMNIST at
64×64, against the small CNN (issue 53).

Imaging consortia train ResNets and vision transformers; dpfl trains them by ghost
clipping (`dpfl.local.ghost`: per-example norms without per-example gradients). The
question here is the issue's: at ε = 3, does a large model reach the small CNN's accuracy?
`dpfl reproduce large-models` runs `model.kind = "resnet18_gn"` and `"vit"`
(`dpfl.models.large`) on PneumoniaMNIST upsampled to 64×64, beside the small CNN at 64×64
and at its native 28×28 (`dpfl reproduce dopamine`'s own CDP studies: the same names,
settings and draws), in Dopamine's pooled private arm (CDP): 10 iid hospitals keeping their
shares of the official splits, DP-SGD at q = 64 / 4,708, 5 epochs, each model tuned alike by
`dpfl tune` (Dopamine's grid of η and law of K, the selection charged in ε, validated on
the official val split, tested on the official test split). Every model trains from
scratch: no pretrained weights can be read here (no network), so this is DP training,
not the fine-tuning of a public checkpoint that large-model DP results rest on.
"""

from __future__ import annotations

from pathlib import Path

from dpfl.experiments.recipes.base import Plan, Recipe, Row, Scale, Selected, Tuning
from dpfl.experiments.recipes.clinical_common import by_scale
from dpfl.experiments.recipes.dopamine import (
    HOSPITALS,
    LEARNING_RATES,
    PNEUMONIA_POOL,
    TRAINING,
    methods,
    pneumonia_folder,
)
from dpfl.experiments.recipes.scatternet import tuned_figures, tuned_note, tuned_study
from dpfl.experiments.study.config import Study

NAME = "large-models"
TITLE = "ResNet-18-GN and a small ViT against the small CNN, pooled DP-SGD on PneumoniaMNIST"
NATIVE = 28
"""PneumoniaMNIST's own side: the small CNN's row there is `dopamine`'s CDP study."""
SIDE = 64
"""The side the images are upsampled to for the large models (the issue's 64×64)."""
MODELS = {
    # (kind, side): (name in the table, what the row is for)
    ("small_cnn", NATIVE): ("small CNN, 28×28", "the reference: Dopamine's model and images"),
    ("small_cnn", SIDE): ("small CNN, 64×64", "the reference at the large models' side"),
    ("resnet18_gn", SIDE): (
        "ResNet-18-GN, 64×64",
        "issue 53's goal: the small CNN's accuracy or better at ε = 3",
    ),
    ("vit", SIDE): ("ViT, 64×64", "issue 53's goal: the small CNN's accuracy or better at ε = 3"),
}
TEST_IMAGES = 624


def _models(scale: Scale) -> list[tuple[str, int]]:
    """The smoke scale trains the ResNet alone, for a tenth of an epoch."""
    return by_scale(scale, [("resnet18_gn", SIDE)], list(MODELS), list(MODELS))


def studies(data_dir: Path | None, scale: Scale) -> Plan:
    """Each model in the CDP arm at ε = 3, tuned alike at every seed; the seeds outermost,
    so that an interrupted run has every model's first seeds."""
    notes: list[str] = []
    folder = pneumonia_folder(data_dir, notes)
    if folder is None:
        return Plan([], notes)
    epochs = by_scale(scale, 1, 5, 20)
    mean = by_scale(scale, 1.0, 3.0, 4.0)
    _, rounds, pooled = methods(epochs, PNEUMONIA_POOL)[0]  # the "pooled" arm: CDP
    algorithm = {**pooled, **TRAINING, "learning_rate": LEARNING_RATES}
    if scale == "smoke":
        algorithm["epochs_per_round"] = 0.1
    plan = Plan([], notes)
    for seed in range(by_scale(scale, 1, 3, 5)):
        for kind, side in _models(scale):
            raw = tuned_study(
                "pneumoniamnist",
                folder,
                ["accuracy", "auroc"],
                kind,
                seed,
                3.0,
                side=None if side == NATIVE else side,
            )
            raw["name"] = _name(kind, side, seed)
            raw["rounds"] = rounds
            raw["algorithm"] = algorithm
            plan.tuned.append(Tuning(Study(raw, source=NAME), "accuracy", mean))
    return plan


def _name(kind: str, side: int, seed: int) -> str:
    """`dopamine`'s own study name for the small CNN at 28×28, one of this recipe's
    otherwise."""
    if (kind, side) == ("small_cnn", NATIVE):
        return f"dopamine-pneumonia-cdp-eps3-seed{seed}"
    return f"large-models-pneumoniamnist-{kind}-{side}-eps3-seed{seed}"


def compare_tuned(selected: list[Selected]) -> list[Row]:
    """A row per model and side, its seeds together, in `MODELS`' order."""
    groups: dict[tuple[str, int], list[Selected]] = {}
    for one in selected:
        config = one.tuning.study.points[0][1]
        images = getattr(config.data, "images", None)
        side = images.size[0] if images is not None and images.size else NATIVE
        groups.setdefault((str(config.model.kind), side), []).append(one)
    return [_row(key, groups[key]) for key in MODELS if key in groups]


def _row(key: tuple[str, int], chosen: list[Selected]) -> Row:
    label, claim = MODELS[key]
    return Row(
        f"PneumoniaMNIST, {HOSPITALS} iid hospitals, ε budget 3: CDP, {label}",
        claim,
        tuned_figures(chosen, "auroc", 3.0),
        tuned_note(chosen, TEST_IMAGES) + "; trained from scratch",
        trials=len(chosen),
    )


RECIPE = Recipe(
    name=NAME,
    title=TITLE,
    studies=studies,
    compare=lambda runs, store: [],  # every study is tuned: `compare_tuned`
    compare_tuned=compare_tuned,
)
