"""Test configuration: fast compilation, the long comparisons behind `--long`, the
order of the long files, and the `formulation` fixture (each formulation of the number
statistics in turn; tests/formulation.py binds one for a whole run).
"""

import os

from tests import xla_flags
from tests.workers import (  # noqa: F401 (the hooks of the test workers)
    pytest_sessionfinish,
    pytest_sessionstart,
    pytest_terminal_summary,
    pytest_testnodedown,
)

# Keras reads its backend once, when it is first imported, by whichever test file does.
os.environ.setdefault("KERAS_BACKEND", "jax")

xla_flags.use_fast_compile()  # before JAX starts its CPU backend
xla_flags.share_compiled_programs()  # before JAX reads its configuration

import ctypes  # noqa: E402
import ctypes.util  # noqa: E402
import gc  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

from ntl_jax._core.number_stats import FORMULATIONS  # noqa: E402

# The files that take minutes, longest first (measured with --durations=0): they start
# first, so that the workers finish together rather than one of them running a long file
# alone at the end (with --no-loadscope-reorder the files go to the workers in the order
# they are collected).
LONG_FILES = (
    "test_low_precision_gradient.py", "test_tpu_cost.py", "test_number_level_multidigit.py", "test_tasks.py",
    "train/test_trainer.py", "test_bad_inputs.py", "train/test_xval.py", "test_vocab_parallel.py",
    "train/test_regression_head.py", "test_sharding.py", "test_benchmarks_smoke.py", "test_t5x_fused_loss.py",
    "train/test_compare.py", "test_multihost.py",
)


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true",
                     help="also run the long comparisons (tests marked `long`: the whole parameter grids)")


def pytest_configure(config):
    config.addinivalue_line("markers", "long: a long comparison, run with --long (tests/grid.py); "
                                       "a short version of it runs by default")


def pytest_unconfigure(config):
    xla_flags.remove_created_cache()


def pytest_collection_modifyitems(session, config, items):
    if not config.getoption("--long"):
        long = [item for item in items if item.get_closest_marker("long")]
        if long:
            config.hook.pytest_deselected(items=long)
            items[:] = [item for item in items if not item.get_closest_marker("long")]
    rank = {name: i for i, name in enumerate(LONG_FILES)}

    def position(item):
        path = item.nodeid.split("::")[0].removeprefix("tests/")
        return rank.get(path, len(LONG_FILES))

    items.sort(key=position)  # stable: each file keeps its own order


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per CPU, at most 4 (each holds a JAX runtime of its own)."""
    return max(1, min(os.cpu_count() or 1, 4))


def _libc_malloc_trim():
    """glibc's `malloc_trim`, which hands freed memory back to the system, or None."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (AttributeError, OSError, TypeError):  # not glibc
        return None


_MALLOC_TRIM = _libc_malloc_trim()


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
    """After each test file: JAX's in-memory caches of compiled programs cleared, and the
    memory freed handed back to the system. A worker runs many files, and what each one
    compiled stayed resident until the run ended: tests/keras, tests/tunix and
    tests/test_fused.py in one process peaked at 4.7 GiB, 3.1 GiB with this (the process
    back near its size before each file once the file is done). A program a later file
    needs again comes from the compilation cache on disk (tests/xla_flags.py)."""
    yield
    jax.clear_caches()
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


@pytest.fixture(params=FORMULATIONS)
def formulation(request):
    """Each formulation in turn, on every backend: a test calls the losses with
    `with_formulation(number_tokens, formulation)` (`ntl_jax._core.number_stats`), or
    through `tests.formulation.bound(formulation)`."""
    return request.param
