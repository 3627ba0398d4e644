"""`dpfl report`: the page reads the right rows of a hand-built store, its figures are real
PNGs embedded in the one file, and it renders in headless Chromium without errors or
missing images."""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from browser import rendered
from dpfl.cli.report import report
from dpfl.experiments.results.datasheet import RESEARCH_NOISE
from dpfl.experiments.results.report import ReportError, write_report
from dpfl.experiments.results.report import page as page_module
from dpfl.experiments.results.store import ResultsStore, RunResults, StoreError
from dpfl.privacy.accounts import account

SILOS = {"hospital-a": 190, "hospital-b": 190, "hospital-c": 189}
DELTA = 1e-5
THREAT_MODEL = (
    "Honest-but-curious server sees each silo's noised update; silos see <weights> & metrics."
)
ASSUMPTIONS = ["Poisson sampling is implemented as analysed", "no server–silo collusion"]
EVALUATION = "Test-set metrics are released every round, outside ε."


@dataclass(frozen=True)
class Plan:
    """One run of the hand-built study."""

    algorithm: str
    grid: dict[str, Any]
    sigma: float | None
    accountant: str = "pld"
    trials: int = 2
    rounds: int = 4
    rounds_completed: int = 4
    research_noise: bool = True

    @property
    def id(self) -> str:
        return hashlib.sha256(f"{self.algorithm}{self.grid}".encode()).hexdigest()[:16]


PLANS = [
    Plan("fedavg", {"privacy.noise_multiplier": 0.8}, 0.8),
    Plan("fedavg", {"privacy.noise_multiplier": 1.6}, 1.6),
    Plan(
        "fedsgd_secure", {}, 1.0, accountant="rdp", rounds_completed=3, research_noise=False
    ),  # stopped by budget; noise from the CSPRNG
    Plan("centralized", {}, None),
]
FAILED = Plan("cyclic", {}, 1.0)
RUNNING = Plan("sign", {}, 1.0)
HEADINGS = [
    "Results",
    "Privacy–utility",
    "Learning curves",
    "Privacy spent over rounds",
    "Communication",
    "Audit",
    "Privacy datasheets",
    "Failed runs",
]


def accuracy(plan: Plan, trial: int, round_: int) -> float:
    """Union accuracy: grows with rounds, shrinks with noise, differs a little per trial."""
    return 0.6 + 0.06 * round_ - 0.1 * (plan.sigma or 0.0) + 0.013 * trial


def epsilon(plan: Plan, silo: int, round_: int, accountant: str, trial: int) -> float:
    """Trials spend differently (as under client sampling): silo 0 most in trial 0."""
    assert plan.sigma is not None
    rdp = 1.1 if accountant == "rdp" else 1.0
    extra = 0.3 if (silo == 0) == (trial == 0) else 0.0
    return (round_ + 1) * (0.2 + 0.05 * silo) / plan.sigma * rdp + extra


def silo_epsilon(plan: Plan, silo: int, accountant: str, round_: int | None = None) -> float:
    """What the page must show for a silo: its largest ε over trials."""
    last = plan.rounds_completed - 1 if round_ is None else round_
    return max(epsilon(plan, silo, last, accountant, t) for t in range(plan.trials))


def final_epsilon(plan: Plan, accountant: str) -> float:
    """What the page must show for a run: the largest final ε over silos and trials."""
    return max(silo_epsilon(plan, k, accountant) for k in range(len(SILOS)))


def auroc(plan: Plan, trial: int, round_: int) -> float:
    """Undefined (NaN, stored as NULL) at round 0, and in trial 1 of the non-private run."""
    undefined = round_ == 0 or (plan.sigma is None and trial == 1)
    return math.nan if undefined else accuracy(plan, trial, round_) + 0.1


def results(plan: Plan) -> RunResults:
    metrics: list[tuple[int, int, str | None, str, float]] = []
    privacy: list[tuple[int, int, str, str | None, str, float, float]] = []
    communication: list[tuple[int, int, str, int, int, int]] = []
    last = plan.rounds_completed - 1
    for t in range(plan.trials):
        for r in range(plan.rounds_completed):
            acc = accuracy(plan, t, r)
            metrics += [(t, r, silo, "accuracy", 0.1) for silo in SILOS]  # not the union's
            metrics += [
                (t, r, None, "accuracy", acc),
                (t, r, None, "balanced_accuracy", acc - 0.02),
                (t, r, None, "auroc", auroc(plan, t, r)),
                (t, r, None, "precision", math.nan),
                (t, r, None, "loss", 1.0 - acc),
            ]
            for k, silo in enumerate(SILOS):
                communication.append((t, r, silo, 50_000, 40_000, 2))
                if plan.sigma is None:
                    continue
                for a in ("pld", "rdp") if r == last else (plan.accountant,):
                    spent = epsilon(plan, k, r, a, t)
                    privacy.append((t, r, silo, None, a, DELTA, spent, account(silo, t)))
                if plan.algorithm == "fedsgd_secure":  # what the other hospitals see
                    seen = account(silo, t, "hospitals")
                    privacy.append(
                        (t, r, silo, "hospitals", plan.accountant, DELTA, 99.0 + t, seen)
                    )
    return RunResults(
        rounds_completed=plan.rounds_completed,
        noise_multiplier=plan.sigma,
        stopped_by_budget=plan.rounds_completed < plan.rounds,
        seconds=1.5,
        ledger=None if plan.sigma is None else Path("ledgers") / f"{plan.id}.sqlite",
        datasheet=datasheet(plan),
        metrics=metrics,
        privacy=privacy,
        communication=communication,
    )


def datasheet(plan: Plan) -> dict[str, Any]:
    sheet: dict[str, Any] = {
        "threat_model": THREAT_MODEL,
        "assumptions": ASSUMPTIONS,
        "accountant": plan.accountant,
        "noise_multiplier": plan.sigma,
        "research_noise": plan.sigma is not None and plan.research_noise,
        "evaluation": EVALUATION,
    }
    if plan.sigma is None:
        return sheet | {"unit": "none", "mechanism": "non-private", "clip_norm": None, "silos": {}}
    return sheet | {
        "unit": "one patient record (add/remove neighbouring)",
        "mechanism": "DP-SGD: per-example clipping and Gaussian noise",
        "clip_norm": 1.0,
        "silos": {
            silo: {
                "public_size": size,
                "public_size_source": "declared by the study",
                "budget_epsilon": 8.0,
                "delta": DELTA,
                "sample_rates": [16 / size],
                "participations": [plan.rounds_completed - t for t in range(plan.trials)],
                "events": [
                    f"{plan.rounds_completed - 1}–{plan.rounds_completed} (by trial) × 12 × "
                    f"Poisson(q={16 / size:.4g}) Gaussian(σ={plan.sigma}) [add/remove one record]"
                ],
                "views": ["hospitals"] if plan.algorithm == "fedsgd_secure" else [],
            }
            for silo, size in SILOS.items()
        },
    }


def build_study(
    directory: Path,
    plans: list[Plan],
    *,
    failed: bool = True,
    results_of: Callable[[Plan], RunResults] = results,
) -> Path:
    with ResultsStore(directory / "results.sqlite") as store:
        for plan in [*plans, FAILED, RUNNING] if failed else plans:
            store.start(
                plan.id,
                study="icu-mortality",
                algorithm=plan.algorithm,
                config={"name": "icu-mortality", "algorithm": {"name": plan.algorithm}},
                grid=plan.grid,
                trials=plan.trials,
                rounds=plan.rounds,
            )
            if plan is FAILED:
                store.fail(plan.id, "RuntimeError: loss is NaN at round 2 <diverged> & stopped")
            elif plan is not RUNNING:
                store.finish(plan.id, results_of(plan))
    return directory


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report(build_study(tmp_path_factory.mktemp("study"), PLANS))


class Tables(HTMLParser):
    """Every <table> of a page as rows of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append(" ".join("".join(self.cell).split()))
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def tables(text: str) -> list[list[dict[str, str]]]:
    parser = Tables()
    parser.feed(text)
    return [[dict(zip(t[0], row, strict=True)) for row in t[1:]] for t in parser.tables]


def results_table(index: Path) -> dict[str, dict[str, str]]:
    """The first table, by short run id."""
    return {row["run"]: row for row in tables(index.read_text(encoding="utf-8"))[0]}


def mean_std(values: list[float]) -> str:
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def image_sources(index: Path) -> list[str]:
    sources: list[str] = []

    class Images(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "img":
                sources.append(str(dict(attrs)["src"]))

    Images().feed(index.read_text(encoding="utf-8"))
    return sources


def section(text: str, run_id: str) -> str:
    start = text.index(f"id='run-{run_id}'")
    return text[start : text.index("</section>", start)]


# -- the page's content -------------------------------------------------------------------


def test_results_table_reads_the_union_at_the_last_round_and_the_server_view(page: Path) -> None:
    table = results_table(page)
    assert set(table) == {p.id[:8] for p in PLANS}  # not the failed nor the running run
    for plan in PLANS:
        row = table[plan.id[:8]]
        last = plan.rounds_completed - 1
        trials = range(plan.trials)
        assert row["algorithm"] == plan.algorithm
        assert row["trials"] == str(plan.trials)
        assert row["accuracy"] == mean_std([accuracy(plan, t, last) for t in trials])
        assert row["balanced accuracy"] == mean_std(
            [accuracy(plan, t, last) - 0.02 for t in trials]
        )
        assert row["bytes up per client"] == f"{40 * plan.rounds_completed:.3g} kB"
        if plan.sigma is None:
            assert row["σ"] == "—"
            assert row["max ε (enforced)"] == row["max ε (other accountant)"] == "∞ (non-private)"
            assert row["AUROC"] == f"{auroc(plan, 0, last):.3f} (n = 1)"  # trial 1's undefined
        else:
            other = "rdp" if plan.accountant == "pld" else "pld"
            mark = " †" if plan.research_noise else ""
            assert row["σ"] == f"{plan.sigma:.3g}"
            assert row["max ε (enforced)"] == (
                f"{final_epsilon(plan, plan.accountant):.3g} ({plan.accountant.upper()}){mark}"
            )
            assert row["max ε (other accountant)"] == (
                f"{final_epsilon(plan, other):.3g} ({other.upper()})"
            )
    fedavg = table[PLANS[0].id[:8]]
    assert fedavg["grid point"] == "noise_multiplier=0.8"
    assert fedavg["rounds"] == "4/4"
    assert table[PLANS[2].id[:8]]["rounds"] == "3/4 (budget spent)"


def test_datasheets_show_every_field_escaped_and_the_worst_trial(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert "<weights>" not in text
    for plan in PLANS:
        sheet = section(text, plan.id)
        assert html.escape(THREAT_MODEL) in sheet
        assert all(html.escape(a) in sheet for a in ASSUMPTIONS)
        assert f"<dt>released outside ε</dt><dd>{html.escape(EVALUATION)}</dd>" in sheet
        if plan.sigma is None:
            assert "ε = ∞ (non-private)" in sheet
            assert "<dt>accountant (enforces budgets)</dt><dd>—</dd>" in sheet
            continue
        assert f"<dd>{plan.accountant.upper()}</dd>" in sheet
        assert (html.escape(RESEARCH_NOISE) in sheet) == plan.research_noise
        assert ("<dd>drawn from the operating system&#x27;s CSPRNG</dd>" in sheet) == (
            not plan.research_noise
        )
        data = datasheet(plan)
        assert data["unit"] in sheet
        assert data["mechanism"] in sheet
        (silo_table,) = tables(sheet)
        own, other = plan.accountant, "rdp" if plan.accountant == "pld" else "pld"
        assert silo_table == [
            {
                "silo": name,
                "public size": f"{silo['public_size']} (declared by the study)",
                "δ": "1e-05",
                "q": f"{16 / silo['public_size']:.4g}",
                "rounds charged": f"{plan.rounds_completed - 1}–{plan.rounds_completed} (by trial)",
                f"ε ({own.upper()}, enforced)": f"{silo_epsilon(plan, k, own):.3g}",
                f"ε ({other.upper()}, not enforced)": f"{silo_epsilon(plan, k, other):.3g}",
                "ε, other observers": "hospitals: 100" if silo["views"] else "—",
                "budget ε": "8",
                "events": silo["events"][0],
            }
            for k, (name, silo) in enumerate(data["silos"].items())
        ]


def test_the_worst_trial_is_shown_not_trial_0_nor_the_mean(page: Path) -> None:
    plan = PLANS[0]
    first = max(epsilon(plan, k, 3, "pld", 0) for k in range(len(SILOS)))
    mean = statistics.fmean(
        max(epsilon(plan, k, 3, "pld", t) for k in range(len(SILOS))) for t in range(plan.trials)
    )
    worst = final_epsilon(plan, "pld")
    assert worst > mean > first or worst > first > mean  # the hand-built trials differ
    assert results_table(page)[plan.id[:8]]["max ε (enforced)"] == f"{worst:.3g} (PLD) †"


def test_failed_runs_are_listed_with_their_error(page: Path) -> None:
    failed = tables(page.read_text(encoding="utf-8"))[-1]
    assert failed == [
        {
            "run": FAILED.id[:8],
            "algorithm": "cyclic",
            "grid point": "—",
            "error": "RuntimeError: loss is NaN at round 2 <diverged> & stopped",
        }
    ]
    assert RUNNING.id not in page.read_text(encoding="utf-8")


def test_page_is_self_contained(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert '<meta charset="utf-8">' in text
    assert '<link rel="icon" href="data:,">' in text  # no favicon request
    assert "http:" not in text and "https:" not in text and "<script" not in text


def test_every_image_is_a_png_inside_the_page(page: Path) -> None:
    sources = image_sources(page)
    assert len(sources) == 4
    for source in sources:
        prefix, _, data = source.partition(",")
        assert prefix == "data:image/png;base64"
        with Image.open(io.BytesIO(base64.b64decode(data, validate=True))) as image:
            assert image.format == "PNG"
            assert image.width > 400 and image.height > 200
            image.verify()
    assert [p.name for p in page.parent.iterdir()] == ["index.html"]  # one file to send


def test_research_noise_is_said_under_the_results_table(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    results = text[text.index("<h2 id='results'>") : text.index("<h2 id='privacy-utility'>")]
    assert f"† {html.escape(RESEARCH_NOISE)}" in results


def test_privacy_utility_draws_one_line_per_value_of_another_axis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plans = [
        Plan("mrmtl", {"algorithm.strength": strength, "privacy.noise_multiplier": sigma}, sigma)
        for strength in (0.1, 1.0)
        for sigma in (0.8, 1.6, 3.2)
    ]
    drawn: dict[str, Any] = {}
    draw = page_module.figure_html

    def keep(figure: Any, caption: str, absent: str = "") -> str:
        drawn.setdefault(caption.split(" ")[0], figure)
        return draw(figure, caption, absent)

    monkeypatch.setattr(page_module, "figure_html", keep)
    write_report(build_study(tmp_path, plans, failed=False))
    (ax,) = drawn["Final"].axes  # the privacy–utility figure's caption starts so
    handles, labels = ax.get_legend_handles_labels()
    assert labels == ["mrmtl (strength=0.1)", "mrmtl (strength=1.0)"]
    for handle, strength in zip(handles, (0.1, 1.0), strict=True):
        mine = [p for p in plans if p.grid["algorithm.strength"] == strength]
        expected = sorted(final_epsilon(p, "pld") for p in mine)
        assert list(handle[0].get_xdata()) == pytest.approx(expected)  # the line, not its bars


def test_learning_curves_give_each_run_its_own_colour_and_legend_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep of one algorithm over σ: its runs' curves must not look alike."""
    plans = [Plan("fedavg", {"privacy.noise_multiplier": s}, s) for s in (0.8, 1.6, 3.2)]
    drawn: dict[str, Any] = {}
    draw = page_module.figure_html

    def keep(figure: Any, caption: str, absent: str = "") -> str:
        drawn.setdefault(caption.split(" ")[0], figure)
        return draw(figure, caption, absent)

    monkeypatch.setattr(page_module, "figure_html", keep)
    write_report(build_study(tmp_path, plans, failed=False))
    (ax,) = drawn["Accuracy"].axes  # the learning curves' caption starts with the metric
    lines = ax.get_lines()
    assert len(lines) == len(plans)
    assert len({line.get_color() for line in lines}) == len(plans)
    labels = [text.get_text() for text in drawn["Accuracy"].legends[0].get_texts()]
    assert labels == [line.get_label() for line in lines] and len(set(labels)) == len(plans)


def test_empty_store_says_so(tmp_path: Path) -> None:
    ResultsStore(tmp_path / "results.sqlite").close()
    index = write_report(tmp_path)
    text = index.read_text(encoding="utf-8")
    assert "No finished runs" in text
    assert image_sources(index) == []


def test_single_run_single_trial_has_no_spread(tmp_path: Path) -> None:
    plan = Plan("fedavg", {}, 1.2, trials=1)
    index = write_report(build_study(tmp_path, [plan], failed=False), metric="auroc")
    row = results_table(index)[plan.id[:8]]
    assert row["AUROC"] == f"{auroc(plan, 0, 3):.3f} (n = 1)"  # a spread of one is unknown
    assert "±" not in row["accuracy"] and row["accuracy"].endswith(" (n = 1)")
    assert len(image_sources(index)) == 4
    assert "Failed runs" not in index.read_text(encoding="utf-8")


def test_an_accountant_missing_at_the_last_round_is_not_read_off_an_earlier_one(
    tmp_path: Path,
) -> None:
    def pld_only(plan: Plan) -> RunResults:
        full = results(plan)
        return replace(full, privacy=[row for row in full.privacy if row[4] == "pld"])

    plan = Plan("fedavg", {}, 1.2)
    build_study(tmp_path, [plan], failed=False, results_of=pld_only)
    row = results_table(write_report(tmp_path))[plan.id[:8]]
    assert row["max ε (enforced)"] == f"{final_epsilon(plan, 'pld'):.3g} (PLD) †"
    assert row["max ε (other accountant)"] == "—"


def test_unknown_metric_and_missing_store_are_errors(tmp_path: Path) -> None:
    build_study(tmp_path / "study", PLANS[:1], failed=False)
    with pytest.raises(ReportError, match=r"'acuracy'.*accuracy, auroc"):
        write_report(tmp_path / "study", metric="acuracy")
    with pytest.raises(StoreError, match="no results store"):
        write_report(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()


# -- the command ----------------------------------------------------------------------------


def test_command_prints_the_page(tmp_path: Path) -> None:
    build_study(tmp_path, PLANS, failed=True)
    app = typer.Typer()
    app.command()(report)
    runner = CliRunner()
    result = runner.invoke(app, [str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "report": str(tmp_path / "report" / "index.html"),
        "runs": len(PLANS),
    }
    result = runner.invoke(app, [str(tmp_path), "--metric", "balanced_accuracy"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(tmp_path / "report" / "index.html")
    result = runner.invoke(app, [str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    assert "no results store" in result.stderr
    result = runner.invoke(app, [str(tmp_path), "--metric", "acuracy"])
    assert result.exit_code == 2
    assert "no finished run has the metric 'acuracy'" in result.stderr


# -- the browser ----------------------------------------------------------------------------


def test_page_renders_in_chromium_without_errors(page: Path) -> None:
    with rendered(page) as shown:
        images = shown.tab.eval_on_selector_all(
            "img", "all => all.map(i => [i.getAttribute('src'), i.naturalWidth])"
        )
        title = shown.tab.title()
        headings = shown.tab.locator("h2").all_inner_texts()
        datasheets = shown.tab.locator("h3").all_inner_texts()
    assert shown.problems == []
    assert all(url == page.as_uri() or url.startswith("data:") for url in shown.requests)
    assert len(images) == 4
    assert all(width > 0 for _, width in images), images
    assert title == "dpfl report: icu-mortality"
    assert headings == HEADINGS
    assert len(datasheets) == len(PLANS)
    assert "fedavg (noise_multiplier=0.8)" in datasheets


def test_datasheets_written_before_per_trial_counts_and_public_sizes_still_render() -> None:
    from dpfl.experiments.results.datasheet import span
    from dpfl.experiments.results.report.page import _public_size

    assert span(5) == "5" and span([4, 5]) == "4–5 (by trial)"
    assert _public_size({"size": 7}) == "7"
    assert _public_size({"public_size": 9, "public_size_source": "declared"}) == "9 (declared)"
