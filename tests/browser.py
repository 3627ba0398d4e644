"""A page rendered in headless Chromium (Debian's, which `make browser` installs), with
what went wrong while it loaded: the pages dpfl writes (`dpfl report`, the ledger's
statement) are checked as a reader's browser shows them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@dataclass
class Rendered:
    """The loaded tab, and what it logged, threw or failed to fetch, and every request."""

    tab: Page
    problems: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


@contextmanager
def rendered(page: Path) -> Iterator[Rendered]:
    """`page` loaded in headless Chromium (closed on leaving). Where Chromium is absent,
    the test is skipped saying so; under CI=true it fails instead."""
    if not CHROMIUM.exists():
        reason = f"Chromium not installed ({CHROMIUM}): the rendered page is not checked"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            shown = Rendered(browser.new_page())
            shown.tab.on("console", lambda m: shown.problems.append(f"console {m.type}: {m.text}"))
            shown.tab.on("pageerror", lambda e: shown.problems.append(f"page error: {e}"))
            shown.tab.on(
                "requestfailed", lambda r: shown.problems.append(f"failed: {r.url} {r.failure}")
            )
            shown.tab.on("request", lambda r: shown.requests.append(r.url))
            shown.tab.goto(page.as_uri(), wait_until="load")
            yield shown
        finally:
            browser.close()
