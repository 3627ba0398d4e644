"""Shared fixtures. Real datasets live in ../shared/data beside the project checkout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("DPFL_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data directory: skipped (with the reason) on a user's machine without
    it, but a hard failure under CI, where a missing file must not pass silently."""
    if SHARED_DATA.is_dir():
        return SHARED_DATA
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but the shared data directory {SHARED_DATA} is missing")
    pytest.skip(f"shared data not found at {SHARED_DATA} (set DPFL_SHARED_DATA to use it)")
