"""Federated algorithms of the seed papers, one module each."""

from dpfl.federation.algorithms.base import Algorithm, DPSGDAlgorithm, RoundContext, State
from dpfl.federation.algorithms.cyclic import Cyclic
from dpfl.federation.algorithms.fedavg import FedAvg
from dpfl.federation.algorithms.fedsgd_secure import FedSGDSecure

__all__ = [
    "Algorithm",
    "Cyclic",
    "DPSGDAlgorithm",
    "FedAvg",
    "FedSGDSecure",
    "RoundContext",
    "State",
]
