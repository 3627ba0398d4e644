"""ScatterNet (Tramèr & Boneh): the fixed scattering front equals kymatio's transform, has
no parameters, is deterministic and memoised without changing its output; the two model
kinds build for grayscale and RGB images, pass the per-example checks, train through the
simulator, are the same model at a deployment's server, and are refused for records that
are not images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dpfl import models
from dpfl.experiments.study.config import ConfigError, Study
from dpfl.local.clipping import ClippedGradientSum
from dpfl.local.losses import bce
from dpfl.models import factories, scattering
from dpfl.models.scattering import Scattering2D, coefficients
from studies import halves_pneumonia

SHAPES = [(1, 28, 28), (3, 28, 28)]
"""PneumoniaMNIST's grayscale and RetinaMNIST's RGB images."""


def _images(n: int, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).random((n, *shape), dtype=np.float32))


@pytest.mark.parametrize("shape", [*SHAPES, (1, 28, 20)])
def test_the_front_is_kymatios_scattering_transform(shape: tuple[int, int, int]) -> None:
    # kymatio.torch imports its 3-D transform, which needs a SciPy function SciPy dropped
    from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D

    x = _images(5, shape)
    front = Scattering2D(shape)
    theirs = ScatteringTorch2D(J=2, shape=shape[1:], L=8)(x)  # (batch, C, 81, h', w')
    ours = front(x)
    assert coefficients(2, 8) == 81 and front.out_channels == 81 * shape[0]
    assert ours.shape == (5, 81 * shape[0], *theirs.shape[-2:])
    torch.testing.assert_close(ours, theirs.reshape(ours.shape), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_shapes_of_both_kinds_for_grayscale_and_rgb(shape: tuple[int, int, int]) -> None:
    x = _images(4, shape)
    assert Scattering2D(shape)(x).shape == (4, 81 * shape[0], 7, 7)
    for kind in ("scatternet_linear", "scatternet_cnn"):
        model = factories.build(factories.KINDS[kind], shape, 5)
        assert model(x).shape == (4, 5)
        assert getattr(models, kind)(shape, 3)(x).shape == (4, 3)  # dpfl.models' own


def test_the_front_has_nothing_to_train_or_send() -> None:
    for kind in ("scatternet_linear", "scatternet_cnn"):
        model = factories.build(factories.KINDS[kind], (1, 28, 28), 1)
        front, norm = model[0], model[1]
        assert isinstance(front, Scattering2D) and not list(front.parameters())
        assert not list(norm.parameters())  # GroupNorm without affine: data-independent
        assert front.state_dict() == {} and not any(k.startswith("0.") for k in model.state_dict())
    linear = factories.build(factories.KINDS["scatternet_linear"], (1, 28, 28), 1)
    assert [name for name, _ in linear.named_parameters()] == ["3.weight", "3.bias"]


def test_the_front_is_deterministic_and_its_memo_changes_nothing() -> None:
    x = _images(70, (3, 28, 28), seed=1)
    scattering._MEMO.clear()
    first = Scattering2D((3, 28, 28))
    direct = first.transform(x)
    assert torch.equal(direct, Scattering2D((3, 28, 28)).transform(x))  # a fresh build
    memoised = first(x)  # computed in chunks of 64 and kept
    assert len(scattering._MEMO) == 70
    torch.testing.assert_close(memoised, direct, rtol=1e-6, atol=1e-7)
    again = Scattering2D((3, 28, 28))(x[[5, 0, 69]])  # another model, other batches: hits
    assert len(scattering._MEMO) == 70 and torch.equal(again, memoised[[5, 0, 69]])
    # one image's coefficients do not depend on the rest of its batch
    torch.testing.assert_close(first.transform(x[3:4]), direct[3:4], rtol=1e-6, atol=1e-7)


def test_the_transform_runs_under_vmap_and_grad_without_the_memo() -> None:
    x = _images(6, (1, 28, 28))
    front = Scattering2D((1, 28, 28))
    mapped = torch.func.vmap(front)(x.reshape(3, 2, 1, 28, 28)).reshape(6, 81, 7, 7)
    torch.testing.assert_close(mapped, front.transform(x), rtol=1e-6, atol=1e-7)
    model = factories.build(factories.KINDS["scatternet_linear"], (1, 28, 28), 1)
    clipped = ClippedGradientSum(model, bce)
    assert not clipped.stacks_members(x, 8)  # silos train one by one: the memo sees bytes
    params = {k: v.detach() for k, v in model.named_parameters()}
    sums, norms = clipped(params, x, torch.ones(6), torch.ones(6), 1.0)
    assert norms.shape == (6,) and bool((norms > 0).all())
    assert set(sums) == {"3.weight", "3.bias"}


def test_non_image_records_and_wrong_shapes_are_refused(tmp_path: Path) -> None:
    for kind in ("scatternet_linear", "scatternet_cnn"):
        with pytest.raises(factories.ModelError, match=f"{kind} classifies .*images"):
            factories.build(factories.KINDS[kind], (13,), 1)
        with pytest.raises(factories.ModelError, match="at least 8×8"):
            factories.build(factories.KINDS[kind], (1, 4, 4), 1)
    model = factories.build(factories.KINDS["scatternet_linear"], (1, 28, 28), 1)
    with pytest.raises(ValueError, match=r"built for images of shape \(1, 28, 28\)"):
        model(torch.zeros(2, 3, 28, 28))
    table = {
        "rounds": 1,
        "data": {"dataset": "synthetic_ehr", "partition": {"kind": "iid", "silos": 2}},
        "model": {"kind": "scatternet_linear"},
        "algorithm": {"name": "fedavg", "learning_rate": 0.1},
        "privacy": {"private": False},
    }
    with pytest.raises(ConfigError, match="scatternet_linear classifies images"):
        Study(table)


def _study(folder: Path, kind: str) -> dict[str, Any]:
    return {
        "name": f"tiny-{kind}",
        "rounds": 3,
        "eval_every": "end",
        "data": {
            "dataset": "pneumoniamnist",
            "path": str(folder),
            "partition": {"kind": "iid", "silos": 2},
            "split": "official",
        },
        "model": {"kind": kind},
        "algorithm": {"name": "fedavg", "learning_rate": 0.5, "expected_batch_size": 8},
        "privacy": {"epsilon": 8.0, "delta": 1e-4},
    }


@pytest.mark.parametrize("kind", ["scatternet_linear", "scatternet_cnn"])
def test_a_tiny_private_study_trains_through_the_simulator(tmp_path: Path, kind: str) -> None:
    from dpfl.experiments.results.store import ResultsStore
    from dpfl.experiments.study.point import STORE
    from dpfl.experiments.study.runner import run_study

    study = _study(halves_pneumonia(tmp_path / "data", {"train": 60, "val": 10, "test": 30}), kind)
    (run,) = run_study(Study(study), tmp_path / "out")
    assert run.status == "finished", run.error
    with ResultsStore(tmp_path / "out" / STORE) as store:
        (auroc,) = store.final_metric(run, "auroc")
    assert 0.5 < auroc <= 1.0


def test_a_deployment_builds_the_same_model_from_the_study_file(tmp_path: Path) -> None:
    from dpfl.experiments.study.build import build_algorithm
    from dpfl.experiments.study.datasets.base import build_silos
    from dpfl.experiments.study.deployment import algorithm_for
    from dpfl.federation.silo import SiloInfo

    ((_, config),) = Study(
        _study(
            halves_pneumonia(tmp_path / "data", {"train": 60, "val": 10, "test": 30}),
            "scatternet_cnn",
        )
    ).points
    silos = build_silos(config.data, config.seed)
    simulated = build_algorithm(config, silos).model
    infos = [SiloInfo(s.name, len(s.y)) for s in silos]
    deployed = algorithm_for(config, infos, (1, 28, 28), 2).model
    assert simulated.state_dict().keys() == deployed.state_dict().keys()
    for (name, a), (_, b) in zip(
        simulated.state_dict().items(), deployed.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
