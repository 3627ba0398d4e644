"""A study's `[analytics]` released by a Flower deployment: the simulator's `dpfl stats`
with each half on its own machine (`dpfl.analytics`'s halves, not a copy of them).

Two messages, after the hellos (`flower.server.Server.hospitals`), each carrying the
study's key, the roster's hospitals in order and the plan in words (`Analytics.plan`),
which each hospital checks against its own copy of the study before it does anything:

1. "query.stats_plan": each hospital checks the whole plan against its own ledger (every
   statistic at once, `plan_refusal`) and accepts it, or refuses, saying why in its log.
2. "query.stats": each hospital checks again, bounds its records (`bounded`), computes
   every vector, charges its ledger (the simulator's events) and adds its own noise, of
   std σ·Δ (seeded with research noise, else the CSPRNG: `streams.stats_noise`); its
   vectors leave end to end as one reply, in the clear or through the study's masking
   or HE session, as training's replies do (a masked session in the statistics' ring,
   `dpfl.secure.masking.STATS_MASKING`, unmasked only as the sum of every hospital's).

The server pools the replies (the sum alone, where masked or encrypted) and
post-processes each statistic's figures (`figures_of`) as the simulator does.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.serverapp import Grid

from dpfl.analytics import (
    Records,
    Released,
    figures_of,
    group,
    neighbouring_of,
    plan_refusal,
    released,
    vectors,
)
from dpfl.engines.flower.hospital import Hospital, head_seq
from dpfl.engines.flower.protocol import LOG, Analytics, Deployment, DeploymentError, Exchange
from dpfl.engines.flower.roster import RosterError
from dpfl.engines.flower.server import Server
from dpfl.engines.flower.sums import Work, deployed
from dpfl.engines.streams import stats_noise
from dpfl.privacy import Ledger
from dpfl.secure.he import HomomorphicError
from dpfl.secure.masking import SecureAggregationError

# -- the hospital half ------------------------------------------------------------------


def _refusal(hospital: Hospital, fields: Mapping[str, Any], book: Ledger) -> str | None:
    """Why this hospital does not release the statistics the server asks for: not its
    study's, not its roster's hospitals, not its study's plan, or past its budget."""
    analytics, run = hospital.run.analytics, hospital.run
    if analytics is None:
        return f"study {run.key} declares no statistics a deployment releases"
    if fields.get("study") != run.key:
        return "the server runs another study than this hospital's"
    names = [str(n) for n in fields["silos"]]
    try:
        run.roster.check_all(names, "the server's list of hospitals")
    except RosterError as exc:
        return str(exc)
    if list(fields["plan"]) != analytics.plan(len(names)):
        return (
            f"the server asks for {list(fields['plan'])}; this hospital's study plans "
            f"{analytics.plan(len(names))}"
        )
    records = _records(hospital, analytics)
    return plan_refusal(
        book,
        [hospital.account],
        analytics.queries,
        analytics.noise_multiplier,
        neighbouring_of(records),
    )


def _records(hospital: Hospital, analytics: Analytics) -> Records:
    return analytics.records(hospital.me.name, hospital.me.data)


def _refused(hospital: Hospital, why: str) -> dict[str, Any]:
    """A refusal, logged and kept in the hospital's ledger."""
    LOG.warning("%s: statistics refused: %s", hospital.me.name, why)
    with hospital.ledger() as book:
        book.refuse(hospital.account, f"statistics: {why}")
    return {"refused": why}


def _plan(hospital: Hospital, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Accept the whole plan (nothing charged), or refuse it, saying why."""
    with hospital.ledger() as book:
        why = _refusal(hospital, fields, book)
    if why is not None:
        return _refused(hospital, why)
    LOG.info("%s: accepts the statistics %s", hospital.me.name, list(fields["plan"]))
    return {"accepted": True}


def _release(hospital: Hospital, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Check again, charge the ledger and release every statistic, protected as the
    study's `secure_aggregation` says."""
    me, run = hospital.me, hospital.run
    with hospital.ledger() as book:
        after = head_seq(book)
        why = _refusal(hospital, fields, book) or hospital.protection.refusal(hospital, fields)
        if why is not None:
            return _refused(hospital, why)
        assert run.analytics is not None  # checked by _refusal
        queries, sigma = run.analytics.queries, run.analytics.noise_multiplier
        names = [str(n) for n in fields["silos"]]
        k, records = names.index(me.name), _records(hospital, run.analytics)
        own = vectors(records, queries, k, len(names), run.analytics.max_records)
        noisy = released(
            own,
            queries,
            sigma,
            group(records, run.analytics.max_records),
            ledger=book,
            accounts=[hospital.account],
            rng=stats_noise(me.research_noise, run.seed, k),
            neighbouring=neighbouring_of(records),
            hospital=k,
            hospitals=len(names),
        )
        spent = book.spent(hospital.account)
        receipt = hospital.receipt(book, after)
    LOG.info(
        "%s: released %d statistics at σ=%g; ε %.4g of %g at δ=%g",
        me.name,
        len(queries),
        sigma,
        spent.epsilon,
        me.epsilon,
        me.delta,
    )
    vector = torch.from_numpy(np.concatenate(noisy))
    out = hospital.protection.released(hospital, fields, vector)
    return {"epsilon": spent.epsilon, **out, **receipt}


HOSPITAL: dict[str, Work] = {
    "stats_plan": _plan,
    "stats": _release,
}
"""The hospital's handlers, by query name (`flower.client_app`)."""


# -- the server half --------------------------------------------------------------------


@dataclass(frozen=True)
class StatsServed:
    """What the server pooled: the hospitals, each one's ε as it reported it, and the
    figures."""

    hospitals: list[str]
    epsilon: dict[str, float]
    noise_multiplier: float
    released: Released


def serve_stats(
    grid: Grid,
    run: Deployment,
    *,
    wait: float = 60.0,
    timeout: float = 600.0,
    he_keys: Path | None = None,
    receipts: Path | None = None,
) -> StatsServed:
    """Release the study's statistics from the hospitals of its roster connected to the
    grid: each checks the plan, then releases its noisy vectors, which the server sums as
    the study says and post-processes. DeploymentError, naming who and why, where a
    hospital refuses or fails: nothing is pooled then. The hospitals' receipts of their
    charges are kept in `receipts`, where given."""
    analytics = run.analytics
    if analytics is None:
        raise DeploymentError(
            f"study {run.key} declares no [analytics] a deployment releases (a table "
            "study's, each hospital reading its own file)"
        )
    server = Server(grid, run, timeout, receipts=receipts)
    known = server.hospitals(wait)
    server.names = {node: name for name, (node, _) in known.items()}
    names = list(known)
    common = {
        "study": run.key,
        "instance": uuid.uuid4().hex[:16],
        "silos": names,
        "cohort": names,
        "plan": analytics.plan(len(names)),
    }
    ask = partial(server.ask_named, common=common)
    _check(ask("query.stats_plan", {name: {} for name in names}))
    length = analytics.length(len(names))
    hellos = {n: hello for n, (_, hello) in known.items()}
    opened = deployed(run.summing).stats_opener(hellos, he_keys)
    try:  # a session that fails is one line too, naming why
        summing = opened(Exchange(ask, ask, run.roster, names, length, len(names), 0))
        answers = _check(ask("query.stats", summing.instructed(names)))
        replies = {n: summing.received(n, fields).vector for n, fields in answers.items()}
        total = summing(replies, at_least=len(names)).total.to(torch.float64).numpy()
    except (SecureAggregationError, HomomorphicError) as exc:
        raise DeploymentError(f"the statistics' secure sum failed: {exc}") from None
    cuts = np.cumsum([q.length(len(names)) for q in analytics.queries])[:-1]
    figures = figures_of(
        analytics.queries,
        np.split(total, cuts),
        analytics.noise_multiplier,
        analytics.max_records or 1,
        names,
        np.random.default_rng(run.seed),
    )
    epsilon = {name: float(fields["epsilon"]) for name, fields in answers.items()}
    LOG.info("statistics pooled from %s", ", ".join(names))
    return StatsServed(names, epsilon, analytics.noise_multiplier, figures)


def _check(answers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The answers, or DeploymentError naming each hospital that refused and why."""
    refused = [f"{name} refused: {a['refused']}" for name, a in answers.items() if "refused" in a]
    if refused:
        raise DeploymentError("; ".join(refused))
    return answers
