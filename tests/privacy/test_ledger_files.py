"""A damaged ledger file (truncated, overwritten, bytes appended) is refused by name, by
the Python API and by `dpfl privacy ledger` in one line, and is never modified; readers
create nothing beside a ledger, damaged or not.

The faults are injected deterministically into a copy of one ledger, and are shared with
tests/experiments/test_store.py."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.privacy import Ledger, LedgerError, events
from dpfl.privacy.ledger import DamagedLedgerError
from dpfl.sqlite_file import DamagedFileError

STEP = events.poisson_gaussian(0.01, 1.0)


def _page_size(data: bytes) -> int:
    return int.from_bytes(data[16:18], "big")


def _overwrite_a_page(data: bytes) -> bytes:
    """16 bytes of 0xff over the header of the middle b-tree page."""
    size = _page_size(data)
    pages = [p for p in range(1, len(data) // size) if data[p * size] in (2, 5, 10, 13)]
    start = pages[len(pages) // 2] * size
    return data[:start] + b"\xff" * 16 + data[start + 16 :]


FAULTS: dict[str, Callable[[bytes], bytes]] = {
    "truncated to half": lambda data: data[: len(data) // 2],
    "one page short": lambda data: data[: -_page_size(data)],
    "one byte short": lambda data: data[:-1],
    "page size overwritten": lambda data: data[:16] + b"\x00\x03" + data[18:],
    "a page overwritten": _overwrite_a_page,
    "garbage appended": lambda data: data + b"garbage" * 10,
    "a page appended": lambda data: data + bytes(_page_size(data)),
}
BESIDE = ("-wal", "-shm", "-journal")


def damage(path: Path, fault: str) -> bytes:
    """Apply `fault` to the file at `path`; its new bytes."""
    data = FAULTS[fault](path.read_bytes())
    path.write_bytes(data)
    return data


def nothing_beside(path: Path) -> bool:
    return not any(path.with_name(path.name + suffix).exists() for suffix in BESIDE)


def one_line_naming(path: Path, stderr: str) -> bool:
    """Whether `dpfl` said one error line (a sweep's progress may come before it) that
    names the file and says that nothing was written."""
    said = [line for line in stderr.splitlines() if line.startswith("error:")]
    return len(said) == 1 and str(path) in said[0] and "nothing was written" in said[0]


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A closed ledger of 40 events on many pages, as the last writer leaves it."""
    path = tmp_path_factory.mktemp("healthy") / "study.sqlite"
    with Ledger(path, accountant="rdp") as book:
        book.register_silo("a", epsilon=math.inf, delta=1e-5)
        for r in range(40):
            book.record("a", STEP, round=r, label=f"round {r} " + "." * 1000)
    assert nothing_beside(path)
    return path.read_bytes()


@pytest.mark.parametrize("fault", FAULTS)
def test_a_damaged_ledger_is_refused_by_name_and_left_as_it_was(
    healthy: bytes, tmp_path: Path, fault: str
) -> None:
    path = tmp_path / "study.sqlite"
    path.write_bytes(healthy)
    data = damage(path, fault)
    for create in (False, True):  # a reader, and a writer about to charge a budget
        with pytest.raises(DamagedLedgerError, match="nothing was written") as refused:
            Ledger(path, create=create)
        assert isinstance(refused.value, LedgerError) and isinstance(
            refused.value, DamagedFileError
        )
        assert f"ledger {path} is damaged (" in str(refused.value)
        assert "\n" not in str(refused.value) and refused.value.path == path
        assert path.read_bytes() == data and os.listdir(tmp_path) == [path.name]


@pytest.mark.parametrize("fault", FAULTS)
def test_dpfl_privacy_ledger_says_one_line_for_a_damaged_ledger(
    healthy: bytes, tmp_path: Path, fault: str
) -> None:
    path = tmp_path / "study.sqlite"
    path.write_bytes(healthy)
    data = damage(path, fault)
    shown = CliRunner().invoke(app, ["privacy", "ledger", str(path), "--events"])
    assert shown.exit_code == 1, shown.output
    assert one_line_naming(path, shown.stderr) and "Traceback" not in shown.output
    assert shown.stderr.startswith(f"error: ledger {path} is damaged (")
    assert shown.stderr.count("\n") == 1
    assert path.read_bytes() == data and os.listdir(tmp_path) == [path.name]


def test_reading_a_healthy_ledger_creates_nothing_beside_it(healthy: bytes, tmp_path: Path) -> None:
    path = tmp_path / "study.sqlite"
    path.write_bytes(healthy)
    stamp = path.stat().st_mtime_ns
    with Ledger(path, create=False) as reader:
        assert reader.accounts()[0].events == 40
    shown = CliRunner().invoke(app, ["privacy", "ledger", str(path), "--json"])
    assert shown.exit_code == 0, shown.output
    assert os.listdir(tmp_path) == [path.name]  # no -wal, no -shm
    assert path.read_bytes() == healthy and path.stat().st_mtime_ns == stamp


def test_a_reader_sees_what_an_open_writer_committed(tmp_path: Path) -> None:
    """While a writer holds the ledger open, its commits are in the write-ahead log, not
    yet in the file: a reader reads them through the log."""
    path = tmp_path / "study.sqlite"
    with Ledger(path) as writer:
        writer.register_silo("a", epsilon=10.0, delta=1e-5)
        writer.record("a", STEP)
        assert not nothing_beside(path)  # the writer's log and index
        with Ledger(path, create=False) as reader:
            assert reader.spent("a") == writer.spent("a")
            assert len(reader.entries("a")) == 1
