"""Write scikit-survival's FLCHAIN (bundled with it: no download; 7,874 people, a serum
free light chain study of Olmsted County, Kyle et al. 2006) as a cohort CSV of three
hospitals, for the worked example of docs/analytics.md:

    .venv/bin/python docs/studies/flchain_csv.py docs/studies/flchain.csv
    .venv/bin/dpfl stats docs/studies/flchain-stats.toml --out flchain-stats

Each person goes to hospital east, north or south in turn by row (2,625, 2,625, 2,624:
the sizes the study declares); the columns as scikit-survival serves them, an empty cell
where a value is missing."""

from __future__ import annotations

import sys
from pathlib import Path

from sksurv.datasets import load_flchain

HOSPITALS = ("east", "north", "south")


def write(path: Path) -> Path:
    """FLCHAIN as a CSV at `path`, with a `hospital` column."""
    features, outcome = load_flchain()
    table = features.assign(
        hospital=[HOSPITALS[i % 3] for i in range(len(features))],
        futime=outcome["futime"],
        death=outcome["death"].astype(int),
    )
    table.to_csv(path, index=False)
    return path


if __name__ == "__main__":
    print(write(Path(sys.argv[1] if len(sys.argv) > 1 else "flchain.csv")))
