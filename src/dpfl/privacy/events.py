"""Privacy events: what a mechanism did, in enough detail to account for it.

An event is a `dp_accounting` `DpEvent` tree plus the neighbouring relation under which
it was analysed. The code that samples a batch or adds noise builds the event (the one
rule in docs/architecture.md); accountants and the ledger only read events. Two event types
are ours because `dp_accounting` has none for them (three, with node-level steps):

* `ApproximateDpEvent`: a mechanism known only to be (ε, δ)-DP (A*STAR's approximate
  output perturbation). It has no Rényi or PLD curve, so it is composed by basic
  composition: its ε and δ add.
* `ClientSampledDpEvent`: a silo takes part in a round with probability C and, when it
  does not, sends nothing. Whoever sees the messages knows whether it took part, so the
  round's privacy loss is 0 with probability 1 - C and the inner event's loss with
  probability C. See `client_sampled` for why this is not Poisson subsampling at rate C·q.
* `NodeSampledGaussianDpEvent`: one DP-SGD step over graph neighbourhoods, in which one
  person can be in up to S rows and replacing them changes up to 2S − 1 (node-level DP;
  see `node_gaussian` and `replacement_rows`).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import attr
import dp_accounting
from dp_accounting import dp_event as dpe

from dpfl.privacy.errors import PrivacyParameterError


class Neighbouring(StrEnum):
    """Which datasets count as neighbours: one record added or removed, one record (or,
    node-level, one person) replaced, or one patient with all their records added or
    removed (patient-level: each sampled patient's records are clipped as one unit, so
    the patient is to the accountant what a record is under add/remove)."""

    ADD_REMOVE = "add_remove"
    REPLACE_ONE = "replace_one"
    ADD_REMOVE_PATIENT = "add_remove_patient"

    @property
    def description(self) -> str:
        return {
            Neighbouring.ADD_REMOVE: "add/remove one record",
            Neighbouring.REPLACE_ONE: "replace one record",
            Neighbouring.ADD_REMOVE_PATIENT: "one patient's records (add or remove one patient)",
        }[self]

    @property
    def adds_or_removes(self) -> bool:
        """Whether neighbours differ by one unit added or removed (a record or a patient)."""
        return self is not Neighbouring.REPLACE_ONE

    def to_dp_accounting(self) -> dp_accounting.NeighboringRelation:
        return {
            Neighbouring.ADD_REMOVE: dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
            Neighbouring.REPLACE_ONE: dp_accounting.NeighboringRelation.REPLACE_ONE,
            Neighbouring.ADD_REMOVE_PATIENT: dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        }[self]


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ApproximateDpEvent(dpe.DpEvent):  # type: ignore[misc]
    """A mechanism that is (epsilon, delta)-DP and nothing finer is known about it."""

    epsilon: float
    delta: float


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ClientSampledDpEvent(dpe.DpEvent):  # type: ignore[misc]
    """`event` runs with probability `sampling_probability`; otherwise nothing is sent."""

    sampling_probability: float
    event: dpe.DpEvent


@attr.s(frozen=True, slots=True, auto_attribs=True)
class NodeSampledGaussianDpEvent(dpe.DpEvent):  # type: ignore[misc]
    """One DP-SGD step (noise multiplier σ: std σC on a sum of gradients clipped to C) on
    a batch of rows of which one person is in at most `appearances` (S); the batch is
    Poisson at `sampling_probability`, or `batch_size` rows of `dataset_size` without
    replacement (the other fields None). The accountant charges the rows that replacing
    the person changes, `changed_rows` = 2S − 1, not S."""

    noise_multiplier: float
    appearances: int
    sampling_probability: float | None = None
    dataset_size: int | None = None
    batch_size: int | None = None

    @property
    def changed_rows(self) -> int:
        return replacement_rows(self.appearances)


def replacement_rows(appearances: int) -> int:
    """The most rows that replacing one person changes, where each person is in at most
    S = `appearances` rows: their own row, the rows of the ≤ S − 1 people who kept them
    as a contact, and the rows of the ≤ S − 1 who keep their replacement: 2S − 1.

    The single place that ties node-level neighbouring (replace one person with all
    their contacts) to a row count: the data layer declares S (a person is in ≤ S rows),
    and every node-level mechanism (DP-SGD steps, the threshold's histogram) reads the
    rows a replacement changes from here. Daigavane et al.'s S rows are for adding or
    removing a node, which would change the number of rows and so the sampling."""
    return 2 * appearances - 1


_EVENT_TYPES: dict[str, type[dpe.DpEvent]] = {
    cls.__name__: cls
    for cls in (
        dpe.NoOpDpEvent,
        dpe.GaussianDpEvent,
        dpe.LaplaceDpEvent,
        dpe.SelfComposedDpEvent,
        dpe.ComposedDpEvent,
        dpe.PoissonSampledDpEvent,
        dpe.SampledWithoutReplacementDpEvent,
        dpe.RepeatAndSelectDpEvent,
        ApproximateDpEvent,
        ClientSampledDpEvent,
        NodeSampledGaussianDpEvent,
    )
}


@dataclass(frozen=True)
class PrivacyEvent:
    """A validated `DpEvent` together with its neighbouring relation.

    Construct through the functions of this module; the constructor re-validates the
    whole tree, so an event read back from disk is checked exactly like a new one.
    """

    dp_event: dpe.DpEvent
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE

    def __post_init__(self) -> None:
        object.__setattr__(self, "neighbouring", Neighbouring(self.neighbouring))
        _validate(self.dp_event, self.neighbouring, top_level=True)

    def describe(self) -> str:
        """One line a person can read, e.g. `300 × Poisson(q=0.0036) Gaussian(σ=1.08)`."""
        return self._description

    @functools.cached_property
    def _description(self) -> str:
        """Kept with the (immutable) event: a run describes each member's event."""
        return f"{_describe(self.dp_event)} [{self.neighbouring.description}]"

    def to_json(self) -> str:
        return self._text

    @functools.cached_property
    def _text(self) -> str:
        """Kept with the event (the ledger writes it for every account it charges), and
        shared by equal events through `_serialise`."""
        try:
            hash(self)
        except TypeError:  # a composition holds a list: not hashable, so not shared
            return _serialise.__wrapped__(self)
        return _serialise(self)

    @classmethod
    def from_json(cls, text: str) -> PrivacyEvent:
        try:
            data = json.loads(text)
            return cls(_from_jsonable(data["event"]), Neighbouring(data["neighbouring"]))
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
            if isinstance(exc, PrivacyParameterError):
                raise
            raise PrivacyParameterError(f"not a serialised privacy event: {exc}") from exc


@functools.lru_cache(maxsize=4096)
def _serialise(event: PrivacyEvent) -> str:
    """Cached by value: a round charges many silos equal events, and the ledger keys its
    histories by this text."""
    return json.dumps(
        {"neighbouring": event.neighbouring.value, "event": _to_jsonable(event.dp_event)},
        sort_keys=True,
    )


# ----------------------------------------------------------------------------------------
# Constructors: one per mechanism the seeds use.


def gaussian(
    noise_multiplier: float, *, count: int = 1, neighbouring: Neighbouring = Neighbouring.ADD_REMOVE
) -> PrivacyEvent:
    """Gaussian noise of std `noise_multiplier` × L2 sensitivity on the full dataset."""
    return PrivacyEvent(_repeat(dpe.GaussianDpEvent(noise_multiplier), count), neighbouring)


def laplace(
    noise_multiplier: float, *, count: int = 1, neighbouring: Neighbouring = Neighbouring.ADD_REMOVE
) -> PrivacyEvent:
    """Laplace noise of scale `noise_multiplier` × L1 sensitivity on the full dataset."""
    return PrivacyEvent(_repeat(dpe.LaplaceDpEvent(noise_multiplier), count), neighbouring)


def poisson_gaussian(
    sample_rate: float,
    noise_multiplier: float,
    *,
    steps: int = 1,
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
) -> PrivacyEvent:
    """`steps` DP-SGD steps: each record joins each batch independently with probability q.

    This is the Sampled Gaussian Mechanism of Mironov et al. 2019 (Owkin, Def. 7), analysed
    under add/remove-one; only a Poisson sampler may emit it. `ADD_REMOVE_PATIENT`: each
    *patient* joins each batch with probability q and their records' gradient is clipped
    to C as one (Chua et al. 2024's user-level sampling): the same mechanism over
    patients, declared with the patient as its unit.
    """
    return _poisson_gaussian(sample_rate, noise_multiplier, steps, Neighbouring(neighbouring))


@functools.lru_cache(maxsize=4096, typed=True)
def _poisson_gaussian(
    sample_rate: float, noise_multiplier: float, steps: int, neighbouring: Neighbouring
) -> PrivacyEvent:
    """Cached (events are immutable; `typed`: 1 and 1.0 serialise differently): every
    member of a round declares one of a few equal events."""
    step = dpe.PoissonSampledDpEvent(sample_rate, dpe.GaussianDpEvent(noise_multiplier))
    return PrivacyEvent(_repeat(step, steps), neighbouring)


def fixed_size_gaussian(
    dataset_size: int, batch_size: int, dpsgd_noise_multiplier: float, *, steps: int = 1
) -> PrivacyEvent:
    """`steps` DP-SGD steps on batches of exactly `batch_size` drawn without replacement.

    `dpsgd_noise_multiplier` is DP-SGD's σ, as samplers receive it: noise of std σ·C on a
    sum of gradients clipped to norm C. `dp_accounting` reads the Gaussian under a
    `SampledWithoutReplacementDpEvent` relative to the replace-one sensitivity (for a
    full batch it is the plain Gaussian mechanism at that multiplier), and replacing one
    record moves the sum by up to 2C; so the event holds σ/2. Holding σ would understate
    ε (one full-batch step at σ = 2, δ = 1e-5: 2.17 instead of 4.73).

    Only sound under replace-one neighbouring (under add/remove the dataset size, and so
    the sampling, changes); a shuffled epoch is not this event either.
    """
    _check_noise(dpsgd_noise_multiplier)
    step = dpe.SampledWithoutReplacementDpEvent(
        dataset_size, batch_size, dpe.GaussianDpEvent(dpsgd_noise_multiplier / 2)
    )
    return PrivacyEvent(_repeat(step, steps), Neighbouring.REPLACE_ONE)


def node_gaussian(
    noise_multiplier: float,
    *,
    appearances: int,
    sample_rate: float | None = None,
    dataset_size: int | None = None,
    batch_size: int | None = None,
    steps: int = 1,
) -> PrivacyEvent:
    """`steps` DP-SGD steps over neighbourhoods of a contact graph pruned so that each
    person is in at most S = `appearances` rows (node-level DP, replace-one person).

    Give a Poisson `sample_rate` q, or a fixed `batch_size` b of `dataset_size` n rows.
    Replacing one person changes at most R = 2S − 1 rows (`replacement_rows`: their own,
    their old contacts', their replacement's contacts'), each clipped gradient by up to
    2C; the ρ of them that the batch holds move the noisy sum by up to 2ρC, where
    ρ ~ Binomial(R, q) (Poisson) or Hypergeometric(n, R, b). The Rényi divergence of the
    mixture is at most the mixture of the per-ρ Gaussians' (joint convexity; Daigavane
    et al. 2021, Thm 1, with R rows in place of their add/remove S):

        γ(α) = ln E_ρ[exp(α(α − 1)·2ρ²/σ²)] / (α − 1)   per step, composed over steps.

    `dpfl.privacy.accounting` reads it by RDP only; docs/privacy.md derives it.
    """
    fixed = dataset_size is not None or batch_size is not None
    if (sample_rate is not None) == fixed:
        raise PrivacyParameterError(
            "a node-level step is Poisson (sample_rate) or fixed-size (dataset_size and "
            "batch_size): give exactly one of the two"
        )
    step = NodeSampledGaussianDpEvent(
        noise_multiplier, appearances, sample_rate, dataset_size, batch_size
    )
    return PrivacyEvent(_repeat(step, steps), Neighbouring.REPLACE_ONE)


def approximate_dp(
    epsilon: float,
    delta: float,
    *,
    count: int = 1,
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
) -> PrivacyEvent:
    """`count` mechanisms each (ε, δ)-DP, composed by basic composition (A*STAR Alg. 3);
    `neighbouring`: the relation the (ε, δ) holds under (one record, or one patient)."""
    return PrivacyEvent(_repeat(ApproximateDpEvent(epsilon, delta), count), neighbouring)


def client_sampled(client_rate: float, round_event: PrivacyEvent) -> PrivacyEvent:
    """A round in which this silo takes part with probability `client_rate`.

    Given the silo's round mechanism M with Rényi curve R(α), the round is the mixture
    "⊥ with probability 1 - C, M(D) with probability C". The ⊥ branch has likelihood
    ratio 1, so D_α = log((1 - C) + C·exp((α - 1)·R(α))) / (α - 1) exactly, and for the
    hockey-stick divergence δ(ε) is multiplied by C while ε is not amplified.

    Kerkouche et al. (Thm 3.1) instead charge the first local step at rate C·q and the
    others at q. Charging C·q is Poisson subsampling, which assumes that a silo left out
    still releases a noisy step computed without the record; here it releases nothing,
    and the adversary (the server, in their threat model) sees who took part. For a
    one-step round (FedSGD) their charge is below the exact one above by convexity of
    x ↦ x^α, i.e. optimistic; for longer rounds it is looser, as no later step is
    amplified. `kerkouche_round` keeps their formula to compare with the paper only.
    """
    _check_probability("client_rate", client_rate)
    if client_rate == 1.0:
        return round_event
    return PrivacyEvent(
        ClientSampledDpEvent(client_rate, round_event.dp_event), round_event.neighbouring
    )


def kerkouche_round(
    *,
    client_rate: float,
    batch_size: int,
    min_silo_size: int,
    noise_multiplier: float,
    local_steps: int,
) -> PrivacyEvent:
    """One round of FL-SIGN-DP as charged by Kerkouche et al., Theorem 3.1.

    A heterogeneous sequence: the first local step at q1 = C·|B| / min_k |D_k|, the
    remaining `local_steps - 1` at q2 = |B| / min_k |D_k|. Kept to reproduce the paper's
    figures; see `client_sampled` for why dpfl's own client-sampling accounting differs.
    """
    if local_steps < 1:
        raise PrivacyParameterError(f"local_steps must be at least 1, got {local_steps}")
    if min_silo_size < 1 or batch_size < 1:
        raise PrivacyParameterError("batch_size and min_silo_size must be positive integers")
    q2 = batch_size / min_silo_size
    q1 = client_rate * q2
    first = poisson_gaussian(q1, noise_multiplier).dp_event
    rest = poisson_gaussian(q2, noise_multiplier, steps=local_steps - 1).dp_event
    return compose([PrivacyEvent(first), PrivacyEvent(rest)])


def tuned(run: PrivacyEvent, *, mean: float, shape: float) -> PrivacyEvent:
    """Private hyperparameter selection (Papernot & Steinke, ICLR 2022): a random number
    K of candidate runs, each at most `run`, of which only the best is released.

    K is drawn (by `dpfl.privacy.selection.repetitions`, never chosen) from a truncated
    negative binomial of this `shape` (0: logarithmic, 1: geometric) or, for
    `shape = inf`, a Poisson distribution, with mean `mean`; K itself and the other runs
    stay secret. Accounted by RDP (`dp_accounting`'s `RepeatAndSelectDpEvent`, their
    Theorems 2 and 6): the cost over one run is modest, far below K runs composed."""
    if not (math.isfinite(mean) and mean >= 1):
        raise PrivacyParameterError(f"the mean number of runs must be ≥ 1, got {mean!r}")
    if math.isnan(shape) or shape < 0:
        raise PrivacyParameterError(f"the shape must be ≥ 0 (inf: Poisson), got {shape!r}")
    return PrivacyEvent(dpe.RepeatAndSelectDpEvent(run.dp_event, mean, shape), run.neighbouring)


def compose(events: Sequence[PrivacyEvent]) -> PrivacyEvent:
    """Adaptive composition of events under one neighbouring relation."""
    if not events:
        return PrivacyEvent(dpe.NoOpDpEvent())
    relations = {e.neighbouring for e in events}
    if len(relations) > 1:
        raise PrivacyParameterError(
            "cannot compose events analysed under different neighbouring relations: "
            + ", ".join(sorted(r.description for r in relations))
        )
    inner = [e.dp_event for e in events if not isinstance(e.dp_event, dpe.NoOpDpEvent)]
    if not inner:
        return events[0]
    tree = inner[0] if len(inner) == 1 else dpe.ComposedDpEvent(inner)
    return PrivacyEvent(tree, events[0].neighbouring)


def repeat(event: PrivacyEvent, count: int) -> PrivacyEvent:
    """`count` adaptive repetitions of `event`."""
    return PrivacyEvent(_repeat(event.dp_event, count), event.neighbouring)


# ----------------------------------------------------------------------------------------
# Validation, description and (de)serialisation.


def _repeat(event: dpe.DpEvent, count: int) -> dpe.DpEvent:
    if isinstance(count, bool) or not isinstance(count, int):
        raise PrivacyParameterError(f"a step count must be an integer, got {count!r}")
    if count < 0:
        raise PrivacyParameterError(f"a step count cannot be negative, got {count}")
    if count == 0:
        return dpe.NoOpDpEvent()
    return event if count == 1 else dpe.SelfComposedDpEvent(event, count)


def _check_probability(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and 0.0 < value <= 1.0):
        raise PrivacyParameterError(f"{name} must lie in (0, 1], got {value!r}")


def _check_noise(value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise PrivacyParameterError(f"noise multiplier must be a finite number > 0, got {value!r}")


def _validate(event: dpe.DpEvent, neighbouring: Neighbouring, *, top_level: bool) -> None:
    if isinstance(event, dpe.NoOpDpEvent):
        return
    if isinstance(event, dpe.GaussianDpEvent | dpe.LaplaceDpEvent):
        _check_noise(event.noise_multiplier)
    elif isinstance(event, dpe.SelfComposedDpEvent):
        _repeat(event.event, event.count)
        _validate(event.event, neighbouring, top_level=top_level)
    elif isinstance(event, dpe.ComposedDpEvent):
        for inner in event.events:
            _validate(inner, neighbouring, top_level=top_level)
    elif isinstance(event, dpe.PoissonSampledDpEvent):
        _check_probability("sample rate q", event.sampling_probability)
        if not neighbouring.adds_or_removes:
            raise PrivacyParameterError(
                "Poisson sampling is accounted under add/remove neighbouring only"
            )
        _validate(event.event, neighbouring, top_level=False)
    elif isinstance(event, dpe.SampledWithoutReplacementDpEvent):
        if neighbouring is not Neighbouring.REPLACE_ONE:
            raise PrivacyParameterError(
                "fixed-size sampling without replacement is only accounted under "
                "replace-one neighbouring; use a Poisson sampler for add/remove"
            )
        n, b = event.source_dataset_size, event.sample_size
        if not (isinstance(n, int) and isinstance(b, int) and 0 < b <= n):
            raise PrivacyParameterError(
                f"fixed-size batches need 0 < batch_size <= dataset_size, got {b} of {n}"
            )
        _validate(event.event, neighbouring, top_level=False)
    elif isinstance(event, ApproximateDpEvent):
        if not top_level:
            raise PrivacyParameterError(
                "an (ε, δ) event can only be composed, not sampled or mixed"
            )
        if not (math.isfinite(event.epsilon) and event.epsilon >= 0):
            raise PrivacyParameterError(f"ε must be finite and ≥ 0, got {event.epsilon!r}")
        if not 0.0 <= event.delta < 1.0:
            raise PrivacyParameterError(f"δ must lie in [0, 1), got {event.delta!r}")
    elif isinstance(event, ClientSampledDpEvent):
        _check_probability("client sampling rate C", event.sampling_probability)
        _validate(event.event, neighbouring, top_level=False)
    elif isinstance(event, NodeSampledGaussianDpEvent):
        _validate_node_step(event, neighbouring)
    elif isinstance(event, dpe.RepeatAndSelectDpEvent):
        if not (math.isfinite(event.mean) and event.mean >= 1) or not event.shape >= 0:
            raise PrivacyParameterError(
                f"a tuned event needs mean ≥ 1 and shape ≥ 0, got {event.mean}, {event.shape}"
            )
        _validate(event.event, neighbouring, top_level=False)  # RDP: no (ε, δ) inside
    else:
        raise PrivacyParameterError(f"dpfl does not account for {type(event).__name__}")


def _validate_node_step(event: NodeSampledGaussianDpEvent, neighbouring: Neighbouring) -> None:
    if neighbouring is not Neighbouring.REPLACE_ONE:
        raise PrivacyParameterError(
            "node-level steps are accounted under replace-one neighbouring only: adding a "
            "person would change the graph's rows as well as their count"
        )
    _check_noise(event.noise_multiplier)
    count = event.appearances
    if isinstance(count, bool) or not (isinstance(count, int) and count >= 1):
        raise PrivacyParameterError(f"appearances must be an integer ≥ 1, got {count!r}")
    n, b = event.dataset_size, event.batch_size
    if event.sampling_probability is not None:
        _check_probability("sample rate q", event.sampling_probability)
        if n is not None or b is not None:
            raise PrivacyParameterError("a Poisson node-level step has no fixed batch size")
        return
    rows = replacement_rows(count)
    if not (isinstance(n, int) and isinstance(b, int) and 0 < b <= n and rows <= n):
        raise PrivacyParameterError(
            f"fixed-size node-level steps need 0 < batch_size <= dataset_size and the "
            f"2S − 1 rows a replacement changes <= dataset_size, got {b} of {n}, "
            f"appearances {count} ({rows} rows)"
        )


def _describe(event: dpe.DpEvent) -> str:
    if isinstance(event, dpe.NoOpDpEvent):
        return "nothing"
    if isinstance(event, dpe.GaussianDpEvent):
        return f"Gaussian(σ={event.noise_multiplier:g})"
    if isinstance(event, dpe.LaplaceDpEvent):
        return f"Laplace(b={event.noise_multiplier:g})"
    if isinstance(event, dpe.SelfComposedDpEvent):
        return f"{event.count} × {_describe(event.event)}"
    if isinstance(event, dpe.ComposedDpEvent):
        return "(" + " then ".join(_describe(e) for e in event.events) + ")"
    if isinstance(event, dpe.PoissonSampledDpEvent):
        return f"Poisson(q={event.sampling_probability:g}) {_describe(event.event)}"
    if isinstance(event, dpe.SampledWithoutReplacementDpEvent):
        return (
            f"fixed-size({event.sample_size} of {event.source_dataset_size}) "
            f"{_describe(event.event)}"
        )
    if isinstance(event, ApproximateDpEvent):
        return f"(ε={event.epsilon:g}, δ={event.delta:g})-DP"
    if isinstance(event, ClientSampledDpEvent):
        return f"client-sampled(C={event.sampling_probability:g}) {_describe(event.event)}"
    if isinstance(event, NodeSampledGaussianDpEvent):
        if event.sampling_probability is not None:
            batch = f"Poisson(q={event.sampling_probability:g})"
        else:
            batch = f"fixed-size({event.batch_size} of {event.dataset_size})"
        sigma = f"Gaussian(σ={event.noise_multiplier:g})"
        rows = f"≤{event.appearances} rows a person, {event.changed_rows} per replacement"
        return f"node-level({rows}) {batch} {sigma}"
    if isinstance(event, dpe.RepeatAndSelectDpEvent):
        law = "Poisson" if math.isinf(event.shape) else f"TNB(shape={event.shape:g})"
        return f"best of {law} runs (mean {event.mean:g}) of {_describe(event.event)}"
    return type(event).__name__


def _to_jsonable(event: dpe.DpEvent) -> dict[str, Any]:
    if type(event).__name__ not in _EVENT_TYPES:
        raise PrivacyParameterError(f"cannot serialise {type(event).__name__}")
    out: dict[str, Any] = {"type": type(event).__name__}
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        if isinstance(value, dpe.DpEvent):
            value = _to_jsonable(value)
        elif isinstance(value, list):
            value = [_to_jsonable(v) for v in value]
        out[field.name] = value
    return out


def _from_jsonable(data: dict[str, Any]) -> dpe.DpEvent:
    kind = _EVENT_TYPES.get(data.get("type", ""))
    if kind is None:
        raise PrivacyParameterError(f"unknown event type {data.get('type')!r}")
    kwargs: dict[str, Any] = {}
    for field in attr.fields(kind):
        value = data[field.name]
        if isinstance(value, dict):
            value = _from_jsonable(value)
        elif isinstance(value, list):
            value = [_from_jsonable(v) for v in value]
        kwargs[field.name] = value
    return kind(**kwargs)
