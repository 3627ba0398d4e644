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
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from dpfl.federation.messages import SecureSum, Summed

__all__ = ["Dropouts", "IdealSecureSum", "InTheClear", "by_name", "dropped", "plain_sum"]

Dropouts = Collection[str] | Callable[[tuple[str, ...]], Collection[str]]
"""Who drops out of a sum: names, or a function of the names sending replies (tests and
simulations of unreliable hospitals)."""


def dropped(dropouts: Dropouts, names: tuple[str, ...]) -> frozenset[str]:
    """The names among `names` that drop out."""
    chosen = dropouts(names) if callable(dropouts) else dropouts
    return frozenset(chosen) & frozenset(names)


def plain_sum(vectors: Mapping[str, Tensor], at_least: int = 1) -> Summed:
    """The sum of the vectors, added in their order, and who is in it (at least
    `at_least`)."""
    if not vectors:
        raise ValueError("nothing to sum: no replies")
    if len(vectors) < at_least:
        raise ValueError(
            f"{len(vectors)} replies, fewer than the {at_least} the sum needs; not revealed"
        )
    shapes = {tuple(v.shape) for v in vectors.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(f"replies must be flat vectors of one length, got shapes {shapes}")
    replies = iter(vectors.values())
    total = next(replies).clone()
    for vector in replies:  # one pass over each reply (stacking first copies them all)
        total += vector
    if not bool(torch.isfinite(total).all()):
        raise ValueError("a reply contains NaN or infinity; refusing to sum it")
    return Summed(total, tuple(vectors))


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


def by_name(kind: str) -> SecureSum:
    """A study's `secure_aggregation`: "none", "ideal", "masking" or "he" (defaults)."""
    if kind == "none":
        return InTheClear()
    if kind == "ideal":
        return IdealSecureSum()
    if kind == "masking":
        from dpfl.secure.masking import PairwiseMasking

        return PairwiseMasking()
    if kind == "he":
        from dpfl.secure.he import HomomorphicSum  # TenSEAL loads only when chosen

        return HomomorphicSum()
    raise ValueError(f"unknown secure aggregation {kind!r}: none, ideal, masking or he")
