"""Errors of the privacy layer: every refusal says what was asked and why it cannot be."""


class PrivacyError(Exception):
    """Base class for dpfl's privacy errors."""


class PrivacyParameterError(PrivacyError, ValueError):
    """A privacy parameter is impossible (q outside (0, 1], σ ≤ 0, δ ≥ 1, ...)."""


class UnsupportedAccountingError(PrivacyError, ValueError):
    """The chosen accountant cannot analyse this event; the message names one that can."""


class BudgetExceededError(PrivacyError):
    """Recording an event would take a silo past its (ε, δ) budget; nothing was recorded."""


class LedgerError(PrivacyError):
    """The ledger file is unreadable, foreign, or asked about a silo it does not have."""
