"""The public API with the formulation of the number statistics under test bound.

`NTL_JAX_FORMULATION=columns`, `gathered` or `reductions` makes the numerical tests
that import `ntl_jax` from here pass that `formulation=` to every loss, on every
backend, so the CPU checks each (`.ci/run` runs them once more with each of the other
two); unset, each backend takes its own ("auto"). The `formulation` fixture of
tests/conftest.py runs a test with each in one session.
"""

import functools
import os
import types

import ntl_jax
from ntl_jax._core.number_stats import FORMULATIONS

FORMULATION = os.environ.get("NTL_JAX_FORMULATION") or "auto"
if FORMULATION not in ("auto",) + FORMULATIONS:
    raise ValueError(f"expected NTL_JAX_FORMULATION in {FORMULATIONS} or unset, got {FORMULATION!r}")

_WITH_FORMULATION = ("cross_entropy_and_ntl", "ntl_dot", "ntl_was", "number_level_loss", "number_token_loss")


class _Bound(types.SimpleNamespace):
    def __getattr__(self, name):  # everything else as `ntl_jax` has it
        return getattr(ntl_jax, name)


def bound(formulation: str):
    """`ntl_jax`, its losses with `formulation=` bound (a keyword the caller may override)."""
    losses = {}
    for name in _WITH_FORMULATION:
        loss = getattr(ntl_jax, name)
        losses[name] = functools.update_wrapper(functools.partial(loss, formulation=formulation), loss)
    return _Bound(**losses)


ntl_jax_under_test = bound(FORMULATION)
