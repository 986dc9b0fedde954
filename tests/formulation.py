"""The public API with the formulation of the number statistics under test bound.

`NTL_JAX_FORMULATION=columns`, `gathered` or `reductions` makes the numerical tests
that import `ntl_jax` from here call every function with its number tokens naming that
formulation (`with_formulation`, `ntl_jax._core.number_stats`), on every backend, so the
CPU checks each (`.ci/run` runs them once more with each of the other two); unset, each
backend takes its own ("auto"). The `formulation` fixture of tests/conftest.py runs a
test with each in one session (`bound(formulation)`).
"""

import functools
import inspect
import os
import types

import ntl_jax
from ntl_jax._core.number_stats import FORMULATIONS, with_formulation

FORMULATION = os.environ.get("NTL_JAX_FORMULATION") or "auto"
if FORMULATION not in ("auto",) + FORMULATIONS:
    raise ValueError(f"expected NTL_JAX_FORMULATION in {FORMULATIONS} or unset, got {FORMULATION!r}")


class _Bound(types.SimpleNamespace):
    def __getattr__(self, name):  # everything else as `ntl_jax` has it
        return getattr(ntl_jax, name)


def _under(formulation: str, fn):
    def named(value):
        return with_formulation(value, formulation) if isinstance(value, ntl_jax.NumberTokens) else value

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return fn(*map(named, args), **{key: named(value) for key, value in kwargs.items()})

    return call


def bound(formulation: str):
    """`ntl_jax`, each of its public functions called with its `NumberTokens` arguments
    naming `formulation` (another formulation for one call: `bound(name).function(...)`)."""
    if formulation != "auto" and formulation not in FORMULATIONS:
        raise ValueError(f"expected a formulation in {('auto',) + FORMULATIONS}, got {formulation!r}")
    functions = {name: _under(formulation, getattr(ntl_jax, name)) for name in ntl_jax.__all__
                 if inspect.isfunction(getattr(ntl_jax, name))}
    return _Bound(**functions)


ntl_jax_under_test = bound(FORMULATION)
