"""A study described in a TOML file, validated by pydantic.

```toml
name = "breast-cancer-fedavg"
rounds = 20
trials = 5

[data]
dataset = "breast_cancer"          # see dpfl.experiments.study.datasets.DATASETS
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
all axes. Keys whose value is itself a list (their schema type is a list or a pair:
`model.hidden`, `metrics`, `data.features`, `data.columns.NAME.range`, ...) become axes
when given a list of lists. Unknown keys and bad values (infinite or NaN numbers among
them) are refused with the dotted path of the key and the reason, before anything runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType, UnionType
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dpfl import secure
from dpfl.experiments.study.datasets import DATASETS, KINDS, DataConfig, own_keys
from dpfl.experiments.study.datasets.base import Strict as _Strict
from dpfl.federation.algorithms import SETTINGS, AlgorithmSettings, DPSGDSettings

if TYPE_CHECKING:
    SecureAggregation = str
else:
    SecureAggregation = Literal[tuple(secure.MODES)]
    """A study's `secure_aggregation`: a name in the registry (`dpfl.secure.MODES`)."""

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


MAX_POINTS = 100_000
"""The largest grid a study may have: a larger one is refused, its size and axes named,
before any point is built (a few two-valued axes too many make millions)."""
UNKNOWN_KEY = "unknown key (check its spelling and section)"


class ConfigError(ValueError):
    """A study file that cannot be run, with every problem named by its key."""


class ModelConfig(_Strict):
    kind: Literal[
        "logistic_regression",
        "mlp",
        "small_cnn",
        "scatternet_linear",
        "scatternet_cnn",
        "resnet18_gn",
        "vit",
    ] = "logistic_regression"
    """The built-in model (`dpfl.models.factories.KINDS`); small_cnn, the two
    scatternet kinds (Tramèr & Boneh's fixed scattering front, then a linear layer or a
    small CNN: `dpfl.models.scattering`), resnet18_gn and vit (`dpfl.models.large`)
    classify images."""
    factory: str | None = None
    """Your own model: `"file.py:build"` (in a study file, relative to the file's folder)
    or `"package.module:build"`, called as `build(n_features, n_outputs)` for feature
    vectors and `build(input_shape, n_outputs)` for images, returning a
    `torch.nn.Module` (`dpfl.models.factories`); instead of `kind`. The run's key holds
    it and its source file's SHA-256."""
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

    @field_validator("factory")
    @classmethod
    def _findable(cls, factory: str | None) -> str | None:
        from dpfl.models.factories import source_file  # imports torch

        if factory is not None:
            source_file(factory)
        return factory

    @model_validator(mode="after")
    def _kind_or_factory(self) -> ModelConfig:
        if self.factory is not None and self.kind != "logistic_regression":
            raise ValueError("give model.kind or model.factory, not both")
        return self


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
    hospitals_per_patient: int | None = Field(None, ge=1)
    """The declared (public) bound on how many hospitals one patient may have visited: the
    report and datasheet then show the consortium-level ε, the composition of the plans
    of the h silos that spent the most (`accounting.consortium_epsilon`), which covers one
    unit at each: a record, or a patient where `[data] unit` is declared."""
    consortium_epsilon: float | None = Field(None, gt=0)
    """A budget on that consortium-level ε at `delta`: σ is calibrated to meet it (and
    `epsilon`, where given, too)."""
    ledger: str | None = None
    """A ledger shared by several studies (a hospital's; in a study file relative to its
    folder) that every release from the study's records is charged to, instead of the
    command's own (`dpfl.experiments.study.spending`): a run's, a selection's (`dpfl tune`) and
    the statistics' (`dpfl stats`) accounts go under `study/release`, and `caps` hold
    every study over a hospital's records together."""
    caps: dict[str, SiloBudget] = Field(default_factory=dict)
    """By hospital (silo) name: the (ε, δ) every study's releases over its records may
    spend together from `ledger` (`Ledger.cap_dataset`); a release whose plan would pass
    it is refused before it starts."""

    @model_validator(mode="after")
    def _private_needs_noise_or_budget(self) -> PrivacyConfig:
        budget = (self.epsilon, self.noise_multiplier, self.consortium_epsilon)
        if self.private and budget == (None, None, None):
            raise ValueError(
                "a private run needs `epsilon` (noise calibrated to it) or `noise_multiplier`"
            )
        if self.consortium_epsilon is not None:
            if self.hospitals_per_patient is None:
                raise ValueError("consortium_epsilon needs hospitals_per_patient (the h it is for)")
            if not self.private:
                raise ValueError("a non-private run takes no consortium_epsilon")
            if self.noise_multiplier is not None:
                raise ValueError("consortium_epsilon sets σ: give no noise_multiplier")
            if self.calibration == "per-silo":
                raise ValueError("consortium_epsilon calibrates one σ: calibration = 'common'")
        if not self.private and (self.noise_multiplier is not None or self.silos):
            raise ValueError("a non-private run takes no noise_multiplier or silo budgets")
        if self.calibration == "per-silo" and self.noise_multiplier is not None:
            raise ValueError("per-silo calibration sets each silo's σ: give no noise_multiplier")
        if self.caps and self.ledger is None:
            raise ValueError("caps are kept in a shared ledger: give privacy.ledger")
        if not self.private and self.ledger is not None:
            raise ValueError(
                "a non-private run releases without any ε to charge: a study over the "
                "records of a shared privacy.ledger (held to its budgets and caps) must be "
                "private"
            )
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
    trains on) and the test metrics are read on the rest of the test records; "official"
    (with `data.split = "official"`): each silo's share of the dataset's official val
    split, in no silo's training or test set, the test metrics read on all its test
    records (`validation_fraction` unused)."""

    validation: Literal["from-training", "held-out", "official"] = "from-training"
    validation_fraction: float = Field(0.2, gt=0, lt=1)


class ColumnBins(_Strict):
    """A column (a table's column, or a built-in dataset's feature) over declared public
    bin edges, in the column's units."""

    column: str
    bins: list[float] = Field(min_length=2)


class ColumnRange(_Strict):
    """A column with its declared public range: values are clipped to it."""

    column: str
    range: tuple[float, float]


class ColumnQuantiles(ColumnBins):
    """Quantiles of a column over its declared domain (the bins' first and last edges).
    `method`: "histogram", pooled, searched over the declared bins in the stats run's
    Gaussian release; or "exponential", each hospital's own, by the exponential
    mechanism (JointExp) on its own records at its own pure `epsilon`, charged beside
    the Gaussian releases (and counted in the run's calibration)."""

    probabilities: list[float] = Field(default_factory=lambda: [0.01, 0.25, 0.5, 0.75, 0.99])
    method: Literal["histogram", "exponential"] = "histogram"
    epsilon: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _epsilon_for_exponential(self) -> ColumnQuantiles:
        if (self.method == "exponential") != (self.epsilon is not None):
            raise ValueError(
                f"quantiles of {self.column!r}: `epsilon` is the exponential method's own "
                '(give it with method = "exponential", and only then)'
            )
        return self


class ColumnCategories(_Strict):
    """Counts of a column's declared values (and of every other value, or none,
    together): a text column by its name (`column = "sex"`, its `values` by default the
    categories its `[data.columns]` declares), a number's by the values listed."""

    column: str
    values: list[str | float] | None = Field(None, min_length=1)


class ContinuousVariable(ColumnRange):
    """A Table 1 continuous variable: mean ± sd over its public range, and median [IQR]
    searched over `bins` (default: 50 equal bins of the range)."""

    bins: list[float] | None = Field(None, min_length=2)


class TableOneConfig(_Strict):
    """Table 1 (`dpfl.analytics.table_one`): per hospital and pooled, by the column `by`
    (its `groups`: by default a text column's declared categories; none: one group),
    each `categorical` column's counts and percentages (a text column by name, or
    `{ column, values }`), each `continuous` variable's mean ± sd and median [IQR]."""

    by: str | None = None
    groups: list[str | float] | None = Field(None, min_length=1)
    categorical: list[str | ColumnCategories] = Field(default_factory=list)
    continuous: list[ContinuousVariable] = Field(default_factory=list)


class ColumnGroups(_Strict):
    """Survival compared between a column's declared values (log-rank, Cox hazard ratios
    against the first) on declared public time bin edges, in the `time` column's units;
    `values` by default a text column's declared categories."""

    column: str
    values: list[str | float] | None = Field(None, min_length=2)
    bins: list[float] = Field(min_length=2)


class AnalyticsConfig(_Strict):
    """`dpfl stats`: DP statistics of the hospitals' records (`dpfl.analytics`), each a
    Gaussian release charged to every hospital's ledger (the study's budget, `[privacy]`)
    and summed by the study's `secure_aggregation`. `noise_multiplier`: σ of every
    statistic (std σ × its sensitivity); or `epsilon`: σ calibrated so that the whole
    stats run costs each hospital at most this ε at `[privacy] delta` (one of them)."""

    epsilon: float | None = Field(None, gt=0)
    noise_multiplier: float | None = Field(None, gt=0)
    counts: bool = True
    """Counts per hospital, pooled and per declared class label."""
    consistent: bool = False
    """Counts post-processed into non-negative integers, each breakdown summing to the
    pooled count (free under DP; `raw = false` on each such figure). False: the raw noisy
    counts, unbiased, fractional, possibly negative."""
    categories: list[ColumnCategories] = Field(default_factory=list)
    histograms: list[ColumnBins] = Field(default_factory=list)
    means: list[ColumnRange] = Field(default_factory=list)
    quantiles: list[ColumnQuantiles] = Field(default_factory=list)
    kaplan_meier: list[float] = Field(default_factory=list)
    """A Kaplan–Meier curve on these public time bin edges (the `time` column's units)."""
    table_one: TableOneConfig | None = None
    survival: list[ColumnGroups] = Field(default_factory=list)
    """Survival between groups: each group's Kaplan–Meier curve, the log-rank test and the
    hazard ratios (`dpfl.analytics.SurvivalComparison`)."""

    @model_validator(mode="after")
    def _one_noise(self) -> AnalyticsConfig:
        if self.epsilon is not None and self.noise_multiplier is not None:
            raise ValueError("analytics: give `epsilon` or `noise_multiplier`, not both")
        return self


class EvaluationConfig(_Strict):
    """What a deployed hospital's evaluation of the final model releases (`dpfl deploy`;
    the simulator's figures are research figures, outside ε, whatever this says).
    `release`: "dp", Gaussian noisy counts of its test records by (label, score bin) and,
    for several classes, its confusion matrix (noise multiplier `noise_multiplier`, over
    `bins` score bins of [0, 1]), charged to its ledger before they leave and planned
    with its rounds; the server reads every metric off them. "clear": its exact metrics
    and counts, outside ε, as the study explicitly says. `queries`: how many evaluations
    each hospital answers over the study's runs (each of the final model of a run it
    trained in; 0: none)."""

    release: Literal["dp", "clear"] = "dp"
    queries: int = Field(1, ge=0)
    noise_multiplier: float = Field(5.0, gt=0)
    bins: int = Field(10, ge=2)

    @model_validator(mode="after")
    def _half_is_an_edge(self) -> EvaluationConfig:
        if self.bins % 2:
            raise ValueError(f"evaluation.bins must be even (0.5 is an edge), got {self.bins}")
        return self


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
    algorithm: AlgorithmSettings
    """The algorithm and its settings, which its own module declares
    (`dpfl.federation.algorithms`)."""
    privacy: PrivacyConfig
    threshold: ThresholdConfig = ThresholdConfig()
    tune: TuneConfig = TuneConfig()
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    """Where local training runs (models, batches, noise): "cuda" refuses to run without
    CUDA, "auto" takes CUDA where there is one and the CPU otherwise."""
    roster: dict[str, str] = Field(default_factory=dict)
    """A deployment's hospitals, pinned: each one's name and identity key, as `dpfl deploy
    identity` prints it (`dpfl.engines.flower.roster`). The simulator does not read it."""
    analytics: AnalyticsConfig = AnalyticsConfig()
    """`dpfl stats`' statistics; in a run key only where set (no run reads it)."""
    evaluation: EvaluationConfig = EvaluationConfig()
    """A deployment's evaluation (`dpfl deploy`); in a run key only where set."""

    @model_validator(mode="before")
    @classmethod
    def _evaluate_at_the_end(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and raw.get("eval_every") == "end":
            return {**raw, "eval_every": raw.get("rounds")}
        return raw

    @model_validator(mode="after")
    def _images_for_image_models(self) -> StudyConfig:
        from dpfl.experiments.study.datasets.images import ImageData

        if self.model.kind.startswith("scatternet") and not isinstance(self.data, ImageData):
            raise ValueError(
                f"model.kind: {self.model.kind} classifies images; data.dataset must be "
                f"'images' or a MedMNIST preset, got {self.data.dataset!r}"
            )
        return self

    @model_validator(mode="after")
    def _fits_the_algorithm(self) -> StudyConfig:
        """The study's other sections against the algorithm's class facts (its settings
        checked themselves)."""
        name, kind = self.algorithm.name, self.algorithm.algorithm
        if kind.sets_own_noise and not self.privacy.private:
            raise ValueError(
                f"{name} has no non-private form; the non-private reference is fedavg or "
                "centralized with privacy.private = false"
            )
        if kind.sets_own_noise and self.privacy.epsilon is None:
            raise ValueError(f"{name} sets its noise from the budget: give privacy.epsilon")
        if kind.sets_own_noise and self.privacy.noise_multiplier is not None:
            raise ValueError(f"{name} calibrates its own noise to privacy.epsilon")
        if kind.sets_own_noise and self.privacy.consortium_epsilon is not None:
            raise ValueError(f"{name} sets its noise from privacy.epsilon: no consortium_epsilon")
        if kind.stops_at_budget and self.privacy.private and self.privacy.epsilon is None:
            raise ValueError(f"{name} stops at its budget: give privacy.epsilon")
        if self.privacy.calibration == "per-silo" and not kind.silo_noise_allowed:
            raise ValueError(f"{name}'s silos cannot have noise multipliers of their own")
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
        if kind.needs_linear_model and (
            self.model.kind != "logistic_regression" or self.model.factory is not None
        ):
            raise ValueError(f"{name} needs a convex model: model.kind = 'logistic_regression'")
        chosen = None if self.secure_aggregation is None else secure.mode(self.secure_aggregation)
        if kind.needs_secure_sum and chosen is not None and not chosen.hides_replies:
            *most, last = (f"'{m.name}'" for m in secure.MODES.values() if m.hides_replies)
            raise ValueError(
                f"{name}'s ε assumes the server sees only the sum of the replies: "
                f"secure_aggregation {', '.join(most)} or {last}"
            )
        if not kind.sums_replies and chosen is not None and chosen.hides_replies:
            raise ValueError(f"{name}'s server sums no replies: no secure_aggregation to choose")
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
        if self.secure_aggregation is not None:
            return self.secure_aggregation
        return secure.default_mode(self.algorithm.algorithm.needs_secure_sum).name

    def key(self) -> str:
        """A stable id of this point (its resolved config), the run's key in the store:
        `KEYED`'s fields, each at this point's value (or the pinned default, where the
        point's section lacks it), and any other field only where it is not at its
        default, so that a new option, or an algorithm's own setting, leaves every
        existing key as it was."""
        keyed = _keyed(self, KEYED)
        if self.model.factory is not None:  # an edited model is a new point
            from dpfl.models.factories import source_digest

            keyed["model"]["factory_sha256"] = source_digest(self.model.factory)
        text = json.dumps(keyed, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


REQUIRED = None
"""Stands in `KEYED` for a field without a default: every point has its own value."""
KEYED: Mapping[str, Any] = MappingProxyType(
    {
        "name": "study",
        "seed": 0,
        "trials": 1,
        "rounds": REQUIRED,
        "eval_every": 1,
        "engine": "simulation",
        "research_noise": True,
        "metrics": ["accuracy", "auroc"],
        "data": {
            "dataset": REQUIRED,
            "path": None,
            "options": {},
            "partition": {"kind": "iid", "silos": None, "alpha": 0.5, "names": None},
            "test_fraction": 0.2,
            "public_sizes": "declared",
            "size_noise": 20.0,
        },
        "model": {"kind": "logistic_regression", "hidden": [200, 200], "init": "per-trial"},
        "algorithm": {
            "name": REQUIRED,
            "learning_rate": 0.5,
            "clip_norm": 1.0,
            "expected_batch_size": 16.0,
            "momentum": 0.0,
            "loss": None,
            "positive_weight": 1.0,
            "local_epochs": 1.0,
            "client_rate": None,
            "clients_per_round": None,
            "weighting": None,
            "steps_per_visit": 10,
            "server_learning_rate": 0.005,
            "strength": 1.0,
            "federated_rounds": 1,
            "epochs_per_round": 1.0,
            "regularization": 0.01,
            "gradient_tolerance": 0.0001,
            "feature_norm_bound": 1.0,
        },
        "privacy": {
            "private": True,
            "epsilon": None,
            "delta": 1e-05,
            "noise_multiplier": None,
            "accountant": "pld",
            "silos": {},
            "calibration": "common",
        },
    }
)
"""The fields (and their defaults) that every run key holds, frozen as they were when
the study had one flat `[algorithm]` section for every algorithm: each key holds them
all, whatever the algorithm's own settings, so that no run's id ever moves. Never add
to it: a new field enters a key only where it is set (`StudyConfig.key`)."""
UNKEYED = frozenset({"tune"})
"""Fields no run reads (only `dpfl tune`), which therefore name no run."""


def _keyed(section: BaseModel, pinned: Mapping[str, Any]) -> dict[str, Any]:
    """`section`'s fields for its run key: every `pinned` one, at the section's value or
    else the pinned default, and every other one where it is not at its default."""
    dumped = section.model_dump(mode="json")
    keyed: dict[str, Any] = {}
    for name, default in pinned.items():
        value = getattr(section, name, None)
        if isinstance(value, BaseModel) and isinstance(default, Mapping):
            keyed[name] = _keyed(value, default)
        else:
            keyed[name] = dumped.get(name, default)
    for name, field in type(section).model_fields.items():
        if name in pinned or name in UNKEYED or name not in dumped:
            continue  # (not dumped: a dataset's options, keyed in its `options`)
        if getattr(section, name) != field.get_default(call_default_factory=True):
            keyed[name] = dumped[name]
    if isinstance(section, DPSGDSettings):  # other algorithms' settings of a grid over them
        keyed |= {name: dumped[name] for name in section.others() if name not in pinned}
    return keyed


class Study:
    """A parsed study file: its grid axes and every point, each validated."""

    def __init__(self, raw: Mapping[str, Any], source: str = "config") -> None:
        self.source = source
        # keys and size first: a grid is expanded only once it is known to be a study's
        errors = [f"  {key}: {_unknown(key, raw)}" for key in dict.fromkeys(_unknown_keys(raw))]
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
    A relative `data.path` or `privacy.ledger` is read from the file's folder, wherever
    dpfl runs."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such file") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    for section, key, resolve in (
        ("data", "path", _beside),
        ("privacy", "ledger", _beside),
        ("model", "factory", _factory_beside),
    ):
        table = raw.get(section)
        if isinstance(table, dict) and key in table:  # a list of them is a grid axis
            value = table[key]
            table[key] = (
                [resolve(path, v) for v in value]
                if isinstance(value, list)
                else resolve(path, value)
            )
    return Study(raw, str(path))


def _factory_beside(study_file: Path, factory: Any) -> Any:
    """A `"file.py:build"` factory with its file read relative to the study file's
    folder; a module's factory as it is (a non-text value is left for validation)."""
    from dpfl.models.factories import in_folder  # imports torch

    return in_folder(factory, study_file.parent) if isinstance(factory, str) else factory


def _beside(study_file: Path, folder: Any) -> Any:
    """`folder` read relative to the study file's folder (a non-text value is left for
    validation to refuse)."""
    if not isinstance(folder, str):
        return folder
    return str((study_file.parent / Path(folder).expanduser()).resolve())


def _axes(raw: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, list[Any]]]:
    """(dotted key, values) of every grid axis: lists where one value is expected."""
    for key, value in raw.items():
        path = (*prefix, key)
        if path[:2] == ("data", "options"):
            continue  # the older spelling of a dataset's own keys: no axes, as ever
        if isinstance(value, dict):
            yield from _axes(value, path)
        elif isinstance(value, list) and (
            not _list_valued(path) or (value and all(isinstance(v, list) for v in value))
        ):
            if not value:
                raise ConfigError(f"{'.'.join(path)}: an empty list is an empty grid")
            yield ".".join(path), value


def _list_valued(path: Sequence[str]) -> bool:
    """Whether the schema's type of the key at `path` is a list (or a pair), whose one
    value is then a list: only a list of lists makes it a grid axis."""
    schema: tuple[type[BaseModel], ...] = (StudyConfig,)
    by_name = False
    annotation: Any = None
    for key in path:
        if by_name:  # the name of a section by name (data.columns.NAME, privacy.silos.NAME)
            by_name = False
            annotation = _value_type(annotation)
            continue
        fields = [m.model_fields[key] for m in schema if key in m.model_fields]
        if not fields:
            return False
        annotation = fields[0].annotation
        schema, by_name = _sections(annotation)
    options = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else ()
    return any(get_origin(a) in (list, tuple) for a in (annotation, *options))


def _unknown_keys(
    raw: Mapping[str, Any], schema: Sequence[type[BaseModel]] = (StudyConfig,), prefix: str = ""
) -> Iterator[str]:
    """The dotted key of every key that no model of `schema` (or a section of it) has,
    read off the raw file: a misspelt key holding a list is named once, and never
    expanded. (A key of some algorithm's settings but not of the one named is left to
    validation, which names the algorithms whose key it is.)"""
    fields = {name: field for model in schema for name, field in model.model_fields.items()}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        field = fields.get(key)
        if dotted == "data.options":
            continue  # the older spelling of a dataset's own keys, which its kind checks
        if field is None:
            yield dotted
            continue
        sections, by_name = _sections(field.annotation)
        tables = value if isinstance(value, list) else [value]  # a grid of sections
        for table in tables if sections else []:
            if not isinstance(table, Mapping):
                continue  # not a table: validation names it
            if not by_name:
                yield from _unknown_keys(table, sections, f"{dotted}.")
                continue
            for name, entry in table.items():  # sections by name (privacy.silos)
                if isinstance(entry, Mapping):
                    yield from _unknown_keys(entry, sections, f"{dotted}.{name}.")


def _sections(annotation: Any) -> tuple[tuple[type[BaseModel], ...], bool]:
    """The sections (models) a field holds, if any: one, or those of a union (an
    algorithm's settings); and whether it holds a table of them (or of values, such as
    `data.columns.NAME.groups`) by name."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return (annotation,), False
    if get_origin(annotation) is dict:
        return _sections(get_args(annotation)[1])[0], True
    options = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else ()
    options = tuple(o for o in options if o is not type(None))  # an optional section
    if len(options) == 1 and get_origin(options[0]) is dict:  # an optional table by name
        return _sections(options[0])
    if options and all(isinstance(o, type) and issubclass(o, BaseModel) for o in options):
        return options, False
    return (), False


def _value_type(annotation: Any) -> Any:
    """The type of a table's values by name (`dict[str, X]`, optional or not): X."""
    options = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else ()
    tables = [o for o in (annotation, *options) if get_origin(o) is dict]
    return get_args(tables[0])[1] if tables else None


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


TAGS: Mapping[str, tuple[str, Mapping[str, Any]]] = {
    "algorithm": ("name", SETTINGS),
    "data": ("dataset", KINDS),
}
"""The sections that are a union of settings: the key naming which, and the names."""


def _describe(exc: ValidationError, grid: Mapping[str, Any]) -> str:
    where = f" (grid point {', '.join(grid_pairs(grid))})" if grid else ""
    lines = []
    for error in exc.errors():
        loc, tag = error["loc"], None
        if len(loc) > 1 and loc[0] in TAGS and loc[1] in TAGS[str(loc[0])][1]:
            loc, tag = (loc[0], *loc[2:]), str(loc[1])  # the name, which the union adds
        key = ".".join(str(p) for p in loc) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "union_tag_not_found":  # no algorithm (dataset) named
            key, message = f"{key}.{TAGS[key][0]}", "Field required"
        if error["type"] == "union_tag_invalid" and key == "algorithm":
            *names, last = (repr(name) for name in SETTINGS)
            key, message = f"{key}.name", f"Input should be {', '.join(names)} or {last}"
        if error["type"] == "union_tag_invalid" and key == "data":
            dataset, known = error.get("ctx", {}).get("tag"), ", ".join(DATASETS)
            key, message = "data.dataset", f"unknown dataset {dataset!r}; known: {known}"
        if error["type"] == "extra_forbidden":
            message = UNKNOWN_KEY
            if key.count(".") == 1 and key.startswith("data.") and tag is not None:
                message = f"{UNKNOWN_KEY}; {own_keys(tag)}"
        lines.append(f"  {key}: {message}{where}")
    return "\n".join(lines)


def _unknown(key: str, raw: Mapping[str, Any]) -> str:
    """Why `key` is refused: no section has it; a key of `[data]`'s own, with those its
    dataset takes."""
    data = raw.get("data")
    dataset = data.get("dataset") if isinstance(data, Mapping) else None
    if key.count(".") != 1 or not key.startswith("data.") or dataset not in KINDS:
        return UNKNOWN_KEY
    return f"{UNKNOWN_KEY}; {own_keys(dataset)}"


def grid_pairs(grid: Mapping[str, Any], *, last_part: bool = False) -> list[str]:
    """`key=value` for each axis of a grid point, in its order, for messages and tables;
    `last_part` keeps the last part of each dotted key, enough to tell a sweep's points
    apart (`noise_multiplier=1.0` for `privacy.noise_multiplier=1.0`)."""
    return [f"{k.rsplit('.', 1)[-1] if last_part else k}={v}" for k, v in grid.items()]
