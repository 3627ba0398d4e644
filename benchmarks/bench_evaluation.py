"""A deployment's DP evaluation (`[evaluation] release = "dp"`) against the exact metrics.

Three hospitals, each with `n` test records of a binary task (labels 0/1 at even odds,
scores sigmoid(3·(label − ½) + N(0, 1.2²)): AUROC about 0.9), seeded. Each hospital's
(label, score bin) counts get the study's default noise (σ = 5, 10 bins,
`flower_protocol.Evaluation`); the server reads the union's accuracy and AUROC off the
rounded, clamped noisy counts (`Evaluation.counted`, `union_metrics`). Prints, per n,
the median absolute error over `--repeats` draws against the exact metrics of the
scores, and the binning's own AUROC error (no noise).

    .venv/bin/python benchmarks/bench_evaluation.py --repeats 200
"""

from __future__ import annotations

import argparse

import numpy as np

from dpfl.engines.evaluation import metrics
from dpfl.engines.flower.protocol import Evaluation, union_metrics

HOSPITALS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    plan, rng = Evaluation(), np.random.default_rng(0)
    print(
        "| test records (3 hospitals) | accuracy error | AUROC error | AUROC error, binned only |"
    )
    print("|---|---|---|---|")
    for per in (38, 300, 3000):
        labels = [rng.integers(0, 2, per) for _ in range(HOSPITALS)]
        scores = [1 / (1 + np.exp(-(3 * (y - 0.5) + rng.normal(0, 1.2, per)))) for y in labels]
        truth = metrics(np.concatenate(labels), np.concatenate(scores), None)
        exact = [plan.histogram(y, s).astype(float) for y, s in zip(labels, scores, strict=True)]
        binned = union_metrics([plan.counted(e.tolist()) for e in exact], [])
        errors: dict[str, list[float]] = {"accuracy": [], "auroc": []}
        for _ in range(args.repeats):
            noisy = [e + rng.normal(0, plan.noise_multiplier, e.shape) for e in exact]
            read = union_metrics([plan.counted(n.tolist()) for n in noisy], [])
            for metric, found in errors.items():
                found.append(abs(read[metric] - truth[metric]))
        print(
            f"| {per * HOSPITALS} | {np.median(errors['accuracy']):.4f} | "
            f"{np.median(errors['auroc']):.4f} | {abs(binned['auroc'] - truth['auroc']):.4f} |"
        )


if __name__ == "__main__":
    main()
