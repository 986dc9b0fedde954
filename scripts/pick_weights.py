"""Picks each loss's weight from a validation sweep (`ntl-jax compare --eval-split validation`
with several `--ntl-weight` / `--del-weight` / `--dist2-weight` values).

    python scripts/pick_weights.py docs/results/sweep_multiplication.json

For every loss swept, the weight with the highest mean of the metric over seeds (ties: the
smaller weight), printed as the flag that sets it: `--del-weight 0.01`.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from ntl_jax.train.systems import weight_flag  # noqa: E402


def pick(result: dict, metric: str) -> dict[str, float]:
    """`{loss: weight}` of the best mean `metric` per loss (higher is better)."""
    scores: dict[str, dict[float, list[float]]] = {}
    for run in result["runs"]:
        if run["loss_function"] == "ce" or run["metrics"].get(metric) is None:
            continue
        value = float(run["metrics"][metric])
        if math.isfinite(value):
            scores.setdefault(run["loss_function"], {}).setdefault(run["ntl_weight"], []).append(value)
    if not scores:
        raise ValueError(f"expected swept runs with the metric {metric!r}, found none")
    return {loss: max(sorted(by_weight), key=lambda w: sum(by_weight[w]) / len(by_weight[w]))
            for loss, by_weight in scores.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", help="compare.json of the sweep")
    parser.add_argument("--metric", default="validation/number_accuracy",
                        help="higher is better (default: %(default)s)")
    args = parser.parse_args(argv)
    with open(args.result, encoding="utf-8") as f:
        picked = pick(json.load(f), args.metric)
    print(" ".join(f"--{weight_flag(loss).replace('_', '-')} {weight:g}" for loss, weight in picked.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
