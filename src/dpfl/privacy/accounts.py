"""The names of a run's ledger accounts (one per (silo, trial), one per view) and of
the charges that are not training's.

Every engine opens them, and the results store and audits read them back: the one
rule for what they are called lives here, beside the ledger that keeps them.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["EVALUATION_LABEL", "RELEASE_LABEL", "STATISTIC_LABEL", "Named", "account"]

STATISTIC_LABEL = "stats: "
"""How a released statistic's charge is labelled (`stats: TITLE`, `dpfl.analytics`)."""
RELEASE_LABEL = "release "
"""How a value released once and kept is labelled (`release NAME`, `Ledger.release`: a
DP record count)."""
EVALUATION_LABEL = "evaluation of the final model: "
"""How a deployed hospital labels its DP evaluation of the final model. A statement
tells charges apart by these prefixes (`dpfl.privacy.statement.kind_of`)."""


class Named(Protocol):
    """A silo, its public description, or anything else with a silo's name."""

    @property
    def name(self) -> str: ...


def account(silo: Named | str, trial: int, view: str | None = None) -> str:
    """The ledger account of a silo (or silo name) in one trial: trials are separate runs
    on the same records, each with the silo's budget (releasing several trials' models
    composes them). A `view` account records what another observer (e.g. the other
    hospitals) learns."""
    name = silo if isinstance(silo, str) else silo.name
    return f"{name}/trial-{trial}" + ("" if view is None else f"/{view}")
