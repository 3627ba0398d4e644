"""`dpfl best`'s choice, made once per server optimiser and ε of a server-optimiser study
(docs/studies/server-*.toml; docs/reproductions/server-optimisers.md).

Among the finished runs of one optimiser at one ε (over the client's step size and the
optimiser's own settings), the best mean test metric within (ε, δ), ranked by
`dpfl.experiments.results.best.candidates`, `dpfl best`'s own ranking. Like `dpfl best` on
a sweep it reads the test sets, so the choice is not in ε; it is made alike for every
optimiser. Beside each, its difference from plain averaging's choice at that ε.

    python docs/studies/server_best.py DIR --metric accuracy
"""

from __future__ import annotations

import argparse
from typing import Any

from dpfl.experiments.results.best import Candidate, candidates
from dpfl.experiments.results.queries import mean_std_text, open_results, read_metrics


def optimiser(run: Any) -> tuple[str, str]:
    """(the run's server optimiser, its rate and momentum: `η=0.03`, or empty), as its
    stored config resolved them."""
    server = run.config["algorithm"].get("server", "averaging")
    if isinstance(server, str):
        return server, ""
    names = {"learning_rate": "η", "momentum": "β"}
    settings = [f"{names[k]}={v:g}" for k, v in server.items() if k in names]
    return server["optimizer"], ", ".join(settings)


def chosen(directory: str, epsilon: float, delta: float, metric: str) -> dict[str, Candidate]:
    """The best run within (ε, δ) of each optimiser, of the runs at ε."""
    best: dict[str, Candidate] = {}
    for c in candidates(directory, epsilon=epsilon, delta=delta, metric=metric):
        if c.run.config["privacy"]["epsilon"] == epsilon and c.qualifies:
            name, _ = optimiser(c.run)
            best.setdefault(name, c)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--metric", default="accuracy")
    args = parser.parse_args()
    with open_results(args.directory) as store:
        runs = store.runs(status="finished")
        privacy = sorted(
            {(r.config["privacy"]["epsilon"], r.config["privacy"]["delta"]) for r in runs}
        )
        metrics = list(runs[0].config["metrics"])
        print(
            "| ε | server | chosen | σ | "
            + " | ".join(m + (" (chosen on)" if m == args.metric else "") for m in metrics)
            + f" | {args.metric} − averaging's | n |"
        )
        print("|" + "---|" * (6 + len(metrics)))
        for epsilon, delta in privacy:
            best = chosen(args.directory, epsilon, delta, args.metric)
            scores = {name: read_metrics(store, c.run) for name, c in best.items()}
            plain = scores["averaging"].score(args.metric).mean
            for name, c in sorted(best.items(), key=lambda item: item[0] != "averaging"):
                _, settings = optimiser(c.run)
                cells = [
                    mean_std_text(s.mean, s.std if len(s.values) > 1 else None)
                    for s in (scores[name].score(m) for m in metrics)
                ]
                lr = c.run.config["algorithm"]["learning_rate"]
                gain = scores[name].score(args.metric).mean - plain
                print(
                    f"| {epsilon:g} | {name} | client η={lr:g}"
                    + (f"; {settings}" if settings else "")
                    + f" | {c.run.noise_multiplier:.3g} | "
                    + " | ".join(cells)
                    + f" | {gain:+.3f} | {c.run.trials} |"
                )


if __name__ == "__main__":
    main()
