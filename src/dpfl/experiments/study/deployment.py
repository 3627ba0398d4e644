"""A study deployed on Flower: the study file read into the engine's `Deployment`, the
Flower app (`dpfl_app:server`, `dpfl_app:client`) that `flwr run` ships, and the
server's run from its run config to its saved result and its run in the results store.

The engine (`dpfl.engines.flower`) knows algorithms and messages; what a study file
means, and which studies a deployment can uphold, is decided here."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from dpfl import secure
from dpfl.engines import flower
from dpfl.engines.flower import analytics as deployed_analytics
from dpfl.engines.flower import approval
from dpfl.engines.flower.protocol import LOG
from dpfl.engines.flower.roster import PREFIX, Roster, RosterError, public_text, read_identity
from dpfl.experiments.results.datasheet import ASSUMPTIONS, mechanism
from dpfl.experiments.results.store import REPORTED_BY_HOSPITALS, ResultsStore, RunResults
from dpfl.experiments.study import analytics
from dpfl.experiments.study.build import build_algorithm
from dpfl.experiments.study.config import StudyConfig, ThresholdConfig, load
from dpfl.experiments.study.point import STORE
from dpfl.experiments.study.runner import owning
from dpfl.federation.algorithms import BY_NAME
from dpfl.federation.algorithms.base import Algorithm
from dpfl.federation.silo import Silo, SiloInfo
from dpfl.models.factories import source_file
from dpfl.privacy.governance import Approval


def study_point(path: str | Path) -> StudyConfig:
    """The study to deploy: one point (a grid is a sweep, run by the simulator), one
    trial, and nothing whose accounting the deployment cannot yet uphold."""
    study = load(path)
    if len(study.points) != 1:
        raise ValueError(
            f"{path}: a deployment runs one point, the study has a grid of {len(study.points)}"
        )
    config = study.points[0][1]
    check_deployable(config)
    return config


def check_deployable(config: StudyConfig) -> None:
    """Refuse what would break an accounting assumption, or is not deployed yet."""
    kind = BY_NAME[config.algorithm.name]
    problems = []
    if config.trials != 1:
        problems.append("trials must be 1 (a deployment is one run on the hospitals' records)")
    if not config.privacy.private:
        problems.append("privacy.private must be true (hospitals enforce their budgets)")
    if config.privacy.ledger is not None:
        problems.append(
            "privacy.ledger and caps: a deployment charges each hospital's own ledger, "
            "capped by its steward (dpfl deploy hospital --ledger, --cap), never a file "
            "beside the server"
        )
    if kind.pools_data:
        problems.append(f"{kind.name} pools every hospital's records: it cannot be deployed")
    if not secure.mode(config.summing).deployable:
        problems.append(
            f"secure_aggregation {config.summing!r}: across machines the server sums by "
            "pairwise masking ('masking') or homomorphic encryption ('he'); "
            f"{config.summing!r} is the simulator's stand-in"
        )
    if config.threshold != ThresholdConfig():
        problems.append("threshold: deployed models predict at 0.5; leave the threshold out")
    problems += _evaluation_problems(config)
    if problems:
        raise ValueError(f"study {config.name!r} cannot be deployed: " + "; ".join(problems))


def _evaluation_problems(config: StudyConfig) -> list[str]:
    """Why the study's DP evaluation cannot be released (`flower.Evaluation`)."""
    if config.evaluation.release != "dp" or not config.evaluation.queries:
        return []
    clear = "declare [evaluation] release = 'clear' (its metrics outside ε) or queries = 0"
    kind = BY_NAME[config.algorithm.name]
    if config.model.time_bins or config.algorithm.loss in ("cox", "logistic_hazard"):
        return [
            f"evaluation: a DP evaluation counts a classifier's scores; a survival study {clear}"
        ]
    if config.data.declared_unit() is not None:
        return [
            "evaluation: a DP evaluation counts each test record once, which bounds no "
            f"patient's records (data.unit); {clear}"
        ]
    if kind.sets_own_noise:
        return [
            f"evaluation: {kind.name} spends its whole budget (ε and δ) on its own noise, "
            f"which leaves nothing for a DP evaluation; {clear}"
        ]
    return []


def algorithm_for(
    config: StudyConfig, silos: Sequence[SiloInfo], shape: Sequence[int], classes: int
) -> Algorithm:
    """The study's algorithm as the simulator builds it, from public facts only: each
    silo's name and public size, the feature shape and the number of classes
    (`flower.SURVIVAL`: survival labels)."""
    label = torch.ones(1, 2) if classes == flower.SURVIVAL else torch.tensor([classes - 1])
    placeholders = [
        Silo(s.name, torch.zeros((1, *shape)), label, public_size=s.public_size) for s in silos
    ]
    return build_algorithm(config, placeholders)


def deployment(config: StudyConfig) -> flower.Deployment:
    """The engine's view of a deployable study point, with its roster (refused without
    one: no hospital takes the server's word for who is in the federation). A table
    study's model input is its schema's (the server reads no record), each hospital
    reading its own file through that schema (`TableData.own_silo`), its silo's seed that
    of its place among the study's sites, or, without declared sites, the roster's
    sorted names."""
    check_deployable(config)
    calibrated = (
        config.privacy.noise_multiplier is None
        and not BY_NAME[config.algorithm.name].sets_own_noise
    )
    roster = Roster.parse(config.roster, f"study {config.name!r}'s [roster]")
    declared = config.data.declared_input()
    return flower.Deployment(
        key=config.key(),
        rounds=config.rounds,
        seed=config.seed,
        accountant=config.privacy.accountant,
        build=partial(algorithm_for, config),
        summing=config.summing,
        roster=roster,
        calibration=config.privacy.calibration if calibrated else None,
        size_noise=config.data.size_noise if config.data.public_sizes == "dp-count" else None,
        schema=None if declared is None else schema(*declared),
        sizes=config.data.declared_sizes(),
        read=None
        if declared is None
        else partial(config.data.own_silo, config.seed, sorted(roster.identities)),
        analytics=analytics.deployed(config),
        evaluation=evaluation(config),
    )


def evaluation(config: StudyConfig) -> flower.Evaluation:
    """The study's `[evaluation]`, as its hospitals release it."""
    return flower.Evaluation(**config.evaluation.model_dump())


def schema(width: int, classes: int | None) -> tuple[tuple[int, ...], int]:
    """A table study's declared model input as a hello announces it: the feature shape
    and the classes (`flower.SURVIVAL`: survival labels)."""
    return (width,), flower.SURVIVAL if classes is None else classes


RECEIPTS = "receipts"
"""The folder in a server's OUT that keeps the hospitals' receipts, one folder each."""


def deployment_of(path: Path) -> flower.Deployment:
    """A study file's deployment (the `DeploymentOf` both apps use), with the digests of
    what a hospital's approval covers."""
    config = study_point(path)
    factory = config.model.factory
    schema_text = json.dumps(config.data.model_dump(mode="json"), sort_keys=True)
    digests = {
        "study": _sha256(path.read_bytes()),
        "model": None if factory is None else _sha256(source_file(factory).read_bytes()),
        "schema": _sha256(schema_text.encode()),
    }
    return dataclasses.replace(deployment(config), name=config.name, digests=digests)


def approve(
    study: Path,
    *,
    ledger: Path,
    identity: Path,
    epsilon: float,
    delta: float,
    dataset_cap: float | None = None,
    name: str | None = None,
) -> Approval:
    """A hospital officer's approval of `study` (`dpfl deploy approve`): at this budget
    and cap, signed with the hospital's identity key, which the study's roster must list,
    and kept in its ledger, where `dpfl deploy hospital` looks for it."""
    run = deployment_of(study)
    mine = public_text(read_identity(identity))
    if mine not in {f"{PREFIX}{key.hex()}" for key in run.roster.identities.values()}:
        raise RosterError(
            f"study {run.name!r}'s roster does not list the identity key in {identity} "
            f"({mine}): it is not this hospital's study"
        )
    needed = approval.wanted(run, epsilon=epsilon, delta=delta, dataset_cap=dataset_cap, name=name)
    return approval.approve(ledger, needed, identity)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def client_app() -> ClientApp:
    """The hospital half, for the study its node config names."""
    return flower.client_app(deployment_of)


def server_app() -> ServerApp:
    """The server half. Run config: `study` (the study file, as the hospitals have it,
    whose roster names the hospitals to wait for), `out` (the study folder: `result.pt`, the
    results store and the server's checkpoint, resumed from when the server runs
    again), `wait` and `timeout` (seconds for the hospitals to connect and to reply),
    `missing` ("stop" or "continue": `flower.serve`), `grace` (seconds to wait for a
    hospital whose SuperNode went away mid-run), `he-keys` (the run's public HE key
    file, for an encrypted study), `task` ("stats": release the study's `[analytics]`,
    `serve_stats_study`, instead of training)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        """A run that stops (a refusal, a hospital gone, one of another study) is logged as
        one line, no traceback: the results store keeps why, and `dpfl deploy server`
        reads it there and exits with 1."""
        try:
            if context.run_config.get("task") == "stats":
                serve_stats_study(grid, context.run_config)
                return
            result = serve_study(grid, context.run_config)
        except flower.DeploymentError as exc:
            LOG.error("the deployment failed: %s", exc)
            return
        why = stop_reason(result)
        if why is not None:
            LOG.error("the deployment %s", why)

    return app


def serve_study(grid: Grid, run: Mapping[str, Any]) -> flower.DeploymentResult:
    """The server's whole run from its run config: the study served to its hospitals,
    the result saved to OUT/result.pt and recorded in OUT's results store (`record`),
    which `dpfl report OUT` reads. OUT is held as `dpfl run` holds a study folder, and a
    study that already finished there is refused before any hospital is asked anything:
    it could not be recorded, and the hospitals would have spent ε for nothing shown."""
    config = study_point(Path(str(run["study"])))
    out, key = Path(str(run["out"])), config.key()
    with owning(out), ResultsStore(out / STORE) as store:
        if not store.start(
            key,
            study=config.name,
            algorithm=config.algorithm.name,
            config=config.model_dump(mode="json"),
            grid={},
            trials=config.trials,
            rounds=config.rounds,
            epsilon_source=REPORTED_BY_HOSPITALS,
        ):
            raise flower.DeploymentError(
                f"{out} already holds the finished run {key} of study {config.name!r}: "
                "give the server another out folder"
            )
        started = time.perf_counter()
        try:
            he_keys = str(run.get("he-keys", ""))
            result = flower.serve(
                grid,
                deployment(config),
                wait=float(run["wait"]),
                timeout=float(run["timeout"]),
                missing=str(run.get("missing", "stop")),
                grace=float(run.get("grace", 0.0)),
                checkpoint=out / f"checkpoint-{key}.pt",
                he_keys=Path(he_keys) if he_keys else None,
                receipts=out / RECEIPTS,
            )
        except Exception as exc:  # e.g. a hospital of another study: failed, with why
            store.fail(key, f"{type(exc).__name__}: {exc}")
            raise
        result.save(out)
        record(store, key, config, result, time.perf_counter() - started)
    return result


def serve_stats_study(grid: Grid, run: Mapping[str, Any]) -> analytics.StatsRun:
    """The study's statistics released by its roster's hospitals (`dpfl.engines.flower.analytics`),
    written as `dpfl stats` writes them: OUT/stats.json and OUT/stats.html; or, where a
    hospital refuses or fails, OUT/stats.error, its one line, and DeploymentError."""
    config = study_point(Path(str(run["study"])))
    out = Path(str(run["out"]))
    out.mkdir(parents=True, exist_ok=True)
    he_keys, deployed = str(run.get("he-keys", "")), deployment(config)
    try:
        served = deployed_analytics.serve_stats(
            grid,
            deployed,
            wait=float(run["wait"]),
            timeout=float(run["timeout"]),
            he_keys=Path(he_keys) if he_keys else None,
            receipts=out / RECEIPTS,
        )
    except flower.DeploymentError as exc:
        (out / STATS_ERROR).write_text(f"the statistics were not released: {exc}\n")
        raise
    released = served.released
    assert deployed.analytics is not None  # serve_stats released them
    result = analytics.StatsRun(
        config.name,
        served.hospitals,
        served.noise_multiplier,
        released.noise,
        config.summing,
        "each hospital's own ledger: ε "
        + ", ".join(f"{n} {e:.4g}" for n, e in sorted(served.epsilon.items())),
        released.figures,
        analytics.release_epsilons(config, deployed.analytics.queries, served.noise_multiplier),
    )
    analytics.write(result, out)
    return result


STATS_ERROR = "stats.error"
"""Why a deployment's statistics were not released, in one line."""


def unfinished(study: Path, out: Path) -> str | None:
    """Why the study's deployment in `out` has not finished, as its results store says,
    or None if it has. `flwr run` ends with the run, successful or not: this tells which."""
    key = study_point(study).key()
    if not (out / STORE).exists():
        return f"the server recorded nothing in {out}: see its log above"
    with ResultsStore(out / STORE, create=False) as store:
        status = store.status(key)
        if status == "finished":
            return None
        if status == "failed":
            return f"the deployment failed: {store.run(key).error}"
    return (
        f"the server's run {key} did not end ({status or 'not started'}): see its log "
        "above; run the server again with the same out folder to resume it"
    )


def stop_reason(result: flower.DeploymentResult) -> str | None:
    """Why a deployment stopped before its end (refusals, then a failure), or None."""
    reasons = [f"{name} refused: {why}" for name, why in result.refused.items()]
    if not reasons and not result.stopped:
        return None
    return f"stopped after {result.rounds_completed} rounds: " + "; ".join(
        [*reasons, *([result.stopped] if result.stopped else [])]
    )


def record(
    store: ResultsStore,
    key: str,
    config: StudyConfig,
    result: flower.DeploymentResult,
    seconds: float,
) -> None:
    """End the started run `key` with a deployment's result, as `dpfl run` ends a
    simulated one: the metrics of the union of the test sets and each hospital's on its
    own as the last round's (the deployment evaluates once, at the end), and ε per
    hospital as each reported it from its own ledger, by the study's accountant (the
    server has no ledger). A run stopped by a refusal or a failure is stored failed, with
    `stop_reason` and the ε reported until then. A hospital that never reported has no ε
    row: in a finished run it never trained; in a stopped one its ledger may hold a
    charge it could not report."""
    kind = BY_NAME[config.algorithm.name]
    results = RunResults(
        rounds_completed=result.rounds_completed,
        noise_multiplier=max(result.noise.values(), default=config.privacy.noise_multiplier),
        stopped_by_budget=False,
        seconds=seconds,
        ledger=None,
        datasheet={
            "accountant": config.privacy.accountant,
            "mechanism": mechanism(config, kind),
            "threat_model": kind.threat_model,
            "secure_aggregation": secure.mode(config.summing).described,
            "assumptions": ASSUMPTIONS,
            "noise_multiplier": max(result.noise.values(), default=config.privacy.noise_multiplier),
            "clip_norm": None if kind.sets_own_noise else config.algorithm.clip_norm,
            "evaluation": _evaluation(config),
            "silos": {
                s.name: {
                    "public_size": s.public_size,
                    "public_size_source": "declared"
                    if config.data.public_sizes == "declared"
                    else "DP count released through the hospital's ledger (charged)",
                    **({"noise_multiplier": result.noise[s.name]} if result.noise else {}),
                }
                for s in result.silos
            },
        },
        metrics=[
            (0, result.rounds_completed - 1, name, metric, value)
            for name, scores in [(None, result.union), *result.metrics.items()]
            for metric, value in scores.items()
        ],
        privacy=(),
        communication=(),
        reported_privacy=[
            (name, config.privacy.accountant, epsilon)
            for name, epsilon in sorted(result.epsilon.items())
        ],
    )
    why = stop_reason(result)
    if why is None:
        store.finish(key, results)
    else:
        store.fail(key, why, results)


def _evaluation(config: StudyConfig) -> str:
    """The datasheet's words on a deployment's evaluation: which kind its metrics are."""
    plan = evaluation(config)
    if plan.release == "clear":
        return (
            "Deployed metrics in the clear, OUTSIDE ε ([evaluation] release = 'clear', as the "
            "study explicitly declares): each hospital scores the final model it uses on its "
            "own held-out test records and sends its exact metrics and, unless deployed "
            "with --no-union, its test scores counted by label in 10,000 bins (the union's); "
            "these counts can place a test record's label and scores. Each hospital answers "
            f"{plan.queries} evaluation(s) over the study's runs, of one model a run."
        )
    return (
        "Deployed DP metrics: each hospital counts its held-out test records by label and "
        f"score ({plan.bins} bins of [0, 1]; with several classes also its confusion "
        "matrix), adds Gaussian noise of noise multiplier "
        f"{plan.noise_multiplier:g} × the counts' sensitivity and charges that release to "
        "its ledger (in its ε above) before the counts leave; every metric, its own and "
        "the union's, is read off the noisy counts (no loss). Each hospital answers "
        f"{plan.queries} evaluation(s) over the study's runs, of the final model of a run "
        "it trained in, one model a run."
    )


APP_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "dpfl-deployment"
version = "1.0.0"
description = "dpfl's study deployment: the server half and the hospital half"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "dpfl"

[tool.flwr.app.components]
serverapp = "dpfl_app:server"
clientapp = "dpfl_app:client"

[tool.flwr.app.config]
study = ""
out = ""
wait = 60.0
timeout = 600.0
missing = "stop"
grace = 0.0
he-keys = ""
task = "train"
"""
APP_MODULE = """\
\"\"\"dpfl's Flower app: every hospital's SuperNode needs dpfl installed.\"\"\"

from dpfl.experiments.study.deployment import client_app, server_app

server = server_app()
client = client_app()
"""


def write_app(folder: str | Path) -> Path:
    """The Flower app folder `flwr run` ships (its code is dpfl's, installed at each
    SuperNode and at the SuperLink: the app is two lines naming dpfl's halves)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(APP_PYPROJECT, encoding="utf-8")
    (folder / "dpfl_app.py").write_text(APP_MODULE, encoding="utf-8")
    return folder
