"""Batch samplers, each declaring the privacy event its batches make possible.

The one rule of docs/architecture.md: the code that draws a batch is the code that declares
its privacy event. `privacy_event(noise_multiplier, steps)` takes the noise multiplier
of DP-SGD as it is run (Gaussian noise of std σ·C added to the sum of gradients clipped
to norm C) and returns the event that is true for *this* way of sampling; a sampler
whose batches no accountant can analyse refuses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from dpfl.privacy import events
from dpfl.privacy.errors import PrivacyParameterError, UnsupportedAccountingError

__all__ = [
    "BalancedPoissonSampler",
    "BatchSampler",
    "CyclicPoissonSampler",
    "PatientPoissonSampler",
    "PoissonSampler",
    "ShuffledSampler",
]


class BatchSampler(ABC):
    """Draws index batches over a dataset of `dataset_size` records."""

    dataset_size: int
    units: np.ndarray | None = None
    """Each record's unit of privacy (patient index), or None: each record is its own.
    Where set, a batch's records are clipped by unit (their mean gradient to C)."""

    @abstractmethod
    def sample(self) -> np.ndarray:
        """The indices of the next batch (int64, possibly empty)."""

    @property
    @abstractmethod
    def expected_batch_size(self) -> float:
        """A data-independent normaliser for the summed gradient.

        Dividing by the realised batch size would make the update depend on a private
        count; this constant does not (Opacus does the same for Poisson batches).
        """

    @abstractmethod
    def privacy_event(self, noise_multiplier: float, steps: int) -> events.PrivacyEvent:
        """The event of `steps` DP-SGD steps on batches from this sampler."""


class PoissonSampler(BatchSampler):
    """Each record joins each batch independently with probability q (Owkin, Def. 7).

    The batch size is Binomial(n, q). This is the sampling the Sampled Gaussian
    Mechanism analysis assumes; each step is one `PoissonSampledDpEvent`. The normaliser
    is q times the silo's *public* size (declared, or a DP count): the true n is private
    under add/remove, and dividing by q·n would let one more record move every update.

    Where one person can be in up to S = `appearances` records (their neighbourhood and
    S − 1 others' in a pruned contact graph), each step is a node-level event instead:
    replacing the person changes up to 2S − 1 records, of which a batch holds
    Binomial(2S − 1, q) (`events.node_gaussian`, which derives 2S − 1 from S).
    """

    sensitivity_in_clip_norms = 1.0
    """How far one record moves a batch's sum of clipped gradients, in units of C."""

    def __init__(
        self,
        dataset_size: int,
        sample_rate: float,
        rng: np.random.Generator,
        *,
        public_size: int,
        appearances: int = 1,
    ) -> None:
        self._check_appearances(appearances)
        if dataset_size < 1 or public_size < 1:
            raise ValueError(
                f"dataset and public sizes must be positive, got {dataset_size}, {public_size}"
            )
        if not 0.0 < sample_rate <= 1.0:
            raise PrivacyParameterError(f"sample rate q must lie in (0, 1], got {sample_rate}")
        self.dataset_size = dataset_size
        self.public_size = public_size
        self.sample_rate = sample_rate
        self.appearances = appearances
        self._rng = rng

    def sample(self) -> np.ndarray:
        chosen = self._rng.random(self.dataset_size) < self.sample_rate
        return chosen.nonzero()[0]

    @property
    def expected_batch_size(self) -> float:
        return self.sample_rate * self.public_size

    def privacy_event(self, noise_multiplier: float, steps: int) -> events.PrivacyEvent:
        return self.event(self.sample_rate, noise_multiplier, steps, appearances=self.appearances)

    @classmethod
    def event(
        cls, sample_rate: float, noise_multiplier: float, steps: int, *, appearances: int = 1
    ) -> events.PrivacyEvent:
        """What `privacy_event` declares, known before any record is read (a plan): the
        Poisson-sampled Gaussian at σ over this sampler's sensitivity, or the node-level
        step where one person is in up to `appearances` records."""
        cls._check_appearances(appearances)
        if appearances > 1:
            return events.node_gaussian(
                noise_multiplier, appearances=appearances, sample_rate=sample_rate, steps=steps
            )
        return events.poisson_gaussian(
            sample_rate, noise_multiplier / cls.sensitivity_in_clip_norms, steps=steps
        )

    @classmethod
    def _check_appearances(cls, appearances: int) -> None:
        if isinstance(appearances, bool) or not (isinstance(appearances, int) and appearances >= 1):
            raise ValueError(f"appearances must be an integer ≥ 1, got {appearances!r}")
        if appearances > 1 and cls.sensitivity_in_clip_norms != 1.0:
            raise UnsupportedAccountingError(
                f"{cls.__name__} has no node-level analysis: its records move the sum by "
                f"{cls.sensitivity_in_clip_norms:g}C each, which the node-level bound "
                "does not cover"
            )


class ShuffledSampler(BatchSampler):
    """Fixed-size batches from a fresh permutation each epoch: non-private training only.

    A shuffled epoch is neither Poisson sampling nor independent sampling without
    replacement (each record is in exactly one batch per epoch), so neither analysis
    applies and reporting one of them would understate ε (Owkin, Sec. II-D).
    """

    def __init__(self, dataset_size: int, batch_size: int, rng: np.random.Generator) -> None:
        if not 0 < batch_size <= dataset_size:
            raise ValueError(
                f"need 0 < batch_size <= dataset_size, got {batch_size}, {dataset_size}"
            )
        self.dataset_size = dataset_size
        self.batch_size = batch_size
        self._rng = rng
        self._order = np.empty(0, dtype=np.int64)

    def sample(self) -> np.ndarray:
        if len(self._order) < self.batch_size:
            self._order = self._rng.permutation(self.dataset_size)
        batch, self._order = self._order[: self.batch_size], self._order[self.batch_size :]
        return batch

    @property
    def expected_batch_size(self) -> float:
        return float(self.batch_size)

    def privacy_event(self, noise_multiplier: float, steps: int) -> events.PrivacyEvent:
        raise UnsupportedAccountingError(
            "shuffled fixed-size batches have no DP-SGD accounting in dpfl; use "
            "PoissonSampler for private training (ShuffledSampler is for non-private runs)"
        )


class BalancedPoissonSampler(PoissonSampler):
    """Kerkouche's downsampling (Alg. 7) applied to a Poisson batch (Alg. 6, line 2-3).

    A Poisson batch B is split by label into C₁, C₂; s = min(|C₁|, |C₂|) records are kept
    from each class, uniformly at random.

    Sensitivity, honestly. Take neighbours D and D' = D ∪ {r}. If r is not in B the two
    downsampled batches have the same distribution. If it is:

    * r in the minority class (|C_r| ≤ |C_other|): adding r raises s by one, so r is kept
      *and* one more record of the other class is kept (couple the two selections by
      adding one uniformly chosen record). The batch gains two records: the sum of clipped
      gradients moves by up to ‖g_r‖ + ‖g_m‖ ≤ 2C.
    * r in the majority class: s is unchanged; r is kept with probability s/|C_r| and
      then displaces one record that would have been kept (couple by swapping): the sum
      moves by ‖g_r − g_m‖ ≤ 2C.

    So each step is the Poisson-sampled Gaussian mechanism with rate q and sensitivity
    2C, not C. With noise N(0, σ²C²) that is a noise multiplier of σC / 2C = σ/2 against
    the true sensitivity, and that is what this sampler declares. (Kerkouche et al.
    charge σ; their ε is therefore optimistic.) The bound is attained: with q = 1, one
    minority record and aligned gradients, removing it removes two clipped gradients.

    The normaliser stays the Poisson batch's q·n (n public): the mean balanced size
    2·E[s] depends on the private class counts; the learning rate absorbs the ratio.
    """

    sensitivity_in_clip_norms = 2.0

    def __init__(
        self,
        labels: np.ndarray,
        sample_rate: float,
        rng: np.random.Generator,
        *,
        public_size: int,
    ) -> None:
        labels = np.asarray(labels)
        classes = np.unique(labels)
        if labels.ndim != 1 or len(classes) > 2:
            raise ValueError(
                f"balanced downsampling is for two classes, got labels of shape {labels.shape} "
                f"with {len(classes)} values"
            )
        super().__init__(len(labels), sample_rate, rng, public_size=public_size)
        self._labels = labels
        self._classes = classes

    def sample(self) -> np.ndarray:
        batch = super().sample()
        by_class = [batch[self._labels[batch] == c] for c in self._classes]
        if len(by_class) < 2:
            return np.empty(0, dtype=np.int64)
        keep = min(len(members) for members in by_class)
        kept = [self._rng.choice(members, size=keep, replace=False) for members in by_class]
        return np.sort(np.concatenate(kept)).astype(np.int64)


class PatientPoissonSampler(BatchSampler):
    """Each *patient* joins each batch independently with probability q, with all their
    records, or at most `max_records` of them drawn uniformly (from that patient's own
    records, without looking at any other's): user-level sampling (ULS) of Chua et al.,
    "Mind the privacy unit!" (2024).

    The trainer clips the mean gradient of each sampled patient's records to C as one
    unit (`units`), so adding or removing a patient moves the noisy sum by at most C
    whatever their record count: each step is the Poisson-sampled Gaussian over patients,
    declared under `ADD_REMOVE_PATIENT`. q and the normaliser q·P come from the public
    number of patients P (declared, or a DP count of patients), never the true one.
    """

    def __init__(
        self,
        units: np.ndarray,
        sample_rate: float,
        rng: np.random.Generator,
        *,
        public_size: int,
        max_records: int | None = None,
    ) -> None:
        units = np.asarray(units)
        if units.ndim != 1 or not len(units) or not np.issubdtype(units.dtype, np.integer):
            raise ValueError("units must be a non-empty integer vector, one patient per record")
        if public_size < 1:
            raise ValueError(f"the public number of patients must be positive, got {public_size}")
        if not 0.0 < sample_rate <= 1.0:
            raise PrivacyParameterError(f"sample rate q must lie in (0, 1], got {sample_rate}")
        if max_records is not None and not (isinstance(max_records, int) and max_records >= 1):
            raise ValueError(f"max_records must be an integer ≥ 1, got {max_records!r}")
        self.dataset_size = len(units)
        self.units = units
        self.public_size = public_size
        self.sample_rate = sample_rate
        self.max_records = max_records
        self._rng = rng
        order = np.argsort(units, kind="stable")
        _, starts = np.unique(units[order], return_index=True)
        self._records = np.split(order.astype(np.int64), starts[1:])
        """Each patient's record indices, patients in increasing order."""

    @property
    def patients(self) -> int:
        """The true number of patients: private, it only indexes the data."""
        return len(self._records)

    def sample(self) -> np.ndarray:
        chosen = (self._rng.random(self.patients) < self.sample_rate).nonzero()[0]
        parts = [self._records[p] for p in chosen]
        if self.max_records is not None:
            cap = self.max_records
            parts = [
                part if len(part) <= cap else np.sort(self._rng.choice(part, cap, replace=False))
                for part in parts
            ]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    @property
    def expected_batch_size(self) -> float:
        """q·P: the expected number of patients, each of whom contributes one clipped
        gradient (the normaliser of the summed gradient)."""
        return self.sample_rate * self.public_size

    def privacy_event(self, noise_multiplier: float, steps: int) -> events.PrivacyEvent:
        return self.event(self.sample_rate, noise_multiplier, steps)

    @staticmethod
    def event(sample_rate: float, noise_multiplier: float, steps: int) -> events.PrivacyEvent:
        """What `privacy_event` declares, known before any record is read: the
        Poisson-sampled Gaussian over patients."""
        return events.poisson_gaussian(
            sample_rate,
            noise_multiplier,
            steps=steps,
            neighbouring=events.Neighbouring.ADD_REMOVE_PATIENT,
        )


class CyclicPoissonSampler(BatchSampler):
    """Min-separated participation: the records are split into b partitions, each
    record's drawn uniformly at random once for the whole run (`partitions`), and step t
    (counted over the run, from `start`) samples only partition t mod b, each of its
    records with probability p (Choquette-Choo et al., "Amplified banded matrix
    factorization", NeurIPS 2023, Alg. 2's cyclic Poisson sampling). A record can then
    take part at most once in any b consecutive steps, which a correlated noise
    mechanism's sensitivity needs (`dpfl.local.mechanisms`).

    With independent noise each record is in ⌈T/b⌉ of any T steps' samples at most, so
    the T steps are ⌈T/b⌉ Poisson-sampled Gaussians at p, whichever its partition; the
    normaliser is the expected batch p·n/b over the public size n. The partitions are
    secret (drawn from the hospital's own randomness), and each record's is drawn on its
    own, so adding or removing one moves no other record's."""

    def __init__(
        self,
        partitions: np.ndarray,
        separation: int,
        sample_rate: float,
        rng: np.random.Generator,
        *,
        public_size: int,
        start: int = 0,
    ) -> None:
        partitions = np.asarray(partitions)
        if isinstance(separation, bool) or not (isinstance(separation, int) and separation >= 1):
            raise ValueError(f"the separation b must be an integer ≥ 1, got {separation!r}")
        if (
            partitions.ndim != 1
            or not len(partitions)
            or not (
                np.issubdtype(partitions.dtype, np.integer)
                and partitions.min() >= 0
                and partitions.max() < separation
            )
        ):
            raise ValueError(f"partitions must be one integer in [0, {separation}) per record")
        if public_size < 1:
            raise ValueError(f"the public size must be positive, got {public_size}")
        if not 0.0 < sample_rate <= 1.0:
            raise PrivacyParameterError(f"sample rate p must lie in (0, 1], got {sample_rate}")
        self.dataset_size = len(partitions)
        self.partitions = partitions
        self.separation = separation
        self.sample_rate = sample_rate
        self.public_size = public_size
        self.step = start
        """The run's step this sampler draws next."""
        self._rng = rng

    @staticmethod
    def draw_partitions(size: int, separation: int, rng: np.random.Generator) -> np.ndarray:
        """Each of `size` records' partition, uniform over the b partitions and drawn on
        its own (from a secret stream: the hospital's)."""
        partitions: np.ndarray = rng.integers(separation, size=size)
        return partitions

    def sample(self) -> np.ndarray:
        members = self.partitions == self.step % self.separation
        self.step += 1
        chosen = members & (self._rng.random(self.dataset_size) < self.sample_rate)
        batch: np.ndarray = chosen.nonzero()[0]
        return batch

    @property
    def expected_batch_size(self) -> float:
        return self.sample_rate * self.public_size / self.separation

    def privacy_event(self, noise_multiplier: float, steps: int) -> events.PrivacyEvent:
        return self.event(self.sample_rate, self.separation, noise_multiplier, steps)

    @staticmethod
    def event(
        sample_rate: float, separation: int, noise_multiplier: float, steps: int
    ) -> events.PrivacyEvent:
        """What `privacy_event` declares, known before any record is read: ⌈T/b⌉
        Poisson-sampled Gaussians at p (the most samples one partition is in)."""
        return events.poisson_gaussian(sample_rate, noise_multiplier, steps=-(-steps // separation))
