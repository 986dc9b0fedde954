"""Picks each loss's weight (and GCE's σ) from a validation sweep (`ntl-jax compare
--eval-split validation` with several `--ntl-weight [LOSS=]LAMBDA` / `--gce-sigma` values).

    python scripts/pick_weights.py docs/results/sweep_multiplication.json

For every loss swept, the setting with the best mean of the metric over seeds (highest for
accuracy, lowest for an error such as log-MAE; ties: the smaller value), printed as the
flags that set it: `--ntl-weight del=0.01 --gce-sigma 1`.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))  # this checkout's ntl_jax

from ntl_jax.train.paired_stats import higher_is_better  # noqa: E402
from ntl_jax.train.step import uses_gce  # noqa: E402
from ntl_jax.train.systems import trains_ntl  # noqa: E402


def setting(run: dict) -> tuple[tuple[str, float], ...]:
    """The swept values of a run, as (flag dest, value) pairs."""
    loss = run["loss_function"]
    pairs = []
    if trains_ntl(loss):
        pairs.append(("ntl_weight", run["ntl_weight"]))
    if uses_gce(loss) and run.get("gce_sigma") is not None:
        pairs.append(("gce_sigma", run["gce_sigma"]))
    return tuple(pairs)


def pick(result: dict, metric: str) -> dict[str, tuple[tuple[str, float], ...]]:
    """`{loss: setting}` of the best mean `metric` per loss."""
    higher = higher_is_better(metric)
    if higher is None:
        raise ValueError(f"expected a metric whose better direction is known (an accuracy or "
                         f"an error), got {metric!r}")
    sign = 1.0 if higher else -1.0
    scores: dict[str, dict[tuple, list[float]]] = {}
    for run in result["runs"]:
        swept = setting(run)
        if not swept or run["metrics"].get(metric) is None:
            continue
        value = float(run["metrics"][metric])
        if math.isfinite(value):
            scores.setdefault(run["loss_function"], {}).setdefault(swept, []).append(value)
    if not scores:
        raise ValueError(f"expected swept runs with the metric {metric!r}, found none")
    return {loss: max(sorted(by_setting), key=lambda s: sign * sum(by_setting[s]) / len(by_setting[s]))
            for loss, by_setting in scores.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", help="compare.json of the sweep")
    parser.add_argument("--metric", default="validation/number_accuracy",
                        help="an accuracy (higher is better) or an error (lower is better) "
                             "(default: %(default)s)")
    args = parser.parse_args(argv)
    with open(args.result, encoding="utf-8") as f:
        picked = pick(json.load(f), args.metric)
    # A weight names its loss (`--ntl-weight LOSS=LAMBDA`): each loss has its own.
    print(" ".join(f"--{dest.replace('_', '-')} {loss + '=' if dest == 'ntl_weight' else ''}{value:g}"
                   for loss, pairs in picked.items() for dest, value in pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
