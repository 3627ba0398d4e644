"""One ledger shared by a hospital's studies: a dataset's cap across them, and many
processes charging it at once."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
from dp_accounting import dp_event as dpe
from dp_accounting.pld import pld_privacy_accountant
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.privacy import BudgetExceededError, Ledger, LedgerError, events
from dpfl.privacy import ledger as ledger_module
from dpfl.privacy.accounting import PLD_DISCRETISATION, epsilon

FIRST = events.poisson_gaussian(0.01, 1.0, steps=10)
SECOND = events.poisson_gaussian(0.02, 1.5, steps=10)
DELTA = 1e-5


def _study(path: Path, study: str, epsilon: float = 5.0) -> Ledger:
    book = Ledger(path, study=study)
    book.register_silo("a/trial-0", epsilon=epsilon, delta=DELTA, dataset="a")
    return book


def test_a_second_study_past_a_datasets_cap_is_refused_naming_the_first(
    tmp_path: Path,
) -> None:
    path = tmp_path / "hospital.sqlite"
    with Ledger(path) as steward:
        steward.cap_dataset("a", epsilon=1.5, delta=DELTA)
    with _study(path, "study-1") as first:
        for round_ in range(40):
            first.record("a/trial-0", FIRST, round=round_)
        assert first.spent("a/trial-0").epsilon < 1.5
    with _study(path, "study-2") as second:
        assert second.silos() == ["a/trial-0"]  # its own account, not study-1's
        assert second.spent("a/trial-0").epsilon == 0.0
        plan = events.repeat(SECOND, 40)
        assert second.projected("a/trial-0", plan).epsilon < 5.0  # its own budget holds
        why = second.refusal([("a/trial-0", plan)])
        assert why is not None and "dataset 'a'" in why and "study-1 (ε=" in why
        recorded = 0
        with pytest.raises(BudgetExceededError, match=r"dataset 'a'.*by study-1 \(ε="):
            for _ in range(40):
                second.record("a/trial-0", SECOND)
                recorded += 1
        assert 0 < recorded < 40
    with Ledger(path, create=False) as reader:
        (shared,) = reader.datasets()
        assert set(shared.studies) == {"study-1", "study-2"}
        both = dpe.ComposedDpEvent(
            [
                dpe.SelfComposedDpEvent(FIRST.dp_event, 40),
                dpe.SelfComposedDpEvent(SECOND.dp_event, recorded),
            ]
        )
        independent = pld_privacy_accountant.PLDAccountant(
            value_discretization_interval=PLD_DISCRETISATION
        )
        independent.compose(both)
        assert shared.spent.epsilon == pytest.approx(independent.get_epsilon(DELTA), rel=1e-6)
        assert shared.spent.epsilon <= 1.5
        # the composition, not a sum: less than the two studies' ε added up
        assert shared.spent.epsilon < sum(r.epsilon for r in shared.studies.values())


def test_a_cap_holding_a_selection_binds_a_pld_study_by_rdp(tmp_path: Path) -> None:
    """A study's private selection (a tuned event, which RDP alone analyses) spends from a
    cap; a study enforcing its own budget by PLD is then held to the cap by RDP, not
    refused as unanalysable, and is refused past it naming the selection."""
    path = tmp_path / "hospital.sqlite"
    with Ledger(path) as steward:
        steward.cap_dataset("a", epsilon=3.0, delta=DELTA)
    selection = events.tuned(events.repeat(FIRST, 40), mean=3.0, shape=1.0)
    with Ledger(path, study="tuned", accountant="rdp") as tuned:
        tuned.register_silo("a/trial-0", epsilon=5.0, delta=DELTA, dataset="a")
        tuned.record("a/trial-0", selection)
    with Ledger(path, study="swept", accountant="pld") as swept:
        swept.register_silo("a/trial-0", epsilon=5.0, delta=DELTA, dataset="a")
        assert swept.can_afford("a/trial-0", SECOND)
        swept.record("a/trial-0", SECOND)
        assert swept.affordable_repeats("a/trial-0", SECOND) > 0
        with pytest.raises(BudgetExceededError, match=r"dataset 'a'.*tuned \(ε="):
            swept.record("a/trial-0", events.repeat(SECOND, 400))
        assert swept.spent("a/trial-0").accountant.value == "pld"  # its own account: PLD
    with Ledger(path, create=False) as reader:
        (cap,) = reader.datasets()
    both = events.compose([selection, SECOND])
    assert cap.spent.accountant.value == "rdp"
    assert cap.spent.epsilon == pytest.approx(epsilon(both, DELTA, "rdp").epsilon)


def test_caps_are_fixed_and_an_account_needs_a_capped_dataset(tmp_path: Path) -> None:
    with Ledger(tmp_path / "h.sqlite") as book:
        with pytest.raises(LedgerError, match="dataset 'a' has no cap"):
            book.register_silo("x", epsilon=1.0, delta=DELTA, dataset="a")
        book.cap_dataset("a", epsilon=8.0, delta=DELTA)
        book.cap_dataset("a", epsilon=8.0, delta=DELTA)  # a restart: the same cap
        with pytest.raises(LedgerError, match="already capped at"):
            book.cap_dataset("a", epsilon=9.0, delta=DELTA)
        book.register_silo("x", epsilon=1.0, delta=DELTA, dataset="a")
        with pytest.raises(LedgerError, match="refusing to change"):
            book.register_silo("x", epsilon=1.0, delta=DELTA)


def test_a_charge_computed_before_another_writer_committed_is_checked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced interleaving: after this writer computed ε (one more round fits) but before
    it takes the write lock, another writer spends the last of the budget. Inside the
    lock it sees the ledger changed, computes again and refuses."""
    path = tmp_path / "l.sqlite"
    with Ledger(path) as book, Ledger(path) as other:
        book.register_silo("a", epsilon=between(1, 2), delta=DELTA)  # one round fits
        taken = []
        locking = ledger_module.write_transaction

        def interleaved(db):  # type: ignore[no-untyped-def]
            if not taken and db is book._db:
                taken.append(other.record("a", FIRST))
            return locking(db)

        monkeypatch.setattr(ledger_module, "write_transaction", interleaved)
        with pytest.raises(BudgetExceededError, match="nothing was recorded"):
            book.record("a", FIRST)
        assert len(taken) == 1 and [e.id for e in book.entries("a")] == [taken[0].id]


def between(rounds: int, more: int, accountant: str | None = None) -> float:
    """A budget that `rounds` rounds of FIRST fit in, and `more` do not."""
    eps = [
        ledger_module.plan_epsilon(events.repeat(FIRST, n), DELTA, accountant).epsilon
        for n in (rounds, more)
    ]
    return sum(eps) / 2


def _writer(path: Path, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """Charge until refused; report how many charges were recorded or the error."""
    recorded = 0
    try:
        with Ledger(path, accountant="rdp") as book:  # RDP: quick, so the test is quick
            while True:
                try:
                    book.record("a", FIRST)
                except BudgetExceededError:
                    break
                recorded += 1
        results.put(recorded)
    except Exception as exc:  # reported, not lost: a "locked" here fails the test
        results.put(repr(exc))


def test_concurrent_writers_never_pass_the_budget_nor_fail(tmp_path: Path) -> None:
    """Eight processes charge one account until refused: no error ("database is
    locked" or other), every charge that fits is recorded, none past the budget."""
    path = tmp_path / "l.sqlite"
    fits = 60
    budget = between(fits, fits + 1, "rdp")
    with Ledger(path) as book:
        book.register_silo("a", epsilon=budget, delta=DELTA)
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    writers = [context.Process(target=_writer, args=(path, results)) for _ in range(8)]
    for writer in writers:
        writer.start()
    counts = [results.get(timeout=600) for _ in writers]
    for writer in writers:
        writer.join()
    assert all(isinstance(n, int) for n in counts), counts
    assert sum(counts) == fits
    with Ledger(path, create=False, accountant="rdp") as reader:
        assert len(reader.entries("a")) == fits
        assert reader.spent("a").epsilon <= budget


def test_deploy_status_shows_each_study_and_the_cap_and_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "hospital.sqlite"
    with Ledger(path) as steward:
        steward.cap_dataset("a", epsilon=8.0, delta=DELTA)
    for study, rounds in (("study-1", 3), ("study-2", 2)):
        with _study(path, study) as book:
            for round_ in range(rounds):
                book.record("a/trial-0", FIRST, round=round_)
    before = sorted(tmp_path.iterdir())
    shown = CliRunner().invoke(app, ["deploy", "status", "--ledger", str(path), "--json"])
    assert shown.exit_code == 0, shown.output
    status = json.loads(shown.stdout)
    assert [(a["study"], a["account"], a["rounds"]) for a in status["accounts"]] == [
        ("study-1", "study-1:a/trial-0", 3),
        ("study-2", "study-2:a/trial-0", 2),
    ]
    (cap,) = status["datasets"]
    assert cap["cap"] == 8.0 and set(cap["studies"]) == {"study-1", "study-2"}
    with Ledger(path, create=False) as reader:
        assert cap["epsilon"] == reader.datasets()[0].spent.epsilon
        assert cap["left"] == pytest.approx(8.0 - cap["epsilon"])
    table = CliRunner().invoke(app, ["deploy", "status", "--ledger", str(path)])
    assert table.exit_code == 0 and "study-2" in table.stdout and "cap" in table.stdout
    assert sorted(tmp_path.iterdir()) == before  # read-only: no -wal, no -shm
