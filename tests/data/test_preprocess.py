"""Default preprocessing reads no private statistic; non-private transforms must be asked
for and are recorded as outside ε."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from dpfl.data import preprocess, public_tables
from dpfl.data.dataset import NONPRIVATE_MARK, Dataset


def _default_pipeline(data: Dataset) -> Dataset:
    data = preprocess.one_hot(data, public_tables.HEART_CATEGORIES)
    data = preprocess.scale_to_ranges(data, public_tables.HEART_RANGES)
    return preprocess.require_finite(preprocess.zero_impute(data))


def _swap_one_record(data: Dataset, index: int, donor: int) -> Dataset:
    features = data.features.copy()
    features[index] = data.features[donor] * 1.5  # an unusual patient
    return dataclasses.replace(data, features=features)


@pytest.fixture(scope="module")
def heart(shared_data: Path) -> Dataset:
    return public_tables.heart_disease(shared_data / "uci_heart_disease")


def test_default_preprocessing_reads_no_private_statistic(heart: Dataset) -> None:
    """Replacing one record changes only that record's row: nothing was fitted."""
    neighbour = _swap_one_record(heart, index=10, donor=500)
    # 1.5x may push categorical codes off their declared values: keep those as in the donor.
    for name in public_tables.HEART_CATEGORIES:
        j = heart.feature_names.index(name)
        neighbour.features[10, j] = heart.features[500, j]
    before, after = _default_pipeline(heart), _default_pipeline(neighbour)
    others = np.arange(len(heart)) != 10
    assert np.array_equal(before.features[others], after.features[others])
    assert not np.array_equal(before.features[10], after.features[10])
    assert before.privacy_caveats == ()


def test_the_swap_test_catches_a_fitted_transform(heart: Dataset) -> None:
    """The same check fails for standardisation fitted on the records: the test can fail."""
    imputed = preprocess.zero_impute(heart)
    neighbour = _swap_one_record(imputed, index=10, donor=500)
    before = preprocess.fit_standardize(imputed, allow_nonprivate=True)
    after = preprocess.fit_standardize(neighbour, allow_nonprivate=True)
    others = np.arange(len(heart)) != 10
    assert not np.array_equal(before.features[others], after.features[others])


def test_default_pipeline_shapes_and_ranges(heart: Dataset) -> None:
    data = _default_pipeline(heart)
    assert data.features.shape == (920, 13 - 4 + 4 + 3 + 3 + 3)
    assert "cp=4" in data.feature_names and "thal=7" in data.feature_names
    assert data.features.min() >= 0 and data.features.max() <= 1
    assert len(data.preprocessing) == 3


def test_nonprivate_transforms_are_refused_unless_asked(heart: Dataset) -> None:
    data = preprocess.zero_impute(heart)
    with pytest.raises(PermissionError, match="allow_nonprivate=True"):
        preprocess.fit_standardize(data)
    with pytest.raises(PermissionError, match="allow_nonprivate=True"):
        preprocess.nonprivate_select_kbest(data, 5, seed=0)
    standardised = preprocess.fit_standardize(data, allow_nonprivate=True)
    assert standardised.privacy_caveats[0].startswith(NONPRIVATE_MARK)
    selected = preprocess.nonprivate_select_kbest(data, 5, seed=0, allow_nonprivate=True)
    assert selected.features.shape == (920, 5)
    assert "cp" in selected.feature_names  # chest-pain type is the classic top predictor
    assert len(selected.privacy_caveats) == 1


def test_bad_preprocessing_input_is_refused(heart: Dataset) -> None:
    with pytest.raises(ValueError, match=r"record 0, column 'cp': value 1 not in declared"):
        preprocess.one_hot(heart, {"cp": (2, 3, 4)})
    with pytest.raises(ValueError, match=r"has no feature\(s\) \['weight'\]"):
        preprocess.scale_to_ranges(heart, {"weight": (0, 1)})
    with pytest.raises(ValueError, match="bad range"):
        preprocess.scale_to_ranges(heart, {"age": (90, 20)})
    with pytest.raises(ValueError, match=r"non-finite value at record 87, feature 'thal'"):
        preprocess.require_finite(heart)


def test_zero_impute_on_sparse_features() -> None:
    features = sp.csr_matrix(np.array([[np.nan, 1.0], [0.0, 2.0]], dtype=np.float32))
    data = Dataset("toy", features, np.array([0, 1]), ("a", "b"), "toy")
    with pytest.raises(ValueError, match="feature 'a'"):
        preprocess.require_finite(data)
    imputed = preprocess.require_finite(preprocess.zero_impute(data))
    assert imputed.features.nnz == 2
    with pytest.raises(ValueError, match="dense 2-D"):
        preprocess.scale_to_ranges(data, {"a": (0, 1)})
