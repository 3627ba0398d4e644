"""Measured privacy: ε lower bounds from attacks on what dpfl's code releases, set
against the ε its ledgers account (docs/audit.md).

* `two_worlds.two_world_audit`: many stacked trials with and without a canary.
* `one_run.one_run_audit`: many canaries in one run (Steinke, Nasr, Jagielski 2023).
* `membership.membership_audit`: loss-threshold and offline LiRA attacks, per silo.
* `canaries`: input and gradient canaries; `bounds`: ε lower bounds from counts.
"""

from dpfl.audit.canaries import GradientCanary, InputCanary, dirac_canaries, outlier_canary
from dpfl.audit.membership import MembershipAudit, membership_audit
from dpfl.audit.one_run import OneRunAudit, one_run_audit
from dpfl.audit.two_worlds import TwoWorldAudit, two_world_audit

__all__ = [
    "GradientCanary",
    "InputCanary",
    "MembershipAudit",
    "OneRunAudit",
    "TwoWorldAudit",
    "dirac_canaries",
    "membership_audit",
    "one_run_audit",
    "outlier_canary",
    "two_world_audit",
]
