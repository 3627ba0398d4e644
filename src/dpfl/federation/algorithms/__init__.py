"""Federated algorithms of the seed papers, one module each."""

from dpfl.federation.algorithms.base import Algorithm, DPSGDAlgorithm, RoundContext, State
from dpfl.federation.algorithms.cyclic import Cyclic
from dpfl.federation.algorithms.fedavg import FedAvg

__all__ = ["Algorithm", "Cyclic", "DPSGDAlgorithm", "FedAvg", "RoundContext", "State"]
