"""DP-SGD whose noisy gradient is pulled towards public anchor parameters.

MR-MTL's local step (puffle seed, §1.3) is θ ← θ − η(g̃ + λ(θ − w̄)): the silo's noisy
DP-SGD gradient g̃ plus the gradient of λ/2‖θ − w̄‖²; Ditto's personal step is the same
with the global model as anchor. The anchor is public to the silo, so adding λ(θ − w̄)
is post-processing of g̃ and costs no privacy (seed, footnote 3). It must act at every
step, not once at the end, so each step here is one `DPSGD` step followed by the pull;
with momentum β the pull joins the velocity, as part of the gradient it is. Adam is
refused: there the pull would be rescaled per coordinate by Adam's second moment, a
different algorithm from MR-MTL's and Ditto's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor

from dpfl.data.sampling import BatchSampler
from dpfl.errors import InternalError
from dpfl.local.clipping import Params
from dpfl.local.dpsgd import DPSGD, DPSGDConfig, StackedResult, declared_events
from dpfl.local.mechanisms import Correlation
from dpfl.local.noise import NoiseSource

__all__ = ["ProximalDPSGD", "check_strength"]


def check_strength(config: DPSGDConfig, strength: float) -> None:
    """Refuse a λ for which the explicit step on λ/2‖θ − anchor‖² diverges: heavy-ball
    on a quadratic of curvature λ converges only for η·λ < 2(1 + β). Refuse Adam too: the
    pull joins SGD's velocity, and with Adam it would be rescaled per coordinate."""
    if config.optimizer != "sgd":
        raise ValueError(
            f"the proximal (MR-MTL, Ditto) trainer needs optimizer 'sgd', got "
            f"{config.optimizer!r}: its pull λ(θ − anchor) joins SGD's velocity; with Adam "
            "it would be rescaled per coordinate by the second moment, a different algorithm"
        )
    if not 0 <= strength < math.inf:
        raise ValueError(f"the proximal strength λ must be finite and ≥ 0, got {strength}")
    if config.learning_rate * strength >= 2 * (1 + config.momentum):
        raise ValueError(
            f"η·λ = {config.learning_rate * strength:g} ≥ 2(1 + β): the pull towards the "
            "anchor would diverge; lower λ or the learning rate"
        )


class ProximalDPSGD:
    """`DPSGD` with λ(θ − anchor) added to every noisy gradient; λ = 0 gives plain
    DP-SGD bit for bit."""

    def __init__(self, trainer: DPSGD, strength: float) -> None:
        check_strength(trainer.config, strength)
        self.trainer = trainer
        self.strength = strength

    def run_stacked(
        self,
        params: Params,
        anchors: Params,
        datasets: Sequence[tuple[Tensor, Tensor]],
        samplers: Sequence[BatchSampler],
        noises: Sequence[NoiseSource],
        steps: int,
        correlation: Correlation | None = None,
    ) -> StackedResult:
        """As `DPSGD.run_stacked`, each member pulled towards its own row of `anchors`.
        The events are declared before the first step, for all `steps` at once (the one
        `correlation`, if any, carries its filters' memory from step to step)."""
        if steps < 1:
            raise InternalError(f"need at least one step, got {steps}")
        cfg = self.trainer.config
        declared = declared_events(cfg, samplers, steps, correlation)
        velocity: Params | None = None
        for _ in range(steps):
            pull = {name: (v - anchors[name]).mul_(self.strength) for name, v in params.items()}
            step = self.trainer.run_stacked(
                params, datasets, samplers, noises, 1, velocity, correlation
            )
            velocity = {name: v.add_(pull[name]) for name, v in step.velocity.items()}
            params = {
                name: v.sub_(pull[name], alpha=cfg.learning_rate) for name, v in step.params.items()
            }
        described = [e.describe() for e in declared] or [m["event"] for m in step.metadata]
        metadata = [
            {**m, "steps": steps, "event": event, "proximal_strength": self.strength}
            for m, event in zip(step.metadata, described, strict=True)
        ]
        assert velocity is not None  # steps ≥ 1
        return StackedResult(params, velocity, declared, metadata)
