"""The Flower engine: a study deployed on Flower's runtime (SuperLink, SuperNodes).

The same algorithm objects as the simulator, split where they belong: the server half
(`configure`, `aggregate`) runs in a ServerApp, the hospital half (`client_update`) in
a ClientApp at each hospital, beside its records and its own ledger. Nothing here is
algorithm logic; this module only carries instructions and replies between the halves.

Both halves build the algorithm from the same `Deployment` (the public design each
machine reads from its copy of the study file: `dpfl.experiments.deploy`) and from
public facts only: each hospital's name and declared public size, the feature shape and
the number of classes (`SURVIVAL` for (time, event) labels), which the hospitals
announce in reply to a first "hello". The server never sees a record.

A hospital's node config (never the server) gives its data folder, public size,
(ε, δ) and ledger. It registers its own account, checks its whole remaining plan before
round 0 and every event before it trains, and refuses, saying why, when its budget
would be passed, whatever the server asks; its own sampling code's events are charged
to its own ledger before the reply leaves. Its local state (momentum, personal models)
stays in a file beside its ledger between rounds. Noise is the CSPRNG's unless the
node config sets `research-noise` (tests only: the simulator's seeded streams, so a
deployment repeats a simulation exactly).

Messages: "query.hello" (the hospital's public facts), "query.plan" (the run's silos
and rounds: each hospital checks its plan), "train" (one exchange of one round: the
cohort and the flat float32 model), "evaluate" (the final model: each hospital scores
the model it uses on its own test set, outside ε as in the simulator). Replies carry
the encoded vector (`messages.encode`) or `refused`, the reason. A study whose ε assumes
the server sees only the sum sends masked replies (`flower_masking`, with its own
messages around "train") or encrypted ones (`flower_he`, with "query.he_decrypt" to the
key holder).

A hospital that refuses, fails or is late stops the run, or with `missing="continue"` is
left out of that round. The server checkpoints every round; restarted, it continues the
same run instance, and each hospital re-sends the reply it already sent for an exchange
asked again (uncharged; a masked one is retrained and paid for). TLS and SuperNode
authentication are Flower's (`dpfl deploy`, docs/deployment.md).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from dpfl.engines import flower_he, flower_masking
from dpfl.engines.accounts import account, register_accounts, register_views, unaffordable
from dpfl.engines.evaluation import evaluate
from dpfl.engines.roster import PREFIX, Roster, RosterError, public_text, read_identity
from dpfl.engines.streams import Streams, member_rng, stream_noise, stream_rng
from dpfl.federation.algorithms.base import (
    Algorithm,
    HospitalContext,
    Instruction,
    Reply,
    flat,
    unflat,
)
from dpfl.federation.messages import Encoding, SecureSum, decode, encode
from dpfl.federation.silo import Silo, SiloInfo
from dpfl.files import replacing
from dpfl.local.clipping import Params
from dpfl.local.dpsgd import parameters_of
from dpfl.local.threads import torch_threads
from dpfl.privacy import Ledger, events
from dpfl.privacy.errors import BudgetExceededError
from dpfl.secure import InTheClear
from dpfl.secure.he import Aggregator, HomomorphicError, KeyFile
from dpfl.secure.masking import SecureAggregationError

PROTOCOL = 1
"""Version of the messages below; a hospital on another version is refused."""
LOG = logging.getLogger("flwr")
"""Flower's logger: what the ServerApp logs, `flwr run --stream` shows."""
POLL = 0.1
INSTANCE = re.compile(r"[0-9a-f]{16}")
"""A run instance's id (hex): it names files at the hospitals."""
"""Seconds between the server's pulls of replies."""
RECORD = "dpfl"
"""The one ConfigRecord every message carries."""

SURVIVAL = 0
"""The "number of classes" a hospital with survival (time, event) labels announces."""


class DeploymentError(RuntimeError):
    """A deployment that cannot go on: a hospital that is not dpfl's, or that disagrees
    with the study, or no reply in time."""


class NodeUnavailable(DeploymentError):
    """The SuperLink gave up on a hospital's SuperNode: it missed its heartbeats (its
    machine died, or it is restarting and has not joined again yet)."""


# -- what both halves agree on ----------------------------------------------------------


@dataclass(frozen=True)
class Deployment:
    """The public design of one run, which the server and every hospital build from the
    same study file (`dpfl.experiments.deploy`): nothing in it is a private fact."""

    key: str
    """The study's id: a hospital of another study is refused."""
    rounds: int
    seed: int
    accountant: str
    build: Callable[[Sequence[SiloInfo], Sequence[int], int], Algorithm]
    """The algorithm from public facts only: each silo's name and public size, the
    feature shape and the number of classes."""
    roster: Roster
    """The federation, pinned in the study file: its silos are exactly these hospitals,
    and every party of a cohort or a sum is one of them (`dpfl.engines.roster`)."""
    summing: str = "none"
    """How the server learns the replies' sum: "none", it sees each; "masking", they
    leave each hospital masked (`flower_masking`); "he", encrypted (`flower_he`)."""

    @property
    def masked(self) -> bool:
        return self.summing == "masking"

    @property
    def encrypted(self) -> bool:
        return self.summing == "he"


DeploymentOf = Callable[[Path], Deployment]
"""How a half reads a study file (the hospital's from its node config, the server's
from its run config) into its `Deployment`; refuses one that cannot be deployed."""


def _record(fields: Mapping[str, Any]) -> RecordDict:
    return RecordDict({RECORD: ConfigRecord(dict(fields))})


def _fields(message: Message) -> dict[str, Any]:
    if message.has_error():
        gone = message.error.code == ErrorCode.NODE_UNAVAILABLE
        error = NodeUnavailable if gone else DeploymentError
        raise error(f"error {message.error.code}: {message.error.reason}")
    records = message.content.config_records
    if RECORD not in records:
        raise DeploymentError("the reply is not dpfl's (no dpfl record)")
    return dict(records[RECORD])


def _silos_of(fields: Mapping[str, Any]) -> list[SiloInfo]:
    return [SiloInfo(str(n), int(s)) for n, s in zip(fields["silos"], fields["sizes"], strict=True)]


# -- the hospital half ------------------------------------------------------------------


@dataclass(frozen=True)
class HospitalConfig:
    """A hospital's own settings, from its SuperNode's `--node-config`."""

    name: str
    study: Path
    data: Path
    public_size: int
    epsilon: float
    delta: float
    ledger: Path
    identity: Path
    """Its identity key file (`dpfl deploy identity`): the key the study's roster lists
    for it, which signs its keys in every masking session."""
    research_noise: bool = False
    he_keys: Path | None = None
    """Its HE key file (encrypted studies; the key holder's holds the secret key)."""

    KEYS = ("name", "study", "data", "public-size", "epsilon", "delta", "ledger", "identity")

    @classmethod
    def from_node_config(cls, node: Mapping[str, Any]) -> HospitalConfig:
        missing = [key for key in cls.KEYS if key not in node]
        if missing:
            raise ValueError(f"the hospital's node config lacks {', '.join(missing)}")
        size, eps, delta = int(node["public-size"]), float(node["epsilon"]), float(node["delta"])
        if size < 1 or not eps > 0 or not 0 < delta < 1:
            raise ValueError("public-size must be ≥ 1, epsilon > 0 and 0 < delta < 1")
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
        )

    def deployment(self, deployment_of: DeploymentOf) -> Deployment:
        """Its study's deployment, whose roster must list this hospital with its key."""
        run = deployment_of(self.study)
        pinned = run.roster.identities.get(self.name)
        mine = read_identity(self.identity).public_key().public_bytes_raw()
        if pinned != mine:
            raise RosterError(
                f"the study's roster does not list {self.name} with the identity key in "
                f"{self.identity}"
                + ("" if pinned is None else f" (it lists {PREFIX}{pinned.hex()})")
            )
        return run

    def silo(self) -> Silo:
        """The hospital's training records: `train.npz` (x, y) in its data folder."""
        with np.load(self.data / "train.npz") as arrays:
            return Silo.from_arrays(
                self.name, arrays["x"], arrays["y"], public_size=self.public_size
            )


@dataclass
class _Hospital:
    """One hospital's half for one message: its config, study, records and ledger."""

    me: HospitalConfig
    run: Deployment
    silo: Silo
    instance: str
    """The server's run instance: the same across a restart from its checkpoint (a new
    Flower run), so local state and cached replies carry over."""
    state: RecordDict
    """The node's context state: kept by the SuperNode between this run's messages."""

    @classmethod
    def of(
        cls, context: Context, deployment_of: DeploymentOf, fields: Mapping[str, Any]
    ) -> _Hospital:
        me = HospitalConfig.from_node_config(context.node_config)
        instance = str(fields.get("instance", ""))
        if not INSTANCE.fullmatch(instance) and "study" in fields:
            raise DeploymentError(f"a malformed run instance {instance!r}")
        return cls(me, me.deployment(deployment_of), me.silo(), instance, context.state)

    @property
    def account(self) -> str:
        return account(self.me.name, 0)

    def hello(self) -> dict[str, Any]:
        classes = SURVIVAL if self.silo.survival else int(self.silo.y.max()) + 1
        return {
            "protocol": PROTOCOL,
            "study": self.run.key,
            "name": self.me.name,
            "public-size": self.me.public_size,
            "shape": list(self.silo.x.shape[1:]),
            "classes": classes,
            "identity": public_text(read_identity(self.me.identity)),
            **({"key-holder": self.keys().secret} if self.run.encrypted else {}),
        }

    def keys(self) -> KeyFile:
        """This hospital's HE key file (the key holder's holds the secret key)."""
        if self.me.he_keys is None:
            raise DeploymentError(
                f"study {self.run.key} encrypts replies: give this hospital its he-keys file"
            )
        return flower_he.read_key_file(self.me.he_keys)

    def masking(self, fields: Mapping[str, Any]) -> flower_masking.HospitalSide:
        """This hospital's side of the exchange's masking session."""
        algorithm, silos = self.algorithm(fields)
        length = flat(parameters_of(algorithm.model)).numel()
        fewest = algorithm.fewest_replies(len(silos))
        return flower_masking.HospitalSide(
            self.state,
            self.me.name,
            length,
            fewest,
            read_identity(self.me.identity),
            self.run.roster,
        )

    def algorithm(self, fields: Mapping[str, Any]) -> tuple[Algorithm, list[SiloInfo]]:
        """The study's algorithm over the run's silos, after checking that they are the
        roster's hospitals and that the server declares this hospital as it declares
        itself."""
        if fields.get("study") != self.run.key:
            raise DeploymentError("the server runs another study than this hospital's")
        silos = _silos_of(fields)
        try:
            self.run.roster.check_all([s.name for s in silos], "the server's list of silos")
        except RosterError as exc:
            raise DeploymentError(str(exc)) from None
        mine = [s for s in silos if s.name == self.me.name]
        if mine != [SiloInfo(self.me.name, self.me.public_size)]:
            raise DeploymentError(
                f"the server declares {self.me.name} as {mine}, not with public size "
                f"{self.me.public_size}"
            )
        return self.run.build(silos, fields["shape"], int(fields["classes"])), silos

    def open(self, algorithm: Algorithm, silos: Sequence[SiloInfo]) -> Ledger:
        """The hospital's ledger with its accounts (its budget binds the server's view;
        other views are recorded, never binding)."""
        book = Ledger(self.me.ledger, accountant=self.run.accountant)
        budgets = {self.me.name: (self.me.epsilon, self.me.delta)}
        declared = {self.me.name: self.me.public_size}
        try:  # a budget other than the one registered before is refused
            register_accounts(book, [self.silo], 1, budgets)
            register_views(book, algorithm, silos, 1, budgets, declared, [self.silo.info])
        except BaseException:
            book.close()
            raise
        return book

    def refusal(
        self,
        book: Ledger,
        algorithm: Algorithm,
        silos: Sequence[SiloInfo],
        round_: int,
        exchange: int = 0,
    ) -> str | None:
        """Why the rest of the plan from `round_` would pass this hospital's budget (for an
        algorithm that stops at its budget: the next round), or None if it fits. A round
        or an exchange outside the study's is refused: the plan this hospital agreed to
        is the study's. A round already paid for, whose reply is kept to be sent again, is
        not paid twice."""
        if not 0 <= round_ < self.run.rounds:
            return f"round {round_} is not one of the study's {self.run.rounds} rounds"
        exchanges = algorithm.exchanges(silos)
        if not 0 <= exchange < exchanges:
            return f"exchange {exchange} is not one of {algorithm.name}'s {exchanges} a round"
        event = algorithm.participation_event(self.silo.info, silos)
        saved = self._load()
        paid = "reply" in saved and saved["at"][0] == round_
        left = 1 if algorithm.stops_at_budget else self.run.rounds - round_
        return None if paid and left == 1 else unaffordable(book, self.account, event, left - paid)

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
            return dict(saved["reply"])
        with self.open(algorithm, silos) as book:
            why = self.refusal(book, algorithm, silos, round_, exchange)
            try:
                self.run.roster.check([str(n) for n in fields["cohort"]], "the cohort")
            except RosterError as exc:
                why = why or str(exc)
            if why is None and self.run.masked:
                try:
                    self.masking(fields).check_cohort(fields)
                except SecureAggregationError as exc:
                    why = str(exc)
            if why is not None:
                return {"refused": why}
            like = parameters_of(algorithm.model)
            params = _received(fields, like)
            names = {s.name: s for s in silos}
            cohort = tuple(names[str(n)] for n in fields["cohort"])
            before = (
                saved["before"]
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

            def charge(charges: Sequence[tuple[Any, str | None, events.PrivacyEvent]]) -> None:
                book.record_many(
                    [(account(self.me.name, 0, view), event) for _, view, event in charges],
                    label=label,
                    round=round_,
                )

            ctx = HospitalContext(round_, partial(rng, *me), partial(noise, *me), charge)
            try:
                with torch_threads(1):  # as the simulator trains: the same float sums
                    reply, local = algorithm.client_update(
                        Instruction(params, cohort), self.silo, before, ctx
                    )
            except BudgetExceededError as exc:
                return {"refused": f"{self.account}: {exc}"}
            out: dict[str, Any] = {"epsilon": book.spent(self.account).epsilon}
        if reply is not None and self.run.masked:
            out.update(self.masking(fields).masked(fields, reply.vector))
        elif reply is not None and self.run.encrypted:
            at = flower_he.counter(round_, exchange, algorithm.exchanges(silos))
            out["ciphertext"] = self.keys().hospital(self.me.name).encrypt(reply.vector, at)
        elif reply is not None:
            out.update(
                {
                    "vector": encode(reply.encoding, reply.vector),
                    "encoding": reply.encoding.value,
                    "length": reply.vector.numel(),
                }
            )
        calls = {"rng": rng.calls(*me), "noise": noise.calls(*me)}
        kept = {"local": local, "before": before, "at": [round_, exchange], "calls": calls}
        self._save({**kept, **({} if self.run.masked else {"reply": out})})
        return out

    def evaluate(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """Metrics of the model this hospital uses (its personal one if it keeps one) on its
        own test set, `test.npz` beside its training records; released outside ε, as the
        simulator's are. None without a test set."""
        test = self.me.data / "test.npz"
        if not test.exists():
            return {"metrics": False}
        algorithm, _ = self.algorithm(fields)
        sent = _received(fields, parameters_of(algorithm.model))
        if sent is None:
            raise DeploymentError("an evaluation needs the model")
        local = self._load().get("local", {})
        with np.load(test) as arrays:
            tested = Silo.from_arrays(self.me.name, arrays["x"], arrays["y"])
        silo = dataclasses.replace(self.silo, x_test=tested.x, y_test=tested.y)
        with torch_threads(1):  # as the simulator trains: the same float sums
            model = algorithm.model_of({"global": sent}, local)
            (row,) = evaluate(
                algorithm.model, [[model]], [silo], int(fields["round"]), algorithm.loss
            )
        metrics: dict[str, float] = row["silos"][self.me.name]
        return {"metrics": True, "names": list(metrics), "values": list(metrics.values())}

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
    """The model the server sent (None: none was)."""
    sent = bytes(fields["params"])
    if not sent:
        return None
    n = sum(v.numel() for v in like.values())
    return unflat(decode(Encoding.FLOAT32, sent, n), like)


def _handler(
    work: Callable[[_Hospital, Mapping[str, Any]], dict[str, Any]], deployment_of: DeploymentOf
) -> Callable[[Message, Context], Message]:
    def handle(message: Message, context: Context) -> Message:
        fields = _fields(message)
        if fields.get("protocol") != PROTOCOL:
            raise DeploymentError(
                f"protocol {fields.get('protocol')!r}, this hospital speaks {PROTOCOL}"
            )
        hospital = _Hospital.of(context, deployment_of, fields)
        return Message(_record(work(hospital, fields)), reply_to=message)

    return handle


def _hello(hospital: _Hospital, fields: Mapping[str, Any]) -> dict[str, Any]:
    return hospital.hello()


def _plan(hospital: _Hospital, fields: Mapping[str, Any]) -> dict[str, Any]:
    algorithm, silos = hospital.algorithm(fields)
    with hospital.open(algorithm, silos) as book:
        why = hospital.refusal(book, algorithm, silos, int(fields["round"]))
    return {"accepted": why is None, **({} if why is None else {"refused": why})}


def _train(hospital: _Hospital, fields: Mapping[str, Any]) -> dict[str, Any]:
    return hospital.train(fields)


def _secagg(
    step: Callable[[flower_masking.HospitalSide, Mapping[str, Any]], dict[str, Any]],
) -> Callable[[_Hospital, Mapping[str, Any]], dict[str, Any]]:
    def work(hospital: _Hospital, fields: Mapping[str, Any]) -> dict[str, Any]:
        if not hospital.run.masked:
            raise DeploymentError("this study's replies are not masked")
        return step(hospital.masking(fields), fields)

    return work


def _evaluate(hospital: _Hospital, fields: Mapping[str, Any]) -> dict[str, Any]:
    return hospital.evaluate(fields)


def _he_decrypt(hospital: _Hospital, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The key holder decrypts one sum of at least what its own algorithm assumes."""
    if not hospital.run.encrypted or hospital.me.he_keys is None:
        raise DeploymentError("this hospital holds no key to decrypt with")
    algorithm, silos = hospital.algorithm(fields)
    side = flower_he.KeyHolderSide(hospital.me.he_keys, hospital.run.roster)
    return side.decrypt(fields, algorithm.fewest_replies(len(silos)))


def client_app(deployment_of: DeploymentOf) -> ClientApp:
    """The hospital half: answers hello, plan, train and evaluate messages, for the study
    file its node config names, read by `deployment_of`."""
    app = ClientApp()
    app.query("hello")(_handler(_hello, deployment_of))
    app.query("plan")(_handler(_plan, deployment_of))
    app.train()(_handler(_train, deployment_of))
    app.query("he_decrypt")(_handler(_he_decrypt, deployment_of))
    for step in ("keys", "shares", "unmask"):
        work = _secagg(getattr(flower_masking.HospitalSide, step))
        app.query(f"secagg_{step}")(_handler(work, deployment_of))
    app.evaluate()(_handler(_evaluate, deployment_of))
    return app


# -- the server half --------------------------------------------------------------------


@dataclass
class DeploymentResult:
    """What the server ends with: the model, how far it got, and why it stopped."""

    rounds_completed: int
    params: dict[str, torch.Tensor]
    silos: list[SiloInfo]
    epsilon: dict[str, float]
    """Each hospital's ε as it reported it from its own ledger."""
    refused: dict[str, str]
    """Hospitals that refused, and why (with `missing="stop"`, the run stopped there)."""
    stopped: str = ""
    """Why the run stopped before its last round otherwise (a hospital that did not
    reply in time, or failed); its hospitals keep what they were charged."""
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    """Each hospital's metrics of its final model on its own test set, as it reported
    them (hospitals without a test set report none)."""
    absent: list[tuple[int, str, str]] = field(default_factory=list)
    """With `missing="continue"`: (round, hospital, why) for each hospital left out of a
    round (it refused, failed or did not reply in time); the run went on without it."""
    instance: str = ""
    """The run instance: kept in the checkpoint, the same across a restart."""

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        saved = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        torch.save(
            {**saved, "silos": [(s.name, s.public_size) for s in self.silos]}, out / "result.pt"
        )

    @staticmethod
    def load(out: Path) -> DeploymentResult:
        saved = torch.load(out / "result.pt", weights_only=True)
        return DeploymentResult(**{**saved, "silos": [SiloInfo(n, s) for n, s in saved["silos"]]})


@dataclass
class _Server:
    grid: Grid
    run: Deployment
    timeout: float
    names: dict[int, str] = field(default_factory=dict)
    """The hospitals' names by node, once they said hello."""
    aggregator: Aggregator | None = None
    """The server's HE half (encrypted studies): it adds ciphertexts, nothing more."""
    holder: str = ""
    """The hospital that holds the HE secret key (encrypted studies)."""

    def ask_named(
        self,
        kind: str,
        by_name: Mapping[str, Mapping[str, Any]],
        *,
        common: Mapping[str, Any],
        absent: list[tuple[str, str]] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """`ask` by hospital name, each message with the `common` fields too. With an
        `absent` list, hospitals that fail or do not reply in time are noted there,
        (name, why), and left out of the answers instead."""
        node = {name: n for n, name in self.names.items()}
        answers, failed = self.collect(kind, {node[n]: {**common, **f} for n, f in by_name.items()})
        if failed and absent is None:
            raise DeploymentError(_joined(failed.values()))
        if absent is not None:
            absent += [(self.names[n], str(why)) for n, why in failed.items()]
        return {name: answers[node[name]] for name in by_name if node[name] in answers}

    def ask(self, kind: str, nodes: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
        """Send each node its fields; every node must reply in time."""
        answers, failed = self.collect(kind, nodes)
        if failed:
            raise DeploymentError(_joined(failed.values()))
        return answers

    def collect(
        self, kind: str, nodes: Mapping[int, Mapping[str, Any]]
    ) -> tuple[dict[int, dict[str, Any]], dict[int, DeploymentError]]:
        """Send each node its fields: the fields of the nodes that replied in time, and
        why each other did not (no reply, an error, not dpfl's, unavailable)."""
        messages = [
            Message(_record({"protocol": PROTOCOL, **fields}), dst_node_id=node, message_type=kind)
            for node, fields in nodes.items()
        ]
        waiting = dict(zip(self.grid.push_messages(messages), nodes, strict=True))
        by_node: dict[int, Message] = {}
        deadline = time.monotonic() + self.timeout
        while waiting and time.monotonic() < deadline:
            # every POLL seconds: Grid.send_and_receive waits 3 s between pulls
            time.sleep(POLL)
            for reply in self.grid.pull_messages(list(waiting)):
                by_node[waiting.pop(reply.metadata.reply_to_message_id)] = reply
        answers, failed = {}, {}
        for node in nodes:
            name = self.names.get(node, str(node))
            if node not in by_node:
                failed[node] = DeploymentError(f"{name}: no {kind} reply within {self.timeout:g}s")
                continue
            try:
                answers[node] = _fields(by_node[node])
            except DeploymentError as exc:
                failed[node] = type(exc)(f"{name}: {exc}")
        return answers, failed

    def hellos(self, count: int, wait: float) -> dict[int, dict[str, Any]]:
        """Each connected SuperNode's hello, once `count` answered (DeploymentError after
        `wait` seconds). A node the SuperLink gives up on while asked (a hospital that is
        restarting after a crash: its old SuperNode is held as connected until it misses
        its heartbeats) is asked again when it has joined again."""
        deadline = time.monotonic() + wait
        hellos: dict[int, dict[str, Any]] = {}
        while True:
            new: dict[int, dict[str, Any]] = {
                n: {} for n in self.grid.get_node_ids() if n not in hellos
            }
            answers, failed = self.collect("query.hello", new) if new else ({}, {})
            hellos.update(answers)
            gone = [why for why in failed.values() if isinstance(why, NodeUnavailable)]
            if len(gone) < len(failed):
                raise DeploymentError(_joined(failed.values()))
            if len(hellos) >= count:
                return dict(sorted(hellos.items()))
            if time.monotonic() > deadline:
                raise DeploymentError(
                    f"{len(hellos)} of {count} hospitals answered hello in {wait:g}s"
                    + (f" ({_joined(gone)})" if gone else "")
                )
            time.sleep(0.2)

    def hospitals(self, wait: float) -> dict[str, tuple[int, dict[str, Any]]]:
        """Wait for the roster's hospitals (`hellos`); each must answer hello as a dpfl
        hospital of this study, under a name of the roster with the roster's identity key
        for it, and the name its SuperNode key was registered with, if any. By name:
        (node id, its hello)."""
        roster = self.run.roster
        hellos = self.hellos(len(roster), wait)
        registered = {int(n.node_id): str(n.name) for n in self.grid.get_nodes()}
        by_name: dict[str, tuple[int, dict[str, Any]]] = {}
        for node, fields in hellos.items():
            if fields.get("protocol") != PROTOCOL or fields.get("study") != self.run.key:
                raise DeploymentError(
                    f"node {node} ({fields.get('name')}) runs protocol {fields.get('protocol')} "
                    f"of study {fields.get('study')}, not protocol {PROTOCOL} of "
                    f"{self.run.key}"
                )
            name = str(fields["name"])
            if registered.get(node) and registered[node] != name:
                raise DeploymentError(
                    f"node {node} says it is {name!r}, its key is registered as "
                    f"{registered[node]!r}"
                )
            if name in by_name:
                raise DeploymentError(f"two hospitals call themselves {name!r}")
            pinned = roster.identities.get(name)
            if pinned is None or fields.get("identity") != PREFIX + pinned.hex():
                raise DeploymentError(
                    f"node {node} says it is {name!r}, which the study's roster "
                    + ("does not list" if pinned is None else "lists with another identity key")
                )
            by_name[name] = (node, fields)
            LOG.info(
                "%s: node %d, public size %s%s",
                name,
                node,
                fields["public-size"],
                f", its key registered as {name}" if registered.get(node) else "",
            )
        return dict(sorted(by_name.items()))


def _joined(failures: Iterable[DeploymentError]) -> str:
    return "; ".join(map(str, failures))


Protected = flower_masking.MaskedSum | flower_he.EncryptedSum
"""A sum whose replies the server never holds in the clear."""


def _exchange(
    server: _Server,
    run: Deployment,
    algorithm: Algorithm,
    orders: Mapping[str, Instruction],
    common: Mapping[str, Any],
    result: DeploymentResult,
    absent: list[tuple[str, str]] | None,
) -> tuple[SecureSum, dict[str, Reply]]:
    """One exchange: its instructions sent, the replies received (masked, after the
    session's first two rounds, if the study masks them), each hospital's ε noted in
    `result`; how the algorithm will learn the replies' sum. A refusal goes to
    `result.refused`, or with an `absent` list there, as a failure does."""
    ask = partial(server.ask_named, common=common, absent=absent)
    summing: SecureSum = InTheClear()
    extra: dict[str, dict[str, Any]] = {name: {} for name in orders}
    if run.masked:
        length = flat(result.params).numel()
        fewest = algorithm.fewest_replies(len(result.silos))
        summing = session = flower_masking.MaskedSum.open(
            ask, run.roster, list(orders), length, fewest
        )
        extra = {name: session.train_fields(name) for name in session.inboxes}
    elif run.encrypted and server.aggregator is not None:
        at = flower_he.counter(
            common["round"], common["exchange"], algorithm.exchanges(result.silos)
        )
        strict = partial(server.ask_named, common=common)
        summing = flower_he.EncryptedSum(strict, server.holder, server.aggregator, at)
    asked = {
        name: {
            "cohort": [s.name for s in order.cohort],
            "params": b"" if order.params is None else encode(Encoding.FLOAT32, flat(order.params)),
            **extra[name],
        }
        for name, order in orders.items()
        if name in extra
    }
    replies: dict[str, Reply] = {}
    for name, fields in ask("train", asked).items():
        if "refused" in fields:
            if absent is None:
                result.refused[name] = str(fields["refused"])
            else:
                absent.append((name, f"refused: {fields['refused']}"))
            continue
        result.epsilon[name] = float(fields["epsilon"])
        if "vector" in fields and run.summing == "none":
            encoding = Encoding(fields["encoding"])
            vector = decode(encoding, bytes(fields["vector"]), int(fields["length"]))
            replies[name] = Reply(vector, encoding)
        elif isinstance(summing, Protected) and summing.carried in fields:
            replies[name] = Reply(summing.received(name, fields))
        elif {"vector", "words", "ciphertext"} & fields.keys():
            raise DeploymentError(f"{name}'s reply is not summed as the study says ({run.summing})")
    return summing, replies


@dataclass(frozen=True)
class Checkpoint:
    """The server's state after a completed round, written atomically to one file; a
    server restarted on it (a new Flower run) continues as the same run instance."""

    path: Path

    def load(self, run: Deployment, silos: Sequence[SiloInfo]) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        saved: dict[str, Any] = torch.load(self.path, weights_only=True)
        if saved["study"] != run.key or saved["silos"] != [[s.name, s.public_size] for s in silos]:
            raise DeploymentError(
                f"checkpoint {self.path} is of another study or other hospitals: "
                f"{saved['study']} over {saved['silos']}"
            )
        return saved

    def save(self, run: Deployment, result: DeploymentResult, state: Mapping[str, Any]) -> None:
        saved = {
            "study": run.key,
            "silos": [[s.name, s.public_size] for s in result.silos],
            "instance": result.instance,
            "round": result.rounds_completed,
            "state": dict(state),
            "epsilon": result.epsilon,
            "absent": result.absent,
        }
        with replacing(self.path) as partial:
            torch.save(saved, partial)


def serve(
    grid: Grid,
    run: Deployment,
    *,
    wait: float = 60.0,
    timeout: float = 600.0,
    missing: str = "stop",
    checkpoint: Path | None = None,
    he_keys: Path | None = None,
) -> DeploymentResult:
    """Run the study's rounds over the hospitals of its roster, connected to the grid: the
    algorithm's server half, each exchange's instructions sent as messages, its replies
    summed in the clear or, if the study masks them, by pairwise masking.

    `missing`: what a hospital that refuses, fails or does not reply within `timeout`
    seconds does to the run: "stop" it after the rounds done, or "continue" without that
    hospital's reply in that round (it is asked again the next; a masked round still
    needs the sum's quorum, else the run stops). `checkpoint`: a file the server's state
    is written to after each round, and resumed from if it exists. `he_keys`: the public
    key file of an encrypted study."""
    if missing not in ("stop", "continue"):
        raise ValueError(f"missing must be 'stop' or 'continue', got {missing!r}")
    server = _Server(grid, run, timeout)
    known = server.hospitals(wait)
    shapes = {tuple(hello["shape"]) for _, hello in known.values()}
    if len(shapes) != 1:
        raise DeploymentError(f"the hospitals' records have different shapes: {sorted(shapes)}")
    shape = list(shapes.pop())
    tasks = {int(hello["classes"]) == SURVIVAL for _, hello in known.values()}
    if len(tasks) != 1:
        raise DeploymentError("some hospitals hold survival labels and others classes")
    classes = max(int(hello["classes"]) for _, hello in known.values())
    silos = [SiloInfo(name, int(hello["public-size"])) for name, (_, hello) in known.items()]
    node = {name: n for name, (n, _) in known.items()}
    server.names = {n: name for name, n in node.items()}
    if run.encrypted:
        holders = [name for name, (_, hello) in known.items() if hello["key-holder"]]
        if len(holders) != 1 or he_keys is None:
            raise DeploymentError(
                f"an encrypted study needs the server's public key file and one key holder "
                f"among the hospitals, not {holders}"
            )
        server.holder, server.aggregator = holders[0], flower_he.read_key_file(he_keys).aggregator()
    algorithm = run.build(silos, shape, classes)
    result = DeploymentResult(0, parameters_of(algorithm.model), silos, {}, {})
    state = algorithm.initial_state(silos)
    result.instance = uuid.uuid4().hex[:16]
    saved = None if checkpoint is None else Checkpoint(checkpoint).load(run, silos)
    if saved is not None:
        result.instance, result.rounds_completed = saved["instance"], saved["round"]
        state, result.epsilon, result.absent = saved["state"], saved["epsilon"], saved["absent"]
        result.params = state["global"]
        LOG.info("resuming instance %s after round %d", result.instance, result.rounds_completed)
    public = {
        "study": run.key,
        "instance": result.instance,
        "silos": [s.name for s in silos],
        "sizes": [s.public_size for s in silos],
        "shape": shape,
        "classes": classes,
    }
    start = result.rounds_completed
    if start < run.rounds:
        asked = {n: {**public, "round": start} for n in node.values()}
        for n, plan in server.ask("query.plan", asked).items():
            if not plan["accepted"] and missing == "stop":
                result.refused[server.names[n]] = str(plan["refused"])
        if result.refused:
            return result
    for round_ in range(start, run.rounds):
        rng = Streams(run.seed, round_, stream_rng)
        absent: list[tuple[str, str]] | None = None if missing == "stop" else []
        for exchange in range(algorithm.exchanges(silos)):
            orders = algorithm.configure(state, round_, silos, partial(rng, 0, -1), exchange)
            common = {**public, "round": round_, "exchange": exchange}
            try:  # a hospital gone, failing or refusing: keep what is done
                summing, replies = _exchange(server, run, algorithm, orders, common, result, absent)
                if result.refused:  # nothing of this round is aggregated
                    return result
                if replies:
                    state = algorithm.aggregate(state, replies, summing)
            except (DeploymentError, SecureAggregationError, HomomorphicError) as exc:
                result.stopped = f"round {round_}: {exc}"
                return result
        for name, why in absent or []:
            LOG.warning("round %d goes on without %s", round_, why)
            result.absent.append((round_, name, why))
        result.rounds_completed, result.params = round_ + 1, state["global"]
        if checkpoint is not None:
            Checkpoint(checkpoint).save(run, result, state)
    final = encode(Encoding.FLOAT32, flat(result.params))
    scored = server.ask_named(
        "evaluate",
        {name: {"params": final} for name in node},
        common={**public, "round": run.rounds - 1},
        absent=None if missing == "stop" else [],
    )
    result.metrics = {
        name: dict(zip(fields["names"], fields["values"], strict=True))
        for name, fields in scored.items()
        if fields["metrics"]
    }
    return result
