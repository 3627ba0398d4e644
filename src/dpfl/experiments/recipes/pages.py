"""The reproduction pages' tables, generated, never written by hand.

A recipe's run is stored as `dpfl reproduce NAME --out DIR --json` printed it, in
`docs/reproductions/results/NAME-SCALE.json`; a page holds its table between
`<!-- table: NAME SCALE -->` and `<!-- end table -->`, and `python -m
dpfl.experiments.recipes.pages` rewrites every such block from its stored run (`--check`: only
say which blocks differ). `markdown` is also what `dpfl reproduce --markdown` prints, so
a pasted table and a rebuilt one are the same text.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from dpfl.experiments.recipes.base import Row

PAGES = Path("docs/reproductions")
"""The pages, from the repository's root."""
RESULTS = "results"
"""The stored runs' folder, in `PAGES`."""
BLOCK = re.compile(
    r"(<!-- table: (?P<name>\S+) (?P<scale>\S+) -->\n)(?P<body>.*?)(<!-- end table -->)",
    re.DOTALL,
)
LEGEND = (
    "n: the trials (or seeds) behind *ours*, the fewest where it compares several runs; "
    "— where *ours* is no measured figure. A row with n = 1 is a single trial: no "
    "conclusion rests on it alone."
)


def markdown(title: str, rows: Sequence[Row], notes: Iterable[str] = ()) -> str:
    """The recipe's table as Markdown: its title, one line a row (`|` escaped), the
    trials behind each row's figures (`n`), the legend, then the run's notes."""
    lines = [f"**{_cell(title)}**", "", "| setting | paper | ours | n | note |"]
    lines.append("|---|---|---|---|---|")
    for row in rows:
        n = "—" if row.trials is None else str(row.trials)
        cells = (row.setting, row.paper, row.ours, n, row.note)
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    lines += ["", LEGEND]
    lines += [f"\nNote: {_cell(note)}" for note in notes]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def stored(path: Path) -> tuple[str, list[Row], list[str]]:
    """A stored run's title, rows and notes; a ValueError naming the file if it is not
    what `dpfl reproduce --json` prints today (e.g. rows without `trials`)."""
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        names = {f.name for f in fields(Row)}
        rows = []
        for row in data["rows"]:
            if set(row) != names:
                raise ValueError(f"a row's keys are {sorted(row)}, not {sorted(names)}")
            rows.append(Row(**row))
        return str(data["title"]), rows, [str(note) for note in data["notes"]]
    except (OSError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path}: not a stored `dpfl reproduce --json` run ({error})") from error


def rendered(page: str, results: Path) -> str:
    """`page` with each table block rebuilt from its stored run in `results`."""

    def block(match: re.Match[str]) -> str:
        path = results / f"{match['name']}-{match['scale']}.json"
        if not path.exists():
            raise ValueError(f"a table block names {path}, which does not exist")
        return match[1] + markdown(*stored(path)) + match[5]

    return BLOCK.sub(block, page)


def rebuild(folder: Path = PAGES, *, check: bool = False) -> list[Path]:
    """The pages in `folder` whose table blocks differ from their stored runs; rewritten
    unless `check`."""
    stale = []
    for page in sorted(folder.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        new = rendered(text, folder / RESULTS)
        if new != text:
            stale.append(page)
            if not check:
                page.write_text(new, encoding="utf-8")
    return stale


def main(argv: Sequence[str] = ()) -> int:
    """`python -m dpfl.experiments.recipes.pages [--check]`, from the repository's root."""
    check = "--check" in argv
    try:
        stale = rebuild(check=check)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for page in stale:
        print(f"{'stale' if check else 'rebuilt'}: {page}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
