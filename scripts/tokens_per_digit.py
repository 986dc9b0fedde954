"""Tokens per digit token among a task's training answers (EOS included): the factor T/D
that maps a loss averaged over digit positions onto our objective's normalisation by
target tokens (docs/guides/losses.md, "Weights").

    python scripts/tokens_per_digit.py [--examples 2000]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))  # this checkout's ntl_jax

import numpy as np  # noqa: E402

import ntl_jax  # noqa: E402
from ntl_jax.train import data as data_lib  # noqa: E402

TASKS = {"multiplication": None, "arithmetic__add_or_sub": None, "diabetes": 354}


def tokens_per_digit(module: str, n: int, vocabulary, digit_ids: set[int]) -> float:
    answers = [a for _, a in data_lib.default_example_source()(module, "train", n, 0)]
    ids = [list(vocabulary.encode(a)) + [data_lib.EOS_ID] for a in answers]
    return sum(map(len, ids)) / sum(t in digit_ids for row in ids for t in row)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="answers per task (default: %(default)s)")
    args = parser.parse_args(argv)
    vocabulary = data_lib.default_vocabulary()
    digit_ids = set(np.asarray(ntl_jax.NumberTokens.from_vocabulary(vocabulary).ids).tolist())
    for module, size in TASKS.items():
        ratio = tokens_per_digit(module, size or args.examples, vocabulary, digit_ids)
        print(f"{module}: T/D = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
