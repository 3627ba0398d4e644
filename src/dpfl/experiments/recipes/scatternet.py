"""ScatterNet features (Tramèr & Boneh, ICLR 2021) against the end-to-end CNN, in
Dopamine's federation (issue 52).

Tramèr & Boneh, "Differentially Private Learning Needs Better Features (or Much More
Data)": a fixed scattering transform (J = 2, L = 8), a data-independent normalisation and
a linear model (or a small CNN) trained with DP-SGD beat end-to-end CNNs at moderate ε
on MNIST, Fashion-MNIST and CIFAR-10 (CIFAR-10 at ε = 3: 67.0 % linear, 69.3 % CNN,
against 59.2 % end to end).

`dpfl reproduce scatternet` runs `model.kind = "scatternet_linear"` (`dpfl.models.
scattering`) on PneumoniaMNIST and RetinaMNIST in the private arms of `dopamine`: CDP
(pooled DP-SGD) and Dopamine (DP-FedSGD, the noise summed securely), 10 iid hospitals
keeping their shares of the official splits, every DP-SGD step at q = 64 / pool, 5
epochs, each arm tuned alike by `dpfl tune` (the grid and law of K of `dopamine`, the
selection charged in ε, validated on the official val split, tested on the official test
split). The end-to-end CNN's arms on PneumoniaMNIST are `dpfl reproduce dopamine`'s
own studies (the same names, settings, seeds and draws of K and η).
"""

from __future__ import annotations

from pathlib import Path

from dpfl.experiments.recipes.base import Plan, Recipe, Row, Scale, Selected, Tuning, real_folder
from dpfl.experiments.recipes.clinical_common import by_scale, metric_text
from dpfl.experiments.recipes.dopamine import (
    DELTA,
    HOSPITALS,
    LEARNING_RATES,
    METHODS,
    PNEUMONIA_POOL,
    TAGS,
    TRAINING,
    methods,
)
from dpfl.experiments.study.config import Study

NAME = "scatternet"
TITLE = "ScatterNet (Tramèr & Boneh) against the end-to-end CNN, in Dopamine's private arms"
RETINA_POOL = 1080
"""RetinaMNIST's official training images: q = 64/1,080."""
DATASETS = {
    # folder: (name in the table, training pool, test images, metrics)
    "retinamnist": ("RetinaMNIST", RETINA_POOL, 400, ["accuracy", "balanced_accuracy"]),
    "pneumoniamnist": ("PneumoniaMNIST", PNEUMONIA_POOL, 624, ["accuracy", "auroc"]),
}
MODELS = {
    "scatternet_linear": "ScatterNet + linear",
    "small_cnn": "CNN",
    "scatternet_cnn": "ScatterNet + CNN",
}
CLAIM = {
    "scatternet_linear": (
        "better than end to end at moderate ε (CIFAR-10, ε = 3: 67.0 against 59.2 %)"
    ),
    "scatternet_cnn": "the best of the three on CIFAR-10 (ε = 3: 69.3 against 59.2 %)",
    "small_cnn": "the end-to-end reference (Dopamine's model here)",
}


def _models(scale: Scale) -> list[str]:
    """The models at the scale: the end-to-end CNN on PneumoniaMNIST is `dopamine`'s own
    studies (`_name`), so a directory holding `dopamine`'s selections reuses them. At the
    `--full` has 5 seeds, 20 epochs and a mean K of 4."""
    return by_scale(
        scale,
        ["scatternet_linear"],
        ["scatternet_linear", "small_cnn", "scatternet_cnn"],
        ["scatternet_linear", "small_cnn", "scatternet_cnn"],
    )


def _runs(scale: Scale, model: str, tag: str) -> bool:
    """Whether the arm `tag` runs `model` at the scale: CDP and Dopamine, not FedAvg
    (`dopamine`'s FPDP); the smoke scale only CDP."""
    return tag != "fedavg" and not (scale == "smoke" and tag == "dopamine")


def studies(data_dir: Path | None, scale: Scale) -> Plan:
    """CDP and Dopamine with each model on each dataset, tuned alike at every ε and seed;
    the larger budget first, so that an interrupted run has finished it."""
    notes: list[str] = []
    plan = Plan([], notes)
    epochs = by_scale(scale, 1, 5, 20)
    mean = by_scale(scale, 1.0, 3.0, 4.0)
    folders = {
        name: real_folder(data_dir, name, f"the {label} study", notes)
        for name, (label, *_) in DATASETS.items()
        if scale != "smoke" or name == "pneumoniamnist"
    }
    for epsilon in by_scale(scale, [3.0], [3.0, 1.0], [3.0, 1.0]):
        for name, folder in folders.items():
            if folder is None:
                continue
            _, pool, _, metrics = DATASETS[name]
            for seed in range(by_scale(scale, 1, 3, 5)):
                for model in _models(scale):
                    for tag, rounds, algorithm in methods(epochs, pool):
                        if not _runs(scale, model, tag):
                            continue
                        raw = tuned_study(name, folder, metrics, model, seed, epsilon)
                        method = METHODS[str(algorithm["name"]), True]
                        raw["name"] = _name(name, model, TAGS[method], epsilon, seed)
                        raw["rounds"] = rounds
                        raw["algorithm"] = {
                            **algorithm,
                            **TRAINING,
                            "learning_rate": LEARNING_RATES,
                        }
                        plan.tuned.append(Tuning(Study(raw, source=NAME), "accuracy", mean))
    return plan


def _name(dataset: str, model: str, tag: str, epsilon: float, seed: int) -> str:
    """`dopamine`'s study name for its own CNN on PneumoniaMNIST (the same study), a
    name of this recipe's otherwise."""
    if dataset == "pneumoniamnist" and model == "small_cnn":
        return f"dopamine-pneumonia-{tag}-eps{epsilon:g}-seed{seed}"
    return f"scatternet-{dataset}-{model}-{tag}-eps{epsilon:g}-seed{seed}"


def tuned_study(
    dataset: str,
    folder: Path,
    metrics: list[str],
    model: str,
    seed: int,
    epsilon: float,
    *,
    side: int | None = None,
) -> dict[str, object]:
    """A tuned study's sections but its name, rounds and algorithm: the hospitals' shares
    of the official splits (each image resized to `side`² where given), the official val
    split validating, δ = `DELTA`."""
    data: dict[str, object] = {
        "dataset": dataset,
        "path": str(folder),
        "partition": {"kind": "iid", "silos": HOSPITALS},
        "split": "official",
    }
    if side is not None:
        data["images"] = {"size": [side, side]}
    return {
        "metrics": metrics,
        "data": data,
        "tune": {"validation": "official"},
        "model": {"kind": model},
        "seed": seed,
        "eval_every": "end",
        "privacy": {"epsilon": epsilon, "delta": DELTA},
    }


def compare_tuned(selected: list[Selected]) -> list[Row]:
    """A row per dataset, budget, method and model, its seeds together."""
    groups: dict[tuple[str, float, str, str], list[Selected]] = {}
    for one in selected:
        config = one.tuning.study.points[0][1]
        method = METHODS[config.algorithm.name, config.privacy.private]
        epsilon = float(config.privacy.epsilon or 0)
        key = (str(config.data.dataset), epsilon, method, str(config.model.kind))
        groups.setdefault(key, []).append(one)
    order = list(DATASETS), ["CDP", "Dopamine"], list(MODELS)
    rows = []
    for key in sorted(
        groups,
        key=lambda k: (order[0].index(k[0]), -k[1], order[1].index(k[2]), order[2].index(k[3])),
    ):
        rows.append(_row(*key, groups[key]))
    return rows


def _row(dataset: str, epsilon: float, method: str, model: str, chosen: list[Selected]) -> Row:
    label, _, tested, metrics = DATASETS[dataset]
    return Row(
        f"{label}, {HOSPITALS} iid hospitals, ε budget {epsilon:g}: {method}, {MODELS[model]}",
        CLAIM[model],
        tuned_figures(chosen, metrics[1], epsilon),
        tuned_note(chosen, tested),
        trials=len(chosen),
    )


def tuned_figures(chosen: list[Selected], second: str, epsilon: float) -> str:
    """The released models' test accuracy and `second` metric (AUROC or balanced
    accuracy) over the seeds, the η each released, the largest ε of their ledgers and
    their σ."""
    values = {m: [one.tuned.test_metrics[m] for one in chosen] for m in ("accuracy", second)}
    rates = ", ".join(f"{one.tuned.point['algorithm.learning_rate']:g}" for one in chosen)
    sigmas = sorted({f"{one.tuned.noise_multiplier:.3g}" for one in chosen})
    shown = "AUROC" if second == "auroc" else "balanced accuracy"
    return (
        f"accuracy {metric_text(values['accuracy'], percent=True)}, {shown} "
        f"{metric_text(values[second], percent=second != 'auroc')}; η chosen {rates}; "
        f"ε = {max(one.epsilon for one in chosen):.3g} (budget {epsilon:g}), "
        f"σ = {', '.join(sigmas)}"
    )


def tuned_note(chosen: list[Selected], tested: int) -> str:
    """How the seeds' models were chosen and tested."""
    n = len(chosen)
    return (
        f"{n} seed{'s' * (n > 1)}; the best of K candidates (mean {chosen[0].tuned.mean:g}), "
        f"validated on the official val split, tested on the official {tested} test images"
    )


RECIPE = Recipe(
    name=NAME,
    title=TITLE,
    studies=studies,
    compare=lambda runs, store: [],  # every study is tuned: `compare_tuned`
    compare_tuned=compare_tuned,
)
