"""The hospital half of a Flower deployment: the ClientApp at each hospital, beside its
records and its own ledger (`client_app`). It runs the algorithm's hospital half
(`client_update`); nothing here is algorithm logic.

A hospital's node config (never the server) gives its records (its own table file, read
through the study's schema, or a folder holding train.npz), public size,
(ε, δ) and ledger. It registers its own account, checks its whole remaining plan before
round 0 and every event before it trains, and refuses, saying why, when its budget
would be passed, whatever the server asks; its own sampling code's events are charged
to its own ledger before the reply leaves. Its local state (momentum, personal models)
stays in a file beside its ledger between rounds. Noise is the CSPRNG's unless the
node config sets `research-noise` (tests only: the simulator's seeded streams, so a
deployment repeats a simulation exactly).

It answers "query.hello" (its public facts), "query.plan" (it checks its plan), "train"
(one exchange: it replies as its study's `summing` says, `flower.sums`) and "evaluate"
(its metrics of the final model on its own test set, a release as the study's
`[evaluation]` says: DP counts charged to its ledger, or declared clear figures outside
ε; only the final model of a run it trained in, a bounded number of times);
in a masked study the session's messages (`flower.masking`), and the key holder of an
encrypted one "query.he_decrypt" (`flower.he`). Asked again for an exchange it answered,
it re-sends the same reply (uncharged; a masked one is retrained and paid for).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from dpfl.analytics import release
from dpfl.engines.accounts import (
    Calibration,
    account,
    public_sizes,
    register_accounts,
    register_views,
    unaffordable,
)
from dpfl.engines.evaluation import evaluate, predictions
from dpfl.engines.flower import approval
from dpfl.engines.flower.protocol import (
    INSTANCE,
    LOG,
    MOST_CLASSES,
    PROTOCOL,
    SURVIVAL,
    UNHELD,
    Deployment,
    DeploymentError,
    DeploymentOf,
    exchange_number,
    fields_of,
    held,
    keep,
    model_digest,
    record,
    silos_of,
    union_counts,
)
from dpfl.engines.flower.roster import PREFIX, RosterError, public_text, read_identity
from dpfl.engines.flower.sums import Protection, Work, deployed, every_deployed
from dpfl.engines.streams import Streams, count_noise, evaluation_noise, member_rng, stream_noise
from dpfl.errors import InternalError
from dpfl.federation.algorithms.base import (
    Algorithm,
    HospitalContext,
    Instruction,
    finite,
    unflat,
)
from dpfl.federation.messages import Encoding, decode
from dpfl.federation.silo import Silo, SiloInfo
from dpfl.files import replacing
from dpfl.local.clipping import Params
from dpfl.local.dpsgd import parameters_of
from dpfl.local.mechanisms import forget_streams
from dpfl.local.threads import torch_threads
from dpfl.privacy import Accountant, Ledger, events
from dpfl.privacy.accounts import EVALUATION_LABEL
from dpfl.privacy.errors import BudgetExceededError, PrivacyError
from dpfl.privacy.governance import Approval


@dataclass(frozen=True)
class HospitalConfig:
    """A hospital's own settings, from its SuperNode's `--node-config`."""

    name: str
    study: Path
    data: Path
    public_size: int | None
    """The record count it declares; None in a study that releases DP counts."""
    epsilon: float
    delta: float
    ledger: Path
    identity: Path
    """Its identity key file (`dpfl deploy identity`): the key the study's roster lists
    for it, which signs its keys in every masking session."""
    research_noise: bool = False
    he_keys: Path | None = None
    """Its HE key file (encrypted studies; the key holder's holds the secret key)."""
    dataset_budget: float | None = None
    """Its data steward's cap on its records across every study (ε at its δ): its ledger
    then holds each study's accounts under the study's key, all held to the cap."""
    union: bool = True
    """Whether its evaluation reply carries its counts for the union of the test sets
    (`union_counts`: outside ε, and close to its test scores record by record); False
    sends its own metrics only, and the server then reports no union."""

    KEYS = ("name", "study", "data", "epsilon", "delta", "ledger", "identity")

    @classmethod
    def from_node_config(cls, node: Mapping[str, Any]) -> HospitalConfig:
        missing = [key for key in cls.KEYS if key not in node]
        if missing:
            raise ValueError(f"the hospital's node config lacks {', '.join(missing)}")
        size = int(node["public-size"]) if node.get("public-size") is not None else None
        eps, delta = float(node["epsilon"]), float(node["delta"])
        if (size is not None and size < 1) or not eps > 0 or not 0 < delta < 1:
            raise ValueError("public-size must be ≥ 1, epsilon > 0 and 0 < delta < 1")
        if not isinstance(node.get("union", True), bool):  # "false" must not mean true
            raise ValueError(f"union must be true or false, got {node['union']!r}")
        return cls(
            str(node["name"]),
            Path(str(node["study"])),
            Path(str(node["data"])),
            size,
            eps,
            delta,
            Path(str(node["ledger"])),
            Path(str(node["identity"])),
            bool(node.get("research-noise", False)),
            Path(str(node["he-keys"])) if node.get("he-keys") else None,
            float(node["dataset-budget"]) if node.get("dataset-budget") else None,
            node.get("union", True),
        )

    def deployment(self, deployment_of: DeploymentOf) -> Deployment:
        """Its study's deployment, whose roster must list this hospital with its key, and
        whose public sizes are declared (the study's for this hospital where it declares
        one, which a public-size given must equal; else this hospital's public-size) or
        DP counts."""
        run = deployment_of(self.study)
        declared = run.sizes.get(self.name)
        if declared is not None and self.public_size not in (None, declared):
            raise ValueError(
                f"study {run.key} declares {self.name}'s public size, {declared} "
                f"([data.sites]): give no public-size, or that one, not {self.public_size}"
            )
        if run.size_noise is None and self.public_size is None and declared is None:
            raise ValueError(
                f"study {run.key} has declared public sizes (data.public_sizes = "
                "'declared'): give this hospital's public-size"
            )
        if run.size_noise is not None and self.public_size is not None:
            raise ValueError(
                f"study {run.key} releases a DP count of each hospital's records "
                "(data.public_sizes = 'dp-count'): give no public-size"
            )
        pinned = run.roster.identities.get(self.name)
        mine = read_identity(self.identity).public_key().public_bytes_raw()
        if pinned != mine:
            raise RosterError(
                f"the study's roster does not list {self.name} with the identity key in "
                f"{self.identity}"
                + ("" if pinned is None else f" (it lists {PREFIX}{pinned.hex()})")
            )
        return run

    def approval(self, run: Deployment, name: str | None = None) -> Approval:
        """The approval its officer must have given to run `run` at its budget and cap."""
        return approval.wanted(
            run, epsilon=self.epsilon, delta=self.delta, dataset_cap=self.dataset_budget, name=name
        )

    def silo(self, run: Deployment) -> Silo:
        """The hospital's records, with its public size (the study's declared one, else
        its own; None where it releases a DP count): its own file read through the study's
        schema and split as the simulator splits its silo (`Deployment.read`), or a folder
        holding `train.npz` (x, y) and, optionally, `test.npz`."""
        size = run.sizes.get(self.name, self.public_size)
        if not self.data.is_dir():
            if run.read is None:
                raise ValueError(
                    f"{self.data}: study {run.key} declares no table to read a hospital's "
                    "file by: give a folder holding train.npz"
                )
            return dataclasses.replace(run.read(self.name, self.data), public_size=size)
        tested: dict[str, np.ndarray] = {}
        if (self.data / "test.npz").exists():
            with np.load(self.data / "test.npz") as arrays:
                tested = {"x_test": arrays["x"], "y_test": arrays["y"]}
        with np.load(self.data / "train.npz") as arrays:
            return Silo.from_arrays(self.name, arrays["x"], arrays["y"], **tested, public_size=size)


@dataclass
class Hospital:
    """One hospital's half for one message: its config, study, records and ledger."""

    me: HospitalConfig
    run: Deployment
    silo: Silo
    instance: str
    """The server's run instance: the same across a restart from its checkpoint (a new
    Flower run), so local state and cached replies carry over."""
    state: RecordDict
    """The node's context state: kept by the SuperNode between this run's messages."""
    counted: dict[str, str] = dataclasses.field(default_factory=dict)
    """The receipt of its DP record count, where this message released it (sent with its
    reply as `count-receipt`)."""

    @classmethod
    def of(
        cls, context: Context, deployment_of: DeploymentOf, fields: Mapping[str, Any]
    ) -> Hospital:
        me = HospitalConfig.from_node_config(context.node_config)
        instance = str(fields.get("instance", ""))
        if not INSTANCE.fullmatch(instance) and "study" in fields:
            raise DeploymentError(f"a malformed run instance {instance!r}")
        run = me.deployment(deployment_of)
        approval.check(me.ledger, me.approval(run), me.identity)
        me = dataclasses.replace(me, public_size=run.sizes.get(me.name, me.public_size))
        silo, counted = me.silo(run), dict[str, str]()
        if run.size_noise is not None:
            silo, counted = _counted(me, run, silo)
        return cls(me, run, silo, instance, context.state, counted)

    @property
    def account(self) -> str:
        return account(self.me.name, 0)

    @property
    def model_input(self) -> tuple[list[int], int]:
        """The feature shape and classes this hospital announces: its records' (read
        through the study's schema, where it declares one) and, for classes, the study's
        where its labels lie in them."""
        declared = SURVIVAL if self.run.schema is None else self.run.schema[1]
        own = int(self.silo.y.max()) + 1
        classes = SURVIVAL if self.silo.survival else max(own, declared)
        return list(self.silo.x.shape[1:]), classes

    def checked_input(self, fields: Mapping[str, Any]) -> tuple[list[int], int]:
        """The shape and classes the server states, refused (DeploymentError) before
        anything is built at them unless they are this hospital's (`model_input`), its
        classes the study's where it declares them, else at least its own and at most
        `MOST_CLASSES` (other hospitals may hold classes it lacks): a server's shape
        [10**9] or a billion classes allocate nothing."""
        shape, classes = fields["shape"], fields["classes"]
        mine, announced = self.model_input
        fixed = self.run.schema is not None or announced == SURVIVAL
        if not (isinstance(shape, list) and shape == mine and isinstance(classes, int)) or not (
            classes == announced if fixed else announced <= classes <= MOST_CLASSES
        ):
            bound = "" if fixed else f" (or up to {MOST_CLASSES} classes, others' labels)"
            raise DeploymentError(
                f"the server states records of shape {shape!r} and {classes!r} classes; "
                f"{self.me.name}'s are {mine} and {announced}{bound}"
            )
        return shape, classes

    def hello(self) -> dict[str, Any]:
        shape, classes = self.model_input
        return {
            "protocol": PROTOCOL,
            "study": self.run.key,
            "name": self.me.name,
            "public-size": self.silo.declared_size,
            "shape": shape,
            "classes": classes,
            "identity": public_text(read_identity(self.me.identity)),
            **self.protection.announced(self),
        }

    @property
    def protection(self) -> Protection:
        """How this hospital's replies leave it, as its study says."""
        return deployed(self.run.summing).protection

    def algorithm(self, fields: Mapping[str, Any]) -> tuple[Algorithm, list[SiloInfo]]:
        """The study's algorithm over the run's silos (`built`), at the σ the server
        states where the study calibrates it: this hospital's plan check, not the server's
        word, keeps its budget at that σ."""
        algorithm, silos = self.built(fields)
        if self.run.calibration is None:
            return algorithm, silos
        noise = [float(v) for v in fields.get("noise", [])]
        if len(noise) != len(silos) or not all(0 < v < math.inf for v in noise):
            raise DeploymentError(f"the server states no finite σ > 0 for each silo: {noise}")
        if self.run.calibration == "per-silo":
            by_silo = {s.name: v for s, v in zip(silos, noise, strict=True)}
            return algorithm.with_silo_noise(by_silo), silos
        if len(set(noise)) != 1:
            raise DeploymentError(f"a common calibration has one σ, the server states {noise}")
        return algorithm.with_noise(noise[0]), silos

    def built(self, fields: Mapping[str, Any]) -> tuple[Algorithm, list[SiloInfo]]:
        """The study's algorithm over the run's silos, after checking that they are the
        roster's hospitals and that the server declares this hospital as it declares
        itself."""
        if fields.get("study") != self.run.key:
            raise DeploymentError("the server runs another study than this hospital's")
        silos = silos_of(fields)
        try:
            self.run.roster.check_all([s.name for s in silos], "the server's list of silos")
        except RosterError as exc:
            raise DeploymentError(str(exc)) from None
        mine = [s for s in silos if s.name == self.me.name]
        if mine != [SiloInfo(self.me.name, self.silo.declared_size)]:
            raise DeploymentError(
                f"the server declares {self.me.name} as {mine}, not with public size "
                f"{self.silo.declared_size}"
            )
        odd = [
            s for s in silos if not 1 <= s.public_size == self.run.sizes.get(s.name, s.public_size)
        ]
        if odd:
            raise DeploymentError(
                f"the server declares public sizes below 1 or not the study's: {odd}"
            )
        return self.run.build(silos, *self.checked_input(fields)), silos

    def ledger(self) -> Ledger:
        """The hospital's ledger with its own account, as it declared its records (a
        budget other than the one registered before is refused)."""
        book = _ledger(self.me, self.run, self.silo)
        budgets = {self.me.name: (self.me.epsilon, self.me.delta)}
        try:
            book.name_study(self.run.key, self.run.name)
            register_accounts(book, [_declared(self.me, self.silo)], 1, budgets)
        except BaseException:
            book.close()
            raise
        return book

    def open(self, algorithm: Algorithm, silos: Sequence[SiloInfo]) -> Ledger:
        """The hospital's ledger with its accounts (its budget binds the server's view;
        other views are recorded, never binding)."""
        book = self.ledger()
        budgets = {self.me.name: (self.me.epsilon, self.me.delta)}
        declared = {self.me.name: self.me.public_size}
        try:
            register_views(book, algorithm, silos, 1, budgets, declared, [self.silo.info])
        except BaseException:
            book.close()
            raise
        return book

    def least_noise(self, fields: Mapping[str, Any]) -> float:
        """The least σ this hospital's budget allows for the study's whole plan (every
        round, its DP count where it releases one, and its DP evaluations), by the study's
        accountant: a function of public facts and its budget, which it publishes
        (`_calibrate`)."""
        algorithm, silos = self.built(fields)
        (me,) = [s for s in silos if s.name == self.me.name]
        count = [] if self.run.size_noise is None else [events.gaussian(self.run.size_noise)]
        evaluations = self.run.evaluation.plan(self.silo.info, self.run.evaluation.queries)
        return Calibration(
            algorithm,
            silos,
            {me.name: self.run.rounds},
            {me.name: (self.me.epsilon, self.me.delta)},
            Accountant(self.run.accountant),
            {me.name: count + evaluations},
        ).least(me)

    def refused(self, round_: int | None, why: str) -> dict[str, Any]:
        """A refusal, logged at this hospital and kept in its ledger (its statement lists
        every one)."""
        LOG.warning("%s: round %s: refused: %s", self.me.name, round_, why)
        with _ledger(self.me, self.run, self.silo) as book:
            book.refuse(self.account, why, round=round_)
        return {"refused": why}

    def receipt(self, book: Ledger, after: int) -> dict[str, str]:
        """The signed receipt of what this release charged after chain entry `after`, for
        the server to keep (`dpfl privacy verify --receipts`)."""
        made = book.receipt(read_identity(self.me.identity), hospital=self.me.name, after=after)
        return {"receipt": made.to_json()}

    def refusal(
        self,
        book: Ledger,
        algorithm: Algorithm,
        silos: Sequence[SiloInfo],
        round_: int,
        exchange: int = 0,
    ) -> str | None:
        """Why the rest of the plan from `round_` would pass this hospital's budget (for an
        algorithm that stops at its budget: the next round), with the DP evaluations it
        has still to answer, or None if it fits. A round or an exchange outside the
        study's is refused: the plan this hospital agreed to is the study's. A round
        already paid for, whose reply is kept to be sent again, is not paid twice."""
        if not 0 <= round_ < self.run.rounds:
            return f"round {round_} is not one of the study's {self.run.rounds} rounds"
        exchanges = algorithm.exchanges(silos)
        if not 0 <= exchange < exchanges:
            return f"exchange {exchange} is not one of {algorithm.name}'s {exchanges} a round"
        event = algorithm.participation_event(self.silo.info, silos)
        saved = self._load()
        paid = "reply" in saved and saved["at"][0] == round_
        left = 1 if algorithm.stops_at_budget else self.run.rounds - round_
        evaluation = self.run.evaluation  # the evaluations it has still to answer
        later = evaluation.plan(self.silo.info, evaluation.queries - self.evaluations(book))
        if paid and left == 1:
            return unaffordable(book, self.account, event, 0, later) if later else None
        return unaffordable(book, self.account, event, left - paid, later)

    @property
    def _state_file(self) -> Path:
        ledger = self.me.ledger
        return ledger.with_name(f"{ledger.stem}.{self.me.name}.run-{self.instance}.state.pt")

    def train(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """Train for one exchange: refuse what its budget cannot afford, charge its ledger,
        then reply (masked, if the study masks replies). Asked again for an exchange it
        answered (a retry, or a server resumed from its checkpoint), it sends the same
        reply again, which releases nothing new; a masked reply is never re-sent (in a new
        session beside other inputs it could be told apart), so it trains again from its
        state before that exchange, and pays again."""
        algorithm, silos = self.algorithm(fields)
        round_, exchange = int(fields["round"]), int(fields["exchange"])
        saved = self._load()
        again = saved.get("at") == [round_, exchange]
        if again and "reply" in saved:
            LOG.info(
                "%s: round %d exchange %d asked again: the same reply, nothing charged",
                self.me.name,
                round_,
                exchange,
            )
            return dict(saved["reply"])
        with self.open(algorithm, silos) as book:
            after = head_seq(book)
            why = self.refusal(book, algorithm, silos, round_, exchange)
            try:
                self.run.roster.check([str(n) for n in fields["cohort"]], "the cohort")
            except RosterError as exc:
                why = why or str(exc)
            like = parameters_of(algorithm.model)
            try:
                params = _received(fields, like)
            except DeploymentError as exc:
                why = why or str(exc)
            if why is None:
                why = self.protection.refusal(self, fields)
            if why is not None:
                return self.refused(round_, why)
            names = {s.name: s for s in silos}
            cohort = tuple(names[str(n)] for n in fields["cohort"])
            before = (  # trained again from before a released exchange: a new noise stream
                forget_streams(saved["before"])
                if again
                else saved.get("local", algorithm.initial_local_state(like))
            )
            calls = saved.get("calls", {}) if saved.get("at", [None])[0] == round_ else {}
            me = (0, [s.name for s in silos].index(self.me.name))  # (trial, silo index)
            seed, research = self.run.seed, self.me.research_noise
            rng = Streams(seed, round_, partial(member_rng, research), {me: calls.get("rng", 0)})
            noise = Streams(
                seed, round_, partial(stream_noise, research), {me: calls.get("noise", 0)}
            )
            label = f"{algorithm.name} deployment of {self.run.key} instance {self.instance}"
            charged: list[str] = []

            def charge(charges: Sequence[tuple[Any, str | None, events.PrivacyEvent]]) -> None:
                charged.extend(event.describe() for _, view, event in charges if view is None)
                book.record_many(
                    [(account(self.me.name, 0, view), event) for _, view, event in charges],
                    label=label,
                    round=round_,
                )

            ctx = HospitalContext(round_, partial(rng, *me), partial(noise, *me), charge)
            try:
                with torch_threads(1):  # as the simulator trains: the same float sums
                    reply, local = algorithm.client_update(  # `before` kept as it is
                        Instruction(params, cohort), self.silo, dict(before), ctx
                    )
            except BudgetExceededError as exc:
                return self.refused(round_, f"{self.account}: {exc}")
            spent = book.spent(self.account)
            out: dict[str, Any] = {"epsilon": spent.epsilon}
            if head_seq(book) > after:
                out.update(self.receipt(book, after))
        LOG.info(
            "%s: round %d exchange %d: charged %s; ε %.4g of %g at δ=%g (%s)",
            self.me.name,
            round_,
            exchange,
            "; ".join(charged) or "nothing",
            spent.epsilon,
            self.me.epsilon,
            self.me.delta,
            spent.accountant.value.upper(),
        )
        if reply is not None and not bool(torch.isfinite(reply.vector).all()):
            # post-processing of what was charged (a non-finite per-example gradient is
            # zeroed before the noise, `clipping`), so refusing it after the charge is safe
            return self.refused(round_, "its reply holds NaN or infinity: charged, not sent")
        if reply is not None:
            at = exchange_number(round_, exchange, algorithm.exchanges(silos))
            out.update(self.protection.protected(self, fields, reply, at))
        calls = {"rng": rng.calls(*me), "noise": noise.calls(*me)}
        kept = {"local": local, "before": before, "at": [round_, exchange], "calls": calls}
        self._save({**kept, **({"reply": out} if self.protection.resent else {})})
        return out

    def evaluate(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """The release of its metrics of the final model it uses (its personal one if it
        keeps one) on its own test set, as the study's `[evaluation]` says (`Evaluation`):
        DP counts charged to its ledger before they leave, or clear figures outside ε.
        It scores only the final model of a run it trained in, one model a run (the
        first it is sent, kept by digest: asked again, it re-sends the same reply and
        releases nothing new), and at most the study's `queries` over its runs; it
        refuses, in one line, anything else, and a DP release its budget cannot afford,
        nothing charged. {"metrics": False} without a test set."""
        silo, plan = self.silo, self.run.evaluation
        if silo.x_test is None or silo.y_test is None:
            return {"metrics": False}
        algorithm, silos = self.algorithm(fields)
        sent = _received(fields, parameters_of(algorithm.model))
        if sent is None:
            raise DeploymentError("an evaluation needs the model")
        saved, digest = self._load(), model_digest(bytes(fields["params"]))
        kept = saved.get("evaluated")
        if kept is not None and kept["digest"] == digest:
            LOG.info("%s: the final model's evaluation asked again: the same reply", self.me.name)
            return dict(kept["reply"])
        with self.open(algorithm, silos) as book:
            answered = self.evaluations(book)
            why = self.unvouched(saved, kept, answered)
            if why is None and plan.release == "dp":
                why = book.refusal([(self.account, plan.event(silo.info))])
            if why is not None:
                book.refuse(self.account, f"evaluation: {why}")
                LOG.warning("%s: evaluation refused: %s", self.me.name, why)
                return {"refused": why}
            local = saved.get("local", {})
            with torch_threads(1):  # as the simulator trains: the same float sums
                model = algorithm.model_of({"global": sent}, local)
                scores = predictions(algorithm.model, model, silo.x_test, silo.survival)
                if plan.release == "clear":
                    out = self.clear(algorithm, model, scores, int(fields["round"]))
                else:
                    after = head_seq(book)
                    out = self.noisy(book, algorithm, silos, scores)
                    out.update(self.receipt(book, after))
            book.noted(self._evaluation_key(answered), note=True)
        self._save({**saved, "evaluated": {"digest": digest, "reply": out}})
        return out

    def evaluations(self, book: Ledger) -> int:
        """How many of the study's evaluations this hospital answered, over its runs."""
        queries = self.run.evaluation.queries
        return next((k for k in range(queries) if not book.noted(self._evaluation_key(k))), queries)

    def _evaluation_key(self, k: int) -> str:
        return f"evaluation {k} of study {self.run.key} by {self.me.name}"

    def unvouched(
        self, saved: Mapping[str, Any], kept: Mapping[str, Any] | None, answered: int
    ) -> str | None:
        """Why the model sent is not one this hospital scores (None: it is): it trained
        in no round of the run, or scored another model as the run's final one, or
        answered the study's every evaluation."""
        if "at" not in saved:
            return (
                f"it trained in no round of run {self.instance}: it scores only the final "
                "model of a run it trained in"
            )
        if kept is not None:
            return (
                f"it scored run {self.instance}'s final model already (model {kept['digest']}): "
                "it scores no other model"
            )
        queries = self.run.evaluation.queries
        if answered >= queries:
            return (
                f"it answered the study's {queries} evaluations ([evaluation] queries = {queries})"
            )
        return None

    def clear(
        self, algorithm: Algorithm, model: Params, scores: np.ndarray, round_: int
    ) -> dict[str, Any]:
        """Its exact metrics, and its counts for the union (`union_counts`) unless
        deployed with `--no-union`: outside ε, as the study explicitly says."""
        silo = self.silo
        assert silo.y_test is not None
        (row,) = evaluate(algorithm.model, [[model]], [silo], round_, algorithm.loss)
        metrics: dict[str, float] = row["silos"][self.me.name]
        out = {"metrics": True, "names": list(metrics), "values": list(metrics.values())}
        if self.me.union:  # its part of the union, counted (`union_counts`)
            labels = silo.y_test.numpy()
            out |= {"records": len(scores), **union_counts(labels, scores, algorithm.loss)}
        LOG.warning(
            "%s: released its metrics of the final model on its %d test records in the "
            "clear%s: OUTSIDE ε (the study's [evaluation] release = 'clear')",
            self.me.name,
            len(scores),
            " and its counts for the union" if self.me.union else " (no union: --no-union)",
        )
        return out

    def noisy(
        self, book: Ledger, algorithm: Algorithm, silos: Sequence[SiloInfo], scores: np.ndarray
    ) -> dict[str, Any]:
        """Its test records counted (`Evaluation.histogram`), released with Gaussian noise
        charged to its account first (`dpfl.analytics.release`): the server reads its
        metrics, and the union's unless deployed with `--no-union`, off them."""
        plan, silo = self.run.evaluation, self.silo
        assert silo.y_test is not None
        exact = plan.histogram(silo.y_test.numpy(), scores).astype(np.float64)
        k = [s.name for s in silos].index(self.me.name)
        noisy = release(
            exact,
            plan.sensitivity(silo.info, len(exact)),
            plan.noise_multiplier,
            ledger=book,
            accounts=[self.account],
            label=f"{EVALUATION_LABEL}{algorithm.name} deployment of "
            f"{self.run.key} instance {self.instance}",
            rng=evaluation_noise(self.me.research_noise, self.run.seed, k),
            neighbouring=silo.neighbouring,
        )
        spent = book.spent(self.account)
        LOG.info(
            "%s: released its test records' counts of the final model with noise, charged "
            "%s; ε %.4g of %g at δ=%g (%s)%s",
            self.me.name,
            plan.event(silo.info).describe(),
            spent.epsilon,
            self.me.epsilon,
            self.me.delta,
            spent.accountant.value.upper(),
            "" if self.me.union else " (no union: --no-union)",
        )
        return {
            "metrics": True,
            "noisy": noisy.tolist(),
            "union": self.me.union,
            "epsilon": spent.epsilon,
        }

    def _load(self) -> dict[str, Any]:
        if not self._state_file.exists():
            return {}
        saved: dict[str, Any] = torch.load(self._state_file, weights_only=True)
        return saved

    def _save(self, saved: Mapping[str, Any]) -> None:
        """Atomically: a crash leaves the previous round's local state."""
        with replacing(self._state_file) as partial:
            torch.save(dict(saved), partial)


def _received(fields: Mapping[str, Any], like: Params) -> Params | None:
    """The model the server sent (None: none was), refused (DeploymentError) unless it
    has the model's length and is finite (`finite`): checked wherever a hospital decodes
    it, to train or to evaluate, before anything is computed from it."""
    sent = bytes(fields["params"])
    if not sent:
        return None
    n = sum(v.numel() for v in like.values())
    try:
        params = unflat(decode(Encoding.FLOAT32, sent, n), like)
        finite(params, "the server's model")
    except ValueError as exc:
        raise DeploymentError(str(exc)) from None
    return params


def _handler(
    work: Callable[[Hospital, Mapping[str, Any]], dict[str, Any]], deployment_of: DeploymentOf
) -> Callable[[Message, Context], Message]:
    def handle(message: Message, context: Context) -> Message:
        sent = fields_of(message)
        if sent.get("protocol") != PROTOCOL:
            raise DeploymentError(
                f"protocol {sent.get('protocol')!r}, this hospital speaks {PROTOCOL}"
            )
        fields = held(sent, context.state)
        if fields is None:  # nothing done: the server sends the facts again
            return Message(record({UNHELD: True}), reply_to=message)
        try:
            hospital = Hospital.of(context, deployment_of, fields)
        except BudgetExceededError as exc:  # its record count, which it cannot afford
            name = str(context.node_config.get("name"))
            why = f"{name}: its record count cannot be released: {exc}"
            LOG.warning("%s", why)
            return Message(record({"name": name, "refused": why}), reply_to=message)
        except approval.NotApprovedError as exc:  # kept in its ledger, if it has one
            me = HospitalConfig.from_node_config(context.node_config)
            why = f"{me.name}: {exc}"
            LOG.warning("%s", why)
            if me.ledger.is_file() and me.ledger.stat().st_size:
                with Ledger(me.ledger) as book:
                    book.refuse(account(me.name, 0), str(exc))
            return Message(record({"name": me.name, "refused": why}), reply_to=message)
        answer = work(hospital, fields) | hospital.counted
        keep(fields, context.state)
        return Message(record(answer), reply_to=message)

    return handle


def _hello(hospital: Hospital, fields: Mapping[str, Any]) -> dict[str, Any]:
    return hospital.hello()


def _plan(hospital: Hospital, fields: Mapping[str, Any]) -> dict[str, Any]:
    algorithm, silos = hospital.algorithm(fields)
    round_ = int(fields["round"])
    with hospital.open(algorithm, silos) as book:
        why = hospital.refusal(book, algorithm, silos, round_)
    if why is not None:
        return {"accepted": False, **hospital.refused(round_, why)}
    event = algorithm.participation_event(hospital.silo.info, silos)
    LOG.info(
        "%s: accepts rounds %d to %d of %s; evaluation: %s",
        hospital.me.name,
        round_,
        hospital.run.rounds - 1,
        event.describe(),
        hospital.run.evaluation.describe(),
    )
    return {"accepted": True}


def _calibrate(hospital: Hospital, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The least σ this hospital's budget allows, published; or why none does."""
    try:
        sigma = hospital.least_noise(fields)
    except (ValueError, PrivacyError) as exc:
        return {"refused": f"{hospital.account}: no σ fits its budget: {exc}"}
    LOG.info(
        "%s: publishes the least σ its budget allows for the study's %d rounds: %.6g",
        hospital.me.name,
        hospital.run.rounds,
        sigma,
    )
    return {"noise": sigma}


def _train(hospital: Hospital, fields: Mapping[str, Any]) -> dict[str, Any]:
    return hospital.train(fields)


def _evaluate(hospital: Hospital, fields: Mapping[str, Any]) -> dict[str, Any]:
    return hospital.evaluate(fields)


def client_app(deployment_of: DeploymentOf, queries: Mapping[str, Work]) -> ClientApp:
    """The hospital half: answers hello, calibrate, plan, train and evaluate messages, a
    secure study's own (`flower.sums`) and `queries` (the statistics',
    `flower.analytics`), for the study file its node config names, read by
    `deployment_of`."""
    app = ClientApp()
    app.query("hello")(_handler(_hello, deployment_of))
    app.query("plan")(_handler(_plan, deployment_of))
    app.query("calibrate")(_handler(_calibrate, deployment_of))
    app.train()(_handler(_train, deployment_of))
    app.evaluate()(_handler(_evaluate, deployment_of))
    for halves in every_deployed():  # the secure sums' sessions
        for kind, work in halves.queries.items():
            app.query(kind)(_handler(work, deployment_of))
    for kind, work in queries.items():
        app.query(kind)(_handler(work, deployment_of))
    return app


def head_seq(book: Ledger) -> int:
    """The number of the ledger's last chain entry: a release's receipt holds the
    entries after it."""
    head = book.head()
    return 0 if head is None else head.seq


def _ledger(me: HospitalConfig, run: Deployment, silo: Silo) -> Ledger:
    """The hospital's ledger; with a dataset budget, the study's book in it (accounts under
    the study's key) and its records' cap, which every study's accounts spend from, under
    the study's relation for `silo` (a patient-level study's: add/remove one patient)."""
    if me.dataset_budget is None:
        return Ledger(me.ledger, accountant=run.accountant)
    book = Ledger(me.ledger, accountant=run.accountant, study=run.key)
    try:
        book.cap_dataset(
            me.name, epsilon=me.dataset_budget, delta=me.delta, neighbouring=silo.neighbouring
        )
    except BaseException:
        book.close()
        raise
    return book


def _declared(me: HospitalConfig, silo: Silo) -> Silo:
    """The records with the public size the hospital declared (None: a DP count's), as its
    account is registered."""
    return dataclasses.replace(silo, public_size=me.public_size)


def _counted(me: HospitalConfig, run: Deployment, silo: Silo) -> tuple[Silo, dict[str, str]]:
    """The records with their public size, a DP count released as the simulator releases
    it: charged to this hospital's account, then drawn, once; kept in its ledger and
    re-used by every later message and run over that ledger. With the receipt of the
    charge where this call made it."""
    if run.size_noise is None:
        raise InternalError(f"{me.name}'s size is counted, but the study sets no size noise")
    k = sorted(run.roster.identities).index(me.name)  # its index among the run's silos
    with _ledger(me, run, silo) as book:
        register_accounts(book, [silo], 1, {me.name: (me.epsilon, me.delta)})
        new, after = book.released(f"record count of {me.name}") is None, head_seq(book)
        (counted,), _ = public_sizes(
            book, [silo], 1, run.size_noise, lambda _: count_noise(me.research_noise, run.seed, k)
        )
        if new:
            LOG.info(
                "%s: released its record count, %d (%s), charged to %s",
                me.name,
                counted.declared_size,
                events.gaussian(run.size_noise).describe(),
                account(me.name, 0),
            )
            made = book.receipt(read_identity(me.identity), hospital=me.name, after=after)
            return counted, {"count-receipt": made.to_json()}
    return counted, {}
