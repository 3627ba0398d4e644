"""Privacy accounting: events, RDP/PLD accountants, calibration and the per-silo ledger.

This package never imports torch or training code: it only reads what mechanisms
declare. Typical use::

    from dpfl.privacy import Ledger, events

    ledger = Ledger("study.sqlite")
    ledger.register_silo("hospital-a", epsilon=1.0, delta=1e-5, size=12_000)
    step = events.poisson_gaussian(sample_rate=0.01, noise_multiplier=1.1, steps=50)
    if ledger.can_afford("hospital-a", step):
        ...  # train
        ledger.record("hospital-a", step, label="round 3")  # then release the update
"""

from dpfl.privacy import events
from dpfl.privacy.accounting import Accountant, DeltaTooLargeWarning, EpsilonReport, epsilon
from dpfl.privacy.calibration import (
    calibrate_dpsgd_noise,
    calibrate_noise,
    gaussian_noise_multiplier,
    max_dpsgd_steps,
    max_steps,
)
from dpfl.privacy.errors import (
    BudgetExceededError,
    LedgerError,
    PrivacyError,
    PrivacyParameterError,
    UnsupportedAccountingError,
)
from dpfl.privacy.events import Neighbouring, PrivacyEvent
from dpfl.privacy.ledger import Budget, Entry, Ledger, SiloAccount

__all__ = [
    "Accountant",
    "Budget",
    "BudgetExceededError",
    "DeltaTooLargeWarning",
    "Entry",
    "EpsilonReport",
    "Ledger",
    "LedgerError",
    "Neighbouring",
    "PrivacyError",
    "PrivacyEvent",
    "PrivacyParameterError",
    "SiloAccount",
    "UnsupportedAccountingError",
    "calibrate_dpsgd_noise",
    "calibrate_noise",
    "epsilon",
    "events",
    "gaussian_noise_multiplier",
    "max_dpsgd_steps",
    "max_steps",
]
