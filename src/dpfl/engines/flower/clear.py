"""Replies in the clear (`secure_aggregation = "none"`), deployed: each hospital sends
its reply as it is, and the server reads each and adds them up itself."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from dpfl import secure
from dpfl.engines.flower.protocol import Exchange
from dpfl.engines.flower.sums import DeployedSum
from dpfl.federation.algorithms.base import Reply
from dpfl.federation.messages import Encoding, decode, encode
from dpfl.secure import InTheClear

if TYPE_CHECKING:
    from dpfl.engines.flower.hospital import Hospital


class ClearReply:
    """The reply as it is, in its wire encoding: the server sees it."""

    resent: ClassVar[bool] = True

    def announced(self, hospital: Hospital) -> dict[str, Any]:
        return {}

    def refusal(self, hospital: Hospital, fields: Mapping[str, Any]) -> str | None:
        return None

    def protected(
        self, hospital: Hospital, fields: Mapping[str, Any], reply: Reply, at: int
    ) -> dict[str, Any]:
        return {
            "vector": encode(reply.encoding, reply.vector),
            "encoding": reply.encoding.value,
            "length": reply.vector.numel(),
        }

    def released(
        self, hospital: Hospital, fields: Mapping[str, Any], vector: Tensor
    ) -> dict[str, Any]:
        return {"vector": vector.numpy().astype("<f8").tobytes()}


@dataclass(frozen=True)
class ClearSum(InTheClear):
    """One exchange's sum when replies travel in the clear: the server reads each reply
    and adds them up itself."""

    carried: ClassVar[str] = "vector"

    @classmethod
    def opener(
        cls, hellos: Mapping[str, Mapping[str, Any]], keys: Path | None
    ) -> Callable[[Exchange], ClearSum]:
        """How the server opens each exchange's sum: nothing to set up."""
        return cls.open

    @classmethod
    def open(cls, exchange: Exchange) -> ClearSum:
        return cls()

    def instructed(self, names: Sequence[str]) -> dict[str, dict[str, Any]]:
        return {name: {} for name in names}

    def received(self, name: str, fields: Mapping[str, Any]) -> Reply:
        encoding = Encoding(fields["encoding"])
        vector = decode(encoding, bytes(fields["vector"]), int(fields["length"]))
        return Reply(vector, encoding)


@dataclass(frozen=True)
class ClearStats(ClearSum):
    """The statistics' replies in the clear: float64 vectors, the server's sum exact."""

    @classmethod
    def opener(
        cls, hellos: Mapping[str, Mapping[str, Any]], keys: Path | None
    ) -> Callable[[Exchange], ClearStats]:
        return lambda exchange: cls()

    def received(self, name: str, fields: Mapping[str, Any]) -> Reply:
        vector = np.frombuffer(bytes(fields["vector"]), dtype="<f8").astype(np.float64)
        return Reply(torch.from_numpy(vector))


HALVES = DeployedSum(secure.NONE, ClearReply(), ClearSum.opener, ClearStats.opener)
