"""A hospital's cap across studies from study files (`[privacy] ledger` and
`[privacy.caps]`): every command that releases anything from a study's records (`dpfl
run`, `sweep`, `tune`, `stats`) charges that one ledger, and one whose plan would take
the composition of every study's events past the cap is refused before it starts,
naming the studies that spent it; the commands whose output no ledger can charge
(`dpfl audit`, a deployment's server, a non-private run) are refused on such a study;
the recipes' built-in studies name no shared ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dp_accounting.pld import pld_privacy_accountant
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.experiments.recipes import RECIPES
from dpfl.experiments.results.store import ResultsStore
from dpfl.experiments.study.config import ConfigError, load
from dpfl.privacy import Ledger
from dpfl.privacy.accounting import PLD_DISCRETISATION
from studies import breast_cancer_study

CAP = {"hospital-0": {"epsilon": 4.0, "delta": 1e-5}}
TIGHT = {"hospital-0": {"epsilon": 1.5, "delta": 1e-5}}


def _sweep(tmp_path: Path, name: str, rounds: int) -> str:
    """Run study `name` (two trials, fixed σ) over the shared ledger; `dpfl sweep`'s output."""
    folder = tmp_path / name
    folder.mkdir()
    study = folder / "study.toml"
    study.write_text(
        breast_cancer_study(
            name,
            rounds=rounds,
            trials=2,
            privacy={"noise_multiplier": 1.5, "ledger": "../hospitals.sqlite", "caps": CAP},
        ),
        encoding="utf-8",
    )
    out = folder / "out"
    result = CliRunner().invoke(app, ["sweep", str(study), "--out", str(out), "-j", "1"])
    with ResultsStore(out / "results.sqlite") as store:
        (run,) = store.runs()
    assert run.id == load(study).points[0][1].key()
    return f"{result.output}\n{run.status} {run.error}"


def test_a_second_study_file_past_a_hospitals_cap_is_refused_naming_the_first(
    tmp_path: Path,
) -> None:
    for first in ("s1", "s2"):
        assert "finished" in _sweep(tmp_path, first, rounds=2)
    refused = _sweep(tmp_path, "s3", rounds=30)
    assert "failed" in refused and "dataset 'hospital-0'" in refused, refused
    assert "s1/" in refused and "s2/" in refused  # the studies that spent it, by name
    with Ledger(tmp_path / "hospitals.sqlite", create=False) as reader:
        (cap,) = reader.datasets()
        assert {s.split("/")[0] for s in cap.studies} == {"s1", "s2"}  # s3 recorded nothing
        independent = pld_privacy_accountant.PLDAccountant(
            value_discretization_interval=PLD_DISCRETISATION
        )
        spenders = [a.silo for a in reader.accounts() if a.budget.dataset == "hospital-0"]
        assert len(spenders) == 3 * 2  # every trial's account of all three studies
        for name in spenders:
            for entry in reader.entries(name):
                independent.compose(entry.event.dp_event)
    assert cap.spent.epsilon == pytest.approx(independent.get_epsilon(1e-5), rel=1e-6)
    assert cap.spent.epsilon <= 4.0


def test_a_run_on_a_shared_ledger_is_re_read_at_another_delta(tmp_path: Path) -> None:
    assert "finished" in _sweep(tmp_path, "s1", rounds=2)
    with ResultsStore(tmp_path / "s1" / "out" / "results.sqlite") as store:
        (run,) = store.runs()
        at_study_delta = store.epsilon_by_silo(run).by_silo
        looser = store.epsilon_by_silo(run, delta=1e-3).by_silo
    assert looser.keys() == at_study_delta.keys()
    assert all(0 < looser[s] < at_study_delta[s] for s in looser)  # a larger δ, a smaller ε


def _capped_study(folder: Path, name: str, epsilon: float, **rest: object) -> Path:
    """A one-point study at `epsilon` over `folder`'s shared ledger, hospital-0 capped at
    ε 1.5, with statistics at that ε too; its file."""
    folder.mkdir(parents=True, exist_ok=True)
    study = folder / f"{name}.toml"
    privacy = {"epsilon": epsilon, "ledger": "hospitals.sqlite", "caps": TIGHT}
    analytics = {"epsilon": epsilon, "counts": True}
    text = breast_cancer_study(name, rounds=2, privacy=privacy, analytics=analytics, **rest)
    study.write_text(text, encoding="utf-8")
    return study


def _charges(ledger: Path) -> list[tuple[str, str]]:
    """Every event the ledger holds, with its account."""
    with Ledger(ledger, create=False) as reader:
        return sorted((s, e.event.to_json()) for s in reader.silos() for e in reader.entries(s))


PAST_THE_CAP = ("dataset 'hospital-0'", "over all its studies", "> its cap 1.5", "by first/")
COMMANDS = {  # each command's arguments and what its one line of refusal says
    "run": (["run", "{study}", "--out", "{out}"], PAST_THE_CAP),
    "sweep": (["sweep", "{study}", "--out", "{out}", "-j", "1"], PAST_THE_CAP),
    "tune": (["tune", "{study}", "--out", "{out}", "--mean", "2"], PAST_THE_CAP),
    "stats": (["stats", "{study}", "--out", "{out}"], PAST_THE_CAP),
    "audit": (["audit", "{spent}", "--trials", "20"], ("shared ledger", "nothing was run")),
    "deploy server": (
        ["deploy", "server", "{study}", "--superlink", "127.0.0.1:9", "--out", "{out}"],
        ("cannot be deployed", "privacy.ledger and caps"),
    ),
}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_releasing_command_is_refused_past_a_capped_ledger_and_charges_nothing(
    tmp_path: Path, command: str
) -> None:
    """A first study spends ε 1 of hospital-0's cap of 1.5; every command of a second
    study at ε 3 over the same ledger (or, for the audit, of the first's run) is refused in
    one line and leaves the ledger's charges as they were."""
    first = _capped_study(tmp_path, "first", 1.0)
    spent = tmp_path / "first-out"
    swept = CliRunner().invoke(app, ["sweep", str(first), "--out", str(spent), "-j", "1"])
    assert swept.exit_code == 0, swept.output
    ledger = tmp_path / "hospitals.sqlite"
    before = _charges(ledger)
    assert before  # the first study's rounds
    study = _capped_study(tmp_path, "second", 3.0)
    arguments, why = COMMANDS[command]
    filled = [a.format(study=study, out=tmp_path / "out", spent=spent) for a in arguments]
    result = CliRunner().invoke(app, filled)
    assert result.exit_code in (1, 2), result.output
    lines = result.output.splitlines()
    assert any(all(part in line for part in why) for line in lines), result.output
    assert "Traceback" not in result.output
    assert _charges(ledger) == before
    with Ledger(ledger, create=False) as reader:
        (cap,) = reader.datasets()
    assert 0.9 < cap.spent.epsilon <= 1.0 and list(cap.studies) == [f"first/{_key(first)}"]
    if command == "tune":
        assert not (tmp_path / "out" / "tuned.json").exists()


def _key(study: Path) -> str:
    return load(study).points[0][1].key()


def test_a_tune_within_the_cap_spends_from_it_and_is_read_back_from_the_shared_ledger(
    tmp_path: Path,
) -> None:
    study = _capped_study(tmp_path, "tuned", 1.0)
    result = CliRunner().invoke(
        app, ["tune", str(study), "--out", str(tmp_path / "out"), "--mean", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["ledger"] == str(tmp_path / "hospitals.sqlite")
    assert not (tmp_path / "out" / "ledger.sqlite").exists()  # nothing charged beside it
    with Ledger(tmp_path / "hospitals.sqlite", create=False) as reader:
        (cap,) = reader.datasets()
        (entry,) = reader.entries(f"{shown['book']}:hospital-0/trial-0")
    assert list(cap.studies) == [shown["book"]] and shown["book"].startswith("tuned/tune-")
    assert "best of" in entry.event.describe()  # the selection, every candidate in it
    assert cap.spent.epsilon == pytest.approx(shown["epsilon"]["hospital-0"], rel=0.05)
    assert max(shown["epsilon"].values()) <= 1.0
    best = CliRunner().invoke(
        app, ["best", str(tmp_path / "out"), "--epsilon", "1", "--delta", "1e-5", "--json"]
    )
    assert best.exit_code == 0, best.output
    assert json.loads(best.output)["best"]["epsilon"] == pytest.approx(
        max(shown["epsilon"].values())
    )


def test_a_non_private_study_over_a_shared_ledger_is_refused(tmp_path: Path) -> None:
    study = tmp_path / "plain.toml"
    privacy = {"private": False, "ledger": "hospitals.sqlite", "caps": TIGHT}
    study.write_text(breast_cancer_study("plain", rounds=2, privacy=privacy), encoding="utf-8")
    with pytest.raises(ConfigError, match="must be private"):
        load(study)
    assert not (tmp_path / "hospitals.sqlite").exists()


def test_no_recipe_names_a_shared_ledger(shared_data: Path) -> None:
    """`dpfl reproduce` runs the recipes' built-in studies, each point on its own ledger
    in the reproduction's directory: none names `[privacy] ledger`, and the command takes
    none, so no recipe spends from a hospital's cap (were one to name it, `run_study` and
    `tune` would charge it there, as for any study)."""
    for recipe in RECIPES.values():
        plan = recipe.studies(shared_data, "smoke")
        studies = [*plan.studies, *(tuning.study for tuning in plan.tuned)]
        assert studies, recipe.name
        assert all(c.privacy.ledger is None for s in studies for _, c in s.points), recipe.name
