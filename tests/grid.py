"""Parameter grids whose short run covers every pair of values.

A grid of options (dtype × formulation × loss × ...) grows as the product of its axes,
and most of its cases check the same code paths as their neighbours. `pairwise` gives
every combination as a pytest parameter; a subset in which every pair of values of any
two axes occurs at least once runs by default, the rest are marked `long` and run with
`pytest --long` (tests/conftest.py). A fault that needs two settings together is caught
either way; one that needs three, only by the long run.
"""

import itertools
import os

import pytest

LONG = pytest.mark.long
# The checks that run as subprocesses (tests/*_check.py) learn from this variable whether
# the test that started them runs with --long.
LONG_ENV = "NTL_JAX_LONG_TESTS"


def long_env(long: bool) -> dict[str, str]:
    """`LONG_ENV` for a subprocess check's environment."""
    return {LONG_ENV: "1" if long else "0"}


def long_run() -> bool:
    """In a subprocess check: whether the test that started it runs with --long."""
    return os.environ.get(LONG_ENV) == "1"


def _label(value):
    if isinstance(value, dict):
        return "-".join(map(_label, value.values()))
    # A number loss by its spec ("was(reweigh=true)"), not its name alone.
    return (getattr(value, "spec", None) or getattr(value, "__name__", None) or getattr(value, "name", None)
            or str(value))


def covering(sizes):
    """Indices (one tuple per case) into axes of `sizes` values in which every pair of
    values of two axes occurs; greedy, deterministic, in the grid's order."""
    pairs = list(itertools.combinations(range(len(sizes)), 2))
    todo = {(i, a, j, b) for i, j in pairs for a in range(sizes[i]) for b in range(sizes[j])}
    grid = list(itertools.product(*map(range, sizes)))
    if len(sizes) < 2:
        return grid
    chosen = []
    while todo:
        case = max(grid, key=lambda c: sum((i, c[i], j, c[j]) in todo for i, j in pairs))
        chosen.append(case)
        todo -= {(i, case[i], j, case[j]) for i, j in pairs}
    return sorted(chosen)


def pairwise(**axes):
    """Every combination of the axes' values as `pytest.param`s (for
    `parametrize(tuple(axes), pairwise(...))`), those outside `covering` marked `long`.
    An axis is a list of values, or a dict of them by their names in the test ids."""
    labelled = [list(a.items()) if isinstance(a, dict) else [(_label(v), v) for v in a] for a in axes.values()]
    short = set(covering([len(a) for a in labelled]))
    params = []
    for case in itertools.product(*map(range, map(len, labelled))):
        chosen = [a[k] for a, k in zip(labelled, case)]
        params.append(pytest.param(*(value for _, value in chosen), id="-".join(label for label, _ in chosen),
                                   marks=() if case in short else LONG))
    return params
