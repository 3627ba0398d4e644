"""Membership inference on the final models, per silo: members are a silo's training
records, non-members its held-out test records (Carlini et al., "Membership inference
attacks from first principles", IEEE S&P 2022).

* loss threshold (Yeom et al. 2018): a record is flagged a member when the model's loss
  on it is low; the score is its log-likelihood log p_y.
* LiRA, offline (Carlini et al. §IV-C and §VI): shadow models trained by the simulator
  without the record give the distribution of its logit-scaled confidence
  φ = log p_y − log(1 − p_y) when it is out; the score is the one-sided likelihood
  Φ((φ − μ_out)/σ_out). The shadows are `folds` runs, each leaving one fold of every
  silo's training records out, `shadows` stacked trials each; a record (member or not)
  is judged against the trials of its fold's run. With few shadows per record a
  per-record variance is noisy, so σ_out is one global estimate, as the paper advises.

Each silo's shared model is attacked, and its personal model where it keeps one (MR-MTL,
Ditto, Finetune, Local); a shared model that never moved from the initial one (Local's)
saw no record and is left out. Each attack is scored over every (trial, record) of the
target run, reporting AUC and
TPR at FPR 0.1 % and 1 % (`roc_curve`, `roc_auc_score`): with small silos those rates
rest on a handful of records, which the counts beside them show.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats
from sklearn.metrics import roc_auc_score, roc_curve
from torch import Tensor, nn
from torch.func import functional_call, vmap

from dpfl.audit.runs import audit_plan
from dpfl.engines.simulation import SimulationResult, simulate
from dpfl.federation.algorithms.base import Algorithm
from dpfl.federation.messages import SecureSum
from dpfl.federation.silo import Silo
from dpfl.local.clipping import Params
from dpfl.local.dpsgd import parameters_of

__all__ = ["MembershipAudit", "membership_audit"]

FALSE_POSITIVE_RATES = (0.001, 0.01)


@dataclass(frozen=True)
class MembershipAudit:
    """One attack on one silo's final models."""

    silo: str
    model: str
    """"shared" (the global model) or "personal" (the silo's own)."""
    attack: str
    auc: float
    tpr_at_fpr: dict[float, float]
    """TPR at FPR 0.1 % and 1 % (the largest TPR whose FPR does not pass them)."""
    members: int
    non_members: int
    trials: int
    shadows: int
    folds: int


def membership_audit(
    algorithm: Algorithm,
    silos: Sequence[Silo],
    *,
    rounds: int,
    trials: int = 1,
    shadows: int = 16,
    folds: int = 4,
    seed: int = 0,
    delta: float = 1e-5,
    epsilon_budget: float | None = None,
    budgets: Mapping[str, tuple[float, float]] | None = None,
    secure_sum: SecureSum | None = None,
) -> list[MembershipAudit]:
    """Train the target models (`trials` stacked) and `folds` × `shadows` shadow models,
    then attack every silo that has test records, by loss and by LiRA."""
    if folds < 2 or shadows < 2:
        raise ValueError(f"need at least 2 folds and 2 shadows, got {folds} and {shadows}")
    tested = [s for s in silos if s.x_test is not None and s.y_test is not None]
    if not tested:
        raise ValueError("membership inference needs silos with held-out test records")
    silos = [s.with_public_size(s.public_size or s.size) for s in silos]
    records = {s.name: _records(s) for s in tested}  # training records first, then test
    rng = np.random.default_rng([seed, 2])
    fold_of = {name: rng.integers(folds, size=len(y)) for name, (_, y) in records.items()}

    scratch = tempfile.TemporaryDirectory(prefix="dpfl-audit-")  # the runs' ledgers

    def run(world: Sequence[Silo], count: int, run_seed: int) -> SimulationResult:
        return simulate(
            algorithm,
            [dataclasses.replace(s, x_test=None, y_test=None) for s in world],
            audit_plan(rounds, count, run_seed, delta, epsilon_budget, budgets, secure_sum),
            ledger=Path(scratch.name) / f"{run_seed}.sqlite",
        )

    with scratch:
        target = run(silos, trials, seed)
        shadow_runs = [
            run([_without(s, fold_of.get(s.name), h) for s in silos], shadows, seed + 1 + h)
            for h in range(folds)
        ]
    trained = not _equal(
        {name: v[0] for name, v in target.params.items()}, parameters_of(algorithm.model)
    )
    design = {"trials": trials, "shadows": shadows, "folds": folds}
    audits = []
    for silo in tested:
        x, y = records[silo.name]
        members = np.arange(len(y)) < silo.size
        personal = not _equal(target.silo_models[silo.name], target.params)
        for kind in ("shared",) * trained + ("personal",) * personal:
            log_p, phi = _confidence(algorithm.model, _model(target, kind, silo.name), x, y)
            out = np.stack(
                [
                    _confidence(algorithm.model, _model(r, kind, silo.name), x, y)[1]
                    for r in shadow_runs
                ]
            )  # [folds, shadows, records]
            own = out[fold_of[silo.name], :, np.arange(len(y))]  # [records, shadows]: out runs
            mean = own.mean(axis=1)
            spread = float(np.std(own - mean[:, None], ddof=1))
            lira = stats.norm.cdf((phi - mean) / spread)
            for attack, scores in (("loss", log_p), ("lira", lira)):
                audits.append(
                    _scored(scores, members, silo=silo.name, model=kind, attack=attack, **design)
                )
    return audits


def _model(result: SimulationResult, kind: str, silo: str) -> Params:
    """The stacked models of `kind` ("shared" or "personal") that `silo` ends with."""
    return result.params if kind == "shared" else result.silo_models[silo]


def _equal(a: Params, b: Params) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _records(silo: Silo) -> tuple[Tensor, Tensor]:
    """The silo's training records, then its test records."""
    assert silo.x_test is not None and silo.y_test is not None  # only tested silos
    return torch.cat([silo.x, silo.x_test]), torch.cat([silo.y, silo.y_test])


def _without(silo: Silo, fold: np.ndarray | None, h: int) -> Silo:
    """The silo without its training records of fold `h` (its public size unchanged)."""
    if fold is None:
        return silo
    keep = torch.from_numpy(fold[: silo.size] != h)
    return dataclasses.replace(silo, x=silo.x[keep], y=silo.y[keep])


def _confidence(
    model: nn.Module, params: Params, x: Tensor, y: Tensor
) -> tuple[np.ndarray, np.ndarray]:
    """[trials, records] each of log p_y and φ = log p_y − log(1 − p_y), for the stacked
    models `params`."""

    def logits(p: Params) -> Tensor:
        out: Tensor = functional_call(model, p, (x,))
        return out

    with torch.no_grad():
        z = vmap(logits)(params).double()
    if z.shape[-1] == 1:
        signed = torch.where(y == 1, 1.0, -1.0).double() * z[..., 0]
        return nn.functional.logsigmoid(signed).numpy(), signed.numpy()
    log_p = torch.log_softmax(z, dim=-1)
    own = log_p.gather(-1, y.expand(z.shape[0], -1).unsqueeze(-1)).squeeze(-1)
    rest = torch.logsumexp(
        log_p.scatter(-1, y.expand(z.shape[0], -1).unsqueeze(-1), -torch.inf), -1
    )
    return own.numpy(), (own - rest).numpy()


def _scored(scores: np.ndarray, members: np.ndarray, **attack: Any) -> MembershipAudit:
    """The attack's figures from its scores ([trials, records]) and who was a member."""
    labels = np.broadcast_to(members, scores.shape).ravel()
    fpr, tpr, _ = roc_curve(labels, scores.ravel())
    return MembershipAudit(
        auc=float(roc_auc_score(labels, scores.ravel())),
        tpr_at_fpr={f: float(tpr[fpr <= f].max()) for f in FALSE_POSITIVE_RATES},
        members=int(members.sum()),
        non_members=int((~members).sum()),
        **attack,
    )
