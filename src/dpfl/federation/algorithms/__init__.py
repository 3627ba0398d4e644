"""Federated algorithms of the seed papers, one module each, and their registry: an
algorithm's module declares the algorithm and its settings (how a study's `[algorithm]`
describes it, and how it is built from them); `AlgorithmSettings` below names each
algorithm's settings once, and everything else (the study schema, the factory, the
deployment, the tests) finds the algorithms here, beside the server optimisers they take
(`dpfl.federation.server_optimizers`)."""

from typing import Annotated, get_args

from pydantic import Field

from dpfl.federation.algorithms.aop import AOP, AOPSettings
from dpfl.federation.algorithms.base import (
    Algorithm,
    DPSGDAlgorithm,
    HospitalContext,
    Instruction,
    LocalState,
    Member,
    Reply,
    State,
)
from dpfl.federation.algorithms.centralized import Centralized, CentralizedSettings
from dpfl.federation.algorithms.cyclic import Cyclic, CyclicSettings
from dpfl.federation.algorithms.ditto import Ditto, DittoSettings
from dpfl.federation.algorithms.fedavg import FedAvg, FedAvgSettings
from dpfl.federation.algorithms.fedsgd_secure import FedSGDSecure, FedSGDSecureSettings
from dpfl.federation.algorithms.finetune import Finetune, FinetuneSettings
from dpfl.federation.algorithms.local import Local, LocalSettings
from dpfl.federation.algorithms.mrmtl import MRMTL, MRMTLSettings
from dpfl.federation.algorithms.settings import DPSGDSettings, Parts
from dpfl.federation.algorithms.sign import Sign, SignSettings
from dpfl.federation.server_optimizers import (
    Averaging,
    FedAdagrad,
    FedAdam,
    FedAvgM,
    FedYogi,
    ServerOptimizer,
)

AlgorithmSettings = Annotated[
    FedAvgSettings
    | SignSettings
    | CyclicSettings
    | FedSGDSecureSettings
    | AOPSettings
    | MRMTLSettings
    | DittoSettings
    | FinetuneSettings
    | LocalSettings
    | CentralizedSettings,
    Field(discriminator="name"),
]
"""A study's `[algorithm]`: the settings of the algorithm it names. The registry: adding
an algorithm adds its settings here."""

SETTINGS: dict[str, type[DPSGDSettings]] = {
    settings.algorithm.name: settings for settings in get_args(get_args(AlgorithmSettings)[0])
}
"""Every algorithm's settings by the name a study file gives the algorithm."""

BY_NAME: dict[str, type[Algorithm]] = {name: s.algorithm for name, s in SETTINGS.items()}
"""Every algorithm by the name a study file gives it."""

__all__ = [
    "AOP",
    "BY_NAME",
    "MRMTL",
    "SETTINGS",
    "Algorithm",
    "AlgorithmSettings",
    "Averaging",
    "Centralized",
    "Cyclic",
    "DPSGDAlgorithm",
    "DPSGDSettings",
    "Ditto",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedSGDSecure",
    "FedYogi",
    "Finetune",
    "HospitalContext",
    "Instruction",
    "Local",
    "LocalState",
    "Member",
    "Parts",
    "Reply",
    "ServerOptimizer",
    "Sign",
    "State",
]
