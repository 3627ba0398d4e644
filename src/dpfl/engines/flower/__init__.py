"""The Flower engine: a study deployed on Flower's runtime (SuperLink, SuperNodes), with
the same algorithm objects as the simulator split where they belong. The server half
(`configure`, `aggregate`) runs in a ServerApp (`dpfl.engines.flower.server.serve`), the
hospital half (`client_update`) in a ClientApp at each hospital
(`client_app`); both build the algorithm from the same
`Deployment` (`dpfl.engines.flower.protocol`), which `dpfl.experiments.study.deployment` reads
from each machine's copy of the study file. This module gathers what the rest of dpfl
uses of them.
"""

from __future__ import annotations

from flwr.clientapp import ClientApp

from dpfl.engines.flower import (  # noqa: F401 - each mode's module registers its halves
    clear,
    he,
    hospital,
    masking,
)
from dpfl.engines.flower.analytics import HOSPITAL
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


def client_app(deployment_of: DeploymentOf) -> ClientApp:
    """The hospital half, with the statistics' messages (`flower.analytics`)."""
    return hospital.client_app(deployment_of, HOSPITAL)


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
