"""The report's HTML: one self-contained page (figures embedded as PNG data URIs, so it
is one file to send), its text escaped here and nowhere else."""

from __future__ import annotations

import base64
import html
import io
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from matplotlib.figure import Figure

from dpfl.experiments.results.datasheet import (
    RESEARCH_MARK,
    RESEARCH_NOISE,
    consortium_text,
    research_noise,
    span,
)
from dpfl.experiments.results.queries import (
    RESULTS_FILE,
    CrossSilo,
    Metrics,
    Pooled,
    Spread,
    Traffic,
    bound_text,
    exceeds_ledger,
    mean_std_text,
    one_class_of,
    pool_seeds,
)
from dpfl.experiments.results.store import RunRow, SiloEpsilons
from dpfl.experiments.study.config import grid_pairs
from dpfl.federation.survival_metrics import SURVIVAL_METRICS

from . import figures
from .shown import Shown, byte_text, metric_name, point

TABLE_METRICS = ("accuracy", "auroc", "balanced_accuracy")
SURVIVAL_TABLE_METRICS = ("c_index", "c_index_uno", "ibs")
MAX_EPSILON_PANELS = 12
REPORTED = (
    "ε marked “reported” is a deployed run's: the server keeps no ledger, so it is each "
    "hospital's ε as the hospital last reported it from its own ledger (by the study's "
    "accountant, at the hospital's own δ, which the server is not told), and the run's ε "
    "is the largest over its hospitals. A hospital that never reported (it refused "
    "before training) has none: the run charged it nothing. A hospital of a run that "
    "stopped early may have been charged for the round it stopped in after it last "
    "reported; its own ledger (`dpfl privacy ledger`) has the exact figure."
)
"""Said wherever ε reported by a deployment's hospitals is shown."""
NOT_REPORTED = "none reported (charged nothing in this run)"
_DPI = 110


class Html(str):
    """Markup built here from escaped parts: table cells of this type are not escaped again."""


def render(
    title: str,
    runs: list[RunRow],
    shown: list[Shown],
    metric: str,
    reported: dict[str, SiloEpsilons],
) -> str:
    """The whole page: overview, results table (and the runs pooled over seeds, if any
    differ only in their seed), cross-silo scores, figures and datasheets of the finished
    runs `shown`, and the failed ones among `runs`, with what the hospitals of each failed
    deployment reported before it stopped (`reported`, by run id)."""
    body = [_overview(runs, shown)]
    if shown:
        groups = pool_seeds(s.summary for s in shown)
        labels = {s.run.id: s.label for s in shown}
        body += [
            _results_table(shown, metric),
            _pooled_table(groups, metric),
            _cross_silo(groups, labels, metric),
            _figures(shown, metric),
            _audits(shown),
            "<h2 id='datasheets'>Privacy datasheets</h2>",
            *(_datasheet(s, metric) for s in shown),
        ]
    body.append(_failed_runs([r for r in runs if r.status == "failed"], reported))
    return html_page(title, "\n".join(body))


def _figures(shown: list[Shown], metric: str) -> str:
    """The four figures, embedded in the page, with their headings and captions."""
    name = metric_name(metric)
    accounted = [s for s in shown if s.epsilon_rounds]
    panels = accounted[:MAX_EPSILON_PANELS]
    capped = (
        f" Showing the first {len(panels)} of {len(accounted)} private runs."
        if len(accounted) > len(panels)
        else ""
    )
    colors = figures.algorithm_colors(shown)
    return "\n".join(
        [
            "<h2 id='privacy-utility'>Privacy–utility</h2>",
            figure_html(
                figures.privacy_utility(shown, metric, colors),
                f"Final {name} on the union of the silos' test sets (mean ± sample std over "
                "trials) against ε: the largest final ε over silos and trials in the "
                "server's view, at each run's own accountant and the silo's δ. One line per "
                "algorithm and value of the grid's other axes. Non-private runs (ε = ∞) are "
                "dashed horizontal lines.",
                f"No private run with {name} on the union of the silos' test sets: there is "
                "no privacy–utility trade-off to plot.",
            ),
            "<h2 id='learning-curves'>Learning curves</h2>",
            figure_html(
                figures.learning_curves(shown, metric),
                f"{name[:1].upper()}{name[1:]} on the union of the silos' test sets at each "
                "evaluated round: mean over trials, band ± 1 sample std (no band with a single "
                "trial).",
                f"No run has {name} on the union of the silos' test sets (a deployment's "
                "hospitals each score their own, once: see its datasheet).",
            ),
            "<h2 id='epsilon-rounds'>Privacy spent over rounds</h2>",
            figure_html(
                figures.epsilon_over_rounds(panels),
                "ε per silo after each round in the server's view (the largest over trials, "
                f"each run's own accountant); dotted lines are the silos' budgets.{capped}",
                "No ε per round to plot: no private run was simulated here (a deployment's "
                "hospitals report their final ε only: see its datasheet).",
            ),
            "<h2 id='communication'>Communication</h2>",
            figure_html(
                figures.communication(shown),
                "Bytes sent per client over all rounds, mean over silos, trials and the "
                "algorithm's runs.",
                "No communication was recorded.",
            ),
        ]
    )


def figure_html(figure: Figure | None, caption: str, absent: str = "") -> str:
    """The figure as a PNG data URI in a <figure>, or a sentence saying why there is none."""
    if figure is None:
        return f"<p>{_e(absent)}</p>"
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=_DPI)
    source = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode("ascii")
    return (
        f'<figure><img src="{source}" alt="{_e(caption)}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _overview(runs: list[RunRow], shown: list[Shown]) -> str:
    counts = Counter(r.status for r in runs)
    if not shown:
        lead = f"No finished runs in {RESULTS_FILE}: nothing to report yet."
    else:
        lead = (
            f"{len(shown)} finished run(s) from {RESULTS_FILE}. Metrics are on the union "
            "of the silos' test sets after each run's last round (mean ± sample std over "
            "what each table's “± over” says: a run's trials, of its one seed, unless "
            "pooled over seeds); ε is the server's view, the one budgets bind, and for "
            "each silo the largest over its trials."
        )

    others = f" Failed: {counts['failed']}. Still running (not shown): {counts['running']}."
    return f"<p>{_e(lead + others)}</p>"


def _results_table(shown: list[Shown], metric: str) -> str:
    rows = [
        _ScoredRow(
            (s.run,),
            point(s.run),
            [
                s.run.trials,
                str(s.summary.replicates),
                _rounds_text(s.run),
                _number(s.run.noise_multiplier) if s.summary.private else "—",
                _epsilon_text(s, s.summary.accountant, mark=True),
                _epsilon_text(s, s.summary.other_accountant),
            ],
            s.summary.metrics,
            s.summary.traffic,
        )
        for s in shown
    ]
    facts = ["trials", "± over", "rounds", "σ", "max ε (enforced)", "max ε (other accountant)"]
    caption = (
        "<p>ε: the largest over silos and trials, by the accountant that enforced the "
        "budgets; the other accountant's figure is shown for comparison only.</p>"
    )
    if any(s.run.reported for s in shown):
        caption += f"<p>{_e(REPORTED)}</p>"
    if any(research_noise(s.run) for s in shown):
        caption += f"<p>{RESEARCH_MARK} {_e(RESEARCH_NOISE)}.</p>"
    for s in shown:
        one = one_class_of(s.summary.metrics, s.run.config)
        if one is not None:
            caption += f"<p class='warning'>Warning: {_e(s.label)}: {_e(one)}.</p>"
    table = _scores_table(("run", "grid point", *facts), rows, metric)
    return "<h2 id='results'>Results</h2>\n" + table + caption


@dataclass(frozen=True)
class _ScoredRow:
    """One row of a table of scores: a run, or runs pooled over seeds."""

    runs: tuple[RunRow, ...]
    point: str
    facts: list[Any]
    """the cells between the grid point and the metrics"""
    metrics: Metrics
    traffic: Traffic


def _scores_table(columns: tuple[str, ...], rows: list[_ScoredRow], metric: str) -> str:
    """The runs (linked to their datasheets), algorithm, grid point and facts of each row,
    then `metric` and the usual metrics, and bytes up per client. `columns` names the runs,
    the grid point and the facts."""
    runs, grid_point, *facts = columns
    metrics = _table_metrics(metric)
    header = [
        runs,
        "algorithm",
        grid_point,
        *facts,
        *(metric_name(m) for m in metrics),
        "bytes up per client",
    ]
    cells = [
        [
            Html(", ".join(f'<a href="#run-{_e(r.id)}">{_e(r.id[:8])}</a>' for r in row.runs)),
            row.runs[0].algorithm,
            row.point or "—",
            *row.facts,
            *(_spread_text(row.metrics.score(m)) for m in metrics),
            _bytes_up(row.runs, row.traffic),
        ]
        for row in rows
    ]
    return html_table(header, cells)


def _bytes_up(runs: Iterable[RunRow], traffic: Traffic) -> str:
    """Mean bytes up per client; not a number for a deployment, whose server does not
    count its bytes yet."""
    if any(r.reported for r in runs):
        return "not recorded"
    return byte_text(traffic.per_client("up"))


def _table_metrics(metric: str) -> list[str]:
    """The metric asked for, then the table's usual ones (survival ones beside a
    survival metric)."""
    usual = SURVIVAL_TABLE_METRICS if metric in SURVIVAL_METRICS else TABLE_METRICS
    return list(dict.fromkeys([metric, *usual]))


def _pooled_table(groups: list[Pooled], metric: str) -> str:
    """Runs that differ only in their seed, one row: figures over every trial of every
    seed (nothing if no two runs differ only in their seed)."""
    rows = [
        _ScoredRow(
            g.runs,
            point(g.run, ("seed",)),
            [
                str(g.replicates),
                ", ".join(str(seed) for seed in g.replicates.seeds),
                _pooled_epsilon(g),
            ],
            g.metrics,
            g.traffic,
        )
        for g in groups
        if len(g.runs) > 1
    ]
    if not rows:
        return ""
    caption = (
        "<p>Runs that differ only in their study seed, pooled: mean ± sample std over every "
        "trial of every seed. A trial varies the batches, the noise and (but for trial 0) "
        "the model's initialisation; a seed also varies the split into silos and trial "
        "0's initialisation. ε: the largest over silos, trials and seeds.</p>"
    )
    columns = ("runs", "grid point (but the seed)", "± over", "seeds", "max ε (enforced)")
    table = _scores_table(columns, rows, metric)
    return "<h2 id='pooled'>Pooled over seeds</h2>\n" + table + caption


def _pooled_epsilon(g: Pooled) -> str:
    if not g.private:
        return "∞ (non-private)"
    seeded = f" {RESEARCH_MARK}" if any(research_noise(r) for r in g.runs) else ""
    return _max_epsilon(g.epsilon[g.accountant]) + seeded


def _cross_silo(groups: list[Pooled], labels: dict[str, str], metric: str) -> str:
    """Per run (or runs pooled over seeds) that scored it: `metric` of each silo's model
    (rows) on each silo's test set (columns)."""
    scored = [g for g in groups if g.cross_silo]
    if not scored:
        return ""
    name = metric_name(metric)
    parts = [
        "<h2 id='cross-silo'>Cross-silo scores</h2>",
        f"<p>{_e(name)} of each silo's final model (rows) on each silo's test set "
        "(columns), mean ± sample std over the replicates named above each table; the "
        "diagonal is each silo's own test set. Like every metric here, these are released "
        "without noise, outside ε (which protects the training records only). Where "
        "every silo used the same model (a non-personalised algorithm) it has one row, "
        "the shared model.</p>",
    ]
    for g in scored:
        title = " + ".join(labels.get(r.id, r.id[:8]) for r in g.runs)
        parts.append(f"<h3>{_e(title)}: over {_e(str(g.replicates))}</h3>")
        parts.append(_cross_silo_table(g.cross_silo, metric))
    return "\n".join(parts)


def _cross_silo_table(cross: CrossSilo, metric: str) -> str:
    tests = sorted({test for by_test in cross.values() for test in by_test})
    models = sorted(cross, key=lambda m: (m is not None, m or ""))
    rows = [
        [
            "shared (every silo's)" if model is None else model,
            *(_spread_text(cross[model].get(test, {}).get(metric, Spread(()))) for test in tests),
        ]
        for model in models
    ]
    return html_table(["model \\ test set", *tests], rows)


def _rounds_text(run: RunRow) -> str:
    text = f"{run.rounds_completed}/{run.rounds}"
    return text + " (budget spent)" if run.stopped_by_budget else text


def _spread_text(spread: Spread) -> str:
    """Mean ± sample std over trials; `n = 1` for a single trial, a dash if undefined."""
    if not spread.defined:
        return "—"
    return mean_std_text(spread.mean, spread.std, space="\u00a0")


def _epsilon_text(s: Shown, accountant: str, *, mark: bool = False) -> str:
    """The run's largest ε by `accountant`, labelled with it; marked if `mark` and the
    noise was seeded."""
    if not s.summary.private:
        return "∞ (non-private)"
    seeded = f" {RESEARCH_MARK}" if mark and research_noise(s.run) else ""
    return _max_epsilon(s.summary.epsilon[accountant]) + seeded


def _max_epsilon(spent: SiloEpsilons) -> str:
    """The largest ε over silos with its accountant, said to be the hospitals' report
    where it is; a dash where none was accounted (or reported)."""
    if not spent.by_silo:
        return "—"
    return f"{spent.max:.3g} ({spent.accountant.upper()}{', reported' if spent.reported else ''})"


def _datasheet(s: Shown, metric: str) -> str:
    """Who is protected, by what mechanism, at what ε per silo, against whom."""
    sheet = s.run.datasheet
    summary = s.summary
    facts = {
        "run": s.run.id,
        "grid point": ", ".join(grid_pairs(dict(sorted(s.run.grid.items())))) or None,
        "unit of privacy": sheet.get("unit"),
        "mechanism": sheet.get("mechanism"),
        "accountant (enforces budgets)": summary.accountant.upper() if summary.private else None,
        "noise multiplier σ": sheet.get("noise_multiplier"),
        "clip norm C": sheet.get("clip_norm"),
        "noise": _noise_text(s),
        "consortium-level ε": consortium_text(sheet["consortium"])
        if sheet.get("consortium")
        else None,
        "threat model (who sees what)": sheet.get("threat_model"),
        "released outside ε": sheet.get("evaluation"),
        "audit (measured, not a DP release)": _bullets(
            f"{b['method']}, {b['silo']} against {b['observer']}: "
            + bound_text(b["epsilon_ledger"], b["epsilon_lower"], b["confidence"])
            for b in summary.audits.bounds
        )
        if summary.audits.bounds
        else None,
    }
    listed = "".join(f"<dt>{_e(k)}</dt><dd>{_cell(_number(v))}</dd>" for k, v in facts.items())
    assumptions = sheet.get("assumptions") or ["none stated"]
    spent = _reported(s, metric) if s.run.reported else _ledger_spent(s)
    return (
        f"<section class='datasheet' id='run-{_e(s.run.id)}'><h3>{_e(s.label)}</h3>"
        f"<dl>{listed}<dt>assumptions</dt><dd>{_bullets(assumptions)}</dd></dl>{spent}</section>"
    )


def _audits(shown: list[Shown]) -> str:
    """What `dpfl audit` measured: each run's latest ε lower bounds beside its ledger's ε,
    and its membership-inference attacks."""
    head = "<h2 id='audit'>Audit</h2>"
    audited = [s for s in shown if s.summary.audits.bounds or s.summary.audits.membership]
    if not audited:
        return (
            f"{head}<p>No run has been audited yet: <code>dpfl audit DIR</code> measures ε "
            "lower bounds and membership inference (docs/audit.md).</p>"
        )
    bounds = [
        [
            s.label,
            b["method"],
            b["silo"],
            b["observer"],
            b["canary"],
            b["trials"],
            bound_text(b["epsilon_ledger"], b["epsilon_lower"], b["confidence"]),
            "EXCEEDS THE LEDGER: a bug" if exceeds_ledger(b) else "ok",
        ]
        for s in audited
        for b in s.summary.audits.bounds
    ]
    attacks = [
        [
            s.label,
            m["silo"],
            m["model"],
            m["attack"],
            _number(m["auc"]),
            _number(m["tpr_at_fpr_0_1"]),
            _number(m["tpr_at_fpr_1"]),
            f"{m['members']} / {m['non_members']}",
            f"{m['trials']}; {m['folds']} × {m['shadows']}",
        ]
        for s in audited
        for m in s.summary.audits.membership
    ]
    parts = [
        head,
        "<p>Attacks on what each run's code releases, its latest audit of each kind "
        "(<code>dpfl audit</code>, docs/audit.md). An ε lower bound holds at the confidence "
        "shown: one above the ledger's ε is a bug in the code or its accounting; one far "
        "below says only that this attack did not get close. The audits train on the "
        "silos' records thousands of times: these figures are not DP releases.</p>",
    ]
    if bounds:
        header = ["run", "method", "silo", "observer", "canary", "trials", "ε", "verdict"]
        parts.append(html_table(header, bounds))
    if attacks:
        header = ["run", "silo", "model", "attack", "AUC", "TPR at FPR 0.1 %"]
        header += ["TPR at FPR 1 %", "members / non-members", "trials; shadows"]
        parts.append(
            html_table(header, attacks)
            + "<p>Membership inference on the final models: members are a silo's training "
            "records, non-members its test records; AUC 0.5 is chance. Trials: the target "
            "run's; shadows: folds × stacked trials (offline LiRA).</p>"
        )
    return "".join(parts)


def _ledger_spent(s: Shown) -> str:
    """A simulated run's silos: ε by both accountants and other observers, read off the
    run's ledger, with what its ledger says they were charged for."""
    summary = s.summary
    silos = s.run.datasheet.get("silos") or {}
    header = [
        "silo",
        "public size",
        "δ",
        "q",
        "rounds charged",
        f"ε ({summary.accountant.upper()}, enforced)",
        f"ε ({summary.other_accountant.upper()}, not enforced)",
        "ε, other observers",
        "budget ε",
        "events",
    ]
    rows = [
        [
            name,
            _public_size(silo),
            _number(silo.get("delta"), ".2g"),
            ", ".join(format(q, ".4g") for q in silo.get("sample_rates") or []) or "—",
            span(silo["participations"]),
            _number(summary.epsilon[summary.accountant].by_silo.get(name)),
            _number(summary.epsilon[summary.other_accountant].by_silo.get(name)),
            _bullets(
                f"{view}: {spent.by_silo[name]:.3g}"
                for view, spent in summary.views.items()
                if name in spent.by_silo
            ),
            _number(silo.get("budget_epsilon"), absent="none"),
            _bullets(silo.get("events") or []),
        ]
        for name, silo in sorted(silos.items())
    ]
    seeded = f"<p>{RESEARCH_MARK} {_e(RESEARCH_NOISE)}.</p>" if research_noise(s.run) else ""
    return (
        f"<p>ε per silo at its δ after the run: the largest over the run's {s.run.trials} "
        "trial(s), each a separate account (under client sampling they spend differently); "
        "by the accountant that enforced the budgets and, for comparison only, by the "
        "other; and against observers other than the server (at the run's accountant; "
        "recorded, never enforced). q: Poisson sampling rate; rounds charged: per trial "
        f"where trials differ; the events give the steps per round.</p>{seeded}"
        f"{html_table(header, rows)}"
        if rows
        else "<p>ε = ∞ (non-private): no record is protected by differential privacy.</p>"
    )


def _reported(s: Shown, metric: str) -> str:
    """A deployed run's hospitals: the ε each reported and its metrics on its own test set
    (the server knows neither their budgets nor their δ, nor how their ledgers charged)."""
    summary = s.summary
    spent = summary.epsilon[summary.accountant]
    metrics = _table_metrics(metric)
    header = [
        "hospital",
        "public size",
        f"ε ({summary.accountant.upper()}, reported by the hospital)",
        *(f"{metric_name(m)} (own test set)" for m in metrics),
    ]
    rows = [
        [
            name,
            _public_size(silo),
            _number(spent.by_silo.get(name), absent=NOT_REPORTED),
            *(_spread_text(summary.metrics.score(m, name)) for m in metrics),
        ]
        for name, silo in sorted((s.run.datasheet.get("silos") or {}).items())
    ]
    caption = (
        "<p>ε per hospital as it last reported it from its own ledger, by the study's "
        "accountant, at its own δ (the server is told neither the hospitals' budgets nor "
        "their δ; each hospital's ledger has the rest: `dpfl privacy ledger`). Metrics: "
        "each hospital's, of the model it uses, on its own test set.</p>"
    )
    return caption + html_table(header, rows)


def _noise_text(s: Shown) -> str | None:
    """Whether the noise may be released: seeded (research) or from the CSPRNG."""
    if research_noise(s.run):
        return f"{RESEARCH_MARK} {RESEARCH_NOISE}"
    if s.summary.private and s.run.datasheet.get("research_noise") is False:
        return "drawn from the operating system's CSPRNG"
    return None  # non-private, or a datasheet that predates the field


def _failed_runs(runs: list[RunRow], reported: dict[str, SiloEpsilons]) -> str:
    """The failed runs with their errors; for a deployment, also the largest ε its
    hospitals reported before it stopped (none for a simulated run: its ledger holds it)."""
    if not runs:
        return ""
    rows = [
        [
            r.id[:8],
            r.algorithm,
            point(r) or "—",
            Html(f"<pre>{_e(r.error or '')}</pre>"),
            *([_stopped_epsilon(reported.get(r.id))] if reported else []),
        ]
        for r in runs
    ]
    header = ["run", "algorithm", "grid point", "error"]
    if reported:
        header.append("max ε reported before it stopped")
    caption = f"<p>{_e(REPORTED)}</p>" if reported else ""
    return "<h2 id='failed'>Failed runs</h2>\n" + html_table(header, rows) + caption


def _stopped_epsilon(spent: SiloEpsilons | None) -> str:
    """A failed run's largest reported ε; a dash for a simulated run (no report)."""
    if spent is None:
        return "—"  # a simulated run
    return _max_epsilon(spent) if spent.by_silo else "none reported"


def html_table(header: list[str], rows: list[list[Any]]) -> str:
    """An HTML table; cells are escaped unless they are `Html`."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return (
        f"<div class='scroll'><table><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table></div>"
    )


def _public_size(silo: dict[str, Any]) -> str:
    """The size that shaped the mechanism, and where it came from (a datasheet written
    before public sizes has only `size`)."""
    size = silo.get("public_size", silo.get("size"))
    source = silo.get("public_size_source")
    return "—" if size is None else f"{size} ({source})" if source else str(size)


def _bullets(items: Iterable[Any]) -> Html:
    """A list, or a dash for none."""
    listed = "".join(f"<li>{_e(item)}</li>" for item in items)
    return Html(f"<ul>{listed}</ul>" if listed else "—")


def html_page(title: str, body: str) -> str:
    """A whole HTML page in the report's style: `body` under `title`."""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<link rel="icon" href="data:,">
<style>{_CSS}</style>
</head>
<body>
<h1>{_e(title)}</h1>
{body}
</body>
</html>
"""


_CSS = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto;
       padding: 0 1rem; color: #222; line-height: 1.4; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.5rem; text-align: left;
         vertical-align: top; }
th { background: #f2f2f2; }
td { overflow-wrap: anywhere; }
td:first-child { white-space: nowrap; overflow-wrap: normal; }
.scroll { overflow-x: auto; max-width: 100%; }
td ul, dd ul { margin: 0; padding-left: 1.1rem; }
pre { margin: 0; white-space: pre-wrap; }
figure { margin: 0 0 1.5rem; }
img { max-width: 100%; height: auto; }
figcaption { font-size: 0.9rem; color: #555; }
.datasheet { border-top: 1px solid #ddd; padding-top: 0.5rem; }
dl { display: grid; grid-template-columns: max-content auto; gap: 0.2rem 1rem; }
dt { font-weight: 600; }
dd { margin: 0; }
.warning { color: #8a4b00; font-weight: 600; }
"""


def _cell(value: Any) -> str:
    """A value escaped, unless it is markup built here from escaped parts (`Html`)."""
    return value if isinstance(value, Html) else _e(value)


def _e(value: object) -> str:
    return html.escape(str(value))


def _number(value: Any, spec: str = ".3g", absent: str = "—") -> str:
    """A float in `spec`; other values (counts, text, markup) as they are; None as `absent`."""
    if value is None:
        return absent
    if isinstance(value, float):
        return format(value, spec)
    return value if isinstance(value, Html) else str(value)
