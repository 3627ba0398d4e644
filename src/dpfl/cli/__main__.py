"""`python -m dpfl.cli`: the `dpfl` command without its console script."""

from dpfl.cli import app

app()
