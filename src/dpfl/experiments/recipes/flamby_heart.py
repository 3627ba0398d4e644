"""FLamby's Fed-Heart-Disease benchmark (Ogier du Terrail et al., NeurIPS 2022 Datasets
and Benchmarks), ours next to FLamby's published numbers.

FLamby trains one logistic regression on the four UCI heart-disease hospitals, with
FLamby's own preprocessing and per-centre 66/34 split (`dpfl.data.flamby`): pooled
training and training at each centre alone (Adam, lr 0.001, batch 4, 50 epochs), and
FedAvg and Cyclic (SGD, 15 rounds of 100 local updates, lr 0.001 and 0.01). Every model
is scored on each centre's test set and the accuracies are averaged over the four
("clientavg", FLamby's figure); a centre's local model ("Local k") is scored on all
four. Five seeds, 42-46, one run each.

We run the same (natural partition, official split, FLamby's hyper-parameters where
dpfl has them, FLamby's number of updates, and each seed's run starting from FLamby's
initial model of that seed; see `SEEDS`), and FedAvg with DP-SGD at ε ∈ {1, 3, 10} on
publicly scaled features, which FLamby's benchmark does not have. What remains different
is how batches are drawn: dpfl's are Poisson samples of expected size 4 (its one
sampler, whose privacy event it can declare), FLamby's a shuffled pass in batches of 4.
Per seed, our figure is the mean of `trials` runs that differ only in their batches;
FLamby's is one such run. Settings and where each comes from (owkin/FLamby at commit
edacf54):

* `flamby/datasets/fed_heart_disease/common.py`: BATCH_SIZE = 4, LR = 0.001, Optimizer =
  Adam, NUM_EPOCHS_POOLED = 50, `get_nb_max_rounds(100)` = (486 // 4 // 4) · 50 // 100
  = 15 rounds;
* `flamby/benchmarks/fed_benchmark.py`: `run_num_updates = [100]`; pooled and local
  trainings use the dataset's Optimizer and LR for NUM_EPOCHS_POOLED epochs
  (`benchmark_utils.train_single_centric`); strategies default to SGD;
* `flamby/config_heart_disease.json`: FedAvg lr 0.001 (SGD), Cyclic lr 0.01 (SGD,
  `deterministic_cycle = false`);
* `flamby/dp_example/create_fed_heart_disease_dp_results.py`: DP FedAvg with clipping
  `dp_max_grad_norm = 1.1`, otherwise FedAvg's settings, δ from 1e-1 to 1e-4 (no single
  δ: we use 1e-5).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.experiments.recipes import flamby_common
from dpfl.experiments.recipes.base import Plan, Recipe, Row, Scale, mean_std, real_folder
from dpfl.experiments.recipes.clinical_common import (
    budget,
    by_scale,
    epsilon_text,
    setting,
    silo_mean,
)
from dpfl.experiments.results.store import ResultsStore, RunRow
from dpfl.experiments.study.config import Study

NAME = "flamby-heart-disease"
TITLE = (
    "FLamby Fed-Heart-Disease (NeurIPS 2022 Datasets & Benchmarks): pooled, local, FedAvg, "
    "Cyclic, and DP FedAvg; client-averaged accuracy, ours vs FLamby's published"
)
HEART = "uci_heart_disease"
RESULTS = "flamby_results"
"""Folder of FLamby's published CSVs, beside the heart-disease folder."""
CITED = (
    "FLamby flamby/results/results_benchmark_fed_heart_disease/heart_seed42..46.csv "
    "(here flamby_results/heart_seed4[2-6].csv): mean ± sd over 5 seeds of the accuracy "
    "averaged over the 4 client test sets"
)
CENTRES = ("cleveland", "hungary", "switzerland", "va-long-beach")
"""Silo names, in FLamby's centre order (centre k = "Local k", client_test_k)."""

BATCH = 4
"""common.py BATCH_SIZE."""
LR = 0.001
"""common.py LR: Adam's, for pooled and local training; also FedAvg's SGD (config JSON)."""
EPOCHS_POOLED = 50
"""common.py NUM_EPOCHS_POOLED: pooled and local training."""
ROUNDS = 15
"""get_nb_max_rounds(100) = 15 rounds of 100 local updates (FedAvg, Cyclic)."""
UPDATES = 100
"""fed_benchmark.py run_num_updates: local updates per client per round."""
FEDAVG_EPOCHS = 2.5
"""dpfl's FedAvg runs `local_epochs` passes (steps ∝ a silo's size), not a fixed number of
updates: 2.5 epochs are 124, 108, 19 and 53 steps at the four centres, whose size-weighted
mean (≈ 100) is FLamby's 100 updates, the mean step FedAvg's weighted average takes."""
CYCLIC_LR = 0.01
"""config_heart_disease.json: Cyclic's SGD learning rate."""
CYCLIC_ROUNDS = 4
"""FLamby's 15 rounds are 15 visits of 100 updates (one client each); dpfl's round visits
all four centres, so 4 rounds × 4 visits × 100 updates (16 visits, the nearest)."""
TRAIN_SIZES = (199, 172, 30, 85)
"""Training records per centre (FLamby's README; the sizes our silos declare)."""
SEEDS = [42, 43, 44, 45, 46]
"""FLamby's seeds (fed_benchmark.py --seed, 42..46). FLamby draws its one initial model
right after `torch.manual_seed(seed)` (`global_init = Baseline()`, an nn.Linear(13, 1))
and so does dpfl for a study seed's trial 0: each of our runs starts from FLamby's initial
model of that seed. The initialisation moves these short trainings by several points
(FedAvg's client-averaged accuracy has an sd of 3 points over initialisations), so
sharing FLamby's five is what makes five runs comparable with its five."""
DP_CLIP = 1.1
"""dp_example: dp_max_grad_norm."""
DELTA = 1e-5
"""FLamby's DP example sweeps δ ∈ {1e-1, ..., 1e-4}; we use 1e-5 (< 1/486 records)."""


def flamby_epochs(size: int) -> float:
    """Epochs whose dpfl step count, round(epochs · n / B), is FLamby's: 50 epochs of a
    DataLoader with ⌈n / 4⌉ batches, the last one partial (Switzerland's 30 records: 400
    updates, where 50 · 30 / 4 would be 375)."""
    return BATCH * EPOCHS_POOLED * math.ceil(size / BATCH) / size


def client0_visits(seed: int, visits: int = ROUNDS, clients: int = len(CENTRES)) -> int:
    """How often FLamby's Cyclic reaches client 0 in `visits` rounds: its clients come in
    cycles of `np.random.default_rng(seed).permutation(4)` (fed_benchmark.py passes that
    generator; deterministic_cycle = false)."""
    rng = np.random.default_rng(seed)
    order: list[int] = []
    while len(order) < visits:
        order += [int(k) for k in rng.permutation(clients)]
    return order[:visits].count(0)


def studies(data_dir: Path | None, scale: Scale) -> Plan:
    notes: list[str] = []
    heart = real_folder(data_dir, HEART, "the FLamby heart-disease benchmark", notes)
    real_folder(data_dir, RESULTS, "FLamby's published numbers (shown as n/a)", notes)
    if heart is None:
        return Plan([], notes)
    seeds = by_scale(scale, SEEDS[:1], SEEDS, SEEDS)
    # trials share the seed's initial model (init "shared") and differ in batches (and
    # noise): their mean is the seed's expected result, which FLamby's one run samples
    trials = by_scale(scale, 1, 3, 5)

    def study(name: str, scaling: str, algorithm: dict[str, Any], **extra: Any) -> Study:
        rounds = extra.pop("rounds", 1)
        config = {
            "name": f"flamby-heart-{name}",
            "seed": extra.pop("seed", seeds),
            "trials": extra.pop("trials", trials),
            "rounds": rounds,
            "eval_every": rounds,
            "metrics": ["accuracy", "auroc"],
            "data": {
                "dataset": "flamby_heart_disease",
                "path": str(heart),
                "scaling": scaling,
                "partition": {"kind": "natural", "names": list(CENTRES)},
                "split": "official",
            },
            "model": {"kind": "logistic_regression", "init": "shared"},
            "algorithm": {"expected_batch_size": BATCH, **algorithm},
            "privacy": extra.pop("privacy", {"private": False}),
            **extra,
        }
        return Study(config, source=NAME)

    smoke = scale == "smoke"
    pooled_epochs = 2.0 if smoke else flamby_epochs(sum(TRAIN_SIZES))
    local_epochs = [2.0] if smoke else [flamby_epochs(n) for n in TRAIN_SIZES]
    visits: dict[int, list[int]] = {}  # client 0's visits in FLamby's Cyclic -> seeds
    for seed in seeds:
        visits.setdefault(client0_visits(seed), []).append(seed)
    as_run = [
        study(
            "cyclic-as-run",
            "flamby",
            {
                "name": "local",
                "learning_rate": CYCLIC_LR,
                "local_epochs": 1.0 if smoke else count * UPDATES * BATCH / TRAIN_SIZES[0],
            },
            cross_silo=True,
            seed=chosen,
        )
        for count, chosen in sorted(visits.items())
    ]
    rounds = by_scale(scale, 2, ROUNDS, ROUNDS)
    adam = {"optimizer": "adam", "learning_rate": LR}
    fedavg = {"name": "fedavg", "learning_rate": LR, "local_epochs": FEDAVG_EPOCHS}
    epsilons = by_scale(scale, [4.0, 10.0], [1.0, 3.0, 10.0], [0.1, 1.0, 3.0, 5.0, 10.0, 50.0])
    return Plan(
        [
            # FLamby's pooled baseline trains on pooled-standardised records and is
            # scored on the per-centre-standardised test sets: "flamby-pooled" is both
            study(
                "pooled",
                "flamby-pooled",
                {"name": "centralized", "epochs_per_round": pooled_epochs, **adam},
            ),
            study(
                "local",
                "flamby",
                {"name": "local", "local_epochs": local_epochs, **adam},
                cross_silo=True,
            ),
            study("fedavg", "flamby", fedavg, rounds=rounds),
            study(
                "cyclic",
                "flamby",
                {"name": "cyclic", "learning_rate": CYCLIC_LR, "steps_per_visit": UPDATES},
                rounds=by_scale(scale, 1, CYCLIC_ROUNDS, CYCLIC_ROUNDS),
            ),
            *as_run,
            study("fedavg-public", "public", fedavg, rounds=rounds),
            study(
                "dp-fedavg",
                "public",
                {**fedavg, "clip_norm": DP_CLIP},
                rounds=rounds,
                privacy=budget(scale, epsilons, DELTA),
                trials=by_scale(scale, 1, 1, 5),
            ),
        ],
        notes,
    )


def compare(runs: list[RunRow], store: ResultsStore) -> list[Row]:
    done = [run for run in runs if run.status == "finished"]
    studies: dict[str, list[RunRow]] = {}
    for run in sorted(done, key=lambda run: setting(run, "seed")):
        if not _private(run):
            studies.setdefault(run.study, []).append(run)
    table = _Comparison(store, studies, _published(done))
    _centralised_rows(table)
    _federated_rows(table)
    _dp_rows(table, [run for run in done if _private(run)])
    if studies:  # FLamby's own DP example, re-accounted (ε = 10 too: flamby_common.rows())
        table.rows.extend(flamby_common.rows(epsilons=[1.0]))
    return table.rows


@dataclass
class _Comparison:
    """What `compare`'s phases share: the non-private runs by study (in seed order), the
    store that scores them, FLamby's published figures, and the rows made so far."""

    store: ResultsStore
    studies: dict[str, list[RunRow]]
    published: dict[str, Any]
    rows: list[Row] = field(default_factory=list)

    def per_seed(self, study: str, score: Callable[[RunRow], list[float]]) -> list[float]:
        """One value per seed: the mean over the seed's trials."""
        return [statistics.fmean(v) for run in self.studies[study] if (v := score(run))]

    def clientavg(self, run: RunRow) -> list[float]:
        """Per trial, the accuracy averaged over the centres' own test sets (FLamby's)."""
        return silo_mean(self.store, run, "accuracy")

    def row(self, setting_: str, method: str, ours: list[float], note: str = "") -> None:
        """Add a row beside FLamby's published `method` (n/a if absent) and the gap."""
        paper = self.published.get(method)
        figure = "n/a" if paper is None else mean_std(paper.clientavg)
        gap = (
            ""
            if paper is None or not ours
            else f"ours − FLamby = {100 * (statistics.fmean(ours) - paper.mean):+.1f} points"
        )
        self.rows.append(
            Row(
                setting_,
                figure,
                mean_std(ours),
                "; ".join(n for n in (gap, note) if n),
                trials=len(ours),
            )
        )


def _centralised_rows(table: _Comparison) -> None:
    """FLamby's non-federated baselines: pooled training, then each centre's local model."""
    studies, store = table.studies, table.store
    if "flamby-heart-pooled" in studies:
        table.row(
            f"Pooled training (Adam, {_updates(studies['flamby-heart-pooled'], None)} updates)",
            "Pooled Training",
            table.per_seed("flamby-heart-pooled", table.clientavg),
            f"{CITED}; ours: the same over FLamby's 5 seeds' initial models, each seed's "
            "figure the mean of runs that differ in their (Poisson) batches; trained on "
            "pooled-standardised records, as FLamby's",
        )
    if "flamby-heart-local" in studies:
        local = sorted(
            {setting(run, "algorithm.local_epochs") for run in studies["flamby-heart-local"]}
        )
        for k, centre in enumerate(CENTRES):
            table.row(
                f"Local {k} ({centre}; Adam, {_updates(studies['flamby-heart-local'], k)} "
                "updates), on all 4 test sets",
                f"Local {k}",
                [
                    statistics.fmean(v)
                    for run in studies["flamby-heart-local"]
                    if _trains(run, k, local) and (v := _model_on_all(store, run, centre))
                ],
            )


def _federated_rows(table: _Comparison) -> None:
    """The non-private federated rows: FedAvg, Cyclic (ours and as FLamby's code runs it),
    and FedAvg on publicly scaled features, the DP rows' reference."""
    studies, store = table.studies, table.store
    if "flamby-heart-fedavg" in studies:
        table.row(
            f"FedAvg (SGD lr 0.001, {studies['flamby-heart-fedavg'][0].rounds} rounds × "
            "≈100 updates)",
            "FedAvg",
            table.per_seed("flamby-heart-fedavg", table.clientavg),
            f"local_epochs = {FEDAVG_EPOCHS:g}: steps ∝ centre size, size-weighted mean ≈ 100",
        )
    if "flamby-heart-cyclic" in studies:
        table.row(
            f"Cyclic (SGD lr 0.01, {len(CENTRES) * studies['flamby-heart-cyclic'][0].rounds} "
            "visits × 100 updates)",
            "Cyclic",
            table.per_seed("flamby-heart-cyclic", table.clientavg),
            "FLamby's Cyclic (flamby/strategies/cyclic.py since bc27fe6) gives each client "
            "its own copy of the model and passes no weights on; the benchmark scores "
            "client 0's, i.e. Cleveland trained alone with SGD. Ours passes the model on "
            "in a fixed order (FLamby shuffles it each cycle)",
        )
    if "flamby-heart-cyclic-as-run" in studies:
        table.row(
            "Cyclic as FLamby's code runs it: Cleveland alone, SGD lr 0.01, 100 updates per "
            "visit of client 0 (3-4 visits), on all 4 test sets",
            "Cyclic",
            table.per_seed(
                "flamby-heart-cyclic-as-run", lambda run: _model_on_all(store, run, CENTRES[0])
            ),
            "what FLamby's Cyclic row measures (see above)",
        )
    if "flamby-heart-fedavg-public" in studies:
        seeds = table.per_seed("flamby-heart-fedavg-public", table.clientavg)
        table.rows.append(
            Row(
                "FedAvg, non-private, public range scaling (the DP runs' ε = ∞ reference)",
                "—",
                mean_std(seeds),
                "features scaled by declared clinical ranges instead of FLamby's "
                "per-centre standardisation, which reads the records",
                trials=len(seeds),
            )
        )


def _dp_rows(table: _Comparison, private: list[RunRow]) -> None:
    """One row per ε of the DP FedAvg runs (not in FLamby's benchmark), in increasing ε."""
    budgets = sorted({setting(run, "privacy.epsilon") for run in private})
    for epsilon in budgets:
        chosen = [run for run in private if setting(run, "privacy.epsilon") == epsilon]
        chosen.sort(key=lambda run: setting(run, "seed"))
        ours = [statistics.fmean(v) for run in chosen if (v := table.clientavg(run))]
        table.rows.append(
            Row(
                f"DP FedAvg at ε = {epsilon:g}, δ = {DELTA:g} (clip {DP_CLIP:g}, public scaling)",
                "—",
                f"{mean_std(ours)}; {epsilon_text(table.store, chosen)} per silo",
                "not in FLamby's benchmark; FLamby's own DP example, re-accounted, is a "
                "separate row",
                trials=len(ours),
            )
        )


def _updates(runs: list[RunRow], centre: int | None) -> str:
    """The steps a pooled run (centre None) or centre's local run took: round(epochs ·
    n / B) for n training records (FLamby's 50 epochs at default scale)."""
    if centre is None:
        size, epochs = sum(TRAIN_SIZES), setting(runs[0], "algorithm.epochs_per_round")
    else:
        planned = sorted({setting(run, "algorithm.local_epochs") for run in runs})
        size = TRAIN_SIZES[centre]
        epochs = min(planned, key=lambda e: abs(e - flamby_epochs(size)))
    return f"{round(epochs * size / BATCH):,}"


def _trains(run: RunRow, centre: int, planned: list[float]) -> bool:
    """Whether `run` is the one of the local study's epoch grid for `centre`: the one
    with FLamby's number of updates at that centre (the only one in a smoke run)."""
    wanted = min(planned, key=lambda e: abs(e - flamby_epochs(TRAIN_SIZES[centre])))
    return bool(setting(run, "algorithm.local_epochs") == wanted)


def _private(run: RunRow) -> bool:
    return bool(setting(run, "privacy.private"))


def _model_on_all(store: ResultsStore, run: RunRow, centre: str) -> list[float]:
    """Per trial, the accuracy of `centre`'s own final model averaged over every centre's
    test set (the cross_silo table): FLamby's "Local k"."""
    by_trial: dict[int, list[float]] = {}
    for row in store.rows("cross_silo", run.id):
        if (
            row["round"] == run.last_round
            and row["model_silo"] == centre
            and row["metric"] == "accuracy"
            and row["value"] is not None
            and not math.isnan(row["value"])
        ):
            by_trial.setdefault(row["trial"], []).append(row["value"])
    return [statistics.fmean(values) for _, values in sorted(by_trial.items())]


def _published(runs: list[RunRow]) -> dict[str, Any]:
    """FLamby's published results, from the folder beside the runs' heart-disease data
    (empty when it is absent: the rows then show n/a)."""
    from dpfl.data.flamby import published_results

    for run in runs:
        folder = Path(setting(run, "data.path")).parent / RESULTS
        if folder.is_dir():
            return published_results(folder, "heart")
    return {}


RECIPE = Recipe(name=NAME, title=TITLE, studies=studies, compare=compare)
