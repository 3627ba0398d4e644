"""The `dpfl` command: JSON outputs agree with the Python API; errors exit with status 2."""

from __future__ import annotations

import functools
import itertools
import json
import re
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from dpfl import __version__
from dpfl.cli import app
from dpfl.experiments import recipes
from dpfl.experiments.results.datasheet import RESEARCH_NOISE
from dpfl.experiments.study.config import Study
from dpfl.experiments.study.runner import run_study
from dpfl.privacy import Ledger, epsilon, events
from studies import breast_cancer_study

runner = CliRunner()


def _json(args: list[str]) -> dict[str, object]:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"dpfl {__version__}"


def test_epsilon_json_is_the_ledgers_number() -> None:
    args = ["privacy", "epsilon", "-s", "1.08", "-q", "0.0036", "-T", "300", "-d", "1.3e-5"]
    for accountant in ("rdp", "pld"):
        data = _json([*args, "--accountant", accountant, "--json"])
        expected = epsilon(events.poisson_gaussian(0.0036, 1.08, steps=300), 1.3e-5, accountant)
        assert data == {
            "epsilon": expected.epsilon,
            "delta": 1.3e-5,
            "accountant": accountant,
            "neighbouring": "add_remove",
        }


def test_epsilon_table_shows_both_accountants_and_the_relation() -> None:
    result = runner.invoke(
        app, ["privacy", "epsilon", "-s", "1.08", "-q", "0.0036", "-T", "300", "-d", "1.3e-5"]
    )
    assert result.exit_code == 0
    for text in ("PLD", "RDP", "0.2873", "add/remove one record"):
        assert text in result.stdout


def test_calibrate_json_meets_the_target() -> None:
    data = _json(
        [
            *("privacy", "calibrate", "-e", "2", "-d", "1e-5", "-q", "0.02", "-T", "500"),
            *("--accountant", "rdp", "--json"),
        ]
    )
    sigma = data["noise_multiplier"]
    assert isinstance(sigma, float)
    event = events.poisson_gaussian(0.02, sigma, steps=500)
    assert epsilon(event, 1e-5, "rdp").epsilon <= 2.0
    assert data["epsilon"] == epsilon(event, 1e-5, "rdp").epsilon


@pytest.mark.parametrize(
    ("options", "event_of"),
    [
        (["-m", "bandmf", "--band", "8"], lambda s: events.poisson_gaussian(0.08, s, steps=63)),
        (["-m", "blt", "--buffers", "2"], None),
    ],
)
def test_epsilon_and_calibrate_take_the_noise_mechanism(
    options: list[str], event_of: Callable[[float], events.PrivacyEvent] | None
) -> None:
    """bandmf's T = 500 steps at q = 0.01 and b = 8 are ⌈500/8⌉ = 63 Poisson-sampled
    Gaussians at b·q (written out here); blt's, the mechanism's own event."""
    from dpfl.local.mechanisms import mechanism

    if event_of is None:
        event_of = functools.partial(mechanism("blt", buffers=2).event, 0.01, steps=500)
    base = ["-d", "1e-5", "-q", "0.01", "-T", "500", "--accountant", "rdp", "--json", *options]
    sigma = _json(["privacy", "calibrate", "-e", "2", *base])["noise_multiplier"]
    assert epsilon(event_of(sigma), 1e-5, "rdp").epsilon <= 2.0
    assert epsilon(event_of(sigma * 0.999), 1e-5, "rdp").epsilon > 2.0
    shown = _json(["privacy", "epsilon", "-s", "3", *base])["epsilon"]
    assert shown == epsilon(event_of(3.0), 1e-5, "rdp").epsilon
    independent = _json(["privacy", "epsilon", "-s", "3", *base[: -len(options)]])["epsilon"]
    assert independent != shown
    wrong = runner.invoke(app, ["privacy", "epsilon", "-s", "1", *base, "-m", "tree"])
    assert wrong.exit_code == 2 and "unknown noise mechanism 'tree'" in wrong.output


def test_max_steps_json() -> None:
    data = _json(
        [
            *("privacy", "max-steps", "-e", "1", "-d", "1e-5", "-q", "0.01", "-s", "1.0"),
            *("--accountant", "rdp", "--json"),
        ]
    )
    steps = data["steps"]
    assert isinstance(steps, int)
    assert epsilon(events.poisson_gaussian(0.01, 1.0, steps=steps), 1e-5, "rdp").epsilon <= 1
    assert epsilon(events.poisson_gaussian(0.01, 1.0, steps=steps + 1), 1e-5, "rdp").epsilon > 1


def test_node_level_epsilon_grows_with_the_rows_a_person_is_in() -> None:
    """One epoch of the seed's Fig. 10 setting at δ = 1/n, each ε the accountant's."""
    args = ["privacy", "node-level", "-s", "2", "-b", "512", "-n", "2600000"]
    data = _json([*args, "-S", "1", "-S", "10", "-S", "50", "--json"])
    assert data["steps"] == 5078
    shown = {int(s): r["epsilon"] for s, r in data["by_appearances"].items()}
    for s, value in shown.items():
        event = events.node_gaussian(
            2.0, appearances=s, dataset_size=2_600_000, batch_size=512, steps=5078
        )
        assert value == epsilon(event, 1 / 2_600_000).epsilon
    assert shown[1] < shown[10] < shown[50]
    assert "replace one person" in data["relation"] and "2S − 1" in data["relation"]
    assert data["by_appearances"]["10"]["changed_rows"] == 19
    result = runner.invoke(app, [*args, "-S", "0"])
    assert result.exit_code == 2 and "appearances" in result.output


def test_impossible_parameters_exit_2_with_a_message() -> None:
    base = ["privacy", "epsilon", "-q", "0.01", "-T", "10", "-d", "1e-5"]
    cases = [
        ([*base, "-s", "0"], "noise multiplier"),
        (["privacy", "epsilon", "-s", "1", "-q", "1.5", "-T", "10", "-d", "1e-5"], "sample rate"),
        ([*base, "-s", "1", "--accountant", "moments"], "unknown accountant"),
        (["privacy", "epsilon", "-s", "1", "-q", "0.1", "-T", "-1", "-d", "1e-5"], "step count"),
        (["privacy", "epsilon", "-s", "1", "-q", "0.1", "-T", "5", "-d", "1"], "δ must lie"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, args
        assert message in result.stderr


def test_large_delta_warns_with_the_dataset_size() -> None:
    result = runner.invoke(
        app, ["privacy", "epsilon", "-s", "1", "-q", "0.1", "-T", "3", "-d", "0.01", "-n", "1000"]
    )
    assert result.exit_code == 0
    assert "silo of 1000 records" in result.stderr


def test_ledger_command_reads_what_the_api_wrote(tmp_path: Path) -> None:
    path = tmp_path / "study.sqlite"
    with Ledger(path) as ledger:
        ledger.register_silo("hospital-a", epsilon=1.0, delta=1e-5, size=5000)
        ledger.register_silo("hospital-b", epsilon=2.0, delta=1e-5, size=8000)
        ledger.record("hospital-a", events.poisson_gaussian(0.01, 1.0, steps=50), round=0)
        expected = ledger.spent("hospital-a")
    result = runner.invoke(app, ["privacy", "ledger", str(path), "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["silo"]: row for row in json.loads(result.stdout)}
    assert rows["hospital-a"]["epsilon"] == expected.epsilon
    assert rows["hospital-a"]["events"] == 1
    assert rows["hospital-b"]["epsilon"] == 0.0
    assert rows["hospital-b"]["epsilon_remaining"] == 2.0
    table = runner.invoke(app, ["privacy", "ledger", str(path), "--events"])
    assert table.exit_code == 0
    assert "50 × Poisson(q=0.01)" in table.stdout
    assert "[add/remove one record]" in " ".join(table.stdout.split())  # not eaten as markup


def test_ledger_command_on_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    result = runner.invoke(app, ["privacy", "ledger", str(tmp_path / "none.sqlite")])
    assert result.exit_code == 2
    assert "no ledger at" in result.stderr
    assert not (tmp_path / "none.sqlite").exists()


@pytest.mark.slow  # the real demo: six points, about a minute on two cores
def test_demo_prints_the_privacy_utility_curve_with_the_ledgers_epsilon(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    # the same directory again: every point is finished, so this only reads the store
    data = _json(["demo", "--out", str(tmp_path), "--json"])
    points: list[dict[str, Any]] = data["points"]  # type: ignore[assignment]
    assert [p["epsilon_budget"] for p in points] == [0.5, 1, 2, 4, 8, None]
    assert [p["private"] for p in points] == [True] * 5 + [False]

    # ε per hospital, read from the ledgers themselves: one per point, found by its budget
    by_budget: dict[float, dict[str, float]] = {}
    unbudgeted = 0
    for ledger_file in (tmp_path / "ledgers").glob("*.sqlite"):
        with Ledger(ledger_file, create=False) as ledger:
            accounts = ledger.accounts()
        if not accounts:  # the non-private reference charges nothing
            unbudgeted += 1
            continue
        assert len(accounts) == 9  # three hospitals × three trials
        (budget,) = {a.budget.epsilon for a in accounts}
        spent: dict[str, float] = {}
        for account in accounts:
            assert account.events == 20 and account.budget.delta == 1e-5
            hospital = account.silo.split("/")[0]
            spent[hospital] = max(spent.get(hospital, 0.0), account.spent.epsilon)
        by_budget[budget] = spent
    assert unbudgeted == 1 and sorted(by_budget) == [0.5, 1, 2, 4, 8]
    for point in points[:5]:
        ledgers = by_budget[point["epsilon_budget"]]
        assert set(ledgers) == {"hospital-0", "hospital-1", "hospital-2"}
        shown = {h["silo"]: h["epsilon"] for h in point["hospitals"]}
        assert shown == pytest.approx(ledgers, rel=1e-9)
        assert point["epsilon"] == pytest.approx(max(ledgers.values()), rel=1e-9)
        assert point["epsilon"] <= point["epsilon_budget"]
        assert point["delta"] == 1e-5 and {h["delta"] for h in point["hospitals"]} == {1e-5}
        assert point["accountant"] == "pld" and point["research_noise"]
    reference = points[5]
    assert reference["epsilon"] is None and reference["noise_multiplier"] is None
    assert {h["epsilon"] for h in reference["hospitals"]} == {None}

    # a sensible curve: less noise for more ε, utility rising with it, the reference on top
    sigmas = [p["noise_multiplier"] for p in points[:5]]
    assert sigmas == sorted(sigmas, reverse=True)
    accuracy = [p["metrics"]["accuracy"]["mean"] for p in points]
    assert accuracy[0] > 0.8  # the majority class is 0.63
    assert accuracy[0] < accuracy[4] and accuracy[5] == max(accuracy)

    # the printed table: a row per point, its figures those of the JSON
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == 6
    for row, point in zip(rows, points, strict=True):
        cells = [cell.strip() for cell in row.strip("│").split("│")]
        accuracy_cell = point["metrics"]["accuracy"]
        assert cells[2] == f"{accuracy_cell['mean']:.3f} ± {accuracy_cell['std']:.3f}"
        if point["private"]:
            assert cells[:2] == [f"{point['epsilon_budget']:g}", f"{point['noise_multiplier']:.4f}"]
            assert cells[4] == f"{point['epsilon']:.4f}"
            assert cells[5] == " · ".join(f"{h['epsilon']:.4f}" for h in point["hospitals"])
        else:
            assert cells[0] == cells[4] == "∞" and cells[1] == "—"
    flat = _flat(result.stdout)
    assert "on the union of the three hospitals' test sets" in flat
    assert _flat(f"† {RESEARCH_NOISE}") in flat  # seeded: not to be released
    assert data["caveat"] == RESEARCH_NOISE
    assert f"report: {data['report']}" in flat
    assert Path(str(data["report"])) == tmp_path / "report" / "index.html"
    assert (tmp_path / "report" / "index.html").is_file()


STUDY = breast_cancer_study(
    "cli", rounds=2, silos=2, algorithm={"learning_rate": 1.0}, privacy={"noise_multiplier": 1.0}
)


def _run(tmp_path: Path, text: str, out: str) -> Any:
    """`dpfl run` on a study file holding `text`, into tmp_path / out."""
    path = tmp_path / "study.toml"
    path.write_text(text, encoding="utf-8")
    return runner.invoke(app, ["run", str(path), "-o", str(tmp_path / out)])


def _flat(text: str) -> str:
    """Console output without the line breaks and borders rich adds."""
    return " ".join(text.replace("│", " ").split())


def test_run_says_where_research_noise_makes_the_epsilon_unreleasable(tmp_path: Path) -> None:
    seeded = _run(tmp_path, STUDY, "a")
    assert seeded.exit_code == 0, seeded.output
    assert "(PLD) †" in seeded.stdout and _flat(f"† {RESEARCH_NOISE}") in _flat(seeded.stdout)
    secure = STUDY.replace('name = "cli"', 'name = "cli"\nresearch_noise = false')
    plain = _run(tmp_path, secure, "b")
    assert plain.exit_code == 0, plain.output
    assert "(PLD)" in plain.stdout and "†" not in plain.stdout


def test_a_config_that_would_fail_inside_a_run_is_refused_before_it_starts(tmp_path: Path) -> None:
    text = STUDY.replace('"breast_cancer"', '"heart_disease"')
    result = _run(tmp_path, text, "o")
    assert result.exit_code == 2
    assert "data: heart_disease is read from files: give data.path" in result.stderr
    assert "Traceback" not in result.output and not (tmp_path / "o").exists()


@pytest.mark.parametrize("cell", ["abc", "nan"])
def test_a_data_cell_that_is_not_a_number_is_one_line_without_a_traceback(
    tmp_path: Path, cell: str
) -> None:
    data = tmp_path / "heart"
    data.mkdir()
    (data / "processed.cleveland.data").write_text(
        f"{cell},1.0,1.0,145.0,233.0,1.0,2.0,150.0,0.0,2.3,3.0,0.0,6.0,0\n"
    )
    text = STUDY.replace('"breast_cancer"', f'"heart_disease"\npath = "{data}"')
    result = _run(tmp_path, text, "o")
    assert result.exit_code == 1
    said = "processed.cleveland.data, line 1, column 'age': "
    assert said in _flat(result.output) and f"'{cell}'" in _flat(result.output)
    assert "Traceback" not in result.output


def test_a_refusal_speaks_the_study_files_terms(tmp_path: Path) -> None:
    text = STUDY.replace("noise_multiplier = 1.0", "noise_multiplier = 0.5\nepsilon = 0.1")
    result = _run(tmp_path, text, "o")
    assert result.exit_code == 1
    assert "leave privacy.noise_multiplier out of the study file" in _flat(result.stderr)
    assert "calibrate=True" not in result.output
    assert "calibrate the noise to the budget" not in _flat(result.output)


def test_best_refuses_unknown_metric_and_silo_names(tmp_path: Path) -> None:
    run_study(Study(tomllib.loads(STUDY)), tmp_path)
    base = ["best", str(tmp_path), "-e", "100", "-d", "1e-5"]
    metric = runner.invoke(app, [*base, "--metric", "acuracy"])
    assert metric.exit_code == 2
    assert "unknown metric 'acuracy'; the finished runs have accuracy, auprc" in metric.stderr
    silo = runner.invoke(app, [*base, "--validation-silo", "hospital-a"])
    assert silo.exit_code == 2
    assert "unknown validation silo 'hospital-a'" in silo.stderr
    assert "are hospital-0, hospital-1" in silo.stderr
    assert runner.invoke(app, [*base, "--validation-silo", "hospital-1"]).exit_code == 0


def test_reproduce_says_which_real_data_it_could_not_find(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: dict[str, Any] = {}

    def fake(name: str, out: Path, **options: Any) -> recipes.Reproduction:
        asked.update(options)
        return recipes.Reproduction(name, "title", [], [], [])

    monkeypatch.setattr(recipes, "reproduce", fake)
    monkeypatch.chdir(tmp_path)  # outside the project: ../shared/data is not there
    result = runner.invoke(app, ["reproduce", "owkin-idash2020", "-o", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert asked["data_dir"] == Path("../shared/data")  # the recipe names what it skips
    note = _flat(result.stderr)
    assert "no real data" in note and str((tmp_path / "../shared/data").resolve()) in note
    assert "pass --data-dir FOLDER" in note
    missing = runner.invoke(
        app, ["reproduce", "owkin-idash2020", "-o", "o", "--data-dir", str(tmp_path / "none")]
    )
    assert missing.exit_code == 2
    assert "--data-dir" in missing.stderr and "not a folder" in missing.stderr


def test_reproduce_help_lists_every_recipe() -> None:
    shown = runner.invoke(app, ["reproduce", "--help"])
    assert shown.exit_code == 0
    for name in recipes.RECIPES:
        assert name in shown.stdout


def test_a_hospitals_supernode_that_stops_soon_after_its_start_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a crash the SuperLink refuses a hospital's new SuperNode until it lets the
    dead one go (up to 60 s): `dpfl deploy hospital` starts it again every 5 s within
    REJOIN_SECONDS of its start, then gives up with the SuperNode's status."""
    from dpfl.cli import deploy

    attempts = tmp_path / "attempts"
    count_and_fail_twice = (
        f"import pathlib, sys; p = pathlib.Path({str(attempts)!r}); "
        "n = len(p.read_text()) if p.exists() else 0; p.write_text('x' * (n + 1)); "
        "sys.exit(0 if n >= 2 else 3)"
    )
    monkeypatch.setattr(deploy.time, "sleep", lambda seconds: None)
    with pytest.raises(typer.Exit) as ended:
        deploy._run_supernode([sys.executable, "-c", count_and_fail_twice])
    assert ended.value.exit_code == 0 and attempts.read_text() == "xxx"
    attempts.unlink()
    monkeypatch.setattr(deploy, "REJOIN_SECONDS", 0.0)
    with pytest.raises(typer.Exit) as ended:
        deploy._run_supernode([sys.executable, "-c", count_and_fail_twice])
    assert ended.value.exit_code == 3 and attempts.read_text() == "x"


INIT_HEADER = "patient_nbr,hospital,age,race,creatinine,readmitted_30d"
INIT_ROWS = ["918273,St-Xavier,87,Zoroastrian,4.321,1", "564738,Mercy-Point,63,Hispanic,0.987,0"]


def _init(tmp_path: Path, *options: str) -> typer.testing.Result:
    table = tmp_path / "cohort.csv"
    table.write_text("\n".join([INIT_HEADER, *INIT_ROWS]) + "\n", encoding="utf-8")
    return runner.invoke(app, ["init", str(table), *options, "--out", str(tmp_path / "s.toml")])


def test_init_writes_a_study_from_the_header_alone_that_sweep_refuses_until_filled(
    tmp_path: Path,
) -> None:
    made = _init(tmp_path, "--label", "readmitted_30d", "--site", "hospital")
    assert made.exit_code == 0, made.output
    text = (tmp_path / "s.toml").read_text()
    for row in INIT_ROWS:  # no value of the rows (but the 0/1 label), written or shown
        for value in row.split(",")[:-1]:  # as a token: pytest's folder may be pytest-63
            token = re.compile(rf"(?<![\w.-]){re.escape(value)}(?![\w.-])")
            assert not token.search(text) and not token.search(made.output), value
    data = tomllib.loads(text)["data"]
    assert (data["path"], data["label"], data["site"]) == (
        "cohort.csv",
        "readmitted_30d",
        "hospital",
    )
    assert data["features"] == ["patient_nbr", "age", "race", "creatinine"]
    assert data["columns"]["age"] == {"range": ["?", "?"]}
    assert data["columns"]["race"] == {"categories": ["?"]}
    refused = runner.invoke(app, ["sweep", str(tmp_path / "s.toml"), "--out", str(tmp_path / "r")])
    assert refused.exit_code == 2
    shown = " ".join(refused.output.split())
    for key in ("patient_nbr.range", "age.range", "race.categories", "creatinine.range"):
        assert f"data.columns.{key}: still '?'" in shown
    assert "a DP quantile release charged to the ledger is not offered yet" in shown
    assert not (tmp_path / "r").exists()


def test_init_refuses_an_unknown_column_and_never_overwrites(tmp_path: Path) -> None:
    unknown = _init(tmp_path, "--label", "readmitted")
    assert unknown.exit_code == 2
    assert "cohort.csv, column 'readmitted': no such column" in " ".join(unknown.output.split())
    assert _init(tmp_path, "--label", "readmitted_30d").exit_code == 0
    again = _init(tmp_path, "--label", "readmitted_30d")
    assert again.exit_code == 2 and "is not overwritten" in again.output


def test_a_model_that_predicts_one_class_is_warned_of_in_run_best_and_the_report(
    tmp_path: Path,
) -> None:
    """A threshold beyond every score makes the model say "no" for every record: the
    run, `best` and the report say so and name the balanced threshold; a model that
    predicts both classes gets no such warning."""
    from dpfl.experiments.results.report import write_report

    said = "predicted the negative class for every test record in 2 of 2 trials"
    advice = '[threshold] choose = "balanced"'
    beyond = breast_cancer_study(
        "cli",
        rounds=2,
        silos=2,
        trials=2,
        algorithm={"learning_rate": 0.0001},
        privacy={"noise_multiplier": 1.0},
        threshold={"value": 0.99},
    )
    one = _run(tmp_path, beyond, "one")
    assert one.exit_code == 0, one.output
    assert said in _flat(one.stderr) and advice in _flat(one.stderr)
    best = runner.invoke(app, ["best", str(tmp_path / "one"), "-e", "100", "-d", "1e-5"])
    assert best.exit_code == 0, best.output
    assert said in _flat(best.stdout) and advice in _flat(best.stdout)
    shown = _json(["best", str(tmp_path / "one"), "-e", "100", "-d", "1e-5", "--json"])
    assert said in str(shown["best"]["one_class"])  # type: ignore[index]
    page = write_report(tmp_path / "one").read_text()
    assert said in page and "choose = &quot;balanced&quot;" in page
    both = _run(tmp_path, STUDY, "both")
    assert both.exit_code == 0, both.output
    assert "every test record" not in _flat(both.output)
    best = runner.invoke(app, ["best", str(tmp_path / "both"), "-e", "100", "-d", "1e-5"])
    assert "every test record" not in _flat(best.output)
    assert "every test record" not in write_report(tmp_path / "both").read_text()


def test_inits_site_sizes_say_which_commands_need_what_and_the_other_choice_loads(
    tmp_path: Path,
) -> None:
    """`dpfl init --site` writes DP-counted sizes (run, sweep), which `dpfl tune` refuses:
    the file says so, and its commented alternative (declared sizes) is a study that loads."""
    from dpfl.experiments.study.config import load

    assert _init(tmp_path, "--label", "readmitted_30d", "--site", "hospital").exit_code == 0
    written = (tmp_path / "s.toml").read_text()
    filled = written.replace('["?", "?"]', "[0, 100]").replace('["?"]', '["A"]')
    (tmp_path / "s.toml").write_text(filled)
    tune = runner.invoke(app, ["tune", str(tmp_path / "s.toml"), "--out", str(tmp_path / "t")])
    assert tune.exit_code == 2 and "data.public_sizes must be 'declared'" in _flat(tune.output)
    assert not (tmp_path / "t").exists()
    comment = _flat(" ".join(line.split("#", 1)[-1] for line in written.splitlines()))
    assert "a DP count, charged (run, sweep); dpfl tune needs declared sizes:" in comment
    declared = filled.replace('public_sizes = "dp-count"', "").replace(
        "# public_sizes", "public_sizes"
    )
    declared = declared.replace(
        "# sites = { name_of_a_site = 1200, another_site = 800 }",
        "sites = { St-Xavier = 1, Mercy-Point = 1 }",
    )
    (tmp_path / "s.toml").write_text(declared)
    config = load(tmp_path / "s.toml").points[0][1]
    assert config.data.public_sizes == "declared"
    assert config.data.sites == {"St-Xavier": 1, "Mercy-Point": 1}


def _commands(command: Any, path: list[str]) -> Any:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, [*path, name])


def test_every_commands_help_wraps_only_where_the_terminal_ends() -> None:
    """A docstring's source line breaks are no breaks in the help: on a terminal wide
    enough, each paragraph of a command's help, and its line in its group's list of
    commands, is one line (rich markup mode kept them, "print the" / "privacy–utility
    table")."""
    import typer.main

    for path, command in _commands(typer.main.get_command(app), []):
        shown = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "400"})
        assert shown.exit_code == 0, shown.output
        lines = [" ".join(line.replace("│", " ").split()) for line in shown.output.splitlines()]
        paragraphs = (command.help or "").split("\n\n")
        listed = [
            (sub.help or "").split("\n\n")[0] for sub in getattr(command, "commands", {}).values()
        ]
        for paragraph in [*paragraphs, *listed]:
            text = " ".join(paragraph.replace("\\[", "[").split())
            assert any(text in line for line in lines), (path, text)
        for width in (80, 100):  # and at a normal width, no break leaves room for a word
            narrow = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(width)})
            assert not _early_breaks(narrow.output), (path, width, _early_breaks(narrow.output))


def _early_breaks(help_text: str) -> list[tuple[str, str]]:
    """(line, next word) wherever a command list's help breaks a line that had room for
    the next line's first word (a continuation: blank under the commands' names)."""
    panel = help_text.partition("╭─ Commands")[2].partition("╰")[0]
    rows = [line.strip("│") for line in panel.splitlines() if line.startswith("│")]
    if not rows:
        return []
    name = rows[0].split()[0]
    column = rows[0].index(name) + len(name)
    column += len(rows[0][column:]) - len(rows[0][column:].lstrip())  # the help's column
    found = []
    for above, below in itertools.pairwise(rows):
        words = below.split()
        if not words or below[:column].strip():
            continue  # a new row: the next command
        if len(above) - len(above.rstrip()) > len(words[0]) + 1:
            found.append((above.strip(), words[0]))
    return found


def test_a_bug_in_dpfl_is_reported_as_one_with_its_traceback_and_status_70(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An internal check that fails (`InternalError`) is dpfl's fault: its traceback, then
    a line that says so and asks for a report, exit status 70; a user's bad input
    (ValueError) is still one line and status 2, without a traceback."""
    import dpfl.privacy
    from dpfl.errors import InternalError

    def failing(error: Exception) -> Callable[..., Any]:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise error

        return fail

    args = ["privacy", "epsilon", "-s", "1", "-q", "0.01", "-T", "10", "-d", "1e-5"]
    monkeypatch.setattr(dpfl.privacy, "epsilon", failing(InternalError("stacks [a] differ")))
    bug = runner.invoke(app, args)
    assert bug.exit_code == 70
    assert bug.stdout == ""
    *traceback, last, report = bug.stderr.splitlines()
    assert traceback[0] == "Traceback (most recent call last):"
    assert "dpfl.errors.InternalError: stacks [a] differ" in traceback
    assert last == "internal error: stacks [a] differ"
    assert report.startswith(f"This is a bug in dpfl {__version__}, not a mistake in your input")
    assert "please report it" in report

    monkeypatch.setattr(dpfl.privacy, "epsilon", failing(ValueError("σ [a] is wrong")))
    mistake = runner.invoke(app, args)
    assert mistake.exit_code == 2
    assert mistake.stderr.splitlines() == ["error: σ [a] is wrong"]
