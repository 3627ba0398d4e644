"""Federated algorithms (one module each), aggregators and message accounting."""
