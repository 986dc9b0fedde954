"""The losses by name: the registry (`LOSSES`, `register`, entry points, losses that a
module holds) and the spec grammar every surface configured by strings reads (`parse`).

A new loss is one file beside this one and one line in `SHIPPED`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import sys
from importlib.metadata import entry_points

from ntl_jax._core.number_losses.digit_entropy import digit_entropy
from ntl_jax._core.number_losses.dist2 import dist2
from ntl_jax._core.number_losses.ntil import ntil
from ntl_jax._core.number_losses.ntl import huber, mae, mse, number_level, number_level_float, was, was_cdf
from ntl_jax._core.number_losses.number_loss import IMPORTABLE, LOSSES, MEAN_OVER, NumberLoss, with_mean_over
from ntl_jax._core.number_losses.smmd import smmd

# The shipped losses, each by its name and constructor.
SHIPPED = {
    "was": was,
    "mse": mse,
    "mae": mae,
    "huber": huber,
    "number_level": number_level,
    "number_level_float": number_level_float,
    "was_cdf": was_cdf,
    "del": digit_entropy,
    "dist2": dist2,
    "smmd": smmd,
    "ntil": ntil,
}
LOSSES.update(SHIPPED)
# The shipped losses' names.
NAMES = tuple(SHIPPED)
# What a spec for no number loss at all (cross-entropy alone) says.
NONE = "none"
# `name`, `module:name` (a loss of your own that importing `module` gives), either with
# `(param=value, ...)`.
_SPEC = re.compile(r"\s*(?:((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*):)?([A-Za-z_][\w-]*)\s*(?:\((.*)\))?\s*", re.S)
_EXAMPLE = "a spec such as 'was', 'smmd(sigma=2, mode=smooth)' or 'my_package.losses:squared(scale=2)'"
# Packages name their losses for every process (a launcher, a saved model's loader) as
# entry points of this group: `squared = "my_package.losses:squared"`, a NumberLoss or a
# constructor, registered the first time a spec names it.
ENTRY_POINTS = "ntl_jax.losses"
# Where a loss of your own can be named from, as the unknown-loss error lists them.
OWN_LOSS_ROUTES = (
    "name the module that holds or registers it, 'my_package.losses:squared' (any process imports it); "
    "register it in this process (ntl_jax.losses.register); or install a package naming it as an entry "
    f"point of the group {ENTRY_POINTS!r} (docs/guides/losses.md, 'A loss of your own')")


def register(loss):
    """Names `loss` for every surface configured by strings: `parse`, gin, MaxText's
    key, the trainer's `--loss`, a run's recorded identity, Keras saving. `loss` is a
    `NumberLoss` (its spec is then its `name`) or a constructor returning one (keyword
    parameters become the spec's; the same value for the same arguments). Returns `loss`,
    so it can decorate a constructor.

    Registered as a module is imported (at its top level), or a constructor that a module
    holds, its spec is `"module:name"`, which any process reads by importing that module.
    Registering a name again replaces that loss (a cell run twice); a shipped name stays
    refused.

    Raises:
      ValueError: the name is a shipped loss's.
    """
    made = _made_by(loss)
    return _register(loss, made, _importable(loss, made, sys._getframe(1)))


def _importable(loss, made: NumberLoss, frame) -> str | None:
    """`"module:attribute"` that gives `loss` in a process that imports `module`: the
    module registering it at its top level, or the module holding a constructor; None
    for neither (a notebook's `__main__`, a function's body)."""
    module = frame.f_globals.get("__name__")
    if frame.f_code.co_name == "<module>" and module not in (None, "__main__"):
        return f"{module}:{made.name}"
    holder = sys.modules.get(getattr(loss, "__module__", None) or "")
    name = getattr(loss, "__qualname__", "")
    if holder is not None and holder.__name__ != "__main__" and getattr(holder, name, None) is loss:
        return f"{holder.__name__}:{name}"
    return None


def _register(loss, made: NumberLoss, importable: str | None):
    """`register`, `made` the loss `loss` gives (its constructor called once), `importable`
    the `"module:attribute"` that gives `loss` in another process (None: none)."""
    name = made.name
    shipped = SHIPPED.get(name) or _shipped_by_label().get(name)
    if shipped is not None and shipped is not loss and _made(shipped) is not loss:
        raise ValueError(f"expected a number loss name that is not a shipped loss's ({NAMES}), got {name!r}: "
                         "choose another name")
    if shipped is not None:
        return loss
    LOSSES[name] = (lambda: loss) if isinstance(loss, NumberLoss) else loss
    if importable is None:
        IMPORTABLE.pop(name, None)
    else:
        IMPORTABLE[name] = importable
    _by_label.cache_clear()
    return loss


def _made_by(loss) -> NumberLoss:
    if isinstance(loss, NumberLoss):
        return loss
    if not callable(loss):
        raise TypeError(f"expected a NumberLoss or a function returning one, got {type(loss).__name__} {loss!r}")
    made = loss()
    if not isinstance(made, NumberLoss):
        raise TypeError(f"expected {loss!r}() to return a NumberLoss, got {type(made).__name__}")
    return made


def _from_entry_points(name: str) -> bool:
    """Registers the loss an installed package names `name` in `ENTRY_POINTS`; whether
    one did. Its spec stays `name`, which every process with the package reads."""
    for point in entry_points(group=ENTRY_POINTS, name=name):
        loss = point.load()
        made = _made_by(loss)
        if made.name != name:
            raise ValueError(f"expected the entry point {point.value!r} ({ENTRY_POINTS}) to give the number loss "
                             f"{name!r}, got {made.name!r}")
        _register(loss, made, None)
        return True
    return False


def _from_module(module: str, attribute: str, spec: str) -> str:
    """Imports `module` and registers its loss `attribute` (the loss importing it
    registers by that name, else its attribute, a NumberLoss or a constructor); that
    loss's name."""
    if attribute in SHIPPED:
        return attribute
    try:
        imported = importlib.import_module(module)
    except ImportError as error:
        raise ValueError(f"expected the module {module!r} of the spec {spec!r} to be importable, got {error!r}") \
            from None
    importable = f"{module}:{attribute}"
    for name, where in IMPORTABLE.items():
        if where == importable and name in LOSSES:
            return name  # importing it registered it
    held = getattr(imported, attribute, None)
    if held is None:
        raise ValueError(f"expected the module {module!r} to hold or register a number loss {attribute!r}, in the "
                         f"spec {spec!r}; it has no such attribute and registers no such loss")
    if not isinstance(held, NumberLoss) and not callable(held):
        raise TypeError(f"expected {importable} to be a NumberLoss or a function returning one, got "
                        f"{type(held).__name__}")
    made = _made_by(held)
    _register(held, made, importable)
    return made.name


def _made(constructor):
    try:
        return constructor()
    except TypeError:
        return None


@functools.lru_cache(maxsize=None)
def _by_label() -> dict:
    """The constructors by the label runs show their losses by (`NumberLoss.label`)."""
    return {made.label: constructor for constructor in LOSSES.values()
            if (made := _made(constructor)) is not None and made.label}


def _shipped_by_label() -> dict:
    return {label: constructor for label, constructor in _by_label().items() if constructor in SHIPPED.values()}


def _parse_value(text: str):
    """A spec's value: true/false, none, an int, a float, or else the word itself."""
    word = text.strip().strip("'\"")
    lowered = word.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    for kind in (int, float):
        try:
            return kind(word)
        except ValueError:
            pass
    return word


def parameters(name: str) -> tuple[str, ...]:
    """The parameters the loss `name` takes (not those its name fixes:
    `number_level_float`'s `float_level`)."""
    constructor = _constructor(name)
    fixed = getattr(constructor, "keywords", {})
    return tuple(param for param in inspect.signature(constructor).parameters if param not in fixed)


def _constructor(name: str):
    return LOSSES.get(name) or _by_label()[name]


def parse(spec: str) -> NumberLoss:
    """The loss a spec string names: `name` or `name(param=value, ...)`, a name of
    `LOSSES` (or the label runs show it by: `"ntl-was"`), or `module:name`, a loss of your
    own that importing `module` gives; values numbers, `true`/`false`, `none` or words
    (`"smmd(sigma=2, mode=smooth)"`). The one parser of every surface configured by
    strings (gin, MaxText's keys, the command line, a run's recorded identity, Keras
    saving); `NumberLoss.spec` writes it back.

    Raises:
      ValueError: a malformed spec, an unknown loss or parameter, or a bad value, named.
    """
    if not isinstance(spec, str):
        raise TypeError(f"expected {_EXAMPLE}, got {type(spec).__name__} {spec!r}")
    match = _SPEC.fullmatch(spec)
    if match is None:
        raise ValueError(f"expected {_EXAMPLE}, got {spec!r}")
    module, name, arguments = match.groups()
    if module is not None:
        name = _from_module(module, name, spec)
    elif name not in LOSSES and name not in _by_label() and not _from_entry_points(name):
        raise ValueError(f"expected a number loss in {tuple(LOSSES)} (or one of their labels "
                         f"{tuple(_by_label())}, or {NONE!r}), got {name!r} in the spec {spec!r}. For a loss of your "
                         f"own: {OWN_LOSS_ROUTES}")
    kwargs = {}
    for item in filter(str.strip, (arguments or "").split(",")):
        key, equals, value = item.partition("=")
        key = key.strip()
        if not equals or not key.isidentifier():
            raise ValueError(f"number loss {name!r}: expected param=value in the spec {spec!r}, got {item.strip()!r}")
        if key not in parameters(name) and key != MEAN_OVER:
            takes = (f"it takes {parameters(name)}, and every loss {MEAN_OVER}" if parameters(name) or name in NAMES
                     else f"it takes only {MEAN_OVER}: a loss of your own takes parameters when it is registered as "
                          "a constructor with keyword parameters, `def squared(*, scale=1.0) -> NumberLoss`")
            raise ValueError(f"number loss {name!r} has no parameter {key!r} ({takes}); in the spec {spec!r}")
        if key in kwargs:
            raise ValueError(f"number loss {name!r}: expected each parameter once in the spec {spec!r}, got {key!r} "
                             "twice")
        kwargs[key] = _parse_value(value)
    mean_over = kwargs.pop(MEAN_OVER, None)
    try:
        loss = _constructor(name)(**kwargs)
    except TypeError as error:  # a value of the wrong kind ("reweigh=yes"): in a string, a bad value
        raise ValueError(f"{error}; in the spec {spec!r}") from None
    if mean_over is None:
        return loss
    try:
        return with_mean_over(loss, mean_over)
    except ValueError as error:
        raise ValueError(f"{error}; in the spec {spec!r}") from None


def resolve(number_loss: NumberLoss | str | None, name: str = "number_loss") -> NumberLoss | None:
    """The `NumberLoss` an entry point's `number_loss` argument names: a `NumberLoss` as
    it is, a spec string parsed (`parse`), None or `"none"` for no number loss."""
    if number_loss is None or isinstance(number_loss, NumberLoss):
        return number_loss
    if isinstance(number_loss, str):
        return None if number_loss.strip() == NONE else parse(number_loss)
    if callable(number_loss):
        raise TypeError(f"expected {name} a NumberLoss or a spec string, got the function {number_loss!r}; a loss "
                        "on the expected value is ntl_jax.losses.expected_value_loss(fn)")
    raise TypeError(f"expected {name} a NumberLoss (ntl_jax.losses), {_EXAMPLE}, or None; "
                    f"got {type(number_loss).__name__} {number_loss!r}")
