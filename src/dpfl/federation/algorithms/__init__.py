"""Federated algorithms of the seed papers, one module each."""

from dpfl.federation.algorithms.aop import AOP
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
from dpfl.federation.algorithms.centralized import Centralized
from dpfl.federation.algorithms.cyclic import Cyclic
from dpfl.federation.algorithms.ditto import Ditto
from dpfl.federation.algorithms.fedavg import FedAvg
from dpfl.federation.algorithms.fedsgd_secure import FedSGDSecure
from dpfl.federation.algorithms.finetune import Finetune
from dpfl.federation.algorithms.local import Local
from dpfl.federation.algorithms.mrmtl import MRMTL
from dpfl.federation.algorithms.sign import Sign

BY_NAME: dict[str, type[Algorithm]] = {
    kind.name: kind
    for kind in (
        FedAvg,
        Sign,
        Cyclic,
        FedSGDSecure,
        AOP,
        MRMTL,
        Ditto,
        Finetune,
        Local,
        Centralized,
    )
}
"""Every algorithm by the name a study file gives it."""

__all__ = [
    "AOP",
    "BY_NAME",
    "MRMTL",
    "Algorithm",
    "Centralized",
    "Cyclic",
    "DPSGDAlgorithm",
    "Ditto",
    "FedAvg",
    "FedSGDSecure",
    "Finetune",
    "HospitalContext",
    "Instruction",
    "Local",
    "LocalState",
    "Member",
    "Reply",
    "Sign",
    "State",
]
