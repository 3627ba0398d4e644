"""Study files: validation names the bad key and why; lists make grids."""

from __future__ import annotations

import ast
import importlib
import inspect
import tomllib
from pathlib import Path

import pytest

from dpfl.data import images
from dpfl.experiments.study import config as config_module
from dpfl.experiments.study import datasets
from dpfl.experiments.study.config import (
    MAX_POINTS,
    ConfigError,
    Study,
    StudyConfig,
    _list_valued,
    load,
)
from dpfl.experiments.study.datasets import DATASETS, KINDS, DataSettings
from dpfl.experiments.study.datasets.base import STORED_EMPTY
from dpfl.experiments.study.datasets.images import ImageData, ImagesConfig
from studies import breast_cancer_study

BASE = breast_cancer_study("t", rounds=3, privacy={"epsilon": 1.0})


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_valid_file_has_one_point_and_a_stable_key(tmp_path: Path) -> None:
    study = load(_write(tmp_path, BASE))
    assert study.axes == {} and len(study.points) == 1
    ((grid, config),) = study.points
    assert grid == {} and config.privacy.delta == 1e-5 and config.trials == 1
    assert config.key() == load(_write(tmp_path, BASE)).points[0][1].key()


def test_lists_where_one_value_is_expected_make_a_grid(tmp_path: Path) -> None:
    text = BASE.replace('name = "fedavg"', 'name = ["fedavg", "cyclic"]\nlearning_rate = [0.1, 1]')
    text = text.replace("[model]", "") + '[model]\nkind = "mlp"\nhidden = [[8], [16, 16]]\n'
    study = load(_write(tmp_path, text))
    assert study.axes == {
        "algorithm.name": ["fedavg", "cyclic"],
        "algorithm.learning_rate": [0.1, 1],
        "model.hidden": [[8], [16, 16]],
    }
    assert len(study.points) == 8
    assert len({config.key() for _, config in study.points}) == 8
    assert {tuple(c.model.hidden) for _, c in study.points} == {(8,), (16, 16)}
    plain = load(_write(tmp_path, BASE + '[model]\nkind = "mlp"\nhidden = [8, 8]\n'))
    assert plain.axes == {} and plain.points[0][1].model.hidden == [8, 8]  # a value, not an axis


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("rounds = 3", "rounds = 0"), r"rounds: Input should be greater than or equal to 1"),
        (("[privacy]", "[privacy]\nepsilonn = 2"), r"privacy.epsilonn: unknown key"),
        (('name = "fedavg"', 'name = "fedprox"'), r"algorithm.name: Input should be 'fedavg'"),
        (("epsilon = 1.0", "epsilon = -1.0"), r"privacy.epsilon: Input should be greater than 0"),
        (("epsilon = 1.0", "delta = 1e-5"), r"privacy: a private run needs `epsilon`"),
        (('kind = "iid", silos = 3', 'kind = "iid"'), r"data.partition: a iid partition needs"),
        (('name = "fedavg"', 'name = "aop"\n[model]\nkind = "mlp"'), r"aop needs a convex"),
        (("epsilon = 1.0", "private = false\nnoise_multiplier = 1.0"), r"non-private run takes no"),
        (
            (
                'name = "fedavg"\n[privacy]\nepsilon = 1.0',
                'name = "aop"\n[privacy]\nprivate = false',
            ),
            r"aop has no non-private form",
        ),
    ],
)
def test_bad_values_are_named_by_key(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(_write(tmp_path, BASE.replace(*change)))


def test_an_error_at_one_grid_point_names_the_point(tmp_path: Path) -> None:
    text = BASE.replace("epsilon = 1.0", "epsilon = [1.0, -2.0]")
    with pytest.raises(ConfigError, match=r"privacy.epsilon: .*grid point privacy.epsilon=-2.0"):
        load(_write(tmp_path, text))


def test_unreadable_files_are_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(_write(tmp_path, "rounds = = 3"))
    with pytest.raises(ConfigError, match="empty list"):
        Study({**{"rounds": [], "data": {"dataset": "x"}}})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ('dataset = "breast_cancer"', 'dataset = "heart"'),
            r"data.dataset: unknown dataset 'heart'",
        ),
        (
            ('dataset = "breast_cancer"', 'dataset = "heart_disease"'),
            r"data: heart_disease is read from files: give data.path",
        ),
        (("[data]", '[data]\npath = "nowhere"'), r"data.path: .*nowhere is not a folder"),
        (("[data]", '[data]\npath = "."'), r"data: breast_cancer reads no files"),
        (("epsilon = 1.0", "epsilon = inf"), r"privacy.epsilon: Input should be a finite number"),
        (
            ("epsilon = 1.0", "noise_multiplier = inf"),
            r"privacy.noise_multiplier: Input should be a finite number",
        ),
        (("epsilon = 1.0", "epsilon = nan"), r"privacy.epsilon: Input should be a finite number"),
    ],
)
def test_what_would_fail_inside_a_run_is_refused_at_load(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load(_write(tmp_path, BASE.replace(*change)))


def test_a_relative_data_path_is_read_from_the_study_files_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "data" / "heart").mkdir(parents=True)
    (tmp_path / "studies").mkdir()
    (tmp_path / "elsewhere").mkdir()
    text = BASE.replace('dataset = "breast_cancer"', 'dataset = "heart_disease"')
    study = tmp_path / "studies" / "heart.toml"
    study.write_text(text.replace("[data]", '[data]\npath = "../data/heart"'), encoding="utf-8")
    monkeypatch.chdir(tmp_path / "elsewhere")
    ((_, config),) = load(Path("..") / "studies" / "heart.toml").points
    assert config.data.path == tmp_path / "data" / "heart"


def test_evaluation_only_at_the_end(tmp_path: Path) -> None:
    text = BASE.replace("rounds = 3", 'rounds = [3, 5]\neval_every = "end"')
    study = load(_write(tmp_path, text))
    assert [config.eval_every for _, config in study.points] == [3, 5]
    with pytest.raises(ConfigError, match="eval_every"):
        load(_write(tmp_path, BASE.replace("rounds = 3", 'rounds = 3\neval_every = "never"')))


@pytest.mark.parametrize(
    ("algorithm", "extra", "message"),
    [
        ("fedsgd_secure", 'secure_aggregation = "none"', "sees only the sum of the replies"),
        ("cyclic", 'secure_aggregation = "masking"', "cyclic's server sums no replies"),
        ("fedavg", 'secure_aggregation = "garbled"', "secure_aggregation: Input should be"),
        ("fedavg", "", "tolerated_dropouts is fedsgd_secure's"),
    ],
)
def test_secure_aggregation_must_fit_the_algorithm(
    tmp_path: Path, algorithm: str, extra: str, message: str
) -> None:
    text = f"{extra}\n{BASE}".replace('name = "fedavg"', f'name = "{algorithm}"')
    if not extra:
        text = text.replace("[privacy]", "tolerated_dropouts = 1\n[privacy]")
    with pytest.raises(ConfigError, match=message):
        load(_write(tmp_path, text))


def test_ternary_votes_are_signs_and_name_a_new_point(tmp_path: Path) -> None:
    sign = BASE.replace('name = "fedavg"', 'name = "sign"')
    binary = load(_write(tmp_path, sign)).points[0][1]
    explicit = sign.replace("[privacy]", 'votes = "binary"\n[privacy]')
    assert load(_write(tmp_path, explicit)).points[0][1].key() == binary.key()
    ternary = load(_write(tmp_path, sign.replace("[privacy]", 'votes = "ternary"\n[privacy]')))
    assert ternary.points[0][1].algorithm.votes == "ternary"
    assert ternary.points[0][1].key() != binary.key()
    with pytest.raises(ConfigError, match=r"algorithm\.votes is sign.s"):
        load(_write(tmp_path, BASE.replace("[privacy]", 'votes = "ternary"\n[privacy]')))


def test_secure_aggregation_defaults_to_what_the_accounting_needs(tmp_path: Path) -> None:
    """An unset option leaves the study's key as it was before the option existed."""
    config = load(_write(tmp_path, BASE)).points[0][1]
    assert config.summing == "none" and config.secure_aggregation is None
    masked = load(_write(tmp_path, 'secure_aggregation = "masking"\n' + BASE)).points[0][1]
    assert masked.summing == "masking" and masked.key() != config.key()
    dopamine = BASE.replace('name = "fedavg"', 'name = "fedsgd_secure"')
    assert load(_write(tmp_path, dopamine)).points[0][1].summing == "ideal"


def test_a_misspelt_key_holding_a_list_is_one_error_and_no_grid(tmp_path: Path) -> None:
    text = BASE.replace("[privacy]", "[privacy]\nepsilonn = [1, 2, 4]")
    with pytest.raises(ConfigError) as refused:
        load(_write(tmp_path, text))
    (line,) = str(refused.value).splitlines()[1:]
    assert line == "  privacy.epsilonn: unknown key (check its spelling and section)"


def test_misspelt_keys_in_sections_by_name_and_in_a_grid_of_sections_are_named() -> None:
    raw = tomllib.loads(BASE)
    raw["privacy"]["silos"] = {"hospital-0": {"epsilon": 1.0, "delta": 1e-5, "deltaa": 1}}
    raw["data"]["partition"] = [{"kind": "iid", "silos": 2}, {"kind": "iid", "sillos": 3}]
    with pytest.raises(ConfigError) as refused:
        Study(raw)
    assert str(refused.value).splitlines()[1:] == [
        "  data.partition.sillos: unknown key (check its spelling and section)",
        "  privacy.silos.hospital-0.deltaa: unknown key (check its spelling and section)",
    ]


class _Expanded(AssertionError):
    """A grid point was built."""


@pytest.fixture
def never_expand(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail at once if any grid point of the study is built (on code that expands a grid
    before it checks it, the test fails here instead of running for minutes)."""

    def refuse(raw: object, grid: object) -> None:
        raise _Expanded("a grid point was built before the study was refused")

    monkeypatch.setattr(config_module, "_with", refuse)


@pytest.mark.usefixtures("never_expand")
def test_many_unknown_two_valued_keys_are_refused_before_expanding(tmp_path: Path) -> None:
    typos = "".join(f"typo{k} = [1, 2]\n" for k in range(24))
    with pytest.raises(ConfigError) as refused:
        load(_write(tmp_path, typos + BASE))
    lines = str(refused.value).splitlines()[1:]
    assert lines == [f"  typo{k}: unknown key (check its spelling and section)" for k in range(24)]


@pytest.mark.usefixtures("never_expand")
def test_a_grid_over_the_limit_is_refused_with_its_size_and_axes(tmp_path: Path) -> None:
    grid = BASE.replace("rounds = 3", f"rounds = {list(range(1, 257))}")
    grid = grid.replace("epsilon = 1.0", f"epsilon = {[k / 8 for k in range(1, 257)]}")
    grid = grid.replace(
        "[algorithm]", f"[algorithm]\nlearning_rate = {[k / 4 for k in range(1, 257)]}"
    )
    with pytest.raises(ConfigError) as refused:
        load(_write(tmp_path, grid))
    assert str(refused.value).splitlines()[1:] == [
        f"  a grid of 16,777,216 points, over the limit of {MAX_POINTS:,}: rounds (256) × "
        "algorithm.learning_rate (256) × privacy.epsilon (256)"
    ]


def test_a_grid_at_the_limit_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_module, "MAX_POINTS", 4)
    study = load(_write(tmp_path, BASE.replace("rounds = 3", "rounds = [1, 2, 3, 4]")))
    assert len(study.points) == 4
    with pytest.raises(ConfigError, match="a grid of 5 points, over the limit of 4: rounds"):
        load(_write(tmp_path, BASE.replace("rounds = 3", "rounds = [1, 2, 3, 4, 5]")))


PANDEMIC = BASE.replace('dataset = "breast_cancer"', 'dataset = "pandemic"')
"""A pandemic study; its own keys go after `[data]`'s first line."""


def _refused(text: str) -> list[str]:
    with pytest.raises(ConfigError) as refused:
        Study(tomllib.loads(text))
    return str(refused.value).splitlines()[1:]


@pytest.mark.parametrize(
    ("own", "line"),
    [
        ('people = "many"', "  data.people: Input should be a valid integer, unable to parse "),
        ("people = 0", "  data.people: Input should be greater than or equal to 1"),
        ("asymptomatic = 1.5", "  data.asymptomatic: Input should be less than or equal to 1"),
        ('contacts = "all"', "  data.contacts: Input should be 'slots' or 'summary'"),
        ("peple = 4000", "  data.peple: unknown key (check its spelling and section); pandemic's "),
        ("options = { peple = 4000 }", "  data.peple: unknown key"),
        (
            "options = { people = 1 }\npeople = 2",
            "  data: people given both in [data] and in [data.options]",
        ),
    ],
)
def test_a_kinds_own_keys_are_typed_and_a_misspelt_one_is_one_line(own: str, line: str) -> None:
    (refused,) = _refused(PANDEMIC.replace("[data]", f"[data]\n{own}", 1))
    assert refused.startswith(line)


def test_a_misspelt_key_names_the_kinds_own_keys() -> None:
    (line,) = _refused(PANDEMIC.replace("[data]", "[data]\npeple = 4000", 1))
    assert line.endswith(
        "pandemic's own keys: people, regions, transmission, initial_infected, asymptomatic, "
        "region_spread, heterogeneity, max_appearances, window, horizon, train_days, contacts"
    )
    (table_key,) = _refused(BASE.replace("[data]", '[data]\nlabel = "y"', 1))
    assert table_key == (
        "  data.label: unknown key (check its spelling and section); "
        "breast_cancer has none of its own"
    )


def test_the_older_data_options_spelling_is_the_same_run() -> None:
    own = '[data]\npeople = 4000\nheterogeneity = 1\ncontacts = "summary"'
    older = '[data]\noptions = { people = 4000, heterogeneity = 1, contacts = "summary" }'
    (_, new), *_ = Study(tomllib.loads(PANDEMIC.replace("[data]", own, 1))).points
    (_, old), *_ = Study(tomllib.loads(PANDEMIC.replace("[data]", older, 1))).points
    assert new == old and new.key() == old.key()
    # a dump (a stored config) holds the given keys under `options`, integers as written
    assert new.model_dump(mode="json")["data"]["options"] == {
        "people": 4000,
        "heterogeneity": 1,
        "contacts": "summary",
    }
    assert StudyConfig.model_validate(new.model_dump(mode="json")).key() == new.key()


def test_a_kinds_own_key_given_a_list_is_a_grid_axis() -> None:
    study = Study(tomllib.loads(PANDEMIC.replace("[data]", "[data]\npeople = [100, 200]", 1)))
    assert study.axes == {"data.people": [100, 200]}
    assert _list_valued(("data", "sets"))  # physionet2012's sets: a list is its one value


def test_a_stored_config_of_the_one_section_data_loads_with_its_key() -> None:
    """Configs stored when `[data]` was one section for every kind hold every table and
    image key at its default; `dpfl report` reads them back."""
    ((_, config),) = Study(tomllib.loads(BASE)).points
    stored = config.model_dump(mode="json")
    assert STORED_EMPTY["images"] == ImagesConfig().model_dump(mode="json")
    stored["data"] = {**stored["data"], **STORED_EMPTY}
    assert StudyConfig.model_validate(stored).key() == config.key()
    stored["data"]["label"] = "y"  # set: a table's key, which breast_cancer refuses
    with pytest.raises(ValueError, match="label"):
        StudyConfig.model_validate(stored)


def test_every_kind_is_in_the_registry_with_its_options_among_its_keys() -> None:
    assert set(DATASETS) == {"images", *images.PRESETS} | {
        name for name, kind in KINDS.items() if not issubclass(kind, ImageData)
    }
    for kind in KINDS.values():
        assert set(kind.OPTIONS) <= set(kind.model_fields) - set(DataSettings.model_fields)


def test_the_dataset_kinds_import_nothing_of_the_study_schema() -> None:
    """config imports the union; no kind imports config back (no import circle)."""
    package = Path(datasets.__file__).parent
    for module in package.glob("*.py"):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "dpfl.experiments.study.config" not in imported, module.name


@pytest.mark.parametrize(
    ("dataset", "loaders"),
    [
        ("flamby_heart_disease", ["dpfl.data.flamby:flamby_heart_disease"]),
        ("physionet2012", ["dpfl.data.physionet:physionet2012"]),
        ("diabetes130", ["dpfl.data.public_tables:diabetes130"]),
        ("synthetic_ehr", ["dpfl.data.synthetic:synthetic_ehr"]),
        ("synthetic_bc_tcga", ["dpfl.data.synthetic:synthetic_bc_tcga"]),
        (
            "pandemic",
            ["dpfl.data.pandemic:pandemic_population", "dpfl.data.pandemic:pandemic_dataset"],
        ),
    ],
)
def test_a_kinds_defaults_are_its_loaders(dataset: str, loaders: list[str]) -> None:
    """A kind passes every one of its keys to its loader, given or not: each default is
    the loader's own, so a key left out loads what it loaded when it was not passed."""
    defaults: dict[str, object] = {}
    for loader in loaders:
        module, name = loader.split(":")
        signature = inspect.signature(getattr(importlib.import_module(module), name))
        defaults |= {k: p.default for k, p in signature.parameters.items() if p.default != p.empty}
    kind = KINDS[dataset]
    for key in kind.OPTIONS:
        ours = kind.model_fields[key].get_default(call_default_factory=True)
        theirs = defaults.get(key, ours)  # pandemic's people: the study's default (20,000)
        assert (list(ours) if isinstance(ours, tuple | list) else ours) == (
            list(theirs) if isinstance(theirs, tuple | list) else theirs
        ), key
    assert set(kind.OPTIONS) - set(defaults) <= {"people"}


def test_a_server_optimiser_is_a_table_or_a_name_and_its_settings_make_grids(
    tmp_path: Path,
) -> None:
    table = BASE.replace(
        'name = "fedavg"',
        'name = "fedavg"\nserver = { optimizer = "fedadam", learning_rate = [0.01, 0.1] }',
    )
    study = load(_write(tmp_path, table))
    assert study.axes == {"algorithm.server.learning_rate": [0.01, 0.1]}
    rates = [config.algorithm.server.build() for _, config in study.points]
    assert [r.name for r in rates] == ["fedadam", "fedadam"]
    assert [r.learning_rate for r in rates] == [0.01, 0.1]  # type: ignore[attr-defined]
    assert len({config.key() for _, config in study.points}) == 2
    named = BASE.replace('name = "fedavg"', 'name = "fedavg"\nserver = ["averaging", "fedyogi"]')
    study = load(_write(tmp_path, named))
    assert [c.algorithm.server.optimizer for _, c in study.points] == ["averaging", "fedyogi"]
    plain = load(_write(tmp_path, BASE)).points[0][1]
    assert plain.key() == load(_write(tmp_path, BASE)).points[0][1].key()
    assert plain.algorithm.server.optimizer == "averaging"
    misspelt = BASE.replace('name = "fedavg"', 'name = "fedavg"\nserver = { optimiser = "adam" }')
    with pytest.raises(ConfigError, match=r"algorithm\.server"):
        load(_write(tmp_path, misspelt))
