"""A study point's model, loss and algorithm, as the simulator, the tuner, the audits and
a deployment build them: the model's head and the loss from the labels, the model from
the records' shape, the study's seed and its factory (`dpfl.models.factories`), and the
algorithm from its own settings (`dpfl.federation.algorithms`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dpfl.experiments.study.config import StudyConfig, ThresholdConfig
from dpfl.federation.algorithms import Algorithm, Parts
from dpfl.federation.silo import Silo
from dpfl.federation.threshold import BalancedThreshold
from dpfl.local import losses
from dpfl.models import factories

SURVIVAL_LOSSES = ("logistic_hazard", "cox")
IMAGE_KINDS = ("small_cnn", "scatternet_linear", "scatternet_cnn", "resnet18_gn", "vit")
"""The built-in models of (channels, height, width) images."""


def decision_threshold(config: ThresholdConfig) -> float | BalancedThreshold:
    """The study's threshold as the simulator takes it."""
    if config.choose == "fixed":
        return config.value
    return BalancedThreshold(config.noise, config.bins, config.logit_range)


def build_algorithm(config: StudyConfig, silos: Sequence[Silo]) -> Algorithm:
    """The configured algorithm, its model initialised from the study's seed."""
    outputs, loss = _head(config, silos)
    torch.manual_seed(config.seed)
    privacy = config.privacy
    parts = Parts(
        model=_model(config, silos[0], outputs),
        loss=loss,
        silos=silos,
        private=privacy.private,
        noise_multiplier=privacy.noise_multiplier,
        epsilon=privacy.epsilon,
        delta=privacy.delta,
        rounds=config.rounds,
    )
    return config.algorithm.build(parts)


def _head(config: StudyConfig, silos: Sequence[Silo]) -> tuple[int, losses.Loss]:
    """The model's number of outputs and the loss: one logit for two classes, one per
    class for more; for survival labels, one hazard logit per time interval
    (logistic_hazard) or one risk score (cox)."""
    spec = config.algorithm
    if any(s.survival for s in silos):
        name = spec.loss or "logistic_hazard"
        if name not in SURVIVAL_LOSSES:
            raise ValueError(
                f"algorithm.loss: {name} is a classification loss and the labels are "
                f"survival (time, event) pairs; use one of {', '.join(SURVIVAL_LOSSES)}"
            )
        if name == "cox":
            return 1, losses.cox
        if not config.model.time_bins:
            raise ValueError("survival with logistic_hazard needs model.time_bins")
        return len(config.model.time_bins) + 1, losses.logistic_hazard(config.model.time_bins)
    classes = int(max(int(s.y.max()) for s in silos)) + 1
    outputs = 1 if classes == 2 else classes
    name = spec.loss or ("bce" if outputs == 1 else "cross_entropy")
    if name in SURVIVAL_LOSSES:
        raise ValueError(f"algorithm.loss: {name} needs survival (time, event) labels")
    if name == "weighted_bce":
        return outputs, losses.weighted_bce(spec.positive_weight)
    if name == "focal":
        return outputs, losses.focal()
    loss: losses.Loss = getattr(losses, name)
    return outputs, loss


def _model(config: StudyConfig, silo: Silo, outputs: int) -> torch.nn.Module:
    """The study's model for records shaped like the silo's, from its factory (its own,
    or the one its `kind` names), checked before any record is touched."""
    spec = config.model
    shape = tuple(silo.x.shape[1:])
    if spec.factory is not None:
        return factories.build(spec.factory, shape, outputs)
    if spec.kind in IMAGE_KINDS and silo.survival:
        raise ValueError(f"model.kind: {spec.kind} classifies images, got {shape} records")
    options = {"hidden": spec.hidden} if spec.kind == "mlp" else {}
    return factories.build(factories.KINDS[spec.kind], shape, outputs, **options)
