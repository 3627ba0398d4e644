"""`dpfl best`'s choice, made once per server optimiser and ε of a server-optimiser study
(docs/studies/server-*.toml; docs/reproductions/server-optimisers.md).

Among the finished runs of one optimiser at one ε (over the client's step size and the
optimiser's own settings), the best mean test metric within (ε, δ), as `choices.py`
makes it (`dpfl best`'s ranking; not in ε, alike for every optimiser). Beside each, its
difference from plain averaging's choice at that ε.

    python docs/studies/server_best.py DIR --metric accuracy
"""

from __future__ import annotations

from typing import Any

from choices import swept

from dpfl.experiments.results.queries import read_metrics


def optimiser(run: Any) -> tuple[str, str]:
    """(the run's server optimiser, its rate and momentum: `η=0.03`, or empty), as its
    stored config resolved them."""
    server = run.config["algorithm"].get("server", "averaging")
    if isinstance(server, str):
        return server, ""
    names = {"learning_rate": "η", "momentum": "β"}
    settings = [f"{names[k]}={v:g}" for k, v in server.items() if k in names]
    return server["optimizer"], ", ".join(settings)


def main() -> None:
    with swept(__doc__.splitlines()[0]) as sweep:
        print(sweep.header("ε | server | chosen | σ", f"{sweep.chosen_on} − averaging's | n"))
        for epsilon, delta in sweep.levels:
            best = sweep.best(epsilon, delta, lambda c: optimiser(c.run)[0])
            plain = read_metrics(sweep.store, best["averaging"].run)
            for name, c in sorted(best.items(), key=lambda item: item[0] != "averaging"):
                _, settings = optimiser(c.run)
                lr = c.run.config["algorithm"]["learning_rate"]
                gain = (
                    read_metrics(sweep.store, c.run).score(sweep.chosen_on).mean
                    - plain.score(sweep.chosen_on).mean
                )
                print(
                    f"| {epsilon:g} | {name} | client η={lr:g}"
                    + (f"; {settings}" if settings else "")
                    + f" | {c.run.noise_multiplier:.3g} | "
                    + " | ".join(sweep.cells(c.run))
                    + f" | {gain:+.3f} | {c.run.trials} |"
                )


if __name__ == "__main__":
    main()
