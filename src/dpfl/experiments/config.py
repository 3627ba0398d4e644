"""A study described in a TOML file, validated by pydantic.

```toml
name = "breast-cancer-fedavg"
rounds = 20
trials = 5

[data]
dataset = "breast_cancer"          # see dpfl.experiments.datasets.DATASETS
# path = "../data/uci_heart_disease" # real data: relative to this file's folder
partition = { kind = "iid", silos = 3 }

[model]
kind = "logistic_regression"

[algorithm]
name = "fedavg"
learning_rate = [0.5, 1.0]         # a list where one value is expected: a grid axis

[privacy]
epsilon = [0.5, 1, 4]              # per silo; the noise is calibrated to it
delta = 1e-5
```

A list where the schema expects one value makes a grid axis; `sweep` runs the product of
all axes. Keys whose value is itself a list (`model.hidden`, `metrics`,
`data.partition.names`) become axes when given a list of lists. Unknown keys and bad
values (infinite or NaN numbers among them) are refused with the dotted path of the key
and the reason, before anything runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

AlgorithmName = Literal[
    "fedavg",
    "cyclic",
    "sign",
    "fedsgd_secure",
    "aop",
    "mrmtl",
    "ditto",
    "finetune",
    "local",
    "centralized",
]
SecureAggregation = Literal["none", "ideal", "masking", "he"]
Metric = Literal[
    "accuracy",
    "balanced_accuracy",
    "auroc",
    "auprc",
    "precision",
    "recall",
    "loss",
    "c_index",
    "c_index_uno",
    "ibs",
    "td_auc",
]
"""Classification metrics, and survival ones: Harrell's and Uno's C-index, the integrated
Brier score (lower is better) and the mean time-dependent AUROC."""
LIST_VALUED = {
    ("model", "hidden"),
    ("model", "time_bins"),
    ("metrics",),
    ("data", "partition", "names"),
}
"""Keys whose single value is a list: a grid over them is a list of lists."""


MAX_POINTS = 100_000
"""The largest grid a study may have: a larger one is refused, its size and axes named,
before any point is built (a few two-valued axes too many make millions)."""
UNKNOWN_KEY = "unknown key (check its spelling and section)"


class ConfigError(ValueError):
    """A study file that cannot be run, with every problem named by its key."""


class _Strict(BaseModel):
    """Unknown keys and non-finite numbers are errors: TOML's `inf` and `nan` are no
    budget, noise or rate (a run without a limit leaves `epsilon` out)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class PartitionConfig(_Strict):
    """How records are split into silos: `iid` (stratified), `dirichlet` label skew
    (concentration `alpha`), `quantity` skew (`alpha`), or `natural` (the dataset's own
    sites, e.g. hospitals; `silos` then keeps only the first sites)."""

    kind: Literal["iid", "dirichlet", "quantity", "natural"] = "iid"
    silos: int | None = Field(None, ge=1)
    alpha: float = Field(0.5, gt=0)
    names: list[str] | None = None

    @model_validator(mode="after")
    def _needs_a_count(self) -> PartitionConfig:
        if self.kind != "natural" and self.silos is None:
            raise ValueError(f"a {self.kind} partition needs `silos` (how many hospitals)")
        return self


class DataConfig(_Strict):
    dataset: str
    path: Path | None = None
    """Folder of the dataset's files (real data); embedded and synthetic data take none.
    In a study file, relative to the file's folder."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the dataset's builder."""
    partition: PartitionConfig = PartitionConfig(kind="natural")
    test_fraction: float = Field(0.2, gt=0, lt=1)
    split: Literal["stratified", "official"] = "stratified"
    """Each silo's train/test split: "stratified" (by class, or by event for survival),
    `test_fraction` of its records held out; "official", the dataset's own assignment
    (FLamby's per-centre splits), `test_fraction` unused."""
    public_sizes: Literal["declared", "dp-count"] = "declared"
    """What shapes each silo's mechanism (q, steps, normaliser): "declared", the sizes of
    the study's own partition, published with the study; "dp-count", a DP count of each
    silo's training records released before round 0 and charged to its ledger."""
    size_noise: float = Field(20.0, gt=0, allow_inf_nan=False)
    """Std, in records, of the Gaussian noise of a "dp-count" release."""

    @field_validator("dataset")
    @classmethod
    def _known(cls, name: str) -> str:
        from dpfl.experiments.datasets import DATASETS  # the registry imports torch

        if name not in DATASETS:
            raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
        return name

    @field_validator("path")
    @classmethod
    def _a_folder(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_dir():
            raise ValueError(f"{path} is not a folder")
        return path

    @model_validator(mode="after")
    def _files_where_needed(self) -> DataConfig:
        from dpfl.experiments.datasets import READERS

        if self.dataset in READERS and self.path is None:
            raise ValueError(
                f"{self.dataset} is read from files: give data.path, the folder that holds them"
            )
        if self.dataset not in READERS and self.path is not None:
            raise ValueError(f"{self.dataset} reads no files: leave data.path out")
        return self


class ModelConfig(_Strict):
    kind: Literal["logistic_regression", "mlp", "small_cnn"] = "logistic_regression"
    hidden: list[int] = Field(default_factory=lambda: [200, 200])
    """Hidden widths of the MLP (Kerkouche: 200, 200)."""
    time_bins: list[float] | None = None
    """Survival with the logistic_hazard loss: the public cut points (in the labels' time
    unit, increasing) of the discrete time intervals, one hazard output per interval
    (the last open-ended). Never chosen from the records' times: that would read them."""
    init: Literal["per-trial", "shared"] = "per-trial"
    """per-trial: every trial but the first starts from its own initialisation, so the
    spread over trials includes the initialisation's; shared: all trials start from the
    study seed's model and differ only in batches and noise. The data split is the
    study seed's in every trial: vary `seed` as a grid axis to vary it too."""


class AlgorithmConfig(_Strict):
    """The algorithm and its hyper-parameters; each algorithm reads the ones it has."""

    name: AlgorithmName
    learning_rate: float = Field(0.5, gt=0)
    clip_norm: float = Field(1.0, gt=0)
    expected_batch_size: float = Field(16.0, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    optimizer: Literal["sgd", "adam"] = "sgd"
    """Local optimiser of the DP-SGD steps; adam is post-processing of the noisy gradient
    (the same ε), FLamby's baselines' choice. Not for mrmtl, ditto, fedsgd_secure, whose
    steps carry state between rounds or pulls (nor aop, which runs no SGD steps, nor sign,
    which sends the signs of one gradient); its state restarts at each local training."""
    loss: (
        Literal["bce", "cross_entropy", "focal", "weighted_bce", "logistic_hazard", "cox"] | None
    ) = None
    """Default: bce for two classes, cross_entropy for more, logistic_hazard for survival
    (discrete-time, over `model.time_bins`); cox, the partial likelihood, only without
    privacy (its risk sets couple patients, so per-example clipping bounds nothing)."""
    sampling: Literal["poisson", "balanced"] = "poisson"
    """Local batches: "poisson", or "balanced", Kerkouche's downsampling of each Poisson
    batch to as many records of each class as the rarer has (two classes; charged at σ/2,
    since one record then moves the clipped sum by up to 2C)."""
    positive_weight: float = Field(1.0, gt=0)
    """weighted_bce's weight of the positive class."""
    local_epochs: float = Field(1.0, gt=0)
    """fedavg, sign, mrmtl, ditto, finetune, local: local epochs per round."""
    client_rate: float | None = Field(None, gt=0, le=1)
    """fedavg, sign: each silo takes part in a round with this probability."""
    clients_per_round: int | None = Field(None, ge=1)
    """fedavg, sign: exactly this many silos, drawn at random, take part in each round."""
    weighting: Literal["size", "uniform"] | None = None
    """fedavg, mrmtl, ditto, finetune: mean of the models weighted by silo size (the
    default) or uniform (Kerkouche's 1/|K|); sign's votes are always uniform."""
    steps_per_visit: int = Field(10, ge=1)
    """cyclic: DP-SGD steps at each silo per visit (Owkin's E)."""
    server_learning_rate: float = Field(0.005, gt=0)
    """sign: the server's step γ."""
    votes: Literal["binary", "ternary"] = "binary"
    """sign: "binary", a coin where the update is exactly 0 (§3.1); "ternary", a 0 there
    (1.6 bits a parameter), so that weights no batch touched stay put."""
    strength: float = Field(1.0, ge=0)
    """mrmtl, ditto: the pull λ towards the global model."""
    federated_rounds: int = Field(1, ge=1)
    """finetune: rounds of FedAvg before local fine-tuning."""
    epochs_per_round: float = Field(1.0, gt=0)
    """centralized: epochs over the pooled data per round."""
    regularization: float = Field(0.01, gt=0)
    """aop: Λ."""
    gradient_tolerance: float = Field(1e-4, gt=0)
    """aop: γ, the bound on the minimiser's gradient norm."""
    feature_norm_bound: float = Field(1.0, gt=0)
    """aop: R, every record's feature norm (rows are clipped to it)."""
    tolerated_dropouts: int = Field(0, ge=0)
    """fedsgd_secure: d, the hospitals whose replies a round's sum may lack; every
    hospital is charged the noise of K − d shares, σ√((K − d)/K)."""


class SiloBudget(_Strict):
    epsilon: float = Field(gt=0)
    delta: float = Field(gt=0, lt=1)


class PrivacyConfig(_Strict):
    """Per-silo record-level budget. With `epsilon` and no `noise_multiplier` the noise
    is calibrated to the budgets (`calibration`); with `noise_multiplier` σ is fixed and
    `epsilon`, if given, is enforced. `private = false` runs the non-private reference: plain SGD
    on the same batches, without clipping or noise."""

    private: bool = True
    epsilon: float | None = Field(None, gt=0)
    delta: float = Field(1e-5, gt=0, lt=1)
    noise_multiplier: float | None = Field(None, gt=0)
    accountant: Literal["pld", "rdp"] = "pld"
    silos: dict[str, SiloBudget] = Field(default_factory=dict)
    """Budgets of named silos that differ from (epsilon, delta)."""
    calibration: Literal["common", "per-silo"] = "common"
    """common: every silo gets the σ of the most constrained one; per-silo: each silo the
    least σ for its own (ε, δ), so no silo ends far below its budget."""

    @model_validator(mode="after")
    def _private_needs_noise_or_budget(self) -> PrivacyConfig:
        if self.private and self.epsilon is None and self.noise_multiplier is None:
            raise ValueError(
                "a private run needs `epsilon` (noise calibrated to it) or `noise_multiplier`"
            )
        if not self.private and (self.noise_multiplier is not None or self.silos):
            raise ValueError("a non-private run takes no noise_multiplier or silo budgets")
        if self.calibration == "per-silo" and self.noise_multiplier is not None:
            raise ValueError("per-silo calibration sets each silo's σ: give no noise_multiplier")
        return self


class ThresholdConfig(_Strict):
    """The decision threshold of a binary model, which accuracy, balanced accuracy,
    precision and recall read: "fixed" at the public `value`, or "balanced": at every
    evaluation each silo releases histograms of its model's scores on its training
    records (per class, `bins` over logits in [−logit_range, logit_range], Gaussian
    noise of std `noise` records a count, charged to its ledger and planned with its
    rounds), and the threshold is the bin edge of the best TPR − FPR on their sum
    (`dpfl.federation.threshold`)."""

    choose: Literal["fixed", "balanced"] = "fixed"
    value: float = Field(0.5, gt=0, lt=1)
    noise: float = Field(10.0, gt=0)
    bins: int = Field(16, ge=2)
    logit_range: float = Field(8.0, gt=0)


class TuneConfig(_Strict):
    """`dpfl tune`'s validation records, which pick the released candidate without noise
    (outside ε); no other command reads them. "from-training": a stratified
    `validation_fraction` of each silo's training records, which every candidate then
    trains without; "held-out": that fraction of each silo's test records, in no silo's
    training set: the candidates train on the study's training records (what `dpfl run`
    trains on) and the test metrics are read on the rest of the test records."""

    validation: Literal["from-training", "held-out"] = "from-training"
    validation_fraction: float = Field(0.2, gt=0, lt=1)


class StudyConfig(_Strict):
    """One point of a study: everything a run needs."""

    name: str = "study"
    seed: int = 0
    trials: int = Field(1, ge=1)
    rounds: int = Field(ge=1)
    eval_every: int = Field(1, ge=1)
    """Rounds between evaluations on the test sets; `"end"`: only after the last round.
    Every evaluation releases metrics of held-out records outside ε."""
    engine: Literal["simulation"] = "simulation"
    secure_aggregation: SecureAggregation | None = None
    """How the server learns the sum of the hospitals' replies: "none", in the clear;
    "ideal", secure aggregation's ideal functionality in one process (the server's code
    is handed the sum only); "masking", pairwise masking (SecAgg: X25519, ChaCha20,
    Shamir; `dpfl.secure.masking`); "he", BFV homomorphic encryption (TenSEAL;
    `dpfl.secure.he`). Masking and HE sum in fixed point (error ≤ K·2^-17 and K·2^-31
    a value). Default: "ideal" where the algorithm's ε needs a secure sum
    (fedsgd_secure), "none" otherwise."""
    research_noise: bool = True
    """Seeded noise and batches, reproducible (research); false draws the noise from the
    OS CSPRNG and the silos' batches from the OS."""
    metrics: list[Metric] = Field(default_factory=lambda: ["accuracy", "auroc"])  # type: ignore[arg-type]
    """Metrics printed in tables (all are computed and stored)."""
    cross_silo: bool = False
    """Also score every silo's final model on every silo's test set (the FLamby
    convention; the results store's `cross_silo` table): more metrics released outside
    ε, after the last round only."""
    data: DataConfig
    model: ModelConfig = ModelConfig()
    algorithm: AlgorithmConfig
    privacy: PrivacyConfig
    threshold: ThresholdConfig = ThresholdConfig()
    tune: TuneConfig = TuneConfig()
    roster: dict[str, str] = Field(default_factory=dict)
    """A deployment's hospitals, pinned: each one's name and identity key, as `dpfl deploy
    identity` prints it (`dpfl.engines.roster`). The simulator does not read it."""

    @model_validator(mode="before")
    @classmethod
    def _evaluate_at_the_end(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and raw.get("eval_every") == "end":
            return {**raw, "eval_every": raw.get("rounds")}
        return raw

    @model_validator(mode="after")
    def _fits_the_algorithm(self) -> StudyConfig:
        from dpfl.federation.algorithms import BY_NAME  # imports torch: only to validate

        name, kind = self.algorithm.name, BY_NAME[self.algorithm.name]
        if self.algorithm.optimizer == "adam":
            why = {
                "mrmtl": "its pull towards the global model joins SGD's velocity",
                "ditto": "its pull towards the global model joins SGD's velocity",
                "fedsgd_secure": "its hospitals reply one plain noisy step for the secure sum",
                "aop": "it runs no SGD steps",
                "sign": "it sends the signs of one gradient",
            }.get(name)
            if why is not None:
                raise ValueError(f"algorithm.optimizer 'adam' is not for {name}: {why}; use 'sgd'")
            if self.algorithm.momentum:
                raise ValueError(
                    "algorithm.optimizer 'adam' takes no algorithm.momentum (Adam's first "
                    "moment is its momentum): leave momentum at 0"
                )
        if kind.sets_own_noise and not self.privacy.private:
            raise ValueError(
                f"{name} has no non-private form; the non-private reference is fedavg or "
                "centralized with privacy.private = false"
            )
        if kind.sets_own_noise and self.privacy.epsilon is None:
            raise ValueError(f"{name} sets its noise from the budget: give privacy.epsilon")
        if kind.sets_own_noise and self.privacy.noise_multiplier is not None:
            raise ValueError(f"{name} calibrates its own noise to privacy.epsilon")
        if kind.stops_at_budget and self.privacy.private and self.privacy.epsilon is None:
            raise ValueError(f"{name} stops at its budget: give privacy.epsilon")
        if self.privacy.calibration == "per-silo" and not kind.silo_noise_allowed:
            raise ValueError(f"{name}'s silos cannot have noise multipliers of their own")
        if self.algorithm.sampling == "balanced" and not getattr(kind, "balances_batches", False):
            raise ValueError(f"algorithm.sampling: {name} cannot draw balanced batches")
        if self.algorithm.loss == "cox" and self.privacy.private:
            raise ValueError(
                "algorithm.loss: the Cox partial likelihood couples the patients of a batch "
                "through its risk sets, so clipping each patient's gradient does not bound "
                "one patient's influence: it is not DP. Use loss = 'logistic_hazard' (a sum "
                "over patients) for private survival, or privacy.private = false"
            )
        if self.algorithm.loss == "logistic_hazard" and not self.model.time_bins:
            raise ValueError("algorithm.loss = 'logistic_hazard' needs model.time_bins")
        bins = self.model.time_bins or []
        if any(b <= 0 for b in bins) or any(b >= c for b, c in itertools.pairwise(bins)):
            raise ValueError(f"model.time_bins must increase from above 0, got {bins}")
        if kind.needs_linear_model and self.model.kind != "logistic_regression":
            raise ValueError(f"{name} needs a convex model: model.kind = 'logistic_regression'")
        if kind.needs_secure_sum and self.secure_aggregation == "none":
            raise ValueError(
                f"{name}'s ε assumes the server sees only the sum of the replies: "
                "secure_aggregation 'ideal', 'masking' or 'he'"
            )
        if not kind.sums_replies and self.secure_aggregation not in (None, "none"):
            raise ValueError(f"{name}'s server sums no replies: no secure_aggregation to choose")
        if self.algorithm.tolerated_dropouts and name != "fedsgd_secure":
            raise ValueError("algorithm.tolerated_dropouts is fedsgd_secure's")
        if self.algorithm.votes != "binary" and name != "sign":
            raise ValueError("algorithm.votes is sign's")
        if self.threshold.choose == "balanced":
            if kind.stops_at_budget and self.privacy.private:
                raise ValueError(
                    f"threshold.choose: {name} runs until its budget is spent, which leaves "
                    "nothing to release a threshold with; use 'fixed'"
                )
            if self.model.time_bins or self.algorithm.loss in ("cox", "logistic_hazard"):
                raise ValueError("threshold.choose: 'balanced' is for binary classifiers")
        return self

    @property
    def summing(self) -> SecureAggregation:
        """The secure aggregation in force: the chosen one, else the algorithm's default."""
        from dpfl.federation.algorithms import BY_NAME

        if self.secure_aggregation is not None:
            return self.secure_aggregation
        return "ideal" if BY_NAME[self.algorithm.name].needs_secure_sum else "none"

    def key(self) -> str:
        """A stable id of this point (its resolved config), the run's key in the store."""
        resolved = self.model_dump(mode="json", exclude={"tune"})  # runs do not read it
        for option in ("cross_silo", "secure_aggregation", "roster"):
            if not resolved[option]:  # keys from before the option stay the same
                del resolved[option]
        if self.threshold == ThresholdConfig():
            del resolved["threshold"]
        if not self.algorithm.tolerated_dropouts:
            del resolved["algorithm"]["tolerated_dropouts"]
        for section, option, default in (
            ("algorithm", "optimizer", "sgd"),
            ("algorithm", "sampling", "poisson"),
            ("algorithm", "votes", "binary"),
            ("data", "split", "stratified"),
            ("model", "time_bins", None),
        ):
            if resolved[section][option] == default:  # keys from before the option stay
                del resolved[section][option]
        text = json.dumps(resolved, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class Study:
    """A parsed study file: its grid axes and every point, each validated."""

    def __init__(self, raw: Mapping[str, Any], source: str = "config") -> None:
        self.source = source
        # keys and size first: a grid is expanded only once it is known to be a study's
        errors = [f"  {key}: {UNKNOWN_KEY}" for key in dict.fromkeys(_unknown_keys(raw))]
        self.axes = {} if errors else dict(_axes(raw))
        size = math.prod(len(values) for values in self.axes.values())
        if size > MAX_POINTS:
            axes = " × ".join(f"{key} ({len(values)})" for key, values in self.axes.items())
            errors.append(f"  a grid of {size:,} points, over the limit of {MAX_POINTS:,}: {axes}")
        if errors:
            raise ConfigError(f"{source}: invalid study\n" + "\n".join(errors))
        self.points: list[tuple[dict[str, Any], StudyConfig]] = []
        for values in itertools.product(*self.axes.values()) if self.axes else [()]:
            grid = dict(zip(self.axes, values, strict=True))
            try:
                self.points.append((grid, StudyConfig.model_validate(_with(raw, grid))))
            except ValidationError as exc:
                errors.append(_describe(exc, grid))
        if errors:
            shown = "\n".join(dict.fromkeys(errors))
            raise ConfigError(f"{source}: invalid study\n{shown}")

    @property
    def name(self) -> str:
        return self.points[0][1].name


def load(path: str | Path) -> Study:
    """Read and validate a study file; errors name the file, the key and the reason.
    A relative `data.path` is read from the file's folder, wherever dpfl runs."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such file") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    data = raw.get("data")
    if isinstance(data, dict) and "path" in data:
        folders = data["path"]
        data["path"] = (
            [_beside(path, f) for f in folders]
            if isinstance(folders, list)
            else _beside(path, folders)
        )
    return Study(raw, str(path))


def _beside(study_file: Path, folder: Any) -> Any:
    """`folder` read relative to the study file's folder (a non-text value is left for
    validation to refuse)."""
    if not isinstance(folder, str):
        return folder
    return str((study_file.parent / Path(folder).expanduser()).resolve())


API_TERMS = {
    "add noise, run fewer rounds, or calibrate the noise to the budget": "raise "
    "privacy.noise_multiplier, lower rounds, or leave privacy.noise_multiplier out of the "
    "study file (σ is then calibrated to privacy.epsilon)",
}
"""Advice the Python API gives, as a study file's user takes it."""


def study_terms(message: str) -> str:
    """`message`, raised by the Python API under a study, in the study file's terms."""
    for api, study in API_TERMS.items():
        message = message.replace(api, study)
    return message


def _axes(raw: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, list[Any]]]:
    """(dotted key, values) of every grid axis: lists where one value is expected."""
    for key, value in raw.items():
        path = (*prefix, key)
        if path[:2] == ("data", "options"):
            continue  # a builder's keyword arguments are passed as given
        if isinstance(value, dict):
            yield from _axes(value, path)
        elif isinstance(value, list) and (
            path not in LIST_VALUED or (value and all(isinstance(v, list) for v in value))
        ):
            if not value:
                raise ConfigError(f"{'.'.join(path)}: an empty list is an empty grid")
            yield ".".join(path), value


def _unknown_keys(
    raw: Mapping[str, Any], schema: type[BaseModel] = StudyConfig, prefix: str = ""
) -> Iterator[str]:
    """The dotted key of every key that `schema` (or a section of it) does not have, read
    off the raw file: a misspelt key holding a list is named once, and never expanded."""
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        field = schema.model_fields.get(key)
        if field is None:
            yield dotted
            continue
        section, by_name = _section(field.annotation)
        tables = value if isinstance(value, list) else [value]  # a grid of sections
        for table in tables if section is not None else []:
            if not isinstance(table, Mapping):
                continue  # not a table: validation names it
            if not by_name:
                yield from _unknown_keys(table, section, f"{dotted}.")
                continue
            for name, entry in table.items():  # sections by name (privacy.silos)
                if isinstance(entry, Mapping):
                    yield from _unknown_keys(entry, section, f"{dotted}.{name}.")


def _section(annotation: Any) -> tuple[Any, bool]:
    """The section (`_Strict` model) a field holds, if any, and whether it holds a table
    of them by name."""
    if isinstance(annotation, type) and issubclass(annotation, _Strict):
        return annotation, False
    if get_origin(annotation) is dict:
        value = get_args(annotation)[1]
        if isinstance(value, type) and issubclass(value, _Strict):
            return value, True
    return None, False


def _with(raw: Mapping[str, Any], grid: Mapping[str, Any]) -> dict[str, Any]:
    """`raw` with each axis set to its value in this grid point."""
    point: dict[str, Any] = json.loads(json.dumps(raw, default=str))
    for dotted, value in grid.items():
        *parents, leaf = dotted.split(".")
        node = point
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    return point


def _describe(exc: ValidationError, grid: Mapping[str, Any]) -> str:
    where = f" (grid point {_show(grid)})" if grid else ""
    lines = []
    for error in exc.errors():
        key = ".".join(str(p) for p in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = UNKNOWN_KEY
        lines.append(f"  {key}: {message}{where}")
    return "\n".join(lines)


def _show(grid: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in grid.items())
