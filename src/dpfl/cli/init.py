"""`dpfl init TABLE --label COLUMN`: a study file for a table of one's own, written from
the table's header alone.

The names of the columns, and their types as pyarrow infers them from the first block of
rows (a CSV) or the schema (Parquet), are all it reads; no value is kept or printed. Every
number gets `range = ["?", "?"]` and every text `categories = ["?"]`, for the user to
fill from a public source: a range or a category list read off the records would release
them. `dpfl sweep` refuses the file, naming each `?`, until they are filled.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated

import typer

from .common import console, reported_errors

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def init(
    table: Annotated[Path, typer.Argument(help="The cohort: a .csv or .parquet file.")],
    label: Annotated[
        str | None, typer.Option(help="The label column (integer classes, or 0/1).")
    ] = None,
    time: Annotated[str | None, typer.Option(help="Survival: the time column.")] = None,
    event: Annotated[str | None, typer.Option(help="Survival: the event column (0/1).")] = None,
    site: Annotated[
        str | None, typer.Option(help="The site column: one silo per site (a hospital).")
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="The study file to write (never overwritten).")
    ] = Path("study.toml"),
) -> None:
    """Write a study file for TABLE from its header alone: its ranges and categories are
    yours to declare from public sources, and `dpfl sweep` refuses it until they are."""
    from dpfl.data.dataset import DataFormatError

    with reported_errors():
        if (label is None) == (time is None or event is None) or (time is None) != (event is None):
            raise ValueError("give --label COLUMN, or --time COLUMN and --event COLUMN")
        if out.exists():
            raise ValueError(f"{out} exists: it is not overwritten; pass another --out")
        numeric = _column_types(table)
        targets = [c for c in (label, time, event, site) if c is not None]
        for name in targets:
            if name not in numeric:
                raise DataFormatError(
                    table, f"no such column (the header has {', '.join(numeric)})", column=name
                )
        features = [c for c in numeric if c not in targets]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(_study(table, out, label, time, event, site, features, numeric))
        console.print(
            f"wrote {out}: fill in each '?' ({len(features)} columns) from a public source, "
            "delete the columns that are not features, then `dpfl sweep "
            f"{out} --out runs/{table.stem}`"
        )


def _column_types(table: Path) -> dict[str, bool]:
    """Each column's name and whether it holds numbers, from the header and the types
    pyarrow infers (a CSV's first block of rows; a Parquet file's schema): no value."""
    import pyarrow as pa
    from pyarrow import csv as pcsv
    from pyarrow import parquet as pq

    from dpfl.data.dataset import DataFormatError, require_file
    from dpfl.data.table import CSV_SUFFIXES, PARQUET_SUFFIXES

    require_file(table)
    name = table.name.lower()
    try:
        if name.endswith(PARQUET_SUFFIXES):
            schema = pq.read_schema(table)
        elif name.endswith(CSV_SUFFIXES):
            schema = pcsv.open_csv(table, read_options=pcsv.ReadOptions(block_size=1 << 16)).schema
        else:
            raise DataFormatError(table, "not a table: name a .csv or .parquet file")
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataFormatError(table, f"cannot be read as a table: {exc}") from exc
    return {
        field.name: pa.types.is_integer(field.type) or pa.types.is_floating(field.type)
        for field in schema
    }


def _key(name: str) -> str:
    """A TOML key: bare where it may be, else quoted."""
    return name if _BARE.match(name) else json.dumps(name)


def _study(
    table: Path,
    out: Path,
    label: str | None,
    time: str | None,
    event: str | None,
    site: str | None,
    features: list[str],
    numeric: dict[str, bool],
) -> str:
    path = Path(os.path.relpath(table.resolve(), out.resolve().parent)).as_posix()
    if label is not None:
        target = (
            f"label = {json.dumps(label)}\n"
            "classes = [0, 1]                   # the label's values as written in the file,\n"
            "                                   # from the data dictionary (never the records)\n"
        )
        model, metrics = 'kind = "logistic_regression"', '["accuracy", "auroc"]'
    else:
        target = f"time = {json.dumps(time)}\nevent = {json.dumps(event)}\n"
        model = 'kind = "logistic_regression"\ntime_bins = ["?"]  # public cut points, in its unit'
        metrics = '["c_index"]'
    sites = (
        f"site = {json.dumps(site)}                 # one silo per value\n"
        'public_sizes = "dp-count"          # each site\'s public size: a DP count, charged\n'
        "                                   # (run, sweep); dpfl tune needs declared sizes:\n"
        '# public_sizes = "declared"        # then declare each one (at most its records):\n'
        "# sites = { name_of_a_site = 1200, another_site = 800 }\n"
        if site is not None
        else 'partition = { kind = "iid", silos = 3 }\n'
    )
    columns = "".join(
        f"\n[data.columns.{_key(name)}]\n"
        + (
            'range = ["?", "?"]                 # a number: a public range (reference range,\n'
            "                                   # data dictionary); scaled to [0, 1], clipped\n"
            '# missing = "zero"                 # what an empty cell is (or a value)\n'
            "# log = true                       # the range on the log scale\n"
            if numeric[name]
            else 'categories = ["?"]                 # text: the values of the data dictionary;\n'
            "                                   # another is 'other', an empty cell missing\n"
        )
        for name in features
    )
    listed = "".join(f"    {json.dumps(name)},\n" for name in features)
    survival = label is None
    return f"""# A study of {table.name}, written by `dpfl init` from the file's header alone (its
# column names, and their types from a few rows that were neither kept nor printed).
#
# Fill in every "?" before `dpfl sweep` (which refuses them, naming each): the ranges and
# categories must come from public sources, never from the records. A minimum, maximum or
# category list read off the records would be released by every model trained with it,
# outside ε. Delete from `features` (and [data.columns]) what is not a feature, such as an
# identifier. docs/experiments.md, "Your own data and model", walks through it.
name = {json.dumps(table.stem)}
rounds = 20
trials = 1
eval_every = "end"
metrics = {metrics}

[data]
dataset = "table"
path = {json.dumps(path)}{" " * 4}# relative to this file
{target}{sites}features = [
{listed}]
{columns}
[model]
{model}

[algorithm]
name = "fedavg"
learning_rate = 0.5
expected_batch_size = 16
{'loss = "logistic_hazard"' + chr(10) if survival else ""}
[privacy]
epsilon = 1.0                       # per silo
delta = 1e-5
"""
