"""What a study directory holds results of: its points and the data files they read.

A point's id hashes its configuration, not its data, and stays so (every run id that
exists keeps its value). So a directory records, in `study.json`, the points run into it
and, for every data folder they read (`data.path`), each file's size and SHA-256. A
later `run`/`sweep`/`tune` into the directory (`claim`) is refused, changing nothing:

* if a data folder's files changed (the finished results came from the old files and
  would be returned as if from the new): the changed files are named, before and after;
  the study goes into a new directory;
* if it brings points the directory does not hold (another study, or this one edited),
  unless asked to add them (`add`, the commands' `--add`): `best` and `report` read every
  run of a directory, and would mix the studies.

A directory from before this file records its store's runs as its points, and its data
as they are now (nothing older to compare them with).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from dpfl.experiments.results.queries import RESULTS_FILE, open_results
from dpfl.experiments.study.config import StudyConfig
from dpfl.files import replacing

IDENTITY = "study.json"
_SHORT = 12  # hex digits of a hash shown in a message

Fingerprint = dict[str, tuple[int, str]]
"""file (relative to its data folder) -> (size in bytes, SHA-256 in hex)"""
_HASHED: dict[tuple[str, int, int], str] = {}
"""SHA-256 by (path, mtime, size): a file is read once per process while it is unchanged."""


class StudyDirectoryError(ValueError):
    """A run into a directory that holds other results (another study's, or the results
    of other data)."""


def fingerprint(folder: Path) -> Fingerprint:
    """Size and SHA-256 of every file under `folder` (what its dataset's reader may
    read), or of `folder` itself where it is a file (an `.npz` of images, a table),
    hashed once per process for as long as the file's size and mtime hold."""
    found: Fingerprint = {}
    files = [folder] if folder.is_file() else sorted(p for p in folder.rglob("*") if p.is_file())
    for path in files:
        stat = path.stat()
        cached = (str(path), stat.st_mtime_ns, stat.st_size)
        if cached not in _HASHED:
            with path.open("rb") as file:
                _HASHED[cached] = hashlib.file_digest(file, "sha256").hexdigest()
        name = path.name if path == folder else path.relative_to(folder).as_posix()
        found[name] = (stat.st_size, _HASHED[cached])
    return found


def claim(
    out: Path, points: Sequence[StudyConfig], studies: Iterable[str], *, add: bool = False
) -> None:
    """Record that `points` (of the studies named) run into `out`, or refuse (see the
    module docstring), writing nothing. The caller owns `out`."""
    held = _read(out)
    names = sorted(set(studies))
    folders = sorted({str(c.data.path.resolve()) for c in points if c.data.path is not None})
    data = {folder: fingerprint(Path(folder)) for folder in folders}
    for folder, now in data.items():
        before = held["data"].get(folder)
        if before is not None and before != now:
            raise StudyDirectoryError(
                f"{out} holds results computed from other data: in {folder}, "
                f"{_changes(before, now)}. Its finished runs would be returned as if they "
                "had read these files: run the study into a new --out (or put the files "
                "back). Nothing was changed."
            )
    keys = [c.key() for c in points]
    new = [k for k in dict.fromkeys(keys) if k not in set(held["points"])]
    if held["points"] and new and not add:
        edited = set(names) <= set(held["studies"])  # the same study, its file since changed
        raise StudyDirectoryError(
            f"{out} holds the results of {_quoted(held['studies'])} "
            f"({_points(len(held['points']))}); "
            + ("as its file now reads, it" if edited else _quoted(names))
            + f" has {_points(len(new))} not among them, whose results `best` and `report` "
            "would mix with those. Run it into a new --out, or pass --add to add its points "
            "to this directory. Nothing was changed."
        )
    _write(
        out,
        {
            "studies": sorted({*held["studies"], *names}),
            "points": [*held["points"], *new],
            "data": {**held["data"], **data},
        },
    )


def _read(out: Path) -> dict[str, Any]:
    """The directory's record; for a directory from before it, its store's runs."""
    try:
        record = json.loads((out / IDENTITY).read_text(encoding="utf-8"))
    except FileNotFoundError:
        if not (out / RESULTS_FILE).exists():
            return {"studies": [], "points": [], "data": {}}
        with open_results(out) as store:
            runs = store.runs()
        return {
            "studies": sorted({r.study for r in runs}),
            "points": [r.id for r in runs],
            "data": {},
        }
    except (ValueError, OSError) as exc:
        raise StudyDirectoryError(f"{out / IDENTITY} cannot be read: {exc}") from exc
    record["data"] = {
        folder: {name: (size, digest) for name, (size, digest) in files.items()}
        for folder, files in record["data"].items()
    }
    return dict(record)


def _write(out: Path, record: dict[str, Any]) -> None:
    """Replace the record at once: a reader never sees half of one."""
    with replacing(out / IDENTITY, out / f".{IDENTITY}.{os.getpid()}") as partial:
        partial.write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")


def _changes(before: Fingerprint, now: Fingerprint) -> str:
    """`a.csv: 303 → 100 bytes, sha256 1f2e… → 9a8b…; b.csv added (12 bytes)`"""
    shown = []
    for name in sorted({*before, *now}):
        if name not in now:
            shown.append(f"{name} removed")
        elif name not in before:
            shown.append(f"{name} added ({now[name][0]:,} bytes)")
        elif before[name] != now[name]:
            (size, digest), (size_now, digest_now) = before[name], now[name]
            shown.append(
                f"{name}: {size:,} → {size_now:,} bytes, sha256 {digest[:_SHORT]}… → "
                f"{digest_now[:_SHORT]}…"
            )
    return "; ".join(shown)


def _quoted(names: Sequence[str]) -> str:
    listed = ", ".join(repr(n) for n in names)
    return f"study {listed}" if len(names) == 1 else f"studies {listed}"


def _points(count: int) -> str:
    return f"{count} point" + ("" if count == 1 else "s")
