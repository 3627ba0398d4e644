"""Engines that run federated algorithms: `simulation` (in one process, the default)."""
