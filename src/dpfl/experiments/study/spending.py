"""Where a study's spending goes, for every command that releases anything from its
records (`dpfl run` and `sweep`, `tune`, `stats`, and `dpfl reproduce`, whose recipes run
their studies through `run_study` and `tune`): decided here once, so that no command
charges another ledger or escapes a cap.

A study that names `[privacy] ledger` (a hospital's ledger, shared by the studies over
its records) is charged there: each release's accounts under their own book,
`study/release`, and every cap of `[privacy.caps]` set first, so that the release's
whole plan is checked against the caps, with what every other study spent, before
any of it runs. A study that names none is charged to the command's own ledger in its
output folder. A command whose output is no DP release (`dpfl audit`) cannot be charged
at all, and is refused on a study whose spending goes to a shared ledger
(`uncharged`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from dpfl.privacy import Accountant, Ledger
from dpfl.privacy.events import Neighbouring

if TYPE_CHECKING:  # the results store reads `book` without the configs' imports
    from dpfl.experiments.study.config import StudyConfig


def book(study: str, release: str, shared: str | None) -> str | None:
    """The name of a release's accounts in study `study`'s shared ledger `shared`:
    `study/release` (a cap's refusal names the study; a resume reopens its own
    accounts); None where the study names no shared ledger (the command's own ledger
    holds only this release)."""
    return None if shared is None else f"{study}/{release}"


def ledger_file(config: StudyConfig, own: Path) -> Path:
    """The ledger a release of `config` is charged to: the study's shared `[privacy]
    ledger` where it names one, else `own`, the command's own file."""
    shared = config.privacy.ledger
    return own if shared is None else Path(shared)


@contextmanager
def charged(
    config: StudyConfig,
    release: str,
    own: Path,
    hospitals: Mapping[str, Neighbouring],
    *,
    accountant: Accountant | str | None,
) -> Iterator[Ledger]:
    """The ledger a release of `config` is charged to (`ledger_file`), open for writing
    with the release's `book`, every cap of `[privacy.caps]` set on its hospital's
    records (`hospitals`: each one's neighbouring relation), so that every account the
    release opens over a capped hospital spends from the cap
    (`engines.accounts.register_accounts`)."""
    shared = config.privacy.ledger
    with Ledger(
        ledger_file(config, own), accountant=accountant, study=book(config.name, release, shared)
    ) as ledger:
        for name, cap in config.privacy.caps.items():
            if name not in hospitals:
                raise ValueError(
                    f"privacy.caps: no hospital {name!r} (the silos: {sorted(hospitals)})"
                )
            ledger.cap_dataset(
                name, epsilon=cap.epsilon, delta=cap.delta, neighbouring=hospitals[name]
            )
        yield ledger


def sharing(config: StudyConfig, ledger: Path | None) -> StudyConfig:
    """`config` charged to the shared `ledger` given beside it (a command's `--ledger`),
    as if its file said `[privacy] ledger`: for a study that names none, or the same one;
    a study that names another is refused, since its spending goes there."""
    if ledger is None:
        return config
    named = config.privacy.ledger
    if named is not None and Path(named).resolve() != ledger.resolve():
        raise ValueError(
            f"study {config.name!r} is charged to its privacy.ledger {named}: give no "
            f"--ledger, or the same one (not {ledger})"
        )
    shared = config.privacy.model_copy(update={"ledger": str(ledger.resolve())})
    return config.model_copy(update={"privacy": shared})


def uncharged(config: StudyConfig, what: str) -> None:
    """Refuse `what`, whose figures are no DP release (no ε can be charged for them), on a
    study whose spending goes to a shared ledger: its records are held to that ledger's
    budgets and caps, which such figures would pass unaccounted."""
    if config.privacy.ledger is not None:
        raise ValueError(
            f"study {config.name!r} charges the shared ledger {config.privacy.ledger} "
            f"(privacy.ledger): {what} reads its records without any ε to charge there, so "
            "it is refused on such a study; nothing was run or charged"
        )
