"""A hospital runs only what its officer approved (`dpfl deploy approve`).

An approval (`dpfl.privacy.governance.Approval`, kept signed in the hospital's ledger)
names the study file, the model file it names, its data schema and the dpfl that runs
it, each by its SHA-256, with the budget and cap approved. Before it answers anything a
hospital compares what it is about to run with its active approvals signed with its own
identity key, and refuses, in one line naming what differs, a study, model file, schema,
version, budget or cap that none of them covers: a changed study needs a new approval.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from dpfl.engines.flower.protocol import Deployment, DeploymentError
from dpfl.engines.flower.roster import public_text, read_identity
from dpfl.privacy import Ledger
from dpfl.privacy.governance import Approval

COVERED = (
    ("study_digest", "the study file"),
    ("model_digest", "the model file"),
    ("schema_digest", "the data schema"),
    ("dpfl_version", "dpfl's version"),
    ("epsilon", "the ε budget"),
    ("delta", "δ"),
    ("dataset_cap", "the dataset's cap"),
)
"""What an approval covers, and how a refusal names it."""


class NotApprovedError(DeploymentError, ValueError):
    """The study, as this hospital would run it, is not what its officer approved (bad
    input: the command says so in one line)."""


@functools.cache
def dpfl_version() -> str:
    """dpfl's version and the SHA-256 of its source files: an edited install is another
    dpfl (computed once a process, of the code that process runs)."""
    import dpfl

    root = Path(dpfl.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(f"{path.relative_to(root).as_posix()}\n".encode())
        digest.update(path.read_bytes())
    return f"{dpfl.__version__}+{digest.hexdigest()[:16]}"


def wanted(
    run: Deployment,
    *,
    epsilon: float,
    delta: float,
    dataset_cap: float | None,
    name: str | None = None,
) -> Approval:
    """The approval that running `run` at this budget needs (unsigned)."""
    return Approval(
        name=name or run.name,
        study=run.name,
        study_key=run.key,
        study_digest=str(run.digests["study"]),
        model_digest=run.digests.get("model"),
        schema_digest=str(run.digests["schema"]),
        dpfl_version=dpfl_version(),
        epsilon=float(epsilon),
        delta=float(delta),
        dataset_cap=None if dataset_cap is None else float(dataset_cap),
    )


def refusal(approvals: list[Approval], needed: Approval, key: str) -> str | None:
    """Why no active approval signed with `key` (the hospital's) covers `needed`, naming
    what differs from the latest one of its study; None if one does."""
    mine = [a for a in approvals if a.active and a.key == key and a.valid()]
    if any(all(getattr(a, f) == getattr(needed, f) for f, _ in COVERED) for a in mine):
        return None
    same = [a for a in mine if a.study == needed.study]
    if not same:
        return (
            f"study {needed.study!r} is not approved in this hospital's ledger: its officer "
            "approves it with `dpfl deploy approve STUDY.toml --ledger ... --identity ... "
            "--epsilon ... --delta ...`"
        )
    latest = same[-1]
    differs = "; ".join(
        f"{what}: approved {_shown(getattr(latest, f))}, now {_shown(getattr(needed, f))}"
        for f, what in COVERED
        if getattr(latest, f) != getattr(needed, f)
    )
    return f"study {needed.study!r} differs from its approval {latest.name!r}: {differs}"


def check(ledger: Path, needed: Approval, identity: Path) -> None:
    """Refuse (`NotApprovedError`) what the ledger's approvals do not cover."""
    key = public_text(read_identity(identity))
    if not (ledger.is_file() and ledger.stat().st_size):
        raise NotApprovedError(f"{refusal([], needed, key)} (there is no ledger at {ledger} yet)")
    with Ledger(ledger, create=False) as book:
        why = refusal(book.approvals(), needed, key)
    if why is not None:
        raise NotApprovedError(why)


def approve(ledger: Path, needed: Approval, identity: Path) -> Approval:
    """Sign `needed` with the hospital's identity key and keep it in its ledger."""
    with Ledger(ledger) as book:
        return book.approve(needed, read_identity(identity))


def _shown(value: object) -> str:
    if isinstance(value, str) and len(value) == 64:
        return value[:12]
    return "none" if value is None else str(value)
