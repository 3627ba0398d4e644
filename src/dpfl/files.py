"""Files replaced in one step: a crash while one is written leaves the previous one whole
(checkpoints, a hospital's local state, a key holder's memory, a study's identity)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["replacing"]


@contextmanager
def replacing(target: Path, partial: Path | None = None) -> Iterator[Path]:
    """The path to write `target`'s new contents to (by default `target` with ".partial"
    added); when the block ends without an error it takes `target`'s name (`os.replace`,
    atomic), so a reader finds the old file or the new one, never half of one."""
    written = partial or target.with_name(target.name + ".partial")
    yield written
    os.replace(written, target)
