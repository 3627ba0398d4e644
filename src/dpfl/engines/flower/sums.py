"""The deployed halves of each secure-sum mode (`dpfl.secure.SecureMode`): how a
hospital's reply leaves it (`Protection`), how the server opens each exchange's sum
(`ExchangeSum`, for training and for the statistics), and the messages of the mode's own
session a hospital answers. Each mode's module (`clear`, `masking`, `he`: the one its
`SecureMode.deployed_in` names) holds its halves as `HALVES`; the hospital and the server
find them here by the study's `secure_aggregation` (`deployed`), never by comparing its
name."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from torch import Tensor

from dpfl import secure
from dpfl.engines.flower.protocol import DeploymentError, Exchange
from dpfl.federation.algorithms.base import Reply
from dpfl.federation.messages import SecureSum
from dpfl.secure import SecureMode

if TYPE_CHECKING:
    from dpfl.engines.flower.hospital import Hospital


class Protection(Protocol):
    """How a hospital's reply leaves it, as its study's mode says."""

    resent: ClassVar[bool]
    """The reply is kept and sent again when its exchange is asked again."""

    def announced(self, hospital: Hospital) -> dict[str, Any]:
        """What the hospital's hello adds."""
        ...

    def refusal(self, hospital: Hospital, fields: Mapping[str, Any]) -> str | None:
        """Why the train message cannot be answered so protected (None: it can), checked
        before anything is charged."""
        ...

    def protected(
        self, hospital: Hospital, fields: Mapping[str, Any], reply: Reply, at: int
    ) -> dict[str, Any]:
        """The reply's fields; `at` numbers the exchange in the run."""
        ...

    def released(
        self, hospital: Hospital, fields: Mapping[str, Any], vector: Tensor
    ) -> dict[str, Any]:
        """The statistics' noisy float64 vector's fields (`flower.analytics`)."""
        ...


class ExchangeSum(SecureSum, Protocol):
    """One exchange's sum at the server, the `SecureSum` its algorithm's `aggregate`
    calls."""

    carried: ClassVar[str]
    """The reply field that carries a hospital's reply, protected as the study says."""

    def instructed(self, names: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Of the hospitals instructed (`names`), those the train message goes to, and
        what it adds for each."""
        ...

    def received(self, name: str, fields: Mapping[str, Any]) -> Reply:
        """`name`'s reply as the server holds it (in the clear, or its protected bytes)."""
        ...


Opener = Callable[[Exchange], ExchangeSum]
OpenerOf = Callable[[Mapping[str, Mapping[str, Any]], Path | None], Opener]
"""How the server opens each exchange's sum, given the hospitals' hellos by name and the
server's HE key file."""
Work = Callable[["Hospital", Mapping[str, Any]], dict[str, Any]]
"""A hospital's answer to one kind of message."""


@dataclass(frozen=True)
class DeployedSum:
    """One mode's halves in a deployment."""

    mode: SecureMode
    protection: Protection
    """The hospital's half."""
    opener: OpenerOf
    """The server's half, for training's exchanges."""
    stats_opener: OpenerOf
    """The server's half, for the statistics' exchange (`flower.analytics`)."""
    queries: Mapping[str, Work] = field(default_factory=dict)
    """The messages of the mode's own session a hospital answers, by query name."""


def deployed(name: str) -> DeployedSum:
    """The halves of the study's `secure_aggregation`, from the module its mode names
    (`SecureMode.deployed_in`), imported here on first use; DeploymentError where it has
    none (a simulator's stand-in)."""
    mode = secure.mode(name)
    if mode.deployed_in is None:
        raise DeploymentError(f"secure_aggregation {mode.name!r} is not deployable")
    halves: DeployedSum = import_module(f"dpfl.engines.flower.{mode.deployed_in}").HALVES
    return halves


def every_deployed() -> list[DeployedSum]:
    """Every deployable mode's halves, in the registry's order."""
    return [deployed(name) for name, mode in secure.MODES.items() if mode.deployable]
