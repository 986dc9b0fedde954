"""scikit-learn's diabetes data as a text regression task (the NTL-versus-regression-head check).

442 patients, 10 baseline measurements each, and a disease-progression score one year
later (an integer, 25-346): Efron et al., "Least Angle Regression" (2004), shipped with
scikit-learn (`sklearn.datasets.load_diabetes`), so no download.

A question lists the raw (`scaled=False`) measurements by name, in the dataset's order:

    "age 59 sex 2 bmi 32.1 bp 101 s1 157 s2 93.2 s3 38 s4 4 s5 4.8598 s6 87"

each value written with at most 4 decimals and trailing zeros dropped
(`format_value`); the release has no more than 4 decimals, so the text holds the exact
values. The answer is the score ("151").

Splits (`examples(split, n, seed)`):

* `test_interpolate` (the name the trainer evaluates): 20 % of the patients (88),
  chosen by a permutation seeded by `split_seed` (default 0); in patient order.
* `train`: the other 354.

The split does not depend on the run's `seed`: the trainer draws its test sets with
seed 0 whatever the run's seed, so a seed-dependent split would put test patients into
the training data of every other seed. The `seed` orders the training patients instead.
There is no extrapolation split.

More examples than a split holds: `train` cycles, example `i` being patient
`perm_p[i mod 354]` with `p = i // 354` and `perm_p` a permutation seeded by
`(seed, p)` (every full pass visits each patient once, and a prefix of a longer request
is the shorter one); a test split is never repeated, asking for more gives all of it.

Needs scikit-learn (the `regression` extra), imported when the data is first read.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

SPLITS: tuple[str, ...] = ("train", "test_interpolate")
FEATURES: tuple[str, ...] = ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6")
NUM_PATIENTS = 442
TEST_FRACTION = 0.2
DECIMALS = 4  # the release's values have at most 4 decimals
_SPLIT_TAG = 1047  # keeps the split permutation's stream apart from the train order's


@functools.lru_cache(maxsize=1)
def load() -> tuple[np.ndarray, np.ndarray]:
    """`(measurements [442, 10] float64, scores [442] int64)`, unscaled."""
    try:
        from sklearn.datasets import load_diabetes
    except ImportError as e:
        raise ImportError("the diabetes task needs scikit-learn: pip install 'ntl-jax[regression]'") from e
    bunch = load_diabetes(scaled=False)
    if tuple(bunch.feature_names) != FEATURES or bunch.data.shape != (NUM_PATIENTS, len(FEATURES)):
        raise ValueError(f"expected the diabetes data with features {FEATURES} and shape "
                         f"{(NUM_PATIENTS, len(FEATURES))}, got {tuple(bunch.feature_names)} "
                         f"and {bunch.data.shape}")
    scores = np.asarray(bunch.target)
    if not np.array_equal(scores, np.round(scores)):
        raise ValueError("expected integer disease-progression scores")
    return np.asarray(bunch.data, np.float64), scores.astype(np.int64)


def format_value(x: float) -> str:
    """`x` with at most `DECIMALS` decimals, trailing zeros and point dropped.

    >>> format_value(32.1), format_value(4.0), format_value(4.85981), format_value(65.33)
    ('32.1', '4', '4.8598', '65.33')
    """
    return np.format_float_positional(round(float(x), DECIMALS), precision=DECIMALS, trim="-")


def question(measurements: Sequence[float]) -> str:
    """The text of one patient's 10 measurements.

    >>> question([59, 2, 32.1, 101, 157, 93.2, 38, 4, 4.8598, 87])
    'age 59 sex 2 bmi 32.1 bp 101 s1 157 s2 93.2 s3 38 s4 4 s5 4.8598 s6 87'
    """
    if len(measurements) != len(FEATURES):
        raise ValueError(f"expected {len(FEATURES)} measurements, got {len(measurements)}")
    return " ".join(f"{name} {format_value(x)}" for name, x in zip(FEATURES, measurements))


@functools.lru_cache(maxsize=16)
def split_patients(split: str, split_seed: int = 0) -> np.ndarray:
    """The patient indices of `split` (sorted), a fixed function of `split_seed`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    perm = np.random.default_rng([_SPLIT_TAG, int(split_seed)]).permutation(NUM_PATIENTS)
    n_test = int(TEST_FRACTION * NUM_PATIENTS)  # 88
    chosen = perm[:n_test] if split == "test_interpolate" else perm[n_test:]
    out = np.sort(chosen)
    out.flags.writeable = False
    return out


def examples(split: str, n: int, seed: int, split_seed: int = 0) -> list[tuple[str, str]]:
    """`(question, answer)` pairs of `split`: `n` training examples in the order of
    `seed` (cycling), or the first `min(n, size)` test patients (see the module doc).

    >>> len(examples("test_interpolate", 1000, 0)), len(examples("train", 1000, 0))
    (88, 1000)
    """
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    patients = split_patients(split, split_seed)
    if split == "train":
        passes = -(-n // len(patients))
        order = np.concatenate([np.random.default_rng([int(seed), p]).permutation(patients)
                                for p in range(passes)] or [np.zeros(0, np.int64)])[:n]
    else:
        order = patients[:n]
    x, y = load()
    return [(question(x[i]), str(int(y[i]))) for i in order]


def metrics(questions: Sequence[str], targets: Sequence[str],
            predictions: Sequence[str]) -> dict[str, float]:
    """RMSE and Pearson r of the predicted scores, and the share that parse:
    `ntl_jax.data.metrics.regression_metrics`, which says how; empty inputs give `{}`.

    >>> m = metrics(["q"] * 3, ["100", "200", "300"], ["110", "190", "no idea"])
    >>> round(m["rmse"], 6), round(m["pearson_r"], 6), round(m["parsed"], 4)
    (10.0, 1.0, 0.6667)
    """
    from ntl_jax.data.metrics import regression_metrics

    if not len(questions) == len(targets) == len(predictions):
        raise ValueError(f"expected as many questions, targets and predictions, got "
                         f"{len(questions)}, {len(targets)} and {len(predictions)}")
    return regression_metrics(targets, predictions) if len(targets) else {}
