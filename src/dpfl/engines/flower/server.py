"""The server half of a Flower deployment: the ServerApp's rounds (`serve`). It runs
the algorithm's server half (`configure`, `aggregate`) and carries its instructions to
the hospitals (`dpfl.engines.flower.hospital`) and their replies back; nothing here is
algorithm logic.

The server builds the algorithm from public facts only: each hospital's name and
declared public size, the feature shape and the number of classes, which the hospitals
announce in reply to a first "hello"; it never sees a record. Each exchange's replies
reach the algorithm through a sum of the study's kind (`flower.sums.deployed`): in the
clear (`clear.ClearSum`), masked (`masking.MaskedSum`) or encrypted (`he.EncryptedSum`).

A hospital that refuses, fails or is late stops the run, or with `missing="continue"` is
left out of that round; one whose SuperNode went away (restarting) is waited for, within
a declared grace period, and asked again. The server checkpoints every round; restarted,
it continues the same run instance. TLS and SuperNode authentication are Flower's
(`dpfl deploy`, docs/deployment.md).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from flwr.app import Message
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from dpfl.engines.flower.protocol import (
    LOG,
    PROTOCOL,
    SURVIVAL,
    UNHELD,
    Deployment,
    DeploymentError,
    Exchange,
    NodeUnavailable,
    Silent,
    by_reference,
    exchange_number,
    fields_of,
    record,
    union_metrics,
)
from dpfl.engines.flower.roster import PREFIX
from dpfl.engines.flower.sums import ExchangeSum, Opener, deployed
from dpfl.engines.streams import Streams, stream_rng
from dpfl.federation.algorithms.base import (
    Algorithm,
    Instruction,
    Reply,
    State,
    flat,
)
from dpfl.federation.messages import Encoding, encode
from dpfl.federation.silo import SiloInfo
from dpfl.files import replacing
from dpfl.local.dpsgd import parameters_of
from dpfl.privacy.chain import Receipt
from dpfl.secure.he import HomomorphicError
from dpfl.secure.masking import SecureAggregationError

POLL = 0.1
"""Seconds between the server's pulls of replies."""
JOIN_POLL = 0.2
"""Seconds between the server's looks for SuperNodes that joined."""
GONE = frozenset(
    {ErrorCode.NODE_UNAVAILABLE, ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.CLIENT_APP_CRASHED}
)
"""Error replies that say a hospital's SuperNode or its ClientApp went away (it missed its
heartbeats, was removed, or its ClientApp stopped), not that the hospital failed: a node
that restarts is asked again (`NodeUnavailable`)."""


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
    """Each hospital's metrics of its final model on its own test set: read off its DP
    counts, or as it sent them where the study's evaluation is clear (hospitals without
    a test set, or that refused, have none)."""
    absent: list[tuple[int, str, str]] = field(default_factory=list)
    """With `missing="continue"`: (round, hospital, why) for each hospital left out of a
    round (it refused, failed or did not reply in time); the run went on without it."""
    instance: str = ""
    """The run instance: kept in the checkpoint, the same across a restart."""
    union: dict[str, float] = field(default_factory=dict)
    """Metrics of the union of the hospitals' test sets, combined from each hospital's
    counts, DP or clear (`flower_protocol.union_metrics`); empty where some hospital
    sent none."""
    noise: dict[str, float] = field(default_factory=dict)
    """Each hospital's σ, where the study calibrates it to the hospitals' budgets."""

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
class Server:
    grid: Grid
    run: Deployment
    timeout: float
    grace: float = 0.0
    """Seconds to wait for a hospital whose SuperNode went away mid-run to come back
    (`rejoined`); 0: its failure is final."""
    names: dict[int, str] = field(default_factory=dict)
    """The hospitals' names by node, once they said hello."""
    greeted: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each hospital's hello, by name: one that comes back must announce the same."""
    holds: dict[int, str] = field(default_factory=dict)
    """The digest of the public facts each node holds (it answered a message stating
    them), which later messages refer to them by."""
    receipts: Path | None = None
    """Where the hospitals' signed receipts of their charges are kept (RECEIPT/NAME/),
    for `dpfl privacy verify --receipts`; None: not kept."""

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
        named = {self.names[n]: fields for n, fields in answers.items()}  # nodes may be new
        return {name: named[name] for name in by_name if name in named}

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
        why each other did not (no reply, an error, not dpfl's, unavailable). The run's
        public facts go by reference to a node that holds them (`by_reference`), in full
        again to one that answers it does not. A hospital whose SuperNode went away is
        asked again where it comes back within the grace period (`rejoined`), under its
        node then; so is one that did not reply in time (`Silent`: it may have died unseen
        yet, or be slow, and then its SuperNode answers hello once its ClientApp is done)."""
        answers, failed = self.collect_once(kind, nodes)
        unheld = [node for node, fields in answers.items() if UNHELD in fields]
        for node in unheld:
            answers.pop(node), self.holds.pop(node, None)
        if unheld:
            again, failed_again = self.collect_once(kind, {n: nodes[n] for n in unheld})
            answers, failed = answers | again, failed | failed_again
        gone = [n for n, why in failed.items() if isinstance(why, NodeUnavailable | Silent)]
        back = self.rejoined([n for n in gone if n in self.names]) if self.grace > 0 else {}
        if back:
            again, failed_again = self.collect(kind, {new: nodes[old] for old, new in back.items()})
            failed = {n: why for n, why in failed.items() if n not in back} | failed_again
            answers |= again
        return answers, failed

    def rejoined(self, gone: Sequence[int]) -> dict[int, int]:
        """Wait up to `grace` seconds for the hospitals of the `gone` nodes to come back: a
        SuperNode that answers hello as one of them, with the hello it gave first, takes
        its place (the same node, or a new one). Each one back, its old node: its new."""
        waiting = {self.names[n]: n for n in gone}
        if not waiting:
            return {}
        them = "it" if len(waiting) == 1 else "them"
        LOG.warning(
            "%s gone: waiting up to %gs for %s to come back", ", ".join(waiting), self.grace, them
        )
        deadline, others = time.monotonic() + self.grace, set(self.names) - set(gone)
        back: dict[int, int] = {}
        while waiting and (left := deadline - time.monotonic()) > 0:
            new: dict[int, dict[str, Any]] = {
                n: {} for n in self.grid.get_node_ids() if n not in others
            }
            limit = min(left, self.timeout)
            answers = self.collect_once("query.hello", new, limit)[0] if new else {}
            registered = {int(n.node_id): str(n.name) for n in self.grid.get_nodes()}
            for node, hello in answers.items():
                name = str(hello.get("name"))
                others.add(node)  # a node that said who it is is not asked again
                if name in waiting:
                    if self.vetted(node, hello, registered) != self.greeted[name]:
                        raise DeploymentError(f"{name} came back with another hello: {hello}")
                    back[waiting.pop(name)] = node
            if waiting:
                time.sleep(JOIN_POLL)
        for old, node in back.items():
            name = self.names.pop(old)
            self.names[node] = name
            self.holds.pop(old, None)
            LOG.info("%s is back (node %d): asking it again", name, node)
        if waiting:
            LOG.warning("%s not back within %gs", ", ".join(waiting), self.grace)
        return back

    def collect_once(
        self, kind: str, nodes: Mapping[int, Mapping[str, Any]], timeout: float | None = None
    ) -> tuple[dict[int, dict[str, Any]], dict[int, DeploymentError]]:
        sent = {node: by_reference(fields, self.holds.get(node)) for node, fields in nodes.items()}
        messages = [
            Message(record({"protocol": PROTOCOL, **fields}), dst_node_id=node, message_type=kind)
            for node, (fields, _) in sent.items()
        ]
        waiting = dict(zip(self.grid.push_messages(messages), nodes, strict=True))
        by_node: dict[int, Message] = {}
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while waiting and time.monotonic() < deadline:
            # every POLL seconds: Grid.send_and_receive waits 3 s between pulls
            time.sleep(POLL)
            for reply in self.grid.pull_messages(list(waiting)):
                by_node[waiting.pop(reply.metadata.reply_to_message_id)] = reply
        answers: dict[int, dict[str, Any]] = {}
        failed: dict[int, DeploymentError] = {}
        for node in nodes:
            name = self.names.get(node, str(node))
            if node not in by_node:
                failed[node] = Silent(f"{name}: no {kind} reply within {limit:g}s")
                continue
            try:
                answers[node] = fields_of(by_node[node])
            except DeploymentError as exc:
                error = by_node[node].error if by_node[node].has_error() else None
                gone = error is not None and error.code in GONE
                failed[node] = (NodeUnavailable if gone else type(exc))(f"{name}: {exc}")
        for node, (_, facts) in sent.items():  # what each node holds now
            if node in answers and facts is not None:
                self.holds[node] = facts
            else:
                self.holds.pop(node, None)
        self.keep_receipts(answers)
        return answers, failed

    def keep_receipts(self, answers: Mapping[int, Mapping[str, Any]]) -> None:
        """Keep each reply's receipts (its release's; a hello's, of the DP record count it
        released) as RECEIPTS/NAME/ENTRY.json; one that is not signed by the key the
        roster lists for its hospital, or does not hold together, is kept all the same
        (it is evidence) and said so in the log."""
        if self.receipts is None:
            return
        for node, fields in answers.items():
            name = self.names.get(node) or str(fields.get("name", node))
            for text in (str(fields[k]) for k in ("receipt", "count-receipt") if fields.get(k)):
                try:
                    made = Receipt.from_json(text)
                except ValueError as exc:
                    LOG.warning("%s sent a receipt that is not one: %s", name, exc)
                    continue
                pinned = self.run.roster.identities.get(name)
                if pinned is None or made.seal.key != f"{PREFIX}{pinned.hex()}":
                    LOG.warning("%s's receipt is not signed with its roster key", name)
                if made.problems() or made.hospital != name:
                    LOG.warning("%s's receipt: %s", name, made.problems() or made.hospital)
                folder = self.receipts / name
                folder.mkdir(parents=True, exist_ok=True)
                with replacing(folder / f"{made.seal.seq:08d}.json") as partial:
                    partial.write_text(text, encoding="utf-8")

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
            time.sleep(JOIN_POLL)

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
            name = str(self.vetted(node, fields, registered)["name"])
            if name in by_name:
                raise DeploymentError(f"two hospitals call themselves {name!r}")
            by_name[name] = (node, fields)
            LOG.info(
                "%s: node %d, public size %s%s",
                name,
                node,
                fields["public-size"],
                f", its key registered as {name}" if registered.get(node) else "",
            )
        return dict(sorted(by_name.items()))

    def vetted(
        self, node: int, fields: Mapping[str, Any], registered: Mapping[int, str]
    ) -> Mapping[str, Any]:
        """A hello, once checked: a dpfl hospital of this study, under a name of the
        roster with the roster's identity key for it, and the name its SuperNode key was
        registered with, if any."""
        if "refused" in fields:
            raise DeploymentError(f"{fields.get('name')} refused: {fields['refused']}")
        if fields.get("protocol") != PROTOCOL or fields.get("study") != self.run.key:
            raise DeploymentError(
                f"node {node} ({fields.get('name')}) runs protocol {fields.get('protocol')} "
                f"of study {fields.get('study')}, not protocol {PROTOCOL} of "
                f"{self.run.key}"
            )
        name = str(fields["name"])
        if registered.get(node) and registered[node] != name:
            raise DeploymentError(
                f"node {node} says it is {name!r}, its key is registered as {registered[node]!r}"
            )
        pinned = self.run.roster.identities.get(name)
        if pinned is None or fields.get("identity") != PREFIX + pinned.hex():
            raise DeploymentError(
                f"node {node} says it is {name!r}, which the study's roster "
                + ("does not list" if pinned is None else "lists with another identity key")
            )
        return fields


def _joined(failures: Iterable[DeploymentError]) -> str:
    return "; ".join(map(str, failures))


CARRIED = {"vector", "words", "ciphertext"}
"""The fields that carry a reply, however it is protected."""


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
    grace: float = 0.0,
    receipts: Path | None = None,
) -> DeploymentResult:
    """Run the study's rounds over the hospitals of its roster, connected to the grid: the
    algorithm's server half, each exchange's instructions sent as messages, its replies
    summed as the study says (in the clear, masked or encrypted).

    Args:
        grid: Flower's grid of the ServerApp, which reaches the hospitals' SuperNodes.
        run: The study's public design.
        wait: Seconds to wait for every hospital of the roster to answer hello.
        timeout: Seconds each hospital has to answer each message.
        missing: What a hospital that refuses, fails or does not reply in time does to
            the run: "stop" it after the rounds done, or "continue" without that
            hospital's reply in that round (it is asked again the next; a masked round
            still needs the sum's quorum, else the run stops).
        checkpoint: A file the server's state is written to after each round, and
            resumed from if it exists.
        he_keys: The public key file of an encrypted study.
        grace: Seconds to wait, mid-run, for a hospital whose SuperNode went away (the
            SuperLink lost it, or its ClientApp stopped) to come back, announcing the
            same hello; it is then asked again for the same exchange, which it answers
            as before without being charged twice (a masked exchange excepted). 0: its
            failure counts at once, as `missing` says. A refusal is never waited for.
        receipts: A folder the hospitals' signed receipts of their charges are kept in
            (one folder a hospital), for `dpfl privacy verify --receipts`.

    Returns:
        The model and how far the run got: the hospitals' ε, and who refused or why the
        run stopped early; each hospital's metrics of the final model, if it completed.
    """
    if missing not in ("stop", "continue"):
        raise ValueError(f"missing must be 'stop' or 'continue', got {missing!r}")
    laps = [("", time.monotonic())]  # (phase, when it ended): where the time went

    def lap(phase: str) -> None:
        laps.append((phase, time.monotonic()))

    server = Server(grid, run, timeout, grace, receipts=receipts)
    serving = _Serving.met(server, wait, he_keys, missing == "continue")
    lap("hellos")
    serving.resume(checkpoint)
    ready = serving.calibrated() and serving.plans_accepted()
    lap("calibration and plans")
    if ready and serving.trained(checkpoint):
        lap("rounds")
        serving.evaluate()
        lap("evaluation")
    LOG.info(  # before the summary, which ends the log
        "time: %s",
        ", ".join(f"{p} {t - laps[i][1]:.2f}s" for i, (p, t) in enumerate(laps[1:])),
    )
    serving.summary(laps[-1][1] - laps[0][1])
    return serving.result


@dataclass
class _Serving:
    """One call of `serve`, in phases: `met` (the roster's hospitals said hello),
    `resume` (the algorithm's state, from the checkpoint if there is one), `calibrated`
    (σ from the hospitals' budgets, where the study calibrates it), `plans_accepted`
    (each hospital checked its plan), `trained` (the rounds), `evaluate` (the final model
    at each hospital) and `summary`."""

    server: Server
    silos: list[SiloInfo]
    shape: list[int]
    classes: int
    open_sum: Opener
    go_on: bool
    """`missing="continue"`: a hospital that fails is left out of its round."""
    algorithm: Algorithm
    result: DeploymentResult
    state: State = field(default_factory=dict)
    public: dict[str, Any] = field(default_factory=dict)
    """The run's public facts, which every message carries."""
    resumed: bool = False

    @property
    def run(self) -> Deployment:
        return self.server.run

    @property
    def node(self) -> dict[str, int]:
        """Each hospital's node, by name (a hospital that came back may be on a new one)."""
        return {name: n for n, name in self.server.names.items()}

    @classmethod
    def met(cls, server: Server, wait: float, he_keys: Path | None, go_on: bool) -> _Serving:
        """The roster's hospitals, once each said hello, and the public facts they
        announced: one feature shape, one kind of labels."""
        known = server.hospitals(wait)
        for name, (_, hello) in known.items():
            announced = (tuple(hello["shape"]), int(hello["classes"]))
            if server.run.schema not in (None, announced):
                raise DeploymentError(
                    f"{name}'s records have shape {list(announced[0])} and "
                    f"{_classes(announced[1])}; the study declares "
                    f"{list(server.run.schema[0])} and {_classes(server.run.schema[1])}"
                )
        shapes = {tuple(hello["shape"]) for _, hello in known.values()}
        if len(shapes) != 1:
            raise DeploymentError(f"the hospitals' records have different shapes: {sorted(shapes)}")
        tasks = {int(hello["classes"]) == SURVIVAL for _, hello in known.values()}
        if len(tasks) != 1:
            raise DeploymentError("some hospitals hold survival labels and others classes")
        classes = max(int(hello["classes"]) for _, hello in known.values())
        silos = [SiloInfo(name, int(hello["public-size"])) for name, (_, hello) in known.items()]
        server.names = {n: name for name, (n, _) in known.items()}
        server.greeted = {name: hello for name, (_, hello) in known.items()}
        open_sum = deployed(server.run.summing).opener(server.greeted, he_keys)
        shape = list(shapes.pop())
        algorithm = server.run.build(silos, shape, classes)
        result = DeploymentResult(0, parameters_of(algorithm.model), silos, {}, {})
        return cls(server, silos, shape, classes, open_sum, go_on, algorithm, result)

    def resume(self, checkpoint: Path | None) -> None:
        """The algorithm's initial state and a new run instance, or the checkpoint's."""
        result = self.result
        self.state = self.algorithm.initial_state(self.silos)
        result.instance = uuid.uuid4().hex[:16]
        saved = None if checkpoint is None else Checkpoint(checkpoint).load(self.run, self.silos)
        if saved is not None:
            result.instance, result.rounds_completed = saved["instance"], saved["round"]
            self.state, result.params = saved["state"], saved["state"]["global"]
            result.epsilon, result.absent = saved["epsilon"], saved["absent"]
            self.resumed = True
            LOG.info(
                "resuming instance %s after round %d", result.instance, result.rounds_completed
            )
        self.public = {
            "study": self.run.key,
            "instance": result.instance,
            "silos": [s.name for s in self.silos],
            "sizes": [s.public_size for s in self.silos],
            "shape": self.shape,
            "classes": self.classes,
        }

    def calibrated(self) -> bool:
        """Where the study calibrates σ: each hospital publishes the least σ its budget
        allows for the study's plan; the run uses the largest ("common") or each its own
        ("per-silo"), stated in every later message. Each hospital then checks its whole
        plan at that σ (`plans_accepted`). False if a hospital has no σ to give."""
        calibration, result = self.run.calibration, self.result
        if calibration is None:
            return True
        asked = {n: {**self.public, "round": result.rounds_completed} for n in self.node.values()}
        least = {}
        for n, answer in self.server.ask("query.calibrate", asked).items():
            if "refused" in answer:
                result.refused[self.server.names[n]] = str(answer["refused"])
            else:
                least[self.server.names[n]] = float(answer["noise"])
        if result.refused:
            return False
        common = max(least.values())
        result.noise = least if calibration == "per-silo" else dict.fromkeys(least, common)
        self.public["noise"] = [result.noise[s.name] for s in self.silos]
        self.algorithm = (
            self.algorithm.with_silo_noise(result.noise)
            if calibration == "per-silo"
            else self.algorithm.with_noise(common)
        )
        if not self.resumed:  # as the simulator: the initial state of the calibrated one
            self.state = self.algorithm.initial_state(self.silos)
        LOG.info(
            "σ calibrated (%s) to the hospitals' budgets: %s",
            calibration,
            ", ".join(f"{name} {least[name]:.6g}" for name in sorted(least))
            + ("" if calibration == "per-silo" else f"; the run's σ is {common:.6g}"),
        )
        return True

    def plans_accepted(self) -> bool:
        """Each hospital checks the rounds left against its budget. With
        `missing="stop"`, a refusal ends the run before it trains (False)."""
        start, result = self.result.rounds_completed, self.result
        if start < self.run.rounds:
            asked = {n: {**self.public, "round": start} for n in self.node.values()}
            for n, plan in self.server.ask("query.plan", asked).items():
                if not plan["accepted"] and not self.go_on:
                    result.refused[self.server.names[n]] = str(plan["refused"])
        return not result.refused

    def trained(self, checkpoint: Path | None) -> bool:
        """The rounds left, the state checkpointed after each; False if a hospital
        refused, failed or was late and stopped the run (`result.refused`,
        `result.stopped`)."""
        algorithm, result = self.algorithm, self.result
        for round_ in range(result.rounds_completed, self.run.rounds):
            began, replied = time.monotonic(), set[str]()
            rng = Streams(self.run.seed, round_, stream_rng)
            absent: list[tuple[str, str]] | None = [] if self.go_on else None
            for exchange in range(algorithm.exchanges(self.silos)):
                cohort = partial(rng, 0, -1)
                orders = algorithm.configure(self.state, round_, self.silos, cohort, exchange)
                common = {**self.public, "round": round_, "exchange": exchange}
                try:  # a hospital gone, failing or refusing: keep what is done
                    summing, replies = self.exchange(orders, common, absent)
                    replied |= replies.keys()
                    if result.refused:  # nothing of this round is aggregated
                        return False
                    if replies:
                        self.state = algorithm.next_state(self.state, replies, summing)
                except (DeploymentError, SecureAggregationError, HomomorphicError) as exc:
                    result.stopped = f"round {round_}: {exc}"
                    return False
            for name, why in absent or []:
                LOG.warning("round %d goes on without %s", round_, why)
                result.absent.append((round_, name, why))
            result.rounds_completed, result.params = round_ + 1, self.state["global"]
            if checkpoint is not None:
                Checkpoint(checkpoint).save(self.run, result, self.state)
            LOG.info(
                "round %d of %d: %d of %d hospitals replied (%s) in %.1fs; %s",
                round_,
                self.run.rounds,
                len(replied),
                len(self.node),
                ", ".join(sorted(replied)),
                time.monotonic() - began,
                self.largest_epsilon(),
            )
        return True

    def largest_epsilon(self) -> str:
        """The largest ε the hospitals reported so far, and whose."""
        reported = self.result.epsilon
        if not reported:
            return "no ε reported yet"
        name = max(reported, key=lambda n: reported[n])
        return f"largest ε so far {reported[name]:.4g} ({name}, reported)"

    def exchange(
        self,
        orders: Mapping[str, Instruction],
        common: Mapping[str, Any],
        absent: list[tuple[str, str]] | None,
    ) -> tuple[ExchangeSum, dict[str, Reply]]:
        """One exchange: its sum opened, its instructions sent, the replies received
        (protected as the study says), each hospital's ε noted in `result`; the sum the
        algorithm will learn the replies' total from. A refusal goes to
        `result.refused`, or with an `absent` list there, as a failure does."""
        algorithm, result = self.algorithm, self.result
        ask = partial(self.server.ask_named, common=common, absent=absent)
        exchanges = algorithm.exchanges(result.silos)
        summing = self.open_sum(
            Exchange(
                ask,
                partial(self.server.ask_named, common=common),
                self.run.roster,
                list(orders),
                flat(result.params).numel(),
                algorithm.fewest_replies(len(result.silos)),
                exchange_number(common["round"], common["exchange"], exchanges),
            )
        )
        extra = summing.instructed(list(orders))
        asked = {
            name: {
                "cohort": [s.name for s in order.cohort],
                "params": b""
                if order.params is None
                else encode(Encoding.FLOAT32, flat(order.params)),
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
            if summing.carried in fields:
                replies[name] = summing.received(name, fields)
            elif CARRIED & fields.keys():
                raise DeploymentError(
                    f"{name}'s reply is not summed as the study says ({self.run.summing})"
                )
        return summing, replies

    def evaluate(self) -> None:
        """Each hospital's metrics of the final model on its own test set, as the study's
        `[evaluation]` releases them: read off its noisy counts ("dp"), or as it sent
        them ("clear"); and the union of the test sets where every hospital's counts
        may be combined. A hospital that refuses is logged, and has no metrics."""
        plan = self.run.evaluation
        if not plan.queries:
            return
        final = encode(Encoding.FLOAT32, flat(self.result.params))
        scored = self.server.ask_named(
            "evaluate",
            {name: {"params": final} for name in self.node},
            common={**self.public, "round": self.run.rounds - 1},
            absent=[] if self.go_on else None,
        )
        for name, fields in scored.items():
            if "refused" in fields:
                LOG.warning("%s refused the evaluation: %s", name, fields["refused"])
        answered = {n: f for n, f in scored.items() if f.get("metrics")}
        if plan.release == "dp":
            self.noisy_metrics(answered)
        else:
            self.clear_metrics(answered)

    def noisy_metrics(self, answered: Mapping[str, Mapping[str, Any]]) -> None:
        """Each hospital's metrics, and the union's, read off its DP counts."""
        plan, result = self.run.evaluation, self.result
        counted = {}
        for name, fields in answered.items():
            if "noisy" not in fields:
                raise DeploymentError(f"{name}'s evaluation is not the study's DP counts")
            result.epsilon[name] = float(fields["epsilon"])
            counted[name] = plan.counted(fields["noisy"])
            if _scored(counted[name]):
                result.metrics[name] = union_metrics([counted[name]], [])
        pooled = [n for n, f in answered.items() if f["union"]]
        self.union([counted[n] for n in pooled], [], [n for n in answered if n not in pooled])

    def clear_metrics(self, answered: Mapping[str, Mapping[str, Any]]) -> None:
        """Each hospital's metrics as it sent them, outside ε, and the union's from their
        `union_counts`."""
        self.result.metrics = {
            name: dict(zip(fields["names"], fields["values"], strict=True))
            for name, fields in answered.items()
        }
        counted = [fields for fields in answered.values() if "cells" in fields]
        losses = [
            (self.result.metrics[name]["loss"], int(fields["records"]))
            for name, fields in answered.items()
            if "cells" in fields and "loss" in self.result.metrics[name]
        ]
        self.union(counted, losses, [n for n, f in answered.items() if "cells" not in f])

    def union(
        self,
        counted: Sequence[Mapping[str, Any]],
        losses: Sequence[tuple[float, int]],
        withheld: Sequence[str],
    ) -> None:
        """The union of every test set, where every hospital's counts are there."""
        if withheld:  # a hospital deployed with --no-union: its own metrics only
            LOG.info("no union of the test sets: %s withheld its counts", ", ".join(withheld))
        if counted and len(counted) == len(self.node) and _scored(*counted):
            self.result.union = union_metrics(counted, losses)

    def summary(self, seconds: float) -> None:
        """One line at the end: how far the run got, in how long, ε and the union's
        metrics, or why it stopped."""
        result = self.result
        why = [f"{name} refused: {reason}" for name, reason in result.refused.items()]
        why += [result.stopped] if result.stopped else []
        union = ", ".join(f"{k} {v:.4f}" for k, v in result.union.items() if k != "loss")
        LOG.info(
            "%s after %d of %d rounds in %.1fs; %s%s",
            "stopped" if why else "finished",
            result.rounds_completed,
            self.run.rounds,
            seconds,
            self.largest_epsilon().replace(" so far", ""),
            f"; {'; '.join(why)}"
            if why
            else (f"; union of the test sets: {union}" if union else ""),
        )


def _scored(*counted: Mapping[str, Any]) -> bool:
    """Whether the counts leave a record to score (noisy counts clamped at 0 may not)."""
    return any(sum(c.get("confusion", c["counts"])) for c in counted)


def _classes(classes: int) -> str:
    """A hello's classes, in words."""
    return "survival labels" if classes == SURVIVAL else f"{classes} classes"
