"""torch's intra-op thread count for the length of a block: small models train faster on
one thread, and the same thread count gives the same float sums in every engine."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["torch_threads"]


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch runs on `threads` threads inside the block, and on as many as before after it
    (None: the block leaves torch's setting as it is)."""
    if threads is None:
        yield
        return
    if threads < 1:
        raise ValueError(f"threads must be ≥ 1, got {threads}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
