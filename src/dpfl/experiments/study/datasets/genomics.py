"""Gene expression: GSE7390 and BC-TCGA restricted to a published signature, and the
synthetic BC-TCGA-shaped generator; log2 values centred at a declared constant."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from dpfl.data import Dataset, preprocess
from dpfl.experiments.study.datasets.base import DataSettings, Files, Real

LOG2_CENTRE = 8.0
"""A declared centre of log2 expression: microarray intensities lie in 0-16 on the log2
scale and the BC-TCGA-shaped generator draws its gene means around 8. Subtracting it is
a fixed map of each value, never a statistic of the records."""


class SignatureData(DataSettings):
    """A real expression set restricted to a published signature's genes."""

    signature: str = "gene76"
    """The published signature (default Wang's `gene76`)."""
    signatures: str | None = None
    """The folder of signature lists (default: `gene_signatures` beside the data's)."""

    def _signature(self, data: Dataset, *, probe_level: bool) -> Dataset:
        from dpfl.data import signatures

        lists = Path(self.signatures or self.folder.parent / "gene_signatures")
        signature = signatures.load_signature(lists, self.signature, probe_level=probe_level)
        selected, _ = signatures.select_signature(data, signature)
        return selected


class GSE7390(SignatureData):
    """GSE7390: the signature's probesets (`gene76` is the file's 76), matched by probe
    id. The clinical columns are left out: the seeds learn from expression alone."""

    dataset: Literal["gse7390"]
    task: Literal["metastasis", "survival"] = "metastasis"
    """"metastasis": observed or not (the seeds' label); "survival": time to distant
    metastasis, censored."""

    def load(self, seed: int) -> Dataset:
        from dpfl.data import genomics

        data = genomics.gse7390(self.folder)
        data = _centre_log2(self._signature(data, probe_level=True))
        return preprocess.as_survival(data, "t.tdm", "e.tdm") if self.task == "survival" else data


class BcTcga(SignatureData):
    """BC-TCGA: the signature's genes, matched by symbol, missing values set to zero and
    nothing rescaled, as in Owkin's submission: the values are log ratios, so zero is
    the neutral value."""

    dataset: Literal["bc_tcga"]

    def load(self, seed: int) -> Dataset:
        from dpfl.data import genomics

        data = self._signature(genomics.bc_tcga(self.folder), probe_level=False)
        return preprocess.zero_impute(data)


class SyntheticBcTcga(DataSettings):
    """The generator's signal genes (its declared list stands in for a published
    signature), centred at the generator's declared centre, missing values imputed at
    the centre (zero). Its keys are the generator's size and effect arguments."""

    FILES: ClassVar[Files] = "nothing"

    dataset: Literal["synthetic_bc_tcga"]
    n_normal: int = Field(61, ge=1)
    n_tumour: int = Field(529, ge=1)
    n_genes: int = Field(17_814, ge=1)
    signal_genes: list[str] = Field(default_factory=list)
    """The signal genes by name (default: `n_signal` of them, named SIG...)."""
    n_signal: int = Field(200, ge=1)
    effect: Real = 1.0
    """The tumour shift of a signal gene, in standard deviations."""
    missing_gene_fraction: Real = Field(0.02, ge=0, le=1)
    missing_rate: Real = Field(0.05, ge=0, le=1)

    def load(self, seed: int) -> Dataset:
        from dpfl.data import synthetic

        data = synthetic.synthetic_bc_tcga(seed, **self.keywords())
        signal = self.signal_genes or [n for n in data.feature_names if n.startswith("SIG")]
        data = preprocess.select_features(data, signal, "the generator's declared signal genes")
        return preprocess.zero_impute(_centre_log2(data))


def _centre_log2(data: Dataset) -> Dataset:
    features = np.asarray(data.features) - LOG2_CENTRE  # NaN stays NaN
    note = f"log2 values centred at the declared {LOG2_CENTRE:g}"
    return dataclasses.replace(data, features=features, preprocessing=(*data.preprocessing, note))
