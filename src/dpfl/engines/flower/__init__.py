"""The Flower engine: a study deployed on Flower's runtime (SuperLink, SuperNodes), with
the same algorithm objects as the simulator split where they belong. The server half
(`configure`, `aggregate`) runs in a ServerApp (`dpfl.engines.flower.server.serve`), the
hospital half (`client_update`) in a ClientApp at each hospital
(`client_app`); both build the algorithm from the same
`Deployment` (`dpfl.engines.flower.protocol`), which `dpfl.experiments.study.deployment` reads
from each machine's copy of the study file. This module gathers what the rest of dpfl
uses of them, each imported on first use: importing `protocol` need not load Flower.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flwr.clientapp import ClientApp

    from dpfl.engines.flower.hospital import HospitalConfig
    from dpfl.engines.flower.protocol import (
        SURVIVAL,
        Deployment,
        DeploymentError,
        DeploymentOf,
        Evaluation,
        NodeUnavailable,
    )
    from dpfl.engines.flower.server import Checkpoint, DeploymentResult, serve

_LAZY = {
    "SURVIVAL": "protocol",
    "Checkpoint": "server",
    "Deployment": "protocol",
    "DeploymentError": "protocol",
    "DeploymentOf": "protocol",
    "DeploymentResult": "server",
    "Evaluation": "protocol",
    "HospitalConfig": "hospital",
    "NodeUnavailable": "protocol",
    "serve": "server",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)


def client_app(deployment_of: DeploymentOf) -> ClientApp:
    """The hospital half, with the statistics' messages (`flower.analytics`)."""
    from dpfl.engines.flower import analytics, hospital

    return hospital.client_app(deployment_of, analytics.HOSPITAL)


__all__ = [
    "SURVIVAL",
    "Checkpoint",
    "Deployment",
    "DeploymentError",
    "DeploymentOf",
    "DeploymentResult",
    "Evaluation",
    "HospitalConfig",
    "NodeUnavailable",
    "client_app",
    "serve",
]
