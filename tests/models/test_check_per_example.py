"""`check_per_example`: models that mix the examples of a batch are refused by behaviour,
not only by type; models whose examples stay apart are accepted."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from dpfl.models import MixesExamplesError, check_per_example, logistic_regression, mlp, small_cnn


class _CentreOverBatch(nn.Module):
    """Subtracts the batch mean: every example's output depends on all the others."""

    def forward(self, x: Tensor) -> Tensor:
        return x - x.mean(0)


def _transformer(batch_first: bool, dropout: float = 0.0) -> nn.Module:
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=dropout, batch_first=batch_first)
    return nn.Sequential(layer, nn.Flatten(), nn.Linear(3 * 8, 1))


def test_batchnorm_is_refused_by_type_before_any_input_is_seen() -> None:
    model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    for shape in (None, (5,)):
        with pytest.raises(MixesExamplesError, match=r"'1' \(BatchNorm1d\).*GroupNorm"):
            check_per_example(model, shape)


@pytest.mark.parametrize(
    ("model", "shape"),
    [
        (_transformer(batch_first=False), (3, 8)),  # attends across the batch
        (_transformer(batch_first=False, dropout=0.1), (3, 8)),
        (nn.Sequential(nn.Linear(5, 4), _CentreOverBatch(), nn.Tanh(), nn.Linear(4, 1)), (5,)),
        (nn.Sequential(nn.Linear(5, 3), nn.Flatten(0)), (5,)),  # not one row per example
    ],
    ids=["transformer_batch_first_false", "with_dropout", "centred_over_batch", "flattens_batch"],
)
def test_models_that_mix_examples_are_refused(model: nn.Module, shape: tuple[int, ...]) -> None:
    check_per_example(model)  # nothing in the module types gives them away
    with pytest.raises(MixesExamplesError, match=r"mixes the examples.*batch_first=True"):
        check_per_example(model, shape)


@pytest.mark.parametrize(
    ("model", "shape"),
    [
        (logistic_regression(7), (7,)),
        (logistic_regression(7, 4).double(), (7,)),
        (mlp(24_428), (24_428,)),
        (small_cnn(), (3, 28, 28)),
        (small_cnn(3, 64, 5).double(), (3, 64, 64)),
        (nn.Sequential(nn.Linear(5, 6), nn.LayerNorm(6), nn.Dropout(0.5), nn.Linear(6, 1)), (5,)),
        (_transformer(batch_first=True, dropout=0.1), (3, 8)),
    ],
    ids=["logistic", "multinomial", "kerkouche_mlp", "cnn28", "cnn64", "layernorm", "attention"],
)
def test_models_that_keep_examples_apart_are_accepted(
    model: nn.Module, shape: tuple[int, ...]
) -> None:
    check_per_example(model, shape)
    assert model.training and all(m.training for m in model.modules())  # dropout restored


def test_the_check_uses_the_models_dtype_and_leaves_its_parameters_alone() -> None:
    model = mlp(6, (5,)).double()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    check_per_example(model, (6,))
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])
