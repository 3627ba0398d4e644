"""What every secure sum shares: who drops out, the plain sum, and `SecureMode`, one
`secure_aggregation` of a study file (its sums, its text, its facts), declared beside its
sum's code and listed in the registry (`dpfl.secure.MODES`)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from dpfl.federation.messages import SecureSum, Summed

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
class SecureMode:
    """One `secure_aggregation` a study file may name: how the simulator sums the replies
    and the statistics' vectors, what the datasheet says of it, and its facts, which the
    rest of dpfl reads instead of its name. A deployment's halves of it are the Flower
    engine's (`dpfl.engines.flower.sums`)."""

    name: str
    """The study file's value, stored as such in every run key."""
    described: str
    """What the datasheet says of it."""
    hides_replies: bool
    """The server learns the sum of the replies only (an algorithm whose ε needs a
    secure sum runs with no other kind)."""
    exact: bool
    """It adds the replies as they are, in floating point (no fixed point, no
    cryptography): the simulator's default, a secure sum's ideal functionality or none."""
    deployed_in: str | None
    """The module of the Flower engine (`dpfl.engines.flower.<deployed_in>`) whose
    `HALVES` run it across machines; None: simulation only (the ideal functionality
    needs the replies in one process)."""
    key_holder: bool
    """A hospital holds a secret key that decrypts the sum (HE): a deployment names it."""
    sums: Callable[[], SecureSum]
    """The simulator's sum of the replies (a new one per run)."""
    stats_sums: Callable[[], SecureSum] | None = None
    """The statistics' sum (`dpfl stats`), where it is not `sums`' (a wider ring)."""

    @property
    def deployable(self) -> bool:
        return self.deployed_in is not None

    def sum(self) -> SecureSum:
        return self.sums()

    def stats_sum(self) -> SecureSum:
        return (self.stats_sums or self.sums)()
