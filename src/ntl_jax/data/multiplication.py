"""Integer multiplication problems, the paper's decoder-only setting.

"What is A * B?" -> "C" with C = A * B written as a decimal integer. A has k digits and
B has l digits, both positive with no leading zeros: a 1-digit operand is one of 1..9
(0 is excluded, so every target is nonzero and its relative error defined).

Splits (`examples(split, n, seed)`):

* `train`: (k, l) uniform over 1..5 x 1..5, then A and B uniform among the numbers of
  those lengths; held-out pairs are rejected.
* `test_interpolate`: the same lengths, held-out pairs only.
* `test_extrapolate`: (k, l) uniform over the 11 pairs of 1..6 x 1..6 with
  max(k, l) == 6; these lengths never occur in training.

A pair (A, B) is held out when the BLAKE2b hash of "A*B" is 0 mod 10 (`is_held_out`):
a fixed function of the pair alone, so train and interpolation test are disjoint
whatever the seeds. Example `i` of a split is drawn from its own generator seeded by
`(split, seed, i)`, so it does not depend on how many examples are asked for.

Needs only numpy and the standard library.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from typing import Sequence

import numpy as np

SPLITS: tuple[str, ...] = ("train", "test_interpolate", "test_extrapolate")
MAX_TRAIN_DIGITS = 5
MAX_EXTRAPOLATE_DIGITS = 6
HELD_OUT_MODULUS = 10  # one pair in ten is held out

TRAIN_LENGTHS: tuple[tuple[int, int], ...] = tuple(
    (k, l) for k in range(1, MAX_TRAIN_DIGITS + 1) for l in range(1, MAX_TRAIN_DIGITS + 1))
EXTRAPOLATE_LENGTHS: tuple[tuple[int, int], ...] = tuple(
    (k, l) for k in range(1, MAX_EXTRAPOLATE_DIGITS + 1)
    for l in range(1, MAX_EXTRAPOLATE_DIGITS + 1) if max(k, l) == MAX_EXTRAPOLATE_DIGITS)

# Length pairs with at most this many (A, B) pairs are enumerated for the interpolation
# split instead of rejection-sampled (1x1 has only 81 pairs, of which ~8 are held out).
_ENUMERATE_BELOW = 100_000
_MAX_TRIES = 10_000  # rejection bound: 0.9**10_000 or 0.1**10_000 never happens
_QUESTION = re.compile(r"^What is (\d+) \* (\d+)\?$")


def question(a: int, b: int) -> str:
    return f"What is {a} * {b}?"


def is_held_out(a: int, b: int) -> bool:
    """Whether `(a, b)` belongs to the interpolation test (stable across runs/platforms)."""
    digest = hashlib.blake2b(f"{a}*{b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % HELD_OUT_MODULUS == 0


def _digits_range(k: int) -> tuple[int, int]:
    """`[low, high)` of the positive k-digit integers."""
    return (1 if k == 1 else 10 ** (k - 1)), 10 ** k


@functools.lru_cache(maxsize=None)
def _held_out_pairs(k: int, l: int) -> tuple[tuple[int, int], ...]:
    (a0, a1), (b0, b1) = _digits_range(k), _digits_range(l)
    return tuple((a, b) for a in range(a0, a1) for b in range(b0, b1) if is_held_out(a, b))


def _space(k: int, l: int) -> int:
    (a0, a1), (b0, b1) = _digits_range(k), _digits_range(l)
    return (a1 - a0) * (b1 - b0)


@functools.lru_cache(maxsize=None)
def _interpolate_lengths() -> tuple[tuple[int, int], ...]:
    """Training length pairs that have held-out pairs (in practice all 25)."""
    return tuple(kl for kl in TRAIN_LENGTHS
                 if _space(*kl) > _ENUMERATE_BELOW or _held_out_pairs(*kl))


def _draw_pair(rng: np.random.Generator, k: int, l: int) -> tuple[int, int]:
    (a0, a1), (b0, b1) = _digits_range(k), _digits_range(l)
    return int(rng.integers(a0, a1)), int(rng.integers(b0, b1))


def _rejection(rng: np.random.Generator, k: int, l: int, held_out: bool) -> tuple[int, int]:
    for _ in range(_MAX_TRIES):
        a, b = _draw_pair(rng, k, l)
        if is_held_out(a, b) == held_out:
            return a, b
    raise RuntimeError(f"no {'held-out' if held_out else 'training'} pair of lengths "
                       f"({k}, {l}) after {_MAX_TRIES} draws")  # pragma: no cover


def example(split: str, seed: int, index: int) -> tuple[str, str]:
    """Example `index` of `split` for `seed`: `(question, answer)`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = np.random.default_rng([SPLITS.index(split), int(seed), int(index)])
    if split == "train":
        k, l = TRAIN_LENGTHS[rng.integers(len(TRAIN_LENGTHS))]
        a, b = _rejection(rng, k, l, held_out=False)
    elif split == "test_interpolate":
        lengths = _interpolate_lengths()
        k, l = lengths[rng.integers(len(lengths))]
        if _space(k, l) <= _ENUMERATE_BELOW:
            pairs = _held_out_pairs(k, l)
            a, b = pairs[rng.integers(len(pairs))]
        else:
            a, b = _rejection(rng, k, l, held_out=True)
    else:
        k, l = EXTRAPOLATE_LENGTHS[rng.integers(len(EXTRAPOLATE_LENGTHS))]
        a, b = _draw_pair(rng, k, l)
    return question(a, b), str(a * b)


def examples(split: str, n: int, seed: int) -> list[tuple[str, str]]:
    """The first `n` examples of `split` for `seed` (a prefix of any longer request).

    >>> examples("train", 2, 0) == examples("train", 5, 0)[:2]
    True
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [example(split, seed, i) for i in range(n)]


def operand_lengths(text: str) -> tuple[int, int]:
    """`(k, l)`, the digit counts of A and B in "What is A * B?".

    >>> operand_lengths("What is 12 * 345?")
    (2, 3)
    """
    m = _QUESTION.match(text.strip())
    if not m:
        raise ValueError(f"expected a question 'What is A * B?', got {text!r}")
    return len(m.group(1)), len(m.group(2))


def _relative_error(target: str, prediction: str) -> tuple[float, bool]:
    """`(|p - t| / |t|, p == t)`; an unparseable or non-finite prediction is error 1.0."""
    from ntl_jax.data.metrics import parse_number

    t = parse_number(target)
    if not math.isfinite(t) or t == 0:
        raise ValueError(f"expected a nonzero number as target, got {target!r}")
    p = parse_number(prediction)
    if not math.isfinite(p):
        return 1.0, False
    return abs(p - t) / abs(t), p == t


def metrics(questions: Sequence[str], targets: Sequence[str],
            predictions: Sequence[str]) -> dict[str, float]:
    """MAPE over all examples and relative error / accuracy per operand lengths.

    Numbers are read with `ntl_jax.data.metrics.parse_number` (the last number of the
    string), without the prediction clipping of `number_metrics`: products reach
    10**12, beyond its clip. A prediction with no number scores relative error 1.0 (as
    predicting 0) and counts as wrong. Keys: `mape`, and for each `(k, l)` present,
    `rel_error/k{k}_l{l}` (mean relative error) and `accuracy/k{k}_l{l}` (fraction of
    exactly right numbers). Empty inputs give `{}`.

    >>> metrics(["What is 2 * 3?", "What is 10 * 10?"], ["6", "100"], ["6", "90"])
    {'mape': 0.05, 'rel_error/k1_l1': 0.0, 'accuracy/k1_l1': 1.0, 'rel_error/k2_l2': 0.1, 'accuracy/k2_l2': 0.0}
    """
    if not len(questions) == len(targets) == len(predictions):
        raise ValueError(f"expected as many questions, targets and predictions, got "
                         f"{len(questions)}, {len(targets)} and {len(predictions)}")
    if not len(targets):
        return {}
    groups: dict[tuple[int, int], list[tuple[float, bool]]] = {}
    errors = []
    for q, t, p in zip(questions, targets, predictions):
        err = _relative_error(t, p)
        errors.append(err[0])
        groups.setdefault(operand_lengths(q), []).append(err)
    out = {"mape": float(np.mean(errors))}
    for (k, l), errs in sorted(groups.items()):
        out[f"rel_error/k{k}_l{l}"] = float(np.mean([e for e, _ in errs]))
        out[f"accuracy/k{k}_l{l}"] = float(np.mean([ok for _, ok in errs]))
    return out
