"""Federated algorithms of the seed papers, one module each."""

from dpfl.federation.algorithms.aop import AOP
from dpfl.federation.algorithms.base import Algorithm, DPSGDAlgorithm, RoundContext, State
from dpfl.federation.algorithms.centralized import Centralized
from dpfl.federation.algorithms.cyclic import Cyclic
from dpfl.federation.algorithms.fedavg import FedAvg
from dpfl.federation.algorithms.fedsgd_secure import FedSGDSecure
from dpfl.federation.algorithms.sign import Sign

__all__ = [
    "AOP",
    "Algorithm",
    "Centralized",
    "Cyclic",
    "DPSGDAlgorithm",
    "FedAvg",
    "FedSGDSecure",
    "RoundContext",
    "Sign",
    "State",
]
