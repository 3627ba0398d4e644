"""A study deployed on Flower: the study file read into the engine's `Deployment`, the
Flower app (`dpfl_app:server`, `dpfl_app:client`) that `flwr run` ships, and the
server's run from its run config to its saved result.

The engine (`dpfl.engines.flower`) knows algorithms and messages; what a study file
means, and which studies a deployment can uphold, is decided here."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch
from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from dpfl.engines import flower
from dpfl.experiments.config import StudyConfig, load
from dpfl.experiments.runner import build_algorithm
from dpfl.federation.algorithms import BY_NAME
from dpfl.federation.algorithms.base import Algorithm
from dpfl.federation.silo import Silo, SiloInfo


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
    if kind.pools_data:
        problems.append(f"{kind.name} pools every hospital's records: it cannot be deployed")
    if config.privacy.noise_multiplier is None and not kind.sets_own_noise:
        problems.append(
            "give privacy.noise_multiplier: calibrating σ to the hospitals' budgets is not "
            "deployed yet"
        )
    if config.summing == "ideal":
        problems.append(
            "secure_aggregation 'ideal': across machines the server sums by pairwise "
            "masking ('masking') or homomorphic encryption ('he'); 'ideal' is the "
            "simulator's stand-in"
        )
    if config.data.public_sizes != "declared":
        problems.append("data.public_sizes must be 'declared' (each hospital declares its own)")
    if problems:
        raise ValueError(f"study {config.name!r} cannot be deployed: " + "; ".join(problems))


def algorithm_for(
    config: StudyConfig, silos: Sequence[SiloInfo], shape: Sequence[int], classes: int
) -> Algorithm:
    """The study's algorithm as the simulator builds it, from public facts only: each
    silo's name and public size, the feature shape and the number of classes."""
    placeholders = [
        Silo(
            s.name, torch.zeros((1, *shape)), torch.tensor([classes - 1]), public_size=s.public_size
        )
        for s in silos
    ]
    return build_algorithm(config, placeholders)


def deployment(config: StudyConfig) -> flower.Deployment:
    """The engine's view of a deployable study point."""
    check_deployable(config)
    return flower.Deployment(
        key=config.key(),
        rounds=config.rounds,
        seed=config.seed,
        accountant=config.privacy.accountant,
        build=partial(algorithm_for, config),
        summing=config.summing,
    )


def deployment_of(path: Path) -> flower.Deployment:
    """A study file's deployment (the `DeploymentOf` both apps use)."""
    return deployment(study_point(path))


def client_app() -> ClientApp:
    """The hospital half, for the study its node config names."""
    return flower.client_app(deployment_of)


def server_app() -> ServerApp:
    """The server half. Run config: `study` (the study file, as the hospitals have it),
    `hospitals` (how many to wait for), `out` (where `result.pt` goes), `wait` and
    `timeout` (seconds for the hospitals to connect and to reply)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run = context.run_config
        result = flower.serve(
            grid,
            deployment_of(Path(str(run["study"]))),
            hospitals=int(run["hospitals"]),
            wait=float(run["wait"]),
            timeout=float(run["timeout"]),
        )
        result.save(Path(str(run["out"])))
        reasons = [f"{name} refused: {why}" for name, why in result.refused.items()]
        if reasons or result.stopped:
            raise flower.DeploymentError(
                f"stopped after {result.rounds_completed} rounds: "
                + "; ".join([*reasons, *([result.stopped] if result.stopped else [])])
            )

    return app


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
hospitals = 3
out = ""
wait = 60.0
timeout = 600.0
"""
APP_MODULE = """\
\"\"\"dpfl's Flower app: every hospital's SuperNode needs dpfl installed.\"\"\"

from dpfl.experiments.deploy import client_app, server_app

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
