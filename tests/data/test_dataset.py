"""The Dataset object refuses inconsistent parts with a clear message."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dpfl.data.dataset import Dataset

X = np.zeros((4, 2), dtype=np.float32)
Y = np.array([0, 1, 1, 0])


def test_subset_keeps_every_per_record_column() -> None:
    data = Dataset(
        "toy", X + np.arange(4, dtype=np.float32)[:, None], Y, ("a", "b"), "toy",
        class_names=("no", "yes"), site_ids=np.array([0, 0, 1, 1]), site_names=("s0", "s1"),
        split=np.array(["train", "test", "train", "test"]), extra={"t": np.arange(4.0)},
    )  # fmt: skip
    part = data.official_split("test")
    assert part.features[:, 0].tolist() == [1, 3]
    assert part.site_ids.tolist() == [0, 1]
    assert part.extra["t"].tolist() == [1.0, 3.0]
    assert part.class_counts().tolist() == [1, 1]
    with pytest.raises(ValueError, match="has no split 'val'"):
        data.official_split("val")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"features": X.astype(np.float64)}, "features must be float32"),
        ({"features": sp.coo_matrix(X)}, "sparse features must be CSR"),
        ({"labels": Y[:3]}, "labels must be an integer vector of length 4"),
        ({"labels": Y.astype(float)}, "labels must be an integer vector"),
        ({"feature_names": ("a",)}, "1 feature names for 2 feature columns"),
        ({"class_names": ("only",)}, r"labels outside 0\.\.0"),
        ({"site_ids": np.array([0, 0, 0, 2]), "site_names": ("a", "b")}, "site_ids outside"),
        ({"site_ids": np.array([0]), "site_names": ("a",)}, "site_ids must have length 4"),
        ({"split": np.array(["train"])}, "split must have length 4"),
        ({"extra": {"t": np.arange(3)}}, "extra column 't' must have length 4"),
    ],
)
def test_inconsistent_parts_are_refused(changes: dict[str, object], message: str) -> None:
    parts: dict[str, object] = {
        "name": "toy", "features": X, "labels": Y, "feature_names": ("a", "b"), "description": ""
    }  # fmt: skip
    with pytest.raises(ValueError, match=message):
        Dataset(**{**parts, **changes})  # type: ignore[arg-type]
