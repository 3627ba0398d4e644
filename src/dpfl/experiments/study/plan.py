"""A study point's run plan, built from its file once (`plan_of`): what the runner,
the cluster and a deployment's check run it with.

σ is decided here: the study's `privacy.noise_multiplier` (or an algorithm that sets
its own noise, AOP) fixes it, and the run's ε is read off the ledger; otherwise the plan
asks the engine to calibrate it (`privacy.calibration`) to the study's budgets."""

from __future__ import annotations

from pathlib import Path

from dpfl import secure
from dpfl.engines.plan import RunPlan
from dpfl.experiments.study.build import decision_threshold
from dpfl.experiments.study.config import StudyConfig
from dpfl.federation.algorithms import Algorithm

__all__ = ["plan_of"]


def plan_of(config: StudyConfig, algorithm: Algorithm, checkpoint: Path | None = None) -> RunPlan:
    """The plan of one study point, run with `algorithm` (built from `config`), saved to
    `checkpoint` after every round; the study's own progress bar replaces the run's."""
    privacy = config.privacy
    fixed_noise = privacy.noise_multiplier is not None or algorithm.sets_own_noise
    consortium = (
        None
        if privacy.consortium_epsilon is None or privacy.hospitals_per_patient is None
        else (privacy.hospitals_per_patient, privacy.consortium_epsilon)
    )
    return RunPlan(
        rounds=config.rounds,
        trials=config.trials,
        seed=config.seed,
        epsilon=privacy.epsilon if privacy.private else None,
        delta=privacy.delta,
        budgets={name: (b.epsilon, b.delta) for name, b in privacy.silos.items()},
        calibrate=privacy.calibration if privacy.private and not fixed_noise else None,
        consortium=consortium,
        research_noise=config.research_noise,
        secure_sum=secure.by_name(config.summing),
        eval_every=config.eval_every,
        cross_silo=config.cross_silo,
        threshold=decision_threshold(config.threshold),
        init=config.model.init,
        device=config.device,
        checkpoint=checkpoint,
        size_noise=config.data.size_noise,
        progress=False,
    )
