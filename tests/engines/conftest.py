"""Messages a server sends a deployed hospital, built by hand: what a mistaken or malicious
server could send, which the hospital must refuse before it charges anything."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict

from dpfl.engines.flower.protocol import PROTOCOL
from dpfl.experiments.study.datasets import build_silos
from dpfl.experiments.study.deployment import study_point


def public_fields(
    study: Path, names: list[str] | None = None, sizes: list[int] | None = None
) -> dict[str, Any]:
    """The public facts of round 0 of the study file's point, as the server states them:
    its key, silos, declared sizes and shapes; `names` and `sizes` replace the silos'."""
    config = study_point(study)
    silos = build_silos(config.data, config.seed)
    return {
        "study": config.key(),
        "instance": "0123456789abcdef",
        "silos": [s.name for s in silos] if names is None else names,
        "sizes": [s.declared_size for s in silos] if sizes is None else sizes,
        "shape": [silos[0].x.shape[1]],
        "classes": 2,
        "round": 0,
        "exchange": 0,
        "params": b"",
    }


def server_message(kind: str, fields: Mapping[str, Any], node: int = 2) -> Message:
    """A message of `kind` (`train`, `query.plan`, ...) from the server to `node` under
    the protocol's version, carrying `fields`."""
    return Message(
        RecordDict({"dpfl": ConfigRecord({"protocol": PROTOCOL, **fields})}),
        dst_node_id=node,
        message_type=kind,
    )
