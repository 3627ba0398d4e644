"""Checks of what only dpfl's engines hand an algorithm: a failure is a bug in dpfl
(`InternalError`, exit status 70 from the CLI), never the user's bad input."""

from __future__ import annotations

import pytest
import torch

from dpfl.errors import InternalError
from dpfl.federation.algorithms import Cyclic, Reply
from dpfl.federation.algorithms import base as algorithm_base
from dpfl.local.dpsgd import DPSGDConfig, parameters_of
from dpfl.local.losses import bce
from dpfl.models import logistic_regression
from dpfl.secure import InTheClear


def test_a_cyclic_exchange_aggregating_two_replies_is_an_internal_error() -> None:
    """The engine aggregates an exchange's replies, which are its one visited silo's."""
    model = logistic_regression(3)
    cyclic = Cyclic(model=model, loss=bce, dpsgd=DPSGDConfig(1.0, 1.0, 0.1))
    replies = {name: Reply(torch.zeros(4)) for name in ("a", "b")}
    with pytest.raises(InternalError, match="visits one silo, got 2 replies"):
        cyclic.aggregate({"global": parameters_of(model)}, replies, InTheClear())


def test_jobs_of_one_batch_that_differ_in_their_momentum_are_an_internal_error() -> None:
    """`train` stacks the jobs an algorithm made alike: all with a velocity, or none."""
    params = parameters_of(logistic_regression(3))
    assert algorithm_base._stacked([None, None]) is None
    with pytest.raises(InternalError, match="every job of a batch"):
        algorithm_base._stacked([params, None])
