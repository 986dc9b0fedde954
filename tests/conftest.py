"""The formulation of the number statistics the tests run (`ntl_jax.number_stats`).

Each backend takes its own (columns on the CPU, masked reductions elsewhere); with
`NTL_JAX_FORMULATION=columns` or `reductions` every test runs the one named, on every
backend, so the CPU checks both (`.ci/run` runs the numerical tests once more with the
reductions). The `formulation` fixture runs a test with each in one session.
"""

import os

from tests import xla_flags

xla_flags.use_fast_compile()  # before JAX starts its CPU backend

import jax  # noqa: E402
import pytest  # noqa: E402

from ntl_jax import number_stats  # noqa: E402

FORMULATIONS = ("columns", "reductions")
_chosen = os.environ.get("NTL_JAX_FORMULATION") or None
if _chosen not in (None,) + FORMULATIONS:
    raise ValueError(f"expected NTL_JAX_FORMULATION in {FORMULATIONS} or unset, got {_chosen!r}")
number_stats._FORCE = _chosen


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per CPU, at most 4 (each holds a JAX runtime of its own)."""
    return max(1, min(os.cpu_count() or 1, 4))


@pytest.fixture(params=FORMULATIONS)
def formulation(request, monkeypatch):
    """Each formulation in turn, forced on every backend (traced afresh)."""
    monkeypatch.setattr(number_stats, "_FORCE", request.param)
    jax.clear_caches()
    yield request.param
    jax.clear_caches()
