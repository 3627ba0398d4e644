"""`dpfl deploy status`: a hospital's ledger as its data-protection officer reads it.
Two studies share the hospital's capped records; the second is refused by the cap. The
statement names studies by their human names, shows as ε left what the cap leaves where
the cap binds (and says which binds), counts training events, statistics and
evaluations apart, and rounds trained; `--html` writes one page that renders in
Chromium with the names, the cap and the refusal's reason visible, everything escaped."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from browser import rendered
from dpfl.cli import app
from dpfl.privacy import BudgetExceededError, Ledger, events
from dpfl.privacy.governance import Approval
from dpfl.privacy.statement import (
    EVALUATION,
    OTHER,
    STATISTIC,
    TRAINING,
    kind_of,
    over_time,
    read,
)

FIRST = "d1b17e811b9c4d0f"
SECOND = "5e60c0dd2f7a9b31"
NAMES = {FIRST: "breast <cancer> & co", SECOND: "second-study"}
"""The studies' human names (the first one's is markup, to be shown as written)."""
CAP, DELTA = 3.0, 1e-5
BUDGET = 2.9
"""The first study's: it spends ≈ 2.876, the cap's rest is more (≈ 0.08)."""
ME = "hospital-0/trial-0"
VIEW = f"{ME}/hospitals"
TRAIN = events.poisson_gaussian(0.05, 1.2, steps=20)
STAT = events.gaussian(6.0)
EVALUATE = events.gaussian(8.0)
IDENTITY = Ed25519PrivateKey.from_private_bytes(bytes(32))


@dataclass(frozen=True)
class Built:
    path: Path
    reason: str


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The first study trains 3 rounds of 2 exchanges (its view recorded beside), releases
    a record count and 2 statistics and evaluates; the second releases 1 statistic and
    is refused its first round by the cap."""
    path = tmp_path_factory.mktemp("hospital") / "hospital.sqlite"
    with Ledger(path) as steward:
        steward.cap_dataset("hospital-0", epsilon=CAP, delta=DELTA)
    with Ledger(path, study=FIRST) as book:
        book.register_silo(ME, epsilon=BUDGET, delta=DELTA, dataset="hospital-0")
        book.register_silo(VIEW, epsilon=math.inf, delta=DELTA)
        for round_ in range(3):
            for _ in range(2):
                book.record_many(
                    [(ME, TRAIN), (VIEW, TRAIN)],
                    label=f"fedavg deployment of {FIRST} instance 0",
                    round=round_,
                )
        book.release("record count of hospital-0", [(ME, events.gaussian(20.0))], lambda: 569.0)
        for title in ("n", "age: mean"):
            book.record(ME, STAT, label=f"stats: {title}")
        book.record(ME, EVALUATE, label=f"evaluation of the final model: fedavg of {FIRST}")
    with Ledger(path, study=SECOND) as book:
        book.register_silo(ME, epsilon=2.0, delta=DELTA, dataset="hospital-0")
        book.record(ME, EVALUATE, label="stats: n")
        with pytest.raises(BudgetExceededError) as refused:
            book.record(ME, TRAIN, label=f"fedavg deployment of {SECOND} instance 0", round=0)
    reason = f"<b>{refused.value}</b>"  # markup, to be shown as written
    with Ledger(path) as book:  # the hospital's names, approvals and refusal
        for i, (key, eps) in enumerate(((FIRST, BUDGET), (SECOND, 2.0))):
            book.name_study(key, NAMES[key])
            approval = Approval(
                f"approval-{i}", NAMES[key], key, "s" * 64, "m" * 64, "c" * 64, "0.9.0",
                eps, DELTA, CAP
            )  # fmt: skip
            book.approve(approval, IDENTITY)
    with Ledger(path, study=SECOND) as book:
        book.refuse(ME, reason, round=0)
    return Built(path, reason)


def _status(path: Path, *args: str) -> str:
    shown = CliRunner().invoke(
        app, ["deploy", "status", "--ledger", str(path), *args], env={"COLUMNS": "250"}
    )
    assert shown.exit_code == 0, shown.output
    return shown.stdout


def test_json_names_studies_counts_kinds_apart_and_says_which_bound_binds(built: Built) -> None:
    status = json.loads(_status(built.path, "--json"))
    by = {(a["study"], a["account"].split(":", 1)[1]): a for a in status["accounts"]}
    first, view, second = by[(FIRST, ME)], by[(FIRST, VIEW)], by[(SECOND, ME)]
    (capped,) = status["datasets"]
    # the second study's own budget leaves more than the cap: the cap's rest is its ε left
    assert second["budget"] - second["epsilon"] > capped["left"]
    assert second["left"] == capped["left"] and second["left_binding"] == "cap"
    assert [a["name"] for a in (first, view, second)] == [NAMES[FIRST]] * 2 + [NAMES[SECOND]]
    assert first["left"] == pytest.approx(BUDGET - first["epsilon"])
    assert first["left"] < capped["left"]
    assert first["left_binding"] == "budget"
    assert view["budget"] == view["left"] == math.inf and view["left_binding"] is None
    counts = ("training_events", "statistics", "evaluations", "other_events", "rounds_trained")
    assert [first[k] for k in counts] == [6, 3, 1, 0, 3]
    assert [view[k] for k in counts] == [6, 0, 0, 0, 3]
    assert [second[k] for k in counts] == [0, 1, 0, 0, 0]
    assert first["events"] == 10 and first["rounds"] == 3
    assert set(capped["studies"]) == {FIRST, SECOND} and status["names"] == NAMES
    (refusal,) = status["refusals"]
    assert refusal["study"] == SECOND and "its cap 3 " in refusal["reason"]
    assert [a["study_key"] for a in status["approvals"]] == [FIRST, SECOND]
    with Ledger(built.path, create=False) as book:
        head = book.head()
    assert head is not None
    assert status["verification"] == {
        "ok": True, "entries": head.seq, "head": head.hash, "seals": 0, "problems": [],
        "chained": True,
    }  # fmt: skip
    released = [(r["kind"], r["label"]) for r in status["released"]]
    assert released[:4] == [
        (STATISTIC, "release record count of hospital-0"),
        (STATISTIC, "stats: n"),
        (STATISTIC, "stats: age: mean"),
        (EVALUATION, f"evaluation of the final model: fedavg of {FIRST}"),
    ]
    assert released[4] == (STATISTIC, "stats: n") and len(released) == 5


def test_table_shows_names_the_binding_bound_and_a_broken_chain(
    built: Built, tmp_path: Path
) -> None:
    table = _status(built.path)
    assert NAMES[FIRST] in table and NAMES[SECOND] in table
    assert "rounds trained" in table and "training events" in table and "(cap)" in table
    assert "chain verified: " in table and " entries, 0 seals" in table
    edited = tmp_path / "edited.sqlite"
    shutil.copyfile(built.path, edited)
    db = sqlite3.connect(edited)
    db.execute("UPDATE silos SET epsilon = 29.0 WHERE epsilon = 2.9")
    db.commit()
    db.close()
    assert "chain BROKEN" in _status(edited) and "epsilon 2.9 → 29.0" in _status(edited)


def test_spending_over_time_ends_at_what_the_ledger_reports(built: Built) -> None:
    """ε after each charge, composed in the order recorded, ends where the ledger's own
    accounting does (`Ledger.spent` through a round could not: it counts the round-less
    statistics from the start)."""
    with Ledger(built.path, create=False) as book:
        statement = read(book, over_time=True)
        spent = {a.silo: a.spent.epsilon for a in book.accounts()}
        (capped,) = book.datasets()
        through_round_0 = book.spent(f"{FIRST}:{ME}", through_round=0).epsilon
    first = statement.spending[f"account {FIRST}:{ME}"]
    assert through_round_0 > first[1].epsilon  # round 0's two exchanges, and no more
    assert len(first) == 10  # one point per time charged: 6 exchanges, 4 releases
    assert [p.epsilon for p in first] == sorted(p.epsilon for p in first)
    assert first[-1].epsilon == spent[f"{FIRST}:{ME}"]
    assert statement.spending["dataset hospital-0"][-1].epsilon == capped.spent.epsilon
    assert f"account {FIRST}:{VIEW}" not in statement.spending  # no bound: no curve


def test_a_long_history_is_drawn_at_a_few_of_its_charges_the_last_among_them(
    built: Built,
) -> None:
    with Ledger(built.path, create=False, study=FIRST) as book:
        entries = book.entries(ME)
    points = over_time(entries, DELTA, None, most=3)
    assert len(points) == 3 and points[-1].at == entries[-1].recorded_at
    assert points[-1].epsilon == over_time(entries, DELTA, None)[-1].epsilon


def test_a_charge_is_of_the_kind_its_engine_records() -> None:
    assert kind_of("fedavg deployment of d1b1 instance 0", 3) == TRAINING
    assert kind_of("stats: Table 1", None) == STATISTIC
    assert kind_of("release patient count of hospital-0", None) == STATISTIC
    assert kind_of("evaluation of the final model: fedavg", None) == EVALUATION
    assert kind_of("private selection over 4 points", None) == OTHER


class _Page(HTMLParser):
    """Tags, attributes that fetch, and the page's text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.sources: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.sources += [v or "" for k, v in attrs if k in ("src", "href")]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.fixture(scope="module")
def page(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("page") / "statement.html"
    before = sorted(built.path.parent.iterdir())
    _status(built.path, "--html", str(out))
    assert sorted(built.path.parent.iterdir()) == before  # nothing beside the ledger
    return out


def test_page_is_one_file_with_everything_escaped(page: Path) -> None:
    parsed = _Page()
    parsed.feed(page.read_text(encoding="utf-8"))
    assert "script" not in parsed.tags and "b" not in parsed.tags  # the reason's <b>: text
    assert all(s.startswith("data:") for s in parsed.sources), parsed.sources
    text = "".join(parsed.text)
    assert NAMES[FIRST] in text and "<b>dataset 'hospital-0'" in text
    assert "approval-0" in text and "in force" in text and "stats: age: mean" in text


def test_page_renders_in_chromium_with_the_names_the_cap_and_the_refusal(page: Path) -> None:
    with rendered(page) as shown:
        text = shown.tab.inner_text("body")
        images = shown.tab.eval_on_selector_all("img", "all => all.map(i => i.naturalWidth)")
        headings = shown.tab.locator("h2").all_inner_texts()
    assert shown.problems == []
    assert all(url == page.as_uri() or url.startswith("data:") for url in shown.requests)
    assert len(images) == 1 and images[0] > 0
    assert headings == [
        "Datasets",
        "Studies",
        "Approvals",
        "Spending over time",
        "Refusals",
        "Statistics released",
    ]
    assert NAMES[FIRST] in text and NAMES[SECOND] in text
    assert "hospital-0\t3\t" in text  # the cap, in its row
    assert "<b>dataset 'hospital-0'" in text and "its cap 3 " in text  # the reason
    assert "(cap)" in text and "chain verified: " in text


def test_a_study_without_a_known_name_is_shown_by_its_key(
    built: Built, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Ledger, "study_names", lambda self: {FIRST: "same"})
    with Ledger(built.path, create=False) as book:
        statement = read(book)
    assert statement.name_of(SECOND) == SECOND and statement.name_of(None) == "—"
    amended = replace(statement, names={FIRST: "same", SECOND: "same"})
    assert amended.name_of(SECOND) == f"same ({SECOND[:12]})"


def test_a_ledger_from_before_the_chain_is_shown_as_such_not_as_broken(
    built: Built, tmp_path: Path
) -> None:
    old = tmp_path / "old.sqlite"
    shutil.copyfile(built.path, old)
    db = sqlite3.connect(old)
    db.execute("DROP TABLE chain")
    db.execute("PRAGMA user_version = 3")  # as dpfl 0.6 wrote it
    db.commit()
    db.close()
    table = _status(old)
    assert "no hash chain: " in table and "dpfl privacy upgrade" in table
    assert "BROKEN" not in table and NAMES[FIRST] in table
