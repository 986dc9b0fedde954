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

import jax
import jax.numpy as jnp
import numpy as np

from ntl_jax._core import digit_runs
from ntl_jax._core.compat import is_traced
from ntl_jax._core.number_losses.digit_entropy import digit_entropy
from ntl_jax._core.number_losses.dist2 import dist2
from ntl_jax._core.number_losses.ntl import huber, mae, mse, number_level, number_level_float, was, was_cdf
from ntl_jax._core.number_losses.number_loss import (
    COMBINES,
    IMPORTABLE,
    LOSSES,
    MEAN_OVER,
    NumberLoss,
    check_choice,
    check_number,
    number_values,
    off_default,
    with_mean_over,
)
from ntl_jax._core.number_losses.smmd import smmd
from ntl_jax._core.number_stats import NumberReads, NumberStats
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.targets import NumberTarget

# -- NTIL (Fei et al., "Advancing Sequential Numerical Prediction in Autoregressive
# Models", ACL 2025; code xfey/NTIL, `ntil.py`) ---------------------------------------
# Per sequence, its numbers the maximal runs of digit targets: a place-weighted NTL-WAS
# over its digit positions, and over its numbers an absolute and an order-of-magnitude
# term between the number its argmax digits write (x) and the target's (y). Its term
# joins CE scaled to it: `λ · stop_gradient(CE / NTIL) · NTIL`.

# The authors' defaults (`NTIL.__init__`, `gumbel_softmax`).
NTIL_DIGIT_ALPHA, NTIL_ABS_ALPHA, NTIL_MAG_ALPHA, NTIL_DIGIT_EXP, NTIL_TAU = 1.0, 0.2, 0.2, 1.2, 0.1
# A number's places in float32: 10^37 is the highest that 9 x it does not overflow (the
# authors' code gives inf, then NaN, from 40 digits on).
_NTIL_MAX_PLACES = 38


def ntil(*, digit_alpha: float = NTIL_DIGIT_ALPHA, abs_alpha: float = NTIL_ABS_ALPHA,
         mag_alpha: float = NTIL_MAG_ALPHA, digit_exp: float = NTIL_DIGIT_EXP, tau: float = NTIL_TAU,
         combine: str = "scale_to_ce") -> NumberLoss:
    """NTIL (Fei et al., ACL 2025; the authors' `NTIL`), per sequence: `digit_alpha` x
    the mean over its digit targets of `digit_exp^k sum_j p_j |j - y|` (`k` the digits
    after it in its number) + `abs_alpha` x the mean over its numbers of `|x - y| /
    (max(x, y) + 1)` + `mag_alpha` x that of `log((max(x, y) + 1) / (min(x, y) + 1))`,
    `x` written by the argmax digits (straight through `softmax(z / tau)`, without the
    authors' Gumbel noise: deterministic). Counted once per sequence with a digit
    target; `combine="scale_to_ce"` adds `weight * stop_gradient(CE / NTIL) * NTIL`, as
    the authors. Digit tables only (docs/guides/losses.md, "NTIL")."""
    def positive(param, value):
        return check_number("ntil", param, value, low=0.0, low_inclusive=False)

    return _ntil(check_number("ntil", "digit_alpha", digit_alpha, low=0.0),
                 check_number("ntil", "abs_alpha", abs_alpha, low=0.0),
                 check_number("ntil", "mag_alpha", mag_alpha, low=0.0), positive("digit_exp", digit_exp),
                 positive("tau", tau), check_choice("ntil", "combine", combine, COMBINES))


def check_digit_table(number_tokens: NumberTokens) -> None:
    """Raises ValueError unless a concrete table's number tokens are single digits 0-9,
    one token each: NTIL reads a number's digits one token at a time."""
    if is_traced(number_tokens.number_values) or is_traced(number_tokens.digit_counts):
        return
    values = np.asarray(number_tokens.number_values, np.float64)
    digits = np.asarray(number_tokens.digit_counts)[np.asarray(number_tokens.ids)]
    single = (values == np.floor(values)) & (values >= 0) & (values <= 9) & (digits == 1)
    if single.all() and len(np.unique(values)) == len(values):
        return
    others = sorted({float(v) for v, ok in zip(values, single) if not ok})[:10]
    reason = (f"number tokens that write more than one digit or no plain digit, values {others}" if others
              else "two tokens for one digit")
    raise ValueError("number loss 'ntil': expected number tokens that are the single digits 0-9, one token each "
                     f"(a number is read one digit token at a time), got {reason}")


def _ntil_terms(z, target: NumberTarget, number_tokens, digit_alpha, abs_alpha, mag_alpha, digit_exp, tau):
    """`[batch]` NTIL of each sequence from the number columns `z` `[batch, length, N]`,
    and `[batch, length]` where each sequence's first digit target is (it is counted there)."""
    v = number_values(number_tokens)
    is_digit = target.is_number
    y = jnp.where(is_digit, target.value, 0.0)
    # Digit level: NTL-WAS weighted by the digits after each one in its number.
    after = _digits_after(is_digit)
    wasserstein = jnp.sum(jax.nn.softmax(z, axis=-1) * jnp.abs(v - y[..., None]), axis=-1)
    weight = jnp.float32(digit_exp) ** after.astype(jnp.float32)
    count = jnp.sum(is_digit, axis=-1)
    emd = jnp.sum(jnp.where(is_digit, weight * wasserstein, 0.0), axis=-1) / jnp.maximum(count, 1)
    # Number level: the argmax digits, their gradient through softmax(z / tau).
    soft = jax.nn.softmax(z / tau, axis=-1)
    hard = jax.nn.one_hot(jnp.argmax(z, axis=-1), z.shape[-1], dtype=soft.dtype)
    predicted = jnp.sum((hard + (soft - jax.lax.stop_gradient(soft))) * v, axis=-1)
    join = functools.partial(digit_runs.join_digit_runs, is_digit, max_places=_NTIL_MAX_PLACES)
    starts, x = join(jnp.where(is_digit, predicted, 0.0))
    _, y_number = join(y)
    high, low = jnp.maximum(x, y_number), jnp.minimum(x, y_number)
    absolute = jnp.where(x == y_number, 0.0, jnp.abs(x - y_number) / (high + 1.0))
    magnitude = jnp.log((high + 1.0) / (low + 1.0))
    numbers = jnp.maximum(jnp.sum(starts, axis=-1), 1)

    def mean(per_number):
        return jnp.sum(jnp.where(starts, per_number, 0.0), axis=-1) / numbers

    per_sequence = digit_alpha * emd + abs_alpha * mean(absolute) + mag_alpha * mean(magnitude)
    first = is_digit & (jnp.cumsum(is_digit, axis=-1) == 1)
    return per_sequence, first


def _digits_after(is_digit):
    """`[batch, length]` int32: how many digit targets follow each in its run."""
    ones = is_digit.astype(jnp.int32)
    ends = digit_runs._shift_left(~is_digit, True)
    return jnp.where(is_digit, digit_runs._suffix_sums(ones, ends) - 1, 0)


@functools.lru_cache(maxsize=None)
def _ntil(digit_alpha, abs_alpha, mag_alpha, digit_exp, tau, combine) -> NumberLoss:
    terms = functools.partial(_ntil_terms, digit_alpha=digit_alpha, abs_alpha=abs_alpha, mag_alpha=mag_alpha,
                              digit_exp=digit_exp, tau=tau)

    def at_first(z, target, number_tokens):
        per_sequence, first = terms(z, target, number_tokens)
        return jnp.where(first, per_sequence[:, None], 0.0), first

    def loss(stats: NumberStats, target, number_tokens):
        return at_first(stats.columns, target, number_tokens)

    params = off_default(digit_alpha=(digit_alpha, NTIL_DIGIT_ALPHA), abs_alpha=(abs_alpha, NTIL_ABS_ALPHA),
                          mag_alpha=(mag_alpha, NTIL_MAG_ALPHA), digit_exp=(digit_exp, NTIL_DIGIT_EXP),
                          tau=(tau, NTIL_TAU), combine=(combine, "scale_to_ce"))
    return NumberLoss("ntil", NumberReads(columns=True), loss, at_first, params=params,
                      check_table=check_digit_table, across_positions=True, combine=combine)


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
    return _register(loss, _importable(loss, sys._getframe(1)))


def _importable(loss, frame) -> str | None:
    """`"module:attribute"` that gives `loss` in a process that imports `module`: the
    module registering it at its top level, or the module holding a constructor; None
    for neither (a notebook's `__main__`, a function's body)."""
    module = frame.f_globals.get("__name__")
    if frame.f_code.co_name == "<module>" and module not in (None, "__main__"):
        return f"{module}:{_made_by(loss).name}"
    holder = sys.modules.get(getattr(loss, "__module__", None) or "")
    name = getattr(loss, "__qualname__", "")
    if holder is not None and holder.__name__ != "__main__" and getattr(holder, name, None) is loss:
        return f"{holder.__name__}:{name}"
    return None


def _register(loss, importable: str | None):
    """`register`, `importable` the `"module:attribute"` that gives `loss` in another
    process (None: none)."""
    made = _made_by(loss)
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
        _register(loss, None)
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
    _register(held, importable)
    return _made_by(held).name


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
