"""The documentation's `dpfl privacy …` examples print what their comments say, and so
does the README's ledger example (run as it is: it records the round it affords).

Every line of README.md and the Markdown pages under docs/ that starts with `dpfl
privacy` and ends in a `# …` comment is run; each number in the comment must be one the
command prints (to the comment's decimals), and an accountant it names must be printed.
The examples run in one child process under a memory limit: one that regressed to a huge
PLD fails, rather than taking the machine's memory. Every relative link in those pages
names a file that exists, and a `#fragment` a heading of the page it points to.
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dpfl.privacy import Ledger

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = re.compile(r"^dpfl (privacy .+?)\s+#\s*(.+)$")
NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?")
ACCOUNTANT = re.compile(r"\b(PLD|RDP)\b")
MEMORY_LIMIT = 3 * 2**29  # 1.5 GiB of address space, as in test_cli_privacy_limits

RUN_ALL = """
import json, shlex, sys
from typer.testing import CliRunner
from dpfl.cli import app

runs = [CliRunner().invoke(app, shlex.split(c)) for c in json.load(sys.stdin)]
print(json.dumps([{"exit_code": r.exit_code, "stdout": r.stdout, "output": r.output}
                  for r in runs]))
"""


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _examples() -> list[tuple[str, str, str]]:
    """(file, command, expected) for every documented example with its result."""
    found = []
    for path in PAGES:
        for line in path.read_text(encoding="utf-8").splitlines():
            if match := EXAMPLE.match(line.strip()):
                found.append((str(path.relative_to(ROOT)), match[1], match[2]))
    return found


EXAMPLES = _examples()


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, Any]]:
    """Each example command's exit code and output, all run in one child process."""
    commands = sorted({command for _, command, _ in EXAMPLES})
    child = subprocess.run(
        [sys.executable, "-c", RUN_ALL],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        preexec_fn=_limit_memory,
        timeout=600,
        check=True,
    )
    return dict(zip(commands, json.loads(child.stdout), strict=True))


def _printed(expected: str, printed: list[str]) -> bool:
    """Whether a printed number shows as `expected` at its decimals."""
    decimals = len(expected.partition(".")[2].partition("e")[0])
    want = float(expected.replace(",", ""))
    return any(
        abs(float(number.replace(",", "")) - want) <= 0.5 * 10**-decimals + 1e-12
        for number in printed
    )


def test_the_readme_privacy_examples_are_found() -> None:
    readme = [command for name, command, _ in EXAMPLES if name == "README.md"]
    assert {c.split()[1] for c in readme} >= {"epsilon", "calibrate", "max-steps"}


@pytest.mark.parametrize(
    ("name", "command", "expected"), EXAMPLES, ids=[f"{n}: {c}" for n, c, _ in EXAMPLES]
)
def test_a_documented_example_prints_what_it_says(
    runs: dict[str, dict[str, Any]], name: str, command: str, expected: str
) -> None:
    run = runs[command]
    assert run["exit_code"] == 0, run["output"]
    printed = NUMBER.findall(run["stdout"])
    for number in NUMBER.findall(expected):
        assert _printed(number, printed), f"{name}: {number} is not in\n{run['stdout']}"
    for accountant in ACCOUNTANT.findall(expected):
        assert accountant in run["stdout"] or accountant.lower() in run["stdout"]


def _readme_python(section: str) -> str:
    """The first Python block under README.md's `## section`."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text.split(f"\n## {section}\n", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_ledger_example_records_the_round_its_plan_affords(tmp_path: Path) -> None:
    code = _readme_python("The privacy layer")
    shown = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    spent = Ledger(tmp_path / "study.sqlite", create=False).spent("hospital-a").epsilon
    assert spent > 0 and "refused" not in shown.stdout  # the round was recorded
    assert NUMBER.findall(shown.stdout) == [str(spent)]
    said = code.rsplit("#", 1)[1]  # the last line's comment: what it prints
    assert _printed(NUMBER.findall(said)[0], [str(spent)])


def _anchors(page: Path) -> set[str]:
    """The fragments GitHub gives a page's headings: lower case, punctuation dropped,
    spaces as hyphens, a repeated one numbered."""
    seen: dict[str, int] = {}
    for line in FENCED.sub("", page.read_text(encoding="utf-8")).splitlines():
        if heading := re.match(r"#+ (.+)", line):
            slug = re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-")
            seen[slug] = seen.get(slug, -1) + 1
            if seen[slug]:
                seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def test_every_relative_link_in_the_docs_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(FENCED.sub("", page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target):  # https:, mailto:: not ours to check
                continue
            file, _, fragment = target.partition("#")
            linked = (page.parent / file).resolve() if file else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and linked.suffix == ".md" and fragment not in _anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
