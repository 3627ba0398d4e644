"""The notebook API of README.md, run exactly as written there."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_study_runs_and_keeps_every_hospital_within_budget() -> None:
    code = re.search(r"```python\n(# A whole study.*?)```", README.read_text(), re.S)
    assert code is not None, "README.md lost its five-line study"
    namespace: dict[str, object] = {}
    exec(code.group(1), namespace)  # the README's own lines, nothing added
    result = namespace["result"]
    assert result.final_metrics()["accuracy"] > 0.85  # type: ignore[attr-defined]
    spent = [r.epsilon for r in result.epsilon[0].values()]  # type: ignore[attr-defined]
    assert len(spent) == 3 and max(spent) <= 1.0


def test_dpfl_version_does_not_import_torch() -> None:
    import subprocess
    import sys

    probe = "import sys, dpfl; dpfl.__version__; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
