"""dpfl: differentially private federated learning for medical data.

The names a notebook needs are here, imported on first use (so that `dpfl --version`
does not load torch); README.md shows a whole study in five lines.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("dpfl")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

_LAZY = {
    "simulate": ("dpfl.engines.simulation", "simulate"),
    "RunPlan": ("dpfl.engines.plan", "RunPlan"),
    "keep_freed_memory": ("dpfl.allocator", "keep_freed_memory"),
    "Silo": ("dpfl.federation.silo", "Silo"),
    "silos_from_dataset": ("dpfl.federation.silo", "silos_from_dataset"),
    "DPSGDConfig": ("dpfl.local.dpsgd", "DPSGDConfig"),
    "Ledger": ("dpfl.privacy.ledger", "Ledger"),
    "algorithms": ("dpfl.federation.algorithms", None),
    "data": ("dpfl.data", None),
    "local": ("dpfl.local", None),
    "models": ("dpfl.models", None),
    "privacy": ("dpfl.privacy", None),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'dpfl' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    loaded = import_module(module)
    return loaded if attribute is None else getattr(loaded, attribute)


__all__ = ["__version__", *_LAZY]
