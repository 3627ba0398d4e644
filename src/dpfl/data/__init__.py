"""Datasets, federated partitions, privacy-safe preprocessing and batch samplers.

One module per concern: `dataset` (the typed object and file errors), `public_tables`,
`physionet`, `images`, `genomics` (loaders, each taking a directory), `signatures`
(published gene lists), `synthetic` (seeded stand-ins for private data), `partition`,
`preprocess` (safe by default) and `dp_preprocess` (DP statistics paid for in a ledger).
"""

from dpfl.data.dataset import DataFormatError, Dataset
from dpfl.data.genomics import bc_tcga, gse7390
from dpfl.data.images import breastmnist, retinamnist
from dpfl.data.physionet import physionet2012
from dpfl.data.public_tables import (
    breast_cancer_wisconsin,
    diabetes130,
    heart_disease,
    tcga_brca_clinical,
)
from dpfl.data.synthetic import synthetic_bc_tcga, synthetic_ehr

__all__ = [
    "DataFormatError",
    "Dataset",
    "bc_tcga",
    "breast_cancer_wisconsin",
    "breastmnist",
    "diabetes130",
    "gse7390",
    "heart_disease",
    "physionet2012",
    "retinamnist",
    "synthetic_bc_tcga",
    "synthetic_ehr",
    "tcga_brca_clinical",
]
