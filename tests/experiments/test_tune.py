"""`dpfl tune`: a private selection whose one charge per silo is the tuned event of
exactly what a candidate's sampling code records, calibrated to the budget, released
once, and refused where the search space would change the mechanism."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from dpfl.cli import app
from dpfl.engines.plan import RunPlan
from dpfl.engines.simulation import simulate
from dpfl.experiments.study import tune as tune_module
from dpfl.experiments.study.build import build_algorithm
from dpfl.experiments.study.config import ConfigError, Study, load
from dpfl.experiments.study.datasets import build_silos
from dpfl.experiments.study.tune import LEDGER, RESULT, fixed_noise, tune, with_validation
from dpfl.federation.silo import Silo
from dpfl.privacy import Accountant, BudgetExceededError, Ledger, events
from dpfl.privacy.accounts import account

STUDY: dict[str, Any] = {
    "name": "tune",
    "rounds": 4,
    "data": {"dataset": "breast_cancer", "partition": {"kind": "iid", "silos": 3}},
    "algorithm": {"name": "fedavg", "learning_rate": [0.1, 1.0]},
    "privacy": {"epsilon": 2.0, "delta": 1e-5},
}
HELD_OUT: dict[str, Any] = {**STUDY, "tune": {"validation": "held-out", "validation_fraction": 0.5}}


def test_the_selection_charges_the_tuned_event_of_a_candidates_own_run(tmp_path: Path) -> None:
    tuned = tune(Study(STUDY), tmp_path, metric="auroc", mean=3.0, shape=1.0)
    assert tuned.point["algorithm.learning_rate"] in (0.1, 1.0)
    assert max(tuned.epsilon.values()) == pytest.approx(2.0, abs=0.02)
    assert max(tuned.epsilon.values()) <= 2.0
    # a candidate run alone, at the selection's σ, records these events ...
    config = fixed_noise(Study(STUDY).points[0][1], tuned.noise_multiplier)
    silos = [with_validation(s, 0.2, 0) for s in build_silos(config.data, 0)]
    simulate(
        build_algorithm(config, silos),
        silos,
        RunPlan(rounds=4, progress=False, eval_every=4),
        ledger=tmp_path / "alone.sqlite",
    )
    with Ledger(tmp_path / "alone.sqlite", create=False) as alone:
        run = {s.name: [e.event for e in alone.entries(account(s, 0))] for s in silos}
    # ... and the selection's ledger holds one entry per silo: their tuned event
    with Ledger(tmp_path / LEDGER, create=False, accountant=Accountant.RDP) as book:
        for silo in silos:
            (entry,) = book.entries(account(silo, 0))
            inner = entry.event.dp_event.event
            expected = events.compose(
                [
                    events.repeat(event, count)
                    for event, count in sorted(
                        Counter(run[silo.name]).items(), key=lambda item: item[0].to_json()
                    )
                ]
            )
            assert inner == expected.dp_event
            assert entry.event == events.tuned(expected, mean=3.0, shape=1.0)
    written = json.loads((tmp_path / RESULT).read_text())
    assert set(written) == {
        "point",
        "noise_multiplier",
        "epsilon",
        "delta",
        "validation",
        "metric",
        "test_metrics",
        "mean",
        "shape",
        "datasheet",
        "ledger",
        "book",
    }  # nothing of the other candidates, nor their number
    assert (written["ledger"], written["book"]) == (LEDGER, None)  # no shared ledger named
    assert written["datasheet"] == tuned.datasheet
    assert tuned.datasheet["validation"] == "from-training"
    assert "training records" in tuned.datasheet["validation_records"]
    assert "trains on them" in tuned.datasheet["outside_epsilon"]
    with pytest.raises(ValueError, match="released once"):
        tune(Study(STUDY), tmp_path, metric="auroc", mean=3.0)


def test_a_selection_its_ledger_cannot_afford_is_refused_before_any_candidate_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same selection again into a folder whose ledger already holds its charge (a
    release lost after its charge): the budget is spent, so no candidate trains."""
    tune(Study(STUDY), tmp_path, metric="auroc", mean=2.0)
    (tmp_path / RESULT).unlink()
    with Ledger(tmp_path / LEDGER, create=False) as book:
        before = [(s, e.id) for s in book.silos() for e in book.entries(s)]
    trained, _ = _recorded(monkeypatch)
    with pytest.raises(BudgetExceededError, match="refused before any candidate trains"):
        tune(Study(STUDY), tmp_path, metric="auroc", mean=2.0)
    assert trained == []
    with Ledger(tmp_path / LEDGER, create=False) as book:
        assert [(s, e.id) for s in book.silos() for e in book.entries(s)] == before


def test_client_sampled_candidates_run_the_planned_schedule(tmp_path: Path) -> None:
    sampled = {**STUDY, "algorithm": {**STUDY["algorithm"], "client_rate": 0.5}}
    tuned = tune(Study(sampled), tmp_path, metric="auroc", mean=3.0)  # same events each
    assert max(tuned.epsilon.values()) <= 2.0


def test_a_non_private_reference_gets_the_same_tuning_runs_and_no_ledger(tmp_path: Path) -> None:
    plain = {**STUDY, "privacy": {"private": False}}
    reference = tune(Study(plain), tmp_path / "plain", metric="auroc", mean=3.0)
    assert reference.noise_multiplier is None and reference.epsilon == {}
    assert not (tmp_path / "plain" / LEDGER).exists()
    best = CliRunner().invoke(app, ["best", str(tmp_path / "plain"), "-e", "9", "-d", "1e-5"])
    assert best.exit_code == 1 and "non-private, ε = ∞" in best.output


def test_dopamine_is_tuned_at_one_sigma_and_runs_every_round(tmp_path: Path) -> None:
    dopamine = {
        **STUDY,
        "secure_aggregation": "ideal",
        "algorithm": {"name": "fedsgd_secure", "learning_rate": [0.1, 1.0], "momentum": 0.5},
    }
    tuned = tune(Study(dopamine), tmp_path, metric="auroc", mean=2.0)
    assert max(tuned.epsilon.values()) == pytest.approx(2.0, abs=0.02)
    assert max(tuned.epsilon.values()) <= 2.0
    # a candidate keeps its ε (it stops at its budget) and σ leaves it unspent: 4 rounds
    config = fixed_noise(Study(dopamine).points[0][1], tuned.noise_multiplier)
    assert config.privacy.epsilon == 2.0 and config.privacy.noise_multiplier is not None
    silos = [with_validation(s, 0.2, 0) for s in build_silos(config.data, 0)]
    alone = simulate(
        build_algorithm(config, silos), silos, RunPlan(rounds=4, epsilon=2.0, progress=False)
    )
    assert alone.rounds_completed == 4


def test_the_validation_part_comes_out_of_the_training_records() -> None:
    (silo, *_) = build_silos(Study(STUDY).points[0][1].data, 0)
    held = with_validation(silo, 0.2, 0)
    assert held.public_size == silo.declared_size - round(0.2 * silo.declared_size)
    rows = {tuple(r) for r in np.round(silo.x.numpy(), 5)}
    parts = [{tuple(r) for r in np.round(x.numpy(), 5)} for x in (held.x, held.x_test)]
    assert held.x_test is not None and held.size + held.x_test.shape[0] == silo.size
    assert parts[0] | parts[1] == rows and not parts[0] & parts[1]
    assert abs(held.y.float().mean() - silo.y.float().mean()) < 0.02  # stratified


def test_a_patient_level_silos_validation_part_holds_whole_patients() -> None:
    """Under a patient unit the validation part is whole patients: none has records on
    both sides, the training part keeps its patients' ids, and the public size (which
    counts patients) shrinks by the public fraction. It was a split of records, which a
    patient-level silo refused (its units no longer matched its records)."""
    rng = np.random.default_rng(0)
    units = np.repeat(np.arange(40), rng.integers(1, 5, 40))
    x = rng.normal(size=(len(units), 3))
    y = (rng.random(40) < 0.3).astype(np.int64)[units]  # a patient's records share a class
    silo = Silo.from_arrays("h", x, y, x[:5], y[:5], public_size=40, units=units)
    held = with_validation(silo, 0.25, 0)
    assert held.units is not None and len(held.units) == held.size
    kept = set(held.units.tolist())
    validation_rows = {tuple(r) for r in np.round(held.x_test.numpy(), 6)}  # type: ignore[union-attr]
    left = {
        int(u)
        for u, r in zip(units, np.round(x.astype(np.float32), 6), strict=True)
        if tuple(r) in validation_rows
    }
    assert left and not kept & left and kept | left == set(range(40))
    assert held.size + len(validation_rows) == silo.size
    assert held.public_size == 40 - round(0.25 * 40)


def test_held_out_validation_records_are_no_candidates_training_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held out: the validation records are test records, disjoint (by the dataset's row
    index) from every candidate's training records, which are the study's own."""
    trained, tested = _recorded(monkeypatch)
    tuned = tune(Study(HELD_OUT), tmp_path, metric="auroc", mean=3.0)

    config = Study(HELD_OUT).points[0][1]
    rows = _rows(config)
    study = build_silos(config.data, 0)
    validation = rows(trained[0], "x_test")
    assert trained and validation
    for candidate in trained:
        assert rows(candidate, "x_test") == validation
        assert not rows(candidate, "x") & validation
        assert rows(candidate, "x") == rows(study, "x")  # what `dpfl run` trains on
        assert [s.public_size for s in candidate] == [s.public_size for s in study]
    (released,) = tested
    assert not rows(released, "x_test") & validation
    assert rows(released, "x_test") | validation == rows(study, "x_test")
    assert tuned.datasheet["validation"] == "held-out"
    assert "no silo's training set" in tuned.datasheet["validation_records"]
    assert "no run of the study trains on them" in tuned.datasheet["outside_epsilon"]
    assert json.loads((tmp_path / RESULT).read_text())["datasheet"] == tuned.datasheet


def _recorded(monkeypatch: pytest.MonkeyPatch) -> tuple[list[list[Silo]], list[list[Silo]]]:
    """The silos every candidate trains on, and those the released one is tested on."""
    trained: list[list[Silo]] = []
    tested: list[list[Silo]] = []
    simulate_, tested_ = tune_module.simulate, tune_module._tested

    def recorded_simulate(algorithm: Any, silos: list[Silo], *plan: Any, **options: Any) -> Any:
        trained.append(silos)
        return simulate_(algorithm, silos, *plan, **options)

    def recorded_tested(algorithm: Any, result: Any, silos: list[Silo]) -> Any:
        tested.append(silos)
        return tested_(algorithm, result, silos)

    monkeypatch.setattr(tune_module, "simulate", recorded_simulate)
    monkeypatch.setattr(tune_module, "_tested", recorded_tested)
    return trained, tested


def _rows(config: Any) -> Callable[[list[Silo], str], set[int]]:
    """Silos' records (part "x" or "x_test") as their row indices in the study's dataset."""
    row = {r.tobytes(): i for i, r in enumerate(config.data.load(0).features)}

    def rows(silos: list[Silo], part: str) -> set[int]:
        return {row[r.tobytes()] for s in silos for r in getattr(s, part).numpy()}

    return rows


def test_official_validation_records_are_neither_training_nor_test_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Official: each hospital's share of the official val split validates; every
    candidate trains on the study's training records, and the released one is tested on
    all of the official test records, none of them a validation record."""
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 60), ("val", 20), ("test", 30)):
        labels = np.arange(n) % 2
        pixels = rng.integers(0, 128, (n, 28, 28)) + 100 * labels[:, None, None]
        arrays[f"{split}_images"], arrays[f"{split}_labels"] = pixels.astype(np.uint8), labels
    np.savez(tmp_path / "breastmnist.npz", **arrays)
    official = {
        "name": "official-validation",
        "rounds": 2,
        "data": {
            "dataset": "breastmnist",
            "path": str(tmp_path),
            "partition": {"kind": "iid", "silos": 2},
            "split": "official",
        },
        "model": {"kind": "small_cnn"},
        "algorithm": {"name": "fedavg", "learning_rate": [0.05, 0.1], "expected_batch_size": 8},
        "privacy": {"private": False},
        "tune": {"validation": "official"},
    }
    trained, tested = _recorded(monkeypatch)
    tuned = tune(Study(official), tmp_path / "out", metric="accuracy", mean=2.0)

    config = Study(official).points[0][1]
    rows = _rows(config)
    split = config.data.load(0).split
    assert split is not None
    official_rows = {name: set(np.flatnonzero(split == name)) for name in ("train", "val", "test")}
    (released,) = tested
    assert rows(released, "x_test") == official_rows["test"]  # every official test record
    for candidate in trained:
        assert rows(candidate, "x_test") == official_rows["val"]
        assert rows(candidate, "x") == official_rows["train"] == rows(released, "x")
    assert not official_rows["val"] & rows(released, "x_test")
    assert tuned.datasheet["validation"] == "official"
    assert "official val split" in tuned.datasheet["validation_records"]
    stratified = {**official, "data": {**official["data"], "split": "stratified"}}
    with pytest.raises(ValueError, match=r"tune\.validation = 'official' needs data\.split"):
        tune(Study(stratified), tmp_path / "refused", metric="accuracy")


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {"validation": "test"},
            r"tune.validation: Input should be 'from-training', 'held-out' or 'official'",
        ),
        ({"validation_fraction": 1.0}, r"tune.validation_fraction: Input should be less than 1"),
        ({"fraction": 0.2}, r"tune.fraction: unknown key"),
    ],
)
def test_bad_validation_choices_are_refused_by_their_key(
    section: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        Study({**STUDY, "tune": section})


def test_a_held_out_split_that_leaves_a_part_empty_is_refused(tmp_path: Path) -> None:
    tiny = {
        **STUDY,
        "data": {**STUDY["data"], "test_fraction": 0.01},  # 2 test records a silo
        "tune": {"validation": "held-out", "validation_fraction": 0.1},
    }
    with pytest.raises(ValueError, match="test records leave no validation or no other record"):
        tune(Study(tiny), tmp_path, metric="auroc", mean=3.0)
    with pytest.raises(ValueError, match=r"must lie in \(0, 1\)"):
        tune(Study(HELD_OUT), tmp_path, metric="auroc", validation_fraction=1.0)
    assert not (tmp_path / LEDGER).exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"algorithm": {"name": "fedavg", "expected_batch_size": [8, 32]}}, "different privacy"),
        ({"rounds": [2, 4]}, "rounds must be the same"),
        ({"privacy": {"noise_multiplier": 1.0, "epsilon": 2.0}}, "leave privacy.noise"),
        ({"trials": 2}, "trials must be 1"),
        ({"tune": {"validation": ["from-training", "held-out"]}}, "tune must be the same"),
    ],
)
def test_a_study_the_selection_cannot_account_for_is_refused(
    change: dict[str, Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=message):
        tune(Study({**STUDY, **change}), tmp_path, metric="auroc")
    assert not (tmp_path / LEDGER).exists()


def test_dpfl_tune_prints_the_choice_and_its_epsilon(tmp_path: Path) -> None:
    study = tmp_path / "study.toml"
    study.write_text(
        'name = "t"\nrounds = 3\n[data]\ndataset = "breast_cancer"\n'
        'partition = { kind = "iid", silos = 2 }\n[algorithm]\nname = "fedavg"\n'
        "learning_rate = [0.5, 1.0]\n[privacy]\nepsilon = 3.0\n"
    )
    result = CliRunner().invoke(
        app, ["tune", str(study), "--out", str(tmp_path / "o"), "--mean", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["point"]["algorithm.learning_rate"] in (0.5, 1.0)
    assert max(shown["epsilon"].values()) <= 3.0
    assert shown["datasheet"]["validation"] == "from-training"

    held = tmp_path / "held.toml"
    held.write_text(study.read_text() + '[tune]\nvalidation = "held-out"\n')
    text = CliRunner().invoke(app, ["tune", str(held), "--out", str(tmp_path / "h"), "--mean", "2"])
    assert text.exit_code == 0, text.output
    lines = " ".join(text.output.split())  # the console wraps long lines
    assert "validation: held-out" in lines
    assert "validation records: a stratified part (0.2) of each silo's test records" in lines
    assert "in epsilon: each silo's records the candidates trained on" in lines
    assert "outside epsilon: the validation records" in lines

    # `dpfl best` of the directory: the one released point, its ε with the selection in it
    best = CliRunner().invoke(app, ["best", str(tmp_path / "o"), "-e", "3", "-d", "1e-5", "--json"])
    assert best.exit_code == 0, best.output
    chosen = json.loads(best.output)["best"]
    assert chosen["selection_in_epsilon"] is True and chosen["grid"] == shown["point"]
    assert chosen["epsilon"] == pytest.approx(max(shown["epsilon"].values()))
    assert chosen["mean"] == shown["test_metrics"]["accuracy"]
    text = CliRunner().invoke(app, ["best", str(tmp_path / "o"), "-e", "3", "-d", "1e-5"])
    assert "the selection is in it" in text.output
    # at a smaller δ the same ledger gives a larger ε, which a budget just above misses
    tight = CliRunner().invoke(app, ["best", str(tmp_path / "o"), "-e", "3", "-d", "1e-9"])
    assert tight.exit_code == 1 and "not within" in tight.output
    pooled = CliRunner().invoke(
        app, ["best", str(tmp_path / "o"), "-e", "3", "-d", "1e-5", "--pool-seeds"]
    )
    assert pooled.exit_code != 0 and "for sweeps" in pooled.output


def test_a_refused_tune_writes_nothing_so_the_corrected_one_runs_there(tmp_path: Path) -> None:
    """The selection's checks come before `--out` is claimed: a study it refuses leaves no
    study.json behind to refuse the corrected study as another one."""
    text = (
        'name = "t"\nrounds = 2\n[data]\ndataset = "breast_cancer"\n'
        'partition = { kind = "iid", silos = 2 }\n[algorithm]\nname = "fedavg"\n'
        "learning_rate = [0.5, 1.0]\n[privacy]\nepsilon = 3.0\n"
    )
    study, out = tmp_path / "study.toml", tmp_path / "o"
    study.write_text(text + "noise_multiplier = 1.0\n")
    refused = CliRunner().invoke(app, ["tune", str(study), "--out", str(out), "--mean", "1"])
    assert refused.exit_code == 2
    assert "leave privacy.noise_multiplier out" in " ".join(refused.output.split())
    assert not out.exists()
    study.write_text(text)
    tuned = CliRunner().invoke(app, ["tune", str(study), "--out", str(out), "--mean", "1"])
    assert tuned.exit_code == 0, tuned.output


def test_dpfl_tune_warns_when_the_released_model_predicts_one_class(tmp_path: Path) -> None:
    study = tmp_path / "study.toml"
    study.write_text(
        'name = "t"\nrounds = 2\n[data]\ndataset = "breast_cancer"\n'
        'partition = { kind = "iid", silos = 2 }\n[algorithm]\nname = "fedavg"\n'
        "learning_rate = [0.0001, 0.0002]\n[privacy]\nepsilon = 3.0\n"
        "[threshold]\nvalue = 0.99\n"
    )
    tuned = CliRunner().invoke(app, ["tune", str(study), "--out", str(tmp_path / "o")])
    assert tuned.exit_code == 0, tuned.output
    said = " ".join(tuned.stderr.split())
    assert "predicted the negative class for every test record" in said
    assert '[threshold] choose = "balanced"' in said


@pytest.mark.parametrize("name", ["tune-heart-mrmtl", "tune-physionet-mrmtl"])
def test_the_documented_tuning_studies_load_as_one_search_space(name: str) -> None:
    study = load(Path(__file__).parents[2] / "docs" / "studies" / f"{name}.toml")
    assert list(study.axes) == ["algorithm.strength"] and len(study.points) == 6
    assert {config.privacy.epsilon for _, config in study.points} == {1.0}


@pytest.mark.parametrize("method", ["c", "cdp", "f", "fpdp", "dopamine"])
def test_dopamines_five_methods_are_tuned_over_the_same_learning_rates(method: str) -> None:
    study = load(
        Path(__file__).parents[2] / "docs" / "studies" / "dopamine-tune" / f"{method}.toml"
    )
    rates = {config.algorithm.learning_rate for _, config in study.points}
    assert rates == {0.01, 0.02, 0.05, 0.1}
    config, private = study.points[0][1], method in ("cdp", "fpdp", "dopamine")
    assert config.privacy.private == private and config.trials == 1
    if private:
        assert (config.privacy.epsilon, config.privacy.delta) == (3.0, 1e-4)


def test_a_server_optimisers_settings_are_a_search_space_of_their_own(tmp_path: Path) -> None:
    """Post-processing at the server: every candidate records the same events, so a grid
    over the optimiser and its rate is tuned, its charge the one selection's."""
    server = {"optimizer": ["fedavgm", "fedadam"], "learning_rate": [0.05, 0.5]}
    served = {**STUDY, "algorithm": {"name": "fedavg", "server": server}}
    tuned = tune(Study(served), tmp_path, metric="auroc", mean=3.0)
    assert tuned.point["algorithm.server.optimizer"] in ("fedavgm", "fedadam")
    assert tuned.point["algorithm.server.learning_rate"] in (0.05, 0.5)
    assert max(tuned.epsilon.values()) <= 2.0
    with Ledger(tmp_path / LEDGER, create=False) as book:
        assert all(len(book.entries(silo)) == 1 for silo in book.silos())
