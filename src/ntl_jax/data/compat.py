"""Makes DeepMind's `mathematics-dataset` 1.0.1 work with current sympy and numpy.

Everything is patched in memory, before the generator runs; nothing in site-packages
is edited. The fixes:

* sympy >= 1.7 moved `base_solution_linear` to `sympy.solvers.diophantine.diophantine`.
* numpy >= 1.24 removed `np.object`; numpy 2 removed `ndarray.itemset`, which the
  polynomial sampler calls on the arrays it creates.
* Python >= 3.12 rejects the integral floats that `round_number` passes to
  `random.randint`.
* `six` (Python 2 compatibility, which `mathematics-dataset` imports everywhere) is
  stood in for while the generator is imported when it is not installed, so the
  trainer's environment does not need it; `absl-py`, its other dependency, comes with
  JAX's libraries (optax, orbax-checkpoint).
* Determinism: the generator picks variable letters with `random.choice(list(a_set))`
  and orders sub-expressions by iterating a set of `Entity` objects (hashed by memory
  address), so the same seed gave different questions in different processes. Letter
  sets now iterate in sorted order and entities hash by their creation number within
  an example (`reset_entity_counter`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import random
import sys
import types

import numpy as np

_APPLIED = False
_ENTITY_COUNTER = itertools.count()


class _ItemsetArray(np.ndarray):
    """ndarray with numpy 1.x's `itemset(index..., value)`."""

    def itemset(self, *args):
        *index, value = args
        index = index[0] if len(index) == 1 else tuple(index)
        if isinstance(index, (int, np.integer)):
            self.flat[index] = value  # a single integer is a flat index
        else:
            self[tuple(index)] = value


class _NumpyWithItemset:
    """Stands in for `numpy` inside the polynomial sampler: arrays it creates with
    `zeros`/`empty` support `itemset`; every other name is numpy's own."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def zeros(*args, **kwargs):
        return np.zeros(*args, **kwargs).view(_ItemsetArray)

    @staticmethod
    def empty(*args, **kwargs):
        return np.empty(*args, **kwargs).view(_ItemsetArray)


class _IntegerRandint:
    """Stands in for `random` inside the numbers module: `randint` accepts integral
    floats (`round_number` passes e.g. 3.0), deprecated in Python 3.10 and a TypeError
    from 3.12. Draws from the same global generator, so sequences are unchanged."""

    def __getattr__(self, name):
        return getattr(random, name)

    @staticmethod
    def randint(a, b):
        def integral(x):
            return int(x) if isinstance(x, float) and x.is_integer() else x

        return random.randint(integral(a), integral(b))


class _SortedSymbols(frozenset):
    """A frozenset of letters that iterates in sorted order, also after `difference`."""

    def difference(self, *others):
        return _SortedSymbols(frozenset.difference(self, *others))

    def __iter__(self):
        return iter(sorted(frozenset.__iter__(self)))


def reset_entity_counter() -> None:
    """Restarts entity numbering; called before each generated example."""
    global _ENTITY_COUNTER
    _ENTITY_COUNTER = itertools.count()


def _has_itemset() -> bool:
    """Whether `ndarray.itemset` works: numpy 2.0 to 2.3 keep the name, as a method
    that only raises AttributeError, and 2.4 drops it."""
    try:
        np.zeros(1).itemset(0, 1)
    except AttributeError:
        return False
    return True


def apply() -> None:
    """Applies the shims once; safe to call repeatedly."""
    global _APPLIED
    if _APPLIED:
        return
    # `import sympy.solvers.diophantine as d` would give the *function* re-exported by
    # sympy.solvers, not the package, hence importlib.
    package = importlib.import_module("sympy.solvers.diophantine")
    if not hasattr(package, "base_solution_linear"):
        inner = importlib.import_module("sympy.solvers.diophantine.diophantine")
        package.base_solution_linear = inner.base_solution_linear
    if "object" not in np.__dict__:
        np.object = object

    polynomials = importlib.import_module("mathematics_dataset.sample.polynomials")
    if not _has_itemset():
        polynomials.np = _NumpyWithItemset()

    numbers = importlib.import_module("mathematics_dataset.modules.numbers")
    numbers.random = _IntegerRandint()

    composition = importlib.import_module("mathematics_dataset.util.composition")
    composition._ALLOWED_SYMBOLS = _SortedSymbols(composition._ALLOWED_SYMBOLS)
    entity = composition.Entity
    original_init = entity.__init__

    @functools.wraps(original_init)
    def init(self, *args, **kwargs):
        self._ntl_serial = next(_ENTITY_COUNTER)
        original_init(self, *args, **kwargs)

    entity.__init__ = init
    # Equality stays identity; only the iteration order of entity sets changes.
    entity.__hash__ = lambda self: self._ntl_serial
    _APPLIED = True


def _six_stand_in() -> types.ModuleType:
    """The part of `six` that `mathematics-dataset` 1.0.1 uses, for Python 3."""
    six = types.ModuleType("six", "ntl_jax's stand-in for six while mathematics_dataset imports")
    moves = types.ModuleType("six.moves")
    moves.range, moves.zip = range, zip
    six.moves = moves
    six.PY2, six.PY3 = False, True
    six.integer_types, six.string_types = (int,), (str,)
    six.iteritems = lambda d, **kw: iter(d.items(**kw))
    six.iterkeys = lambda d, **kw: iter(d.keys(**kw))
    six.itervalues = lambda d, **kw: iter(d.values(**kw))

    def add_metaclass(metaclass):  # six's own recipe
        def wrapper(cls):
            namespace = cls.__dict__.copy()
            slots = namespace.get("__slots__")
            for name in [slots] if isinstance(slots, str) else (slots or ()):
                namespace.pop(name)
            namespace.pop("__dict__", None)
            namespace.pop("__weakref__", None)
            namespace["__qualname__"] = cls.__qualname__
            return metaclass(cls.__name__, cls.__bases__, namespace)

        return wrapper

    six.add_metaclass = add_metaclass
    return six


@contextlib.contextmanager
def _six_if_missing():
    """Imports inside see a stand-in `six` when it is not installed; afterwards
    `sys.modules` is as before (the generator's modules keep their reference)."""
    try:
        import six  # noqa: F401
    except ImportError:
        pass
    else:
        yield
        return
    saved = {name: sys.modules.get(name, _MISSING) for name in ("six", "six.moves")}
    stand_in = _six_stand_in()
    sys.modules.update({"six": stand_in, "six.moves": stand_in.moves})
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is _MISSING:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


_MISSING = object()


def import_generator():
    """Returns `(generate, modules)` from `mathematics_dataset`, shims applied."""
    try:
        with _six_if_missing():
            apply()
            from mathematics_dataset import generate
            from mathematics_dataset.modules import modules
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the offline generator needs the `mathematics-dataset` package (with sympy "
            "and absl-py): pip install 'ntl-jax[train]' or 'ntl-jax[seqio]'"
        ) from e
    return generate, modules
