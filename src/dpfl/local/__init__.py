"""One silo's private training: DP-SGD with per-example clipping, and output perturbation.

Nothing here talks to other silos. Every entry point returns the `PrivacyEvent` of what it
ran, for the caller to record in the silo's ledger before releasing the result.
"""

from dpfl.local.clipping import ClippedGradientSum, Params
from dpfl.local.dpsgd import DPSGD, DPSGDConfig, LocalResult, StackedResult, parameters_of, stack
from dpfl.local.losses import Loss, bce, cross_entropy, focal, weighted_bce
from dpfl.local.noise import NoiseSource, SecureNoise, SeededNoise
from dpfl.local.output_perturbation import AOPConfig, AOPResult, output_perturbation

__all__ = [
    "DPSGD",
    "AOPConfig",
    "AOPResult",
    "ClippedGradientSum",
    "DPSGDConfig",
    "LocalResult",
    "Loss",
    "NoiseSource",
    "Params",
    "SecureNoise",
    "SeededNoise",
    "StackedResult",
    "bce",
    "cross_entropy",
    "focal",
    "output_perturbation",
    "parameters_of",
    "stack",
    "weighted_bce",
]
