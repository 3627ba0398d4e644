"""A model from a factory dpfl has never seen: built from a file or a module, and refused,
before any record is touched, where DP-SGD could not train it with a per-record bound."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from dpfl.models import factories

MLP_GROUPNORM = """
import torch
from torch import nn


def build(n_features, n_outputs):
    return nn.Sequential(
        nn.Linear(n_features, 8), nn.GroupNorm(2, 8), nn.ReLU(), nn.Linear(8, n_outputs)
    )
"""
MLP_BATCHNORM = MLP_GROUPNORM.replace("nn.GroupNorm(2, 8)", "nn.BatchNorm1d(8)")
CENTRED = '''
import torch
from torch import nn


class Centred(nn.Module):
    """Subtracts the batch's mean: one example's output depends on the others."""

    def __init__(self, n_features, n_outputs):
        super().__init__()
        self.linear = nn.Linear(n_features, n_outputs)

    def forward(self, x):
        return self.linear(x - x.mean(0, keepdim=True))


def build(n_features, n_outputs):
    return Centred(n_features, n_outputs)
'''
NOT_FINITE = MLP_GROUPNORM.replace(
    "    return nn.Sequential(",
    "    model = nn.Sequential(",
).replace(
    "nn.Linear(8, n_outputs)\n    )",
    "nn.Linear(8, n_outputs)\n    )\n    with torch.no_grad():\n"
    "        model[3].bias.fill_(float('nan'))\n    return model",
)


def _file(tmp_path: Path, text: str, name: str = "my_model.py") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return f"{path}:build"


def test_a_groupnorm_mlp_from_a_file_is_built_and_checked(tmp_path: Path) -> None:
    model = factories.build(_file(tmp_path, MLP_GROUPNORM), (30,), 1)
    assert isinstance(model, torch.nn.Sequential) and isinstance(model[1], torch.nn.GroupNorm)
    assert model(torch.zeros(3, 30)).shape == (3, 1)


def test_batchnorm_is_refused_naming_the_file_and_the_layer_with_groupnorm(
    tmp_path: Path,
) -> None:
    spec = _file(tmp_path, MLP_BATCHNORM)
    with pytest.raises(factories.ModelError) as refused:
        factories.build(spec, (30,), 1)
    said = str(refused.value)
    assert "\n" not in said
    assert said.startswith(f"{spec}: ")
    assert "'1' (BatchNorm1d) mixes the examples" in said and "nn.GroupNorm" in said


def test_a_model_whose_output_depends_on_another_example_is_refused(tmp_path: Path) -> None:
    spec = _file(tmp_path, CENTRED)
    with pytest.raises(factories.ModelError, match="mixes the examples of a batch") as refused:
        factories.build(spec, (5,), 1)
    assert str(refused.value).startswith(spec)


def test_a_non_finite_parameter_is_refused_by_name(tmp_path: Path) -> None:
    spec = _file(tmp_path, NOT_FINITE)
    with pytest.raises(factories.ModelError, match=r"parameter '3\.bias' is not finite"):
        factories.build(spec, (5,), 1)


def test_an_output_of_the_wrong_width_is_refused() -> None:
    with pytest.raises(factories.ModelError, match=r"has shape \(1,\), expected \(3,\)"):
        factories.check_model(torch.nn.Linear(5, 1), (5,), 3, "here")


def test_the_check_draws_nothing_from_torchs_generator(tmp_path: Path) -> None:
    spec = _file(tmp_path, MLP_GROUPNORM)
    torch.manual_seed(0)
    factories.build(spec, (30,), 1)
    after_build = torch.rand(1)
    torch.manual_seed(0)
    factories.resolve(spec)(30, 1)
    assert torch.equal(after_build, torch.rand(1))


def test_a_package_modules_factory_resolves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "hospital_models"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(MLP_GROUPNORM)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        model = factories.build("hospital_models.nets:build", (4,), 2)
        assert model(torch.zeros(1, 4)).shape == (1, 2)
        assert factories.source_file("hospital_models.nets:build") == package / "nets.py"
    finally:
        for name in ("hospital_models", "hospital_models.nets"):
            sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("no_colon", "is neither 'file.py:function'"),
        ("missing.py:build", "no such file"),
        ("no_such_package_xyz.nets:build", "cannot import 'no_such_package_xyz.nets'"),
    ],
)
def test_a_factory_that_cannot_be_found_is_one_line(spec: str, said: str) -> None:
    with pytest.raises(factories.ModelError, match=said):
        factories.source_file(spec)


def test_a_missing_function_is_named(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("x = 1\n")
    with pytest.raises(factories.ModelError, match="defines no function 'build'"):
        factories.resolve(f"{path}:build")


def test_a_groupnorm_after_a_linear_layer_gets_its_exact_per_example_gradients() -> None:
    """GroupNorm on feature vectors (batch, channels), as in the MLP above: the clipped
    sum's per-layer rule equals autograd example by example."""
    from dpfl.local import losses
    from dpfl.local.clipping import ClippedGradientSum

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(5, 8), torch.nn.GroupNorm(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
    )
    x, y = torch.randn(6, 5), (torch.rand(6) > 0.5).float()
    params = {k: p.detach() for k, p in model.named_parameters()}
    sums, _ = ClippedGradientSum(model, losses.bce)(params, x, y, torch.ones(6), 1e9)
    expected = {k: torch.zeros_like(p) for k, p in params.items()}
    params_of = list(model.parameters())
    for i in range(6):
        one = torch.autograd.grad(losses.bce(model(x[i : i + 1]), y[i : i + 1]).sum(), params_of)
        for k, g in zip(params, one, strict=True):
            expected[k] += g
    for k in params:
        torch.testing.assert_close(sums[k], expected[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["resnet18_gn", "vit"])
def test_the_large_kinds_build_checked_models_for_images(kind: str) -> None:
    """ResNet-18-GN and the small ViT from their kind, for 28×28 grey images; a feature
    vector is refused by name."""
    model = factories.build(factories.KINDS[kind], (1, 28, 28), 2)
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 2)
    with pytest.raises(factories.ModelError, match=f"{kind} classifies"):
        factories.build(factories.KINDS[kind], (12,), 2)
