"""Secure aggregation: how the server learns the sum of the hospitals' replies.

Every sum here satisfies `dpfl.federation.messages.SecureSum`. `InTheClear` shows the
server each reply (and so suits robust aggregators, never an algorithm whose accounting
needs the replies hidden). `IdealSecureSum` is the ideal functionality of secure
aggregation inside one process: the server's code is handed the sum of every reply and
nothing else, which is what masking or homomorphic encryption guarantee across machines;
the simulator uses it for algorithms that need a secure sum (Dopamine).
`masking.PairwiseMasking` is the real protocol (SecAgg with dropout recovery);
`he.HomomorphicSum` does it by BFV encryption (TenSEAL): the server adds ciphertexts, a
key holder that is not the server decrypts the sum.

Each is a `SecureMode` (`base`), a study file's `secure_aggregation`, declared beside its
sum; `MODES` lists them: adding a mode adds its module and its entry there (and, where it
deploys, its Flower halves: `dpfl.engines.flower.sums`). Nothing else in dpfl compares a
mode's name (tests/test_registry_names.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import Tensor

from dpfl.federation.messages import SecureSum, Summed
from dpfl.secure import he, masking
from dpfl.secure.base import Dropouts, SecureMode, dropped, plain_sum

__all__ = [
    "IDEAL",
    "MODES",
    "NONE",
    "Dropouts",
    "IdealSecureSum",
    "InTheClear",
    "SecureMode",
    "by_name",
    "default_mode",
    "dropped",
    "mode",
    "plain_sum",
]


@dataclass(frozen=True)
class InTheClear:
    """The server receives every reply as sent and adds them up itself."""

    @property
    def reveals_inputs(self) -> bool:
        return True

    def __call__(self, vectors: Mapping[str, Tensor], *, at_least: int = 1) -> Summed:
        return plain_sum(vectors, at_least)


@dataclass(frozen=True)
class IdealSecureSum:
    """Only the sum reaches the server (the simulator's stand-in for secure aggregation:
    one process holds the replies, the algorithm's server half sees only their sum).
    `dropouts`: hospitals whose replies never arrive."""

    dropouts: Dropouts = frozenset()

    @property
    def reveals_inputs(self) -> bool:
        return False

    def __call__(self, vectors: Mapping[str, Tensor], *, at_least: int = 1) -> Summed:
        lost = dropped(self.dropouts, tuple(vectors))
        return plain_sum({n: v for n, v in vectors.items() if n not in lost}, at_least)


NONE = SecureMode(
    name="none",
    described="none: the server sees every reply",
    hides_replies=False,
    exact=True,
    deployed_in="clear",
    key_holder=False,
    sums=InTheClear,
)
IDEAL = SecureMode(
    name="ideal",
    described="simulated by its ideal functionality: one process holds the replies and "
    "hands the server's code their sum only (a deployment needs masking or HE)",
    hides_replies=True,
    exact=True,
    deployed_in=None,
    key_holder=False,
    sums=IdealSecureSum,
)

MODES: Mapping[str, SecureMode] = {m.name: m for m in (NONE, IDEAL, masking.MODE, he.MODE)}
"""The registry: every `secure_aggregation` by the name a study file gives it, in the
order the study file's schema lists them."""


def mode(name: str) -> SecureMode:
    """The mode a study file names; ValueError naming the known ones."""
    if name not in MODES:
        *most, last = MODES
        raise ValueError(f"unknown secure aggregation {name!r}: {', '.join(most)} or {last}")
    return MODES[name]


def by_name(name: str) -> SecureSum:
    """The simulator's sum of a study's `secure_aggregation`."""
    return mode(name).sum()


def default_mode(hides_replies: bool) -> SecureMode:
    """The exact sum that hides the replies or shows them: the simulator's default (and
    its stand-in for a cryptographic sum, whose replies it sums alike)."""
    (found,) = (m for m in MODES.values() if m.exact and m.hides_replies == hides_replies)
    return found
