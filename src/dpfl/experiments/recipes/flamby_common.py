"""What FLamby's recipes share: FLamby's DP example (Fed-Heart-Disease), re-accounted
with dpfl's ledger.

What FLamby did (owkin/FLamby `flamby/dp_example/create_fed_heart_disease_dp_results.py`;
its CSV was produced at commit b00c657, October 2022, with Opacus ≤ 1.2): FedAvg over the
4 centres, 15 rounds of 100 local DP-SGD steps, batches of 4 from an ordinary shuffled
`DataLoader`. Each client's σ comes from Opacus's `make_private_with_epsilon`, told
`epochs=nrounds` = 15 and `sample_rate = 1/len(loader)`, so Opacus's RDP accountant
charged 15 epochs (15·⌈n/4⌉ steps: 120 for the 30-record centre) of Poisson-sampled
steps, for targets ε ∈ {0.1, 1, 5, 10, 50} and δ ∈ {1e-1, …, 1e-4}.

Why that ε is not what was spent: every client takes 1500 steps, 2 to 12.5 times what
Opacus was told; and the batches are shuffled, not Poisson-sampled (Opacus's Poisson
loader is built but FedAvg never iterates it), so Poisson amplification does not apply.
For each (client, target ε, δ) `reaccount` puts three numbers side by side, all from a
dpfl `Ledger`: the nominal ε; ε for the 1500 steps had they been Poisson-sampled (PLD,
or RDP where the PLD would be too large; add/remove one record), which the shuffled
loader does not guarantee; and a bound sound for the shuffled loader, without any
amplification: each epoch puts a record in exactly one batch, so
an epoch is at most one Gaussian release of a sum moved by 2C when one record is replaced
(C the clipping bound, noise σC), i.e. dpfl's `gaussian(σ/2)` under replace-one
neighbouring, composed over every epoch begun.

Not accounted here, and worse: FedAvg seeds every client's Opacus noise generator with
the same `int(time.time())`, so the four clients add proportional noise at every step
and the server, which sees all their updates, can cancel it exactly.
"""

from __future__ import annotations

import functools
import math
import tempfile
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dpfl.experiments.recipes.base import Row
from dpfl.privacy import calibration, events
from dpfl.privacy.accounting import EpsilonReport
from dpfl.privacy.events import Neighbouring
from dpfl.privacy.ledger import Ledger

FLAMBY_COMMIT = "edacf54d5211520583b0133d55ac39b6fda8324b"
"""The owkin/FLamby snapshot read; the DP code and CSV are unchanged since b00c657."""

# flamby/datasets/fed_heart_disease/README.md, "Records per center | Train/Test: 199/104,
# 172/89, 30/16, 85/45" (dataset.py: per-centre train_test_split, train_size=0.66); their
# sum, 486, is the constant in common.py's get_nb_max_rounds.
TRAIN_SIZES = (199, 172, 30, 85)
POOLED_TRAIN_SIZE = 486
NUM_CLIENTS = 4  # common.py l.5
BATCH_SIZE = 4  # common.py l.6; create_fed_heart_disease_dp_results.py l.65-74: shuffle=True
NUM_EPOCHS_POOLED = 50  # common.py l.7
LOCAL_STEPS = 100  # create_fed_heart_disease_dp_results.py l.28: num_updates = 100
# common.py l.14-15: get_nb_max_rounds(num_updates) = (486 // 4 // 4) * 50 // 100 = 15,
# called at create_fed_heart_disease_dp_results.py l.29
ROUNDS = (POOLED_TRAIN_SIZE // NUM_CLIENTS // BATCH_SIZE) * NUM_EPOCHS_POOLED // LOCAL_STEPS
# strategies/utils.py l.158-167: make_private_with_epsilon(..., epochs=nrounds, ...)
OPACUS_EPOCHS = ROUNDS
# Opacus ≤ 1.2 (current in October 2022): PrivacyEngine(accountant="rdp") by default
# (privacy_engine.py l.110 at v1.2.0; PRV became the default in 1.3, November 2022), and
# get_noise_multiplier(epsilon_tolerance=0.01) (accountants/utils.py l.31).
OPACUS_ACCOUNTANT = "rdp"
OPACUS_EPSILON_TOLERANCE = 0.01
# create_fed_heart_disease_dp_results.py l.43-44 (the CSV's columns e and d)
TARGET_EPSILONS = (50.0, 10.0, 5.0, 1.0, 0.1)
TARGET_DELTAS = (1e-1, 1e-2, 1e-3, 1e-4)
MAX_GRAD_NORM = 1.1  # create_fed_heart_disease_dp_results.py l.93; ε does not depend on it
TARGETS = tuple((e, d) for e in TARGET_EPSILONS for d in TARGET_DELTAS)

ROW_EPSILONS = (1.0, 10.0)
ROW_DELTA = 1e-4
"""The rows: FLamby's smallest δ (δ = 0.1 exceeds 1/n at every centre, 0.01 at the
centres of 30 and 85 records: guarantees that allow one record to leak outright)."""
ROW_CLIENTS = (0, 2)
"""The largest centre (2× the steps Opacus was told) and the smallest (12.5×)."""


@dataclass(frozen=True)
class Reaccounted:
    """One FLamby client at one (target ε, δ): what Opacus was told and what was spent.

    `noise_multiplier` is DP-SGD's σ (noise σC on a sum of gradients clipped to C).
    `epsilon_poisson` is ε for `steps` Poisson-sampled steps at `sample_rate` (add/remove
    one record); `epsilon_shuffled` is sound for the shuffled batches actually used
    (replace one record). Both at `delta`, both from the ledger; the `*_accountant`
    fields say which accountant answered and, if not the one asked for, why."""

    client: int
    records: int
    nominal_epsilon: float
    delta: float
    noise_multiplier: float
    sigma_source: str
    sample_rate: float
    opacus_steps: int
    steps: int
    epochs: int
    epsilon_poisson: float
    poisson_accountant: str
    epsilon_shuffled: float
    shuffled_accountant: str

    @property
    def batches_per_epoch(self) -> int:
        return round(1 / self.sample_rate)


def opacus_noise_multiplier(
    target_epsilon: float, delta: float, *, sample_rate: float, epochs: int
) -> tuple[float, str]:
    """σ as FLamby's Opacus computed it, and where it came from.

    With Opacus installed (a dev dependency): its own `get_noise_multiplier` with the RDP
    accountant, whose code is unchanged from 1.1 to 1.6. Without it: dpfl's calibration
    by its RDP accountant on the same event (Poisson rate `sample_rate`,
    `int(epochs / sample_rate)` steps), whose denser orders and sharper RDP conversion
    give a slightly smaller σ, so a slightly larger re-accounted ε."""
    try:
        from opacus.accountants.utils import get_noise_multiplier
    except ImportError:
        steps = int(epochs / sample_rate)  # as Opacus converts epochs to steps
        sigma = calibration.calibrate_dpsgd_noise(
            target_epsilon, delta, sample_rate=sample_rate, steps=steps, accountant="rdp"
        )
        return sigma, "dpfl RDP calibration (Opacus not installed)"
    with warnings.catch_warnings():  # "optimal order is the largest alpha" at large ε
        warnings.simplefilter("ignore", UserWarning)
        sigma = get_noise_multiplier(
            target_epsilon=target_epsilon,
            target_delta=delta,
            sample_rate=sample_rate,
            epochs=epochs,
            accountant=OPACUS_ACCOUNTANT,
            epsilon_tolerance=OPACUS_EPSILON_TOLERANCE,
        )
    return float(sigma), "Opacus get_noise_multiplier (RDP)"


def reaccount(
    targets: Iterable[tuple[float, float]] = TARGETS,
    *,
    clients: Iterable[int] = range(NUM_CLIENTS),
    train_sizes: tuple[int, ...] = TRAIN_SIZES,
    batch_size: int = BATCH_SIZE,
    rounds: int = ROUNDS,
    local_steps: int = LOCAL_STEPS,
    opacus_epochs: int = OPACUS_EPOCHS,
) -> list[Reaccounted]:
    """Re-account each (target ε, δ) × client with dpfl's ledger (see the module doc).

    Defaults: FLamby's settings. Slow for the large targets (a few seconds each: little
    noise makes large PLDs); results are cached per (client setting, ε, δ)."""
    wanted = list(clients)
    return [
        _reaccount_one(
            client,
            train_sizes[client],
            batch_size,
            rounds,
            local_steps,
            opacus_epochs,
            float(target_epsilon),
            float(delta),
        )
        for target_epsilon, delta in targets
        for client in wanted
    ]


@functools.lru_cache(maxsize=256)
def _reaccount_one(
    client: int,
    records: int,
    batch_size: int,
    rounds: int,
    local_steps: int,
    opacus_epochs: int,
    target_epsilon: float,
    delta: float,
) -> Reaccounted:
    batches = math.ceil(records / batch_size)  # len(DataLoader), drop_last=False
    sample_rate = 1 / batches  # Opacus: sample_rate = 1 / len(data_loader)
    sigma, source = opacus_noise_multiplier(
        target_epsilon, delta, sample_rate=sample_rate, epochs=opacus_epochs
    )
    steps = rounds * local_steps
    # DataLoaderWithMemory keeps its iterator across rounds: epochs run on through them
    epochs = math.ceil(steps / batches)
    poisson_silo, shuffled_silo = f"client{client}-poisson", f"client{client}-shuffled"
    with tempfile.TemporaryDirectory() as folder, Ledger(Path(folder) / "ledger.db") as ledger:
        # ε = ∞: an account that records and reports but never refuses
        ledger.register_silo(poisson_silo, epsilon=math.inf, delta=delta)
        ledger.register_silo(
            shuffled_silo, epsilon=math.inf, delta=delta, neighbouring=Neighbouring.REPLACE_ONE
        )
        for r in range(rounds):
            ledger.record(
                poisson_silo,
                events.poisson_gaussian(sample_rate, sigma, steps=local_steps),
                label="FedAvg local DP-SGD steps, as if Poisson-sampled",
                round=r,
            )
        ledger.record(
            shuffled_silo,
            events.gaussian(sigma / 2, count=epochs, neighbouring=Neighbouring.REPLACE_ONE),
            label="shuffled epochs, each one Gaussian release (no amplification)",
        )
        poisson = ledger.spent(poisson_silo)
        shuffled = ledger.spent(shuffled_silo)
    return Reaccounted(
        client=client,
        records=records,
        nominal_epsilon=target_epsilon,
        delta=delta,
        noise_multiplier=sigma,
        sigma_source=source,
        sample_rate=sample_rate,
        opacus_steps=int(opacus_epochs / sample_rate),
        steps=steps,
        epochs=epochs,
        epsilon_poisson=poisson.epsilon,
        poisson_accountant=_accountant_text(poisson),
        epsilon_shuffled=shuffled.epsilon,
        shuffled_accountant=_accountant_text(shuffled),
    )


def _accountant_text(report: EpsilonReport) -> str:
    """'PLD', 'RDP', or the note saying why RDP answered instead of PLD."""
    return report.note or report.accountant.value.upper()


def rows(
    *,
    epsilons: Iterable[float] = ROW_EPSILONS,
    delta: float = ROW_DELTA,
    clients: Iterable[int] = ROW_CLIENTS,
) -> list[Row]:
    """FLamby's nominal ε next to the ledger's, two rows per (target ε, client): ε had
    the batches been Poisson-sampled, and a sound bound for the shuffled batches used.
    By default the largest and the smallest centre at target ε 1 and 10, δ = 1e-4 (about
    15 s: little noise is slow to account for)."""
    out: list[Row] = []
    for r in reaccount([(e, delta) for e in epsilons], clients=clients):
        setting = (
            f"Fed-Heart-Disease client {r.client} ({r.records} records), "
            f"target ε = {r.nominal_epsilon:g}, δ = {r.delta:g}"
        )
        paper = (
            f"ε = {r.nominal_epsilon:g} (Opacus RDP: {OPACUS_EPOCHS} epochs = "
            f"{r.opacus_steps} steps at q = 1/{r.batches_per_epoch}; σ = {r.noise_multiplier:.4g})"
        )
        out.append(
            Row(
                setting,
                paper,
                f"ε = {_show(r.epsilon_poisson)} ({r.poisson_accountant}: {r.steps} steps "
                f"at q = 1/{r.batches_per_epoch})",
                "if the batches had been Poisson-sampled (they were shuffled); add/remove "
                "one record",
            )
        )
        out.append(
            Row(
                setting,
                paper,
                f"ε ≤ {_show(r.epsilon_shuffled)} ({r.shuffled_accountant}: {r.epochs} "
                f"epochs × Gaussian σ/2 = {r.noise_multiplier / 2:.4g})",
                "sound for the shuffled batches, no amplification by sampling; replace "
                "one record (sum moved by 2C)",
            )
        )
    return out


def _show(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.1f}"
