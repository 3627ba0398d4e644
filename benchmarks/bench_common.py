"""What every benchmark script shares: its log goes to stderr, so that stdout carries
only its table or its one JSON object (`--json`)."""

from __future__ import annotations

import logging
import sys


def log_to_stderr(log: logging.Logger) -> None:
    """Send `log`'s INFO messages, bare, to stderr and nowhere else."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
