"""Seeded synthetic stand-ins for data that cannot be shared, at the seeds' real scale.

* `synthetic_bc_tcga`: BC-TCGA's shape (590 samples x 17,814 genes, 61 normal / 529
  tumour, sparse `null`s); the tumour signal lives in a few signal genes (e.g. a
  published signature) among many null genes, so signature selection matters.
* `synthetic_ehr`: Kerkouche's Premier shape (314 hospitals sized as their Table 4,
  80/20 split per hospital, 24,428 features of which 24,419 sparse binary drug/ICD9
  codes, ~3.15% deaths); hospitals differ in case mix and prescribing, and the label
  model has interactions, so a model that can represent them (an MLP) has something
  to gain over logistic regression. The true risk is returned as the Bayes reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from dpfl.data.dataset import Dataset


def synthetic_bc_tcga(
    seed: int,
    *,
    n_normal: int = 61,
    n_tumour: int = 529,
    n_genes: int = 17_814,
    signal_genes: Sequence[str] = (),
    n_signal: int = 200,
    effect: float = 1.0,
    missing_gene_fraction: float = 0.02,
    missing_rate: float = 0.05,
) -> Dataset:
    """BC-TCGA-shaped expression: log-scale genes, tumour shift on the signal genes only.

    The signal genes are `signal_genes` (e.g. the citbcmst and Wang lists, so signature
    selection finds them) or, if none are given, `n_signal` genes named `SIG<i>`; the
    other genes, named `GENE<i>`, carry no signal. Each signal gene's tumour shift is
    ±`effect` standard deviations. A `missing_gene_fraction` of genes has values missing
    (NaN, written as `null`) in a `missing_rate` of samples.
    """
    names = list(dict.fromkeys(signal_genes)) or [f"SIG{i}" for i in range(n_signal)]
    n_sig = len(names)
    if n_sig > n_genes:
        raise ValueError(f"{len(names)} signal genes do not fit in {n_genes} genes")
    if min(n_normal, n_tumour) < 1 or not 0 <= missing_rate <= 1:
        raise ValueError("need at least one sample per class and a missing rate in [0, 1]")
    rng = np.random.default_rng(seed)
    names += [f"GENE{i}" for i in range(n_genes - len(names))]
    order = rng.permutation(n_genes)  # signal genes are not the first columns
    n = n_normal + n_tumour
    labels = np.repeat([0, 1], [n_normal, n_tumour]).astype(np.int64)
    centre = rng.normal(8.0, 2.0, n_genes).astype(np.float32)
    spread = rng.uniform(0.3, 1.5, n_genes).astype(np.float32)
    features = rng.standard_normal((n, n_genes), dtype=np.float32)
    shift = effect * rng.choice([-1.0, 1.0], n_sig).astype(np.float32)
    features[labels == 1, :n_sig] += shift
    features = features * spread + centre
    gaps = rng.random(n_genes) < missing_gene_fraction
    holes = (rng.random((n, n_genes)) < missing_rate) & gaps
    features[holes] = np.nan
    return Dataset(
        name="synthetic_bc_tcga",
        features=features[:, order],
        labels=labels,
        feature_names=tuple(names[j] for j in order),
        class_names=("normal", "tumour"),
        description=(
            f"SYNTHETIC BC-TCGA-shaped data (seed {seed}): {n_normal} normal, {n_tumour} "
            f"tumour x {n_genes} genes; {n_sig} signal genes shifted by ±{effect} sd in "
            f"tumours, the rest null; {int(holes.sum())} missing values in "
            f"{int(gaps.sum())} genes."
        ),
    )


KERKOUCHE_TRAIN_SIZES = {"min": 804, "max": 12_447, "mean": 3_114.42, "std": 1_913.39}
"""Kerkouche et al., Table 4: training records per hospital (314 hospitals, 80% split)."""
EHR_CODES = 24_419
EHR_DENSE = ("age", "gender=male", "gender=female", "gender=unknown", "admission=emergency",
             "admission=urgent", "admission=trauma", "admission=unknown", "mrci")  # fmt: skip
EHR_MRCI_RANGE = (2.0, 60.0)


def kerkouche_train_sizes(seed: int, n_hospitals: int = 314) -> np.ndarray:
    """Per-hospital training sizes whose min, max, mean and std equal Table 4.

    A Beta draw on [804, 12,447] with Table 4's mean and std gives the shape; its
    smallest and largest values are pinned to the two bounds and the others are mapped
    affinely (and kept inside the bounds) so that the mean and std match exactly up to
    rounding to whole records.
    """
    target = KERKOUCHE_TRAIN_SIZES
    if n_hospitals < 3:
        raise ValueError("need at least 3 hospitals to match min, max, mean and std")
    low, high = target["min"], target["max"]
    mu = (target["mean"] - low) / (high - low)
    var = (target["std"] / (high - low)) ** 2
    nu = mu * (1 - mu) / var - 1
    rng = np.random.default_rng(seed)
    draw = np.sort(rng.beta(mu * nu, (1 - mu) * nu, n_hospitals))[1:-1] * (high - low) + low
    m = n_hospitals - 2
    total = target["mean"] * n_hospitals - low - high
    squares = (target["std"] ** 2 + target["mean"] ** 2) * n_hospitals - low**2 - high**2
    inner_mean, inner_std = total / m, np.sqrt(squares / m - (total / m) ** 2)
    for _ in range(100):
        draw = inner_mean + (draw - draw.mean()) / draw.std() * inner_std
        draw = np.clip(draw, low, high)
    sizes = np.concatenate([[low], np.round(draw), [high]]).astype(np.int64)
    return rng.permutation(sizes)


def synthetic_ehr(
    seed: int,
    *,
    n_hospitals: int = 314,
    size_scale: float = 1.0,
    positive_rate: float = 0.0315,
    codes_per_admission: float = 12.0,
) -> Dataset:
    """Kerkouche-shaped many-hospital sparse EHR, stored as CSR float32.

    Columns: age and MRCI already min-max scaled by the public ranges 15-89 and 2-60
    (as in the paper), one-hot gender (3) and admission type (4), then 24,419 binary
    codes. Hospital h draws codes from a Zipf-like popularity tilted by its own
    prescribing factors, and has its own case-mix (age, admission type, baseline risk).
    The death log-odds carry most of their signal in interactions (see `_ehr_logit`:
    drug classes of common codes whose effect flips sign with age or admission type, a
    drug-drug interaction, age x emergency) on top of weak linear effects, so that an
    MLP beats logistic regression; the intercept is set so that about `positive_rate`
    die; each record's true death probability is in
    `extra["true_risk"]` (the Bayes-optimal score). `split` is an 80/20 train/test split
    per hospital; `size_scale` shrinks every hospital (for tests) keeping the shape.
    """
    if n_hospitals < 1 or not 0 < size_scale <= 1 or not 0 < positive_rate < 1:
        raise ValueError("need n_hospitals >= 1, 0 < size_scale <= 1, 0 < positive_rate < 1")
    rng = np.random.default_rng(seed)
    train = kerkouche_train_sizes(seed, max(n_hospitals, 314))[:n_hospitals]
    train = np.maximum(np.round(train * size_scale).astype(np.int64), 4)
    sizes = np.round(train / 0.8).astype(np.int64)
    n = int(sizes.sum())
    hospital = np.repeat(np.arange(n_hospitals), sizes)

    # Case mix: per-hospital age location and admission-type mix.
    age_shift = rng.normal(0, 0.08, n_hospitals)[hospital]
    age = np.clip(rng.beta(4.0, 2.5, n) + age_shift, 0, 1)
    gender = rng.choice(3, n, p=[0.47, 0.52, 0.01])
    admission_mix = rng.dirichlet([6, 3, 1, 0.5], n_hospitals)
    admission = (rng.random(n)[:, None] > np.cumsum(admission_mix, 1)[hospital]).sum(1)
    admission = np.minimum(admission, 3)

    # Codes: Zipf popularity x hospital prescribing factors, count grows with age.
    popularity = 1.0 / np.arange(1, EHR_CODES + 1) ** 1.1
    popularity = popularity[rng.permutation(EHR_CODES)]
    counts = 1 + rng.poisson(codes_per_admission * (0.6 + 0.8 * age))
    indptr = np.concatenate([[0], np.cumsum(counts)])
    codes = np.empty(indptr[-1], dtype=np.int32)
    for h in range(n_hospitals):
        weights = popularity * rng.lognormal(0, 0.7, EHR_CODES)
        cdf = np.cumsum(weights) / weights.sum()
        rows = np.flatnonzero(hospital == h)
        lo, hi = indptr[rows[0]], indptr[rows[-1] + 1]
        codes[lo:hi] = np.minimum(np.searchsorted(cdf, rng.random(hi - lo)), EHR_CODES - 1)
    code_matrix = sp.csr_matrix(
        (np.ones(len(codes), dtype=np.float32), codes, indptr), shape=(n, EHR_CODES)
    )
    code_matrix.sum_duplicates()
    code_matrix.data[:] = 1.0
    n_codes = np.asarray(code_matrix.getnnz(axis=1), dtype=np.float64)
    raw_mrci = 2 + 2.2 * n_codes + rng.normal(0, 4, n)  # complexity grows with medications
    mrci = np.clip((raw_mrci - EHR_MRCI_RANGE[0]) / (EHR_MRCI_RANGE[1] - EHR_MRCI_RANGE[0]), 0, 1)

    logit = _ehr_logit(rng, code_matrix, popularity, age, mrci, admission, hospital)
    risk = 1 / (1 + np.exp(-(logit + _intercept_for_rate(logit, positive_rate))))
    labels = (rng.random(n) < risk).astype(np.int64)

    dense = np.column_stack([age, np.eye(3)[gender], np.eye(4)[admission], mrci]).astype(np.float32)
    features = sp.hstack([sp.csr_matrix(dense), code_matrix], format="csr", dtype=np.float32)
    split = np.full(n, "train")
    for h in range(n_hospitals):
        rows = np.flatnonzero(hospital == h)
        split[rng.choice(rows, len(rows) - train[h], replace=False)] = "test"
    return Dataset(
        name="synthetic_ehr",
        features=features,
        labels=labels,
        feature_names=(*EHR_DENSE, *(f"code{j}" for j in range(EHR_CODES))),
        class_names=("survived", "in-hospital death"),
        site_ids=hospital.astype(np.int64),
        site_names=tuple(f"hospital{h}" for h in range(n_hospitals)),
        split=split,
        extra={"true_risk": risk.astype(np.float32)},
        description=(
            f"SYNTHETIC Kerkouche-shaped EHR (seed {seed}): {n_hospitals} hospitals, {n} "
            f"admissions, {features.shape[1]} features ({EHR_CODES} sparse binary codes), "
            f"{labels.mean():.2%} deaths; age and MRCI scaled by public ranges 15-89 and "
            "2-60; 80/20 train/test per hospital."
        ),
    )


def _ehr_logit(
    rng: np.random.Generator,
    code_matrix: sp.csr_matrix,
    popularity: np.ndarray,
    age: np.ndarray,
    mrci: np.ndarray,
    admission: np.ndarray,
    hospital: np.ndarray,
) -> np.ndarray:
    """Death log-odds (up to the intercept) of `synthetic_ehr`.

    Most of the signal is in interactions that logistic regression cannot represent but
    that a small MLP learns from a moderate sample, because they live in a few dense
    features and in four "drug classes" of common codes:

    * classes: four disjoint sets of common codes (popularity ranks 2-61, each code in
      under 30% of admissions), each grown until about half the admissions hold at
      least one of its codes (8-16 codes each); `on[:, k]` is +1 if an admission holds
      class k, else -1;
    * class 2 is harmful for old patients and protective for young ones (sign flip with
      standardised age); class 3 is harmful in emergency admissions and protective in
      the others. As each class is held by about half the admissions, these terms have
      almost no main effect, so a linear model misses them;
    * classes 0 and 1 interact (drug-drug): log-odds +1.7 with both, +0.3 with neither,
      -1.0 with exactly one; a linear model only sees the small main effects;
    * linear: age, MRCI, a weak sparse part on 100 codes drawn by popularity, and the
      hospital's own baseline; plus the age x emergency-admission interaction.

    At 40 hospitals x size 0.5 (66k training records, codes seen >= 300 times), tuned L2
    logistic regression reaches a test AUROC of about 0.80, a 64-64 MLP about 0.88 and
    the true risk about 0.95 (tests/data/test_synthetic_ehr.py).
    """
    n, n_hospitals = len(age), int(hospital.max()) + 1
    beta = np.zeros(EHR_CODES)
    linear = rng.choice(EHR_CODES, 100, replace=False, p=popularity / popularity.sum())
    beta[linear] = rng.normal(0.1, 0.3, len(linear))

    prevalence = np.bincount(code_matrix.indices, minlength=EHR_CODES) / n
    ranked = np.argsort(-popularity)[1:61]
    pool = [int(j) for j in rng.permutation(ranked) if prevalence[j] < 0.3]
    membership = np.zeros((EHR_CODES, 4))
    for k in range(4):
        absent = 1.0  # share of admissions without the class, codes taken as independent
        while absent > 0.5 and pool:
            j = pool.pop()
            membership[j, k] = 1.0
            absent *= 1 - prevalence[j]
    on = np.where(code_matrix @ membership > 0, 1.0, -1.0)

    std_age = (age - 0.6) / 0.18
    emergency = admission == 0
    logit: np.ndarray = (
        code_matrix @ beta
        + 1.5 * age
        + 0.5 * mrci
        + 1.5 * age * emergency
        + 1.5 * std_age * on[:, 2]
        + 1.5 * np.where(emergency, 1.0, -1.0) * on[:, 3]
        + 0.35 * (on[:, 0] + on[:, 1])
        + 1.0 * on[:, 0] * on[:, 1]
        + rng.normal(0, 0.3, n_hospitals)[hospital]
    )
    return logit


def _intercept_for_rate(logit: np.ndarray, rate: float) -> float:
    """The offset b with mean(sigmoid(logit + b)) = rate, by bisection."""
    low, high = -30.0, 30.0
    for _ in range(60):
        middle = (low + high) / 2
        if np.mean(1 / (1 + np.exp(-(logit + middle)))) > rate:
            high = middle
        else:
            low = middle
    return (low + high) / 2
