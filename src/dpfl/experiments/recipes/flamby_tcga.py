"""FLamby's Fed-TCGA-BRCA (Ogier du Terrail et al., NeurIPS 2022 Datasets and Benchmarks):
survival of 1,088 breast-cancer patients across 6 regions, FLamby's baselines re-run,
a logistic-hazard model beside FLamby's Cox model, and DP FedAvg.

Data: `DATA_DIR/fed_tcga_brca` (FLamby's 39 clinical features; age scaled by declared
bounds, where FLamby feeds the raw years), FLamby's own per-centre train/test split
(`data.split = "official"`: 866 training and 222 test patients; centre k of FLamby's
`fold2` is Northeast, South, West, Midwest, Europe, Canada). FLamby's published
figures come from `DATA_DIR/flamby_results/tcga_seed42..46.csv` (its five seeds, read by
`dpfl.data.flamby.published_results`).

FLamby's settings (owkin/FLamby at commit edacf54), used as they are for the Cox rows:

* model: one linear layer, 39 -> 1 (`flamby/datasets/fed_tcga_brca/model.py`): ours
  `model.kind = "logistic_regression"`, which for a survival loss is that layer;
* loss: Cox's partial likelihood over the batch, Breslow ties
  (`flamby/datasets/fed_tcga_brca/loss.py`): ours `loss = "cox"` (non-private only);
* metric: Harrell's C-index by lifelines (`.../metric.py`): ours `c_index`
  (scikit-survival's Harrell C);
* pooled and local training: Adam, learning rate 0.1, batch 8, 30 epochs
  (`.../common.py`: `Optimizer`, `LR`, `BATCH_SIZE`, `NUM_EPOCHS_POOLED`), one optimiser
  for the 30 epochs (`flamby/benchmarks/benchmark_utils.py`, `train_single_centric`);
  "Local k" is centre k's model scored on every centre's test set
  (`flamby/benchmarks/fed_benchmark.py`): ours `local` with `cross_silo = true`;
* FedAvg: SGD, learning rate 0.1 (`flamby/config_tcga_brca.json`), 100 local updates of
  batch 8 per round (`fed_benchmark.py`: `run_num_updates = [100]`), 5 rounds
  (`common.py`: `get_nb_max_rounds(100)` = (866 // 6 // 8) * 30 // 100), the mean of the
  updates weighted by the centres' sizes (`flamby/strategies/fed_avg.py`). dpfl's local
  training is counted in epochs, so every centre runs 5.54 epochs a round: the 6 x 100 x
  8 records of FLamby's round in total (a large centre makes more steps than 100, a
  small one fewer);
* Cyclic: SGD, learning rate 0.01 (`config_tcga_brca.json`), 100 updates of batch 8 at
  each visit, 5 rounds of one visit each, in a random order (`flamby/strategies/
  cyclic.py`): ours one round that visits all 6 centres in turn, 100 steps each.

Batches are Poisson-sampled with the expected size (FLamby shuffles and cuts), and the
loss of a batch is its sum over the expected batch size (FLamby: the mean over the batch).

The logistic-hazard rows (discrete-time survival over the public cut points `BINS`,
which DP-SGD can train) and the DP rows use hyper-parameters chosen on the training
records only, never on a test set: each centre's official training records were split
75/25 (stratified by event, two such splits), every setting trained 3 times on the 75 %
and scored by its C-index on the union of the 25 % parts; the best mean (within 0.005
of it, the cheaper) was kept. Grids (extended where the best sat at an edge): SGD
learning rate {0.1, 0.3, 1, 3} and Adam {0.003, 0.01, 0.03, 0.1} (batch 16), pooled and
local epochs {10, 30, 100}, FedAvg rounds {10, 30, 100} of one local epoch, Cyclic
rounds {3, 10, 30} of 20 steps a visit; DP FedAvg (batch 16, clip 1, each centre's σ
calibrated to its ε) SGD learning rate {0.3, 1, 3} x rounds {10, 30} of one local epoch
at each ε, and at ε = 1 also rounds {5, 10, 20} of 0.25 or 0.5 epochs (SGD 1, 3), Adam
{0.01, 0.03, 0.1} x rounds {5, 10}, and cut points {2, 5, 10 years} (0.597 at ε = 1,
a tie; 0.620 at ε = 3 against 0.601, within the noise of these validation sets:
`BINS` are kept, common to every row). Batch 32 is too large for Canada's 30 tuning
records. Chosen: pooled SGD 1, 30 epochs; local Adam 0.01, 30 epochs; FedAvg SGD 1, 100
rounds; Cyclic SGD 3, 10 rounds; DP FedAvg SGD 1 at every ε, 10 rounds of half an epoch
at ε = 1 (validation C 0.596, against 0.570 for the best of one epoch a round), 30
rounds of one epoch at ε = 3 and 10. The selection read training records outside ε;
the ε reported is that of the training run. The tuning scored with a risk that ignored
the last closed and the open interval's hazards (fixed since: `expected_survival`),
which handicapped the coarser cut sets; it has not been redone.

Scores: FLamby's figure averages a method's C-index over the 6 client test sets
("clientavg", its mean ± std over its 5 seeds), and we average ours the same way over
trials. A test set with no comparable pair (all censored, or every event after every
other time) has no C-index: scikit-survival finds it undefined and dpfl stores NaN;
we average over the test sets where it is defined, in each trial (`client_average`),
and the row's note counts the undefined ones. FLamby's lifelines would have raised on
such a set, so each of its rows averages all 6.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpfl.experiments.recipes.base import Plan, Recipe, Row, Scale, real_folder
from dpfl.experiments.recipes.clinical_common import (
    SMOKE_NOISE,
    by_scale,
    epsilon_text,
    final_rows,
    metric_text,
    setting,
)
from dpfl.experiments.results.store import ResultsStore, RunRow
from dpfl.experiments.study.config import Study

NAME = "flamby-tcga-brca"
TITLE = (
    "FLamby Fed-TCGA-BRCA (NeurIPS 2022): survival across 6 regions, C-index of FLamby's "
    "Cox baselines, a logistic-hazard model and DP FedAvg"
)
FOLDER = "fed_tcga_brca"
RESULTS_FOLDER = "flamby_results"
RESULTS_FILES = "flamby/results/results_benchmark_fed_tcga_brca/tcga_seed42..46.csv"
CENTRES = ("northeast", "south", "west", "midwest", "europe", "canada")
"""dpfl's silo names, in FLamby's centre order (FLamby's "Local k" is CENTRES[k])."""
BINS = [365.0, 730.0, 1095.0, 1460.0, 1825.0, 2555.0, 3650.0]
"""Public cut points (days) of the logistic-hazard model: yearly to 5 years, then 7 and
10 years, the horizons of breast-cancer survival reporting; none read from the records."""
DELTA = 1e-5
"""FLamby ran no DP on Fed-TCGA-BRCA; δ = 1e-5 < 1/866, the usual choice."""
FLAMBY_UPDATES = 100
FLAMBY_BATCH = 8
FLAMBY_ROUNDS = 5
FLAMBY_EPOCHS = 30
LOCAL_EPOCHS = round(FLAMBY_UPDATES * FLAMBY_BATCH / (866 / 6), 2)
"""5.54: FLamby's 100 updates of batch 8 on the average centre's 866 / 6 records."""
STRATEGIES = ("pooled", "local", "fedavg", "cyclic")
FLAMBY_METHOD = {"pooled": "Pooled Training", "fedavg": "FedAvg", "cyclic": "Cyclic"}
DP_STUDY = "flamby-tcga-dp-fedavg"
MODELS = {"cox": "Cox (FLamby's linear model)", "hazard": "logistic hazard (linear)"}


@dataclass(frozen=True)
class Setting:
    """One strategy's training: the algorithm section and its number of rounds."""

    rounds: int
    algorithm: dict[str, Any]


def _cox(scale: Scale) -> dict[str, Setting]:
    """FLamby's own settings (the module's docstring), shortened at smoke scale."""
    epochs = float(by_scale(scale, 2, FLAMBY_EPOCHS, FLAMBY_EPOCHS))
    adam = {"optimizer": "adam", "learning_rate": 0.1, "expected_batch_size": FLAMBY_BATCH}
    sgd = {"learning_rate": 0.1, "expected_batch_size": FLAMBY_BATCH}
    return {
        "pooled": Setting(1, {"name": "centralized", "epochs_per_round": epochs, **adam}),
        "local": Setting(1, {"name": "local", "local_epochs": epochs, **adam}),
        "fedavg": Setting(
            by_scale(scale, 1, FLAMBY_ROUNDS, FLAMBY_ROUNDS),
            {
                "name": "fedavg",
                "local_epochs": by_scale(scale, 1.0, LOCAL_EPOCHS, LOCAL_EPOCHS),
                **sgd,
            },
        ),
        "cyclic": Setting(
            1,
            {
                "name": "cyclic",
                "steps_per_visit": by_scale(scale, 10, FLAMBY_UPDATES, FLAMBY_UPDATES),
                **sgd,
                "learning_rate": 0.01,
            },
        ),
    }


def _hazard(scale: Scale) -> dict[str, Setting]:
    """Chosen on the training records (the module's docstring)."""
    epochs = float(by_scale(scale, 2, 30, 30))
    batch = {"expected_batch_size": 16}
    return {
        "pooled": Setting(
            1, {"name": "centralized", "epochs_per_round": epochs, "learning_rate": 1.0, **batch}
        ),
        "local": Setting(
            1,
            {
                "name": "local",
                "local_epochs": epochs,
                "optimizer": "adam",
                "learning_rate": 0.01,
                **batch,
            },
        ),
        "fedavg": Setting(
            by_scale(scale, 3, 100, 100), {"name": "fedavg", "learning_rate": 1.0, **batch}
        ),
        "cyclic": Setting(
            by_scale(scale, 2, 10, 10),
            {"name": "cyclic", "steps_per_visit": 20, "learning_rate": 3.0, **batch},
        ),
    }


DP_SETTINGS = {1.0: (10, 0.5, 1.0), 3.0: (30, 1.0, 1.0), 10.0: (30, 1.0, 1.0)}
"""DP FedAvg's (rounds, local epochs a round, SGD learning rate) at each ε, chosen on the
training records; another ε (the full scale's) takes those of the nearest one here."""


def studies(data_dir: Path | None, scale: Scale) -> Plan:
    notes: list[str] = []
    folder = real_folder(data_dir, FOLDER, "the Fed-TCGA-BRCA study", notes)
    if folder is None:
        return Plan([], notes)
    if data_dir is None or not (data_dir / RESULTS_FOLDER).is_dir():
        notes.append(
            f"FLamby's published results ({RESULTS_FOLDER}) not found beside {FOLDER}: "
            "the paper column says n/a"
        )
    trials = by_scale(scale, 1, 5, 5)
    base: dict[str, Any] = {
        "trials": trials,
        "metrics": ["c_index", "c_index_uno", "ibs", "td_auc"],
        "data": {"dataset": "tcga_brca", "path": str(folder), "split": "official"},
        "privacy": {"private": False},
    }
    plan: list[Study] = []
    for model, settings in (("cox", _cox(scale)), ("hazard", _hazard(scale))):
        model_section: dict[str, Any] = {"kind": "logistic_regression"}
        loss = "cox"
        if model == "hazard":
            model_section["time_bins"] = BINS
            loss = "logistic_hazard"
        for strategy in STRATEGIES:
            chosen = settings[strategy]
            raw = {
                **base,
                "name": f"flamby-tcga-{model}-{strategy}",
                "rounds": chosen.rounds,
                "eval_every": chosen.rounds,
                "cross_silo": strategy == "local",
                "model": model_section,
                "algorithm": {**chosen.algorithm, "loss": loss},
            }
            plan.append(Study(raw, source=NAME))
    epsilons = by_scale(scale, [10.0], [1.0, 3.0, 10.0], [0.5, 1.0, 2.0, 3.0, 5.0, 10.0])
    plan += [Study(_dp(base, scale, epsilon), source=NAME) for epsilon in epsilons]
    return Plan(plan, notes)


def _dp(base: dict[str, Any], scale: Scale, epsilon: float) -> dict[str, Any]:
    """DP FedAvg with the logistic-hazard model at `epsilon`: σ calibrated to the budget
    of each centre (its own σ: the centres differ 6-fold in size); fixed in smoke runs."""
    rounds, epochs, learning_rate = DP_SETTINGS[
        min(DP_SETTINGS, key=lambda known: abs(known - epsilon))
    ]
    privacy: dict[str, Any] = {"epsilon": epsilon, "delta": DELTA}
    if scale == "smoke":  # calibration is too slow for a smoke test (clinical_common)
        privacy["noise_multiplier"] = SMOKE_NOISE
    else:
        privacy["calibration"] = "per-silo"
    rounds = by_scale(scale, 2, rounds, rounds)
    return {
        **base,
        "name": f"{DP_STUDY}-eps{epsilon:g}",
        "rounds": rounds,
        "eval_every": rounds,
        "model": {"kind": "logistic_regression", "time_bins": BINS},
        "algorithm": {
            "name": "fedavg",
            "loss": "logistic_hazard",
            "learning_rate": learning_rate,
            "local_epochs": epochs,
            "expected_batch_size": 16,
            "clip_norm": 1.0,
        },
        "privacy": privacy,
    }


# -- comparison ----------------------------------------------------------------------


def client_average(by_test: Mapping[str, float | None]) -> float:
    """One trial's C-index averaged over the client test sets where it is defined (a
    test set with no comparable pair is NaN or None and left out); NaN if none is."""
    defined = [v for v in by_test.values() if v is not None and not math.isnan(v)]
    return statistics.fmean(defined) if defined else math.nan


@dataclass(frozen=True)
class Scores:
    """A method's client-averaged C-index per trial, and how many (trial, test set)
    pairs had no C-index."""

    clientavg: list[float]
    undefined: int
    scored: int


def client_scores(rows: Iterable[Mapping[str, Any]], test_key: str = "silo") -> Scores:
    """Per trial, `client_average` of the rows (one per client test set, named by
    `test_key`); trials with no defined test set are left out."""
    by_trial: dict[int, dict[str, float | None]] = {}
    for row in rows:
        by_trial.setdefault(row["trial"], {})[row[test_key]] = row["value"]
    averages = [client_average(tests) for _, tests in sorted(by_trial.items())]
    values = [v for tests in by_trial.values() for v in tests.values()]
    undefined = sum(1 for v in values if v is None or math.isnan(v))
    return Scores([a for a in averages if not math.isnan(a)], undefined, len(values))


def _shared_scores(store: ResultsStore, run: RunRow, metric: str = "c_index") -> Scores:
    """The run's shared model on each client test set."""
    return client_scores(row for row in final_rows(store, run, metric) if row["silo"] is not None)


def _local_scores(store: ResultsStore, run: RunRow, centre: str) -> Scores:
    """Centre `centre`'s own model on every client test set (FLamby's "Local k")."""
    rows = [
        row
        for row in store.rows("cross_silo", run.id)
        if row["round"] == run.last_round
        and row["metric"] == "c_index"
        and row["model_silo"] == centre
    ]
    return client_scores(rows, "test_silo")


def _pooled(store: ResultsStore, run: RunRow, metric: str = "c_index") -> list[float]:
    """The metric on the pooled test set (the union of the client test sets), per trial."""
    return [
        row["value"]
        for row in final_rows(store, run, metric)
        if row["silo"] is None and row["value"] is not None and not math.isnan(row["value"])
    ]


def compare(runs: list[RunRow], store: ResultsStore) -> list[Row]:
    finished = {run.study: run for run in runs if run.status == "finished"}
    if not finished:
        return []
    any_run = next(iter(finished.values()))
    published, where = _published(Path(setting(any_run, "data.path")).parent / RESULTS_FOLDER)
    rows: list[Row] = []
    for model, label in MODELS.items():
        for strategy in STRATEGIES:
            run = finished.get(f"flamby-tcga-{model}-{strategy}")
            if run is None:
                continue
            if strategy == "local":
                rows += [
                    _local_row(label, model, k, run, store, published, where)
                    for k in range(len(CENTRES))
                ]
            else:
                rows.append(_shared_row(label, model, strategy, run, store, published, where))
    reference = finished.get("flamby-tcga-hazard-fedavg")
    dp = [run for run in runs if run.study.startswith(DP_STUDY) and run.status == "finished"]
    for run in sorted(dp, key=lambda r: setting(r, "privacy.epsilon")):
        rows.append(_dp_row(run, reference, store))
    return rows


def _published(folder: Path) -> tuple[dict[str, Any], str]:
    """FLamby's results by method, and where they came from (or why they are absent)."""
    from dpfl.data.flamby import published_results

    if not folder.is_dir():
        return {}, f"FLamby's results not found at {folder}"
    return published_results(folder, "tcga"), RESULTS_FILES


def _paper(published: Mapping[str, Any], method: str, *, pooled: bool = False) -> str:
    if method not in published:
        return "n/a"
    result = published[method]
    text = f"clientavg {result.mean:.3f} ± {result.std:.3f} ({len(result.seeds)} seeds)"
    if pooled and result.pooled_test:
        spread = statistics.stdev(result.pooled_test) if len(result.pooled_test) > 1 else 0.0
        text += f"; pooled test {result.pooled_test_mean:.3f} ± {spread:.3f}"
    return text


def _model_note(model: str, scores: Scores, where: str) -> str:
    ours = "FLamby's settings" if model == "cox" else "tuned on training records"
    paper = "FLamby" if model == "cox" else "FLamby (no logistic-hazard model: its Cox figure)"
    return (
        f"ours: {ours}, mean over the client test sets where defined "
        f"({scores.undefined} of {scores.scored} (trial, test set) pairs undefined), "
        f"± over trials; {paper}: {where}"
    )


def _pooled_text(store: ResultsStore, run: RunRow) -> str:
    """Harrell's C on the pooled test set, with Uno's C and the IBS where defined."""
    text = f"pooled test {metric_text(_pooled(store, run))}"
    extra = [
        f"{label} {metric_text(values)}"
        for label, metric in (("Uno", "c_index_uno"), ("IBS", "ibs"))
        if (values := _pooled(store, run, metric))
    ]
    return text + (f" ({', '.join(extra)})" if extra else "")


def _shared_row(
    label: str,
    model: str,
    strategy: str,
    run: RunRow,
    store: ResultsStore,
    published: Mapping[str, Any],
    where: str,
) -> Row:
    scores = _shared_scores(store, run)
    name = {"pooled": "pooled training", "fedavg": "FedAvg", "cyclic": "Cyclic"}[strategy]
    return Row(
        f"{label}: {name}, Harrell's C-index",
        _paper(published, FLAMBY_METHOD[strategy], pooled=strategy == "pooled"),
        f"clientavg {metric_text(scores.clientavg)}; {_pooled_text(store, run)}",
        _model_note(model, scores, where),
        trials=run.trials,
    )


def _local_row(
    label: str,
    model: str,
    k: int,
    run: RunRow,
    store: ResultsStore,
    published: Mapping[str, Any],
    where: str,
) -> Row:
    scores = _local_scores(store, run, CENTRES[k])
    return Row(
        f"{label}: Local {k} ({CENTRES[k]}'s own model on every test set), Harrell's C-index",
        _paper(published, f"Local {k}"),
        f"clientavg {metric_text(scores.clientavg)}",
        _model_note(model, scores, where),
        trials=run.trials,
    )


def _dp_row(run: RunRow, reference: RunRow | None, store: ResultsStore) -> Row:
    scores = _shared_scores(store, run)
    epsilon = setting(run, "privacy.epsilon")
    note = f"{epsilon_text(store, [run])} by the ledger, δ = {DELTA:g}"
    if reference is not None:
        free, paid = _shared_scores(store, reference).clientavg, scores.clientavg
        pooled = _difference(_pooled(store, run), _pooled(store, reference))
        note += (
            f"; cost vs non-private logistic-hazard FedAvg: clientavg "
            f"{_difference(paid, free)}, pooled test {pooled}"
        )
    note += (
        f"; {scores.undefined} of {scores.scored} (trial, test set) pairs undefined; "
        "FLamby ran no DP on Fed-TCGA-BRCA"
    )
    return Row(
        f"DP FedAvg, logistic hazard, ε = {epsilon:g}: Harrell's C-index",
        "—",
        f"clientavg {metric_text(scores.clientavg)}; {_pooled_text(store, run)}",
        note,
        trials=run.trials,
    )


def _difference(private: list[float], reference: list[float]) -> str:
    """Mean private − mean non-private (negative: what privacy costs)."""
    if not private or not reference:
        return "n/a"
    return f"{statistics.fmean(private) - statistics.fmean(reference):+.3f}"


RECIPE = Recipe(name=NAME, title=TITLE, studies=studies, compare=compare)
