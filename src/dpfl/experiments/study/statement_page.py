"""A hospital ledger's statement as one page for its data-protection officer (`dpfl deploy
status --html`), in the report's style: one self-contained file (the plot embedded), no
script. Everything the ledger holds is user data (study names, labels, reasons), escaped
by the report's helpers (`html_table`, `figure_html`)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from html import escape

from dpfl.experiments.results.report.page import Html, figure_html, html_page, html_table
from dpfl.privacy.governance import Approval
from dpfl.privacy.statement import (
    EVALUATION,
    STATISTIC,
    TRAINING,
    AccountStatement,
    Point,
    Statement,
    chain_text,
    epsilon_text,
    own_name,
    when,
)


def render(statement: Statement) -> str:
    """The page: the chain's verification first, then the datasets' caps, the studies'
    accounts, their approvals, their spending over time, every refusal and every
    statistic released."""
    verified = statement.verification
    problems = "".join(f"<li>{escape(p)}</li>" for p in verified.problems)
    body = [
        f"<p>Ledger {escape(statement.path)}, read {escape(when(datetime.now(UTC).timestamp()))}"
        ". ε left is the smaller of what a study's budget and its dataset's cap leave "
        "(compositions are not sums: the accountant checks each charge).</p>",
        f"<p class='{'' if verified.ok else 'warning'}'>{escape(chain_text(verified))}</p>",
        f"<ul class='warning'>{problems}</ul>" if problems else "",
        "<h2>Datasets</h2>",
        _datasets(statement),
        "<h2>Studies</h2>",
        _accounts(statement),
        "<h2>Approvals</h2>",
        _approvals(statement),
        "<h2>Spending over time</h2>",
        _plot(statement),
        "<h2>Refusals</h2>",
        _refusals(statement),
        "<h2>Statistics released</h2>",
        _released(statement),
    ]
    return html_page(f"Privacy statement: {statement.path}", "\n".join(body))


def _datasets(statement: Statement) -> str:
    if not statement.datasets:
        return "<p>No dataset is capped in this ledger.</p>"
    rows = [
        [
            d.cap.dataset,
            f"{d.cap.epsilon:g}",
            f"{d.cap.delta:g}",
            f"{d.spent.epsilon:.4g}",
            f"{d.remaining:.4g}",
            "; ".join(f"{statement.name_of(s)}: ε {r.epsilon:.4g}" for s, r in d.studies.items()),
        ]
        for d in statement.datasets
    ]
    header = ["dataset", "cap ε", "δ", "ε spent (all studies)", "ε left", "each study alone"]
    return html_table(header, rows)


def _accounts(statement: Statement) -> str:
    if not statement.accounts:
        return "<p>No account in this ledger.</p>"
    rows = [
        [
            statement.name_of(a.study),
            a.own,
            a.budget.dataset or "—",
            epsilon_text(a.budget.epsilon),
            f"{a.budget.delta:g}",
            epsilon_text(a.spent),
            epsilon_text(a.left) + ("" if a.left_binding is None else f" ({a.left_binding})"),
            a.rounds_trained,
            a.kinds[TRAINING],
            a.kinds[STATISTIC],
            a.kinds[EVALUATION],
        ]
        for a in statement.accounts
    ]
    header = ["study", "account", "dataset", "ε budget", "δ", "ε spent", "ε left (bound)"]
    header += ["rounds trained", "training events", "statistics", "evaluations"]
    return html_table(header, rows)


def _approvals(statement: Statement) -> str:
    if not statement.approvals:
        return "<p>No study approved in this ledger.</p>"
    rows = [
        [
            a.name,
            a.study,
            a.study_key,
            f"{a.epsilon:g}",
            f"{a.delta:g}",
            "—" if a.dataset_cap is None else f"{a.dataset_cap:g}",
            when(a.approved_at),
            _standing(a),
            Html(
                "<br>".join(
                    escape(f"{what}: {digest[:16]}…" if digest else f"{what}: built-in")
                    for what, digest in (
                        ("model", a.model_digest),
                        ("study", a.study_digest),
                        ("schema", a.schema_digest),
                    )
                )
            ),
            a.dpfl_version,
        ]
        for a in statement.approvals
    ]
    header = ["approval", "study", "key", "ε", "δ", "dataset cap", "approved", "standing"]
    return html_table([*header, "digests (their start)", "dpfl"], rows)


def _standing(approval: Approval) -> str:
    if approval.revoked_at is not None:
        return f"revoked {when(approval.revoked_at)}"
    if approval.superseded_by is not None:
        return f"superseded by {approval.superseded_by}"
    return "in force"


def _refusals(statement: Statement) -> str:
    if not statement.refusals:
        return "<p>Nothing was refused.</p>"
    rows = [
        [
            when(r.recorded_at),
            statement.name_of(r.study),
            own_name(r.account, r.study),
            "—" if r.round is None else r.round,
            r.reason,
        ]
        for r in statement.refusals
    ]
    return html_table(["when", "study", "account", "round", "why"], rows)


def _released(statement: Statement) -> str:
    if not statement.released:
        return "<p>No statistic was released.</p>"
    rows = [
        [
            when(c.recorded_at),
            statement.name_of(c.study),
            own_name(c.account, c.study),
            c.kind,
            c.label,
            c.event,
        ]
        for c in statement.released
    ]
    return html_table(["when", "study", "account", "kind", "label", "ε event"], rows)


def _plot(statement: Statement) -> str:
    """ε over time: per capped dataset, every study's account over it, the dataset's
    total and its cap; then the accounts over no cap, each with its budget."""
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter  # only when writing
    from matplotlib.figure import Figure

    groups: dict[str | None, list[AccountStatement]] = {}
    for a in statement.accounts:
        if f"account {a.account}" in statement.spending:
            groups.setdefault(a.budget.dataset, []).append(a)
    if not groups:
        return "<p>Nothing was spent.</p>"
    plot = Figure(figsize=(8, 3.2 * len(groups)), layout="constrained")
    axes = plot.subplots(len(groups), 1, squeeze=False)[:, 0]
    for ax, (dataset, accounts) in zip(axes, groups.items(), strict=True):
        ax.set_title(_plain(f"dataset {dataset}" if dataset else "accounts over no cap"))
        for a in accounts:
            points = statement.spending[f"account {a.account}"]
            line = _plain(f"{statement.name_of(a.study)}: {a.own}")
            (drawn,) = ax.step(
                _times(points), _epsilons(points), where="post", marker=".", label=line
            )
            if math.isfinite(a.budget.epsilon):
                ax.axhline(a.budget.epsilon, ls=":", color=drawn.get_color())
        if dataset is not None:
            points = statement.spending[f"dataset {dataset}"]
            total = _times(points), _epsilons(points)
            ax.step(*total, where="post", color="0.7", lw=5, zorder=1, label="all studies")
            (cap,) = [d.cap for d in statement.datasets if d.cap.dataset == dataset]
            ax.axhline(cap.epsilon, ls="--", color="red", label=f"cap ε {cap.epsilon:g}")
        ax.set_ylabel("ε spent")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in axes:
        locator = AutoDateLocator()  # type: ignore[no-untyped-call]
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    axes[-1].set_xlabel("time (UTC)")
    caption = (
        "ε spent after each charge (steps); dotted: each account's budget; grey: all "
        "studies over the dataset together; dashed red: its cap"
    )
    return figure_html(plot, caption)


def _times(points: list[Point]) -> list[datetime]:
    return [datetime.fromtimestamp(p.at, UTC) for p in points]


def _epsilons(points: list[Point]) -> list[float]:
    return [p.epsilon for p in points]


def _plain(text: str) -> str:
    """Text matplotlib draws as written (a `$` would start its mathtext)."""
    return text.replace("$", r"\$")
