"""The number loss as a value (`NumberLoss`): what every entry point takes as
`number_loss`, its checks, how its term joins the cross-entropy, the spec it writes, and
the helpers its constructors share. The losses themselves are a file per family beside
this one; `registry.py` names them.

Notation, per position: `y` the target's value, `v_j` the number tokens' values,
`p_j = softmax(z)_j` over the number tokens. Positions whose target is no number token
are not counted (the number-level loss counts a number's first token).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Callable

import jax
import jax.numpy as jnp

from ntl_jax._core.loss_params import check_bool, check_choice, check_number
from ntl_jax._core.number_stats import NumberReads, NumberStats
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.targets import NumberTarget

# reweigh: a position whose mass is off the number tokens costs slightly more than the
# worst number token (ntloss's constant).
_REWEIGH_MARGIN = 1.01

# How a number loss's term joins the cross-entropy (`NumberLoss.combine`): "add" adds
# `weight * loss`; "scale_to_ce" adds `weight * stop_gradient(CE / loss) * loss`, whose
# value is `weight * CE` and whose gradient is the loss's, rescaled (NTIL's rule).
COMBINES = ("add", "scale_to_ce")
# How a number loss's weighted sum over the positions it counts is normalised into its
# term (`NumberLoss.mean_over`): "counted", its weighted mean over those positions, put
# beside the cross-entropy as the authors put it beside CE's mean over the target tokens
# (the paper's and ntloss's, DEL's, DIST²'s, SMMD's); "targets", the sum divided by the
# cross-entropy's own normalising factor, as ntl_jax 0.4 and before did (the first times
# D/T, the share of counted targets among the target tokens).
MEAN_OVERS = ("counted", "targets")
# The weight λ in CE + λ·loss when none is given: the paper's.
DEFAULT_WEIGHT = 0.3
# The number loss an entry point takes when none is named: the paper's NTL-WAS.
DEFAULT = "was"


@dataclasses.dataclass(frozen=True, eq=False)
class NumberLoss:
    """A number loss with its parameters: what every entry point takes as `number_loss`.

    Build one with a constructor (`was(squash_factor=2.0)`), a one-liner (`expectation`,
    `of_expected_value`), or in full: `loss(stats, target, number_tokens) -> (loss,
    counted)`, each `[batch, length]`, reading `stats.means[k]` / `stats.sums[k]` in the
    order `reads` names them (docs/guides/losses.md). `register` gives it a spec.

    What an integration may know of a loss is here: `name` and `spec`; `label`, the name
    runs and tables show (`name` when None); `across_positions`, whether its loss at a
    position may read other positions' targets (True unless it says not); `default_weight`,
    λ when none is given; `combine`, how its term joins CE (`COMBINES`);
    `mean_over`, how its sum over the positions it counts is normalised (`MEAN_OVERS`,
    `normalised`); `with_label_width(sigma)`, the loss against GCE's label of width
    sigma, where it has one (else None). The rest: `reference(z, target, number_tokens)`, the formula on the
    number columns (the tests' oracle); `ceiling(number_tokens)`, its largest value, for
    `reweigh` (ntloss's `loss * m + 1.01 * ceiling * (1 - m)`); `params`, its
    constructor's arguments off their defaults; `check_table(number_tokens)`, raising for
    a table it cannot score.
    """

    name: str
    reads: NumberReads
    loss: Callable
    reference: Callable | None = None
    ceiling: Callable | None = None
    reweigh: bool = False
    params: tuple = ()
    check_table: Callable | None = None
    label: str | None = None
    across_positions: bool = True  # what no integration may assume away unless told
    default_weight: float = DEFAULT_WEIGHT
    combine: str = "add"
    mean_over: str = "counted"
    with_label_width: Callable | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise TypeError(f"expected a NumberLoss's name to be a word (letters, digits, _), got {self.name!r}")
        if not isinstance(self.reads, NumberReads):
            raise TypeError(f"number loss {self.name!r}: expected reads to be a NumberReads, "
                            f"got {type(self.reads).__name__}")
        if not callable(self.loss):
            raise TypeError(f"number loss {self.name!r}: expected loss to be a function, got {self.loss!r}")
        check_bool(self.name, "reweigh", self.reweigh)
        check_bool(self.name, "across_positions", self.across_positions)
        check_number(self.name, "default_weight", self.default_weight, low=0.0)
        check_choice(self.name, "combine", self.combine, COMBINES)
        check_choice(self.name, "mean_over", self.mean_over, MEAN_OVERS)
        if self.reweigh and self.ceiling is None:
            raise ValueError(f"number loss {self.name!r}: expected reweigh=False (the loss has no largest value to "
                             "charge for probability off the number tokens), got reweigh=True")

    @property
    def spec(self) -> str:
        """The loss as a spec string, which `parse` reads back to this loss: its name (a
        loss of your own that a module holds, `"module:name"`, so any process imports it)
        and its parameters.

        Raises:
          ValueError: a loss no spec names (one of your own, not registered).
        """
        if self._rebuilt() is not self:
            raise ValueError(f"number loss {self.name!r} has no spec that parse reads back (got {self._text()!r}); "
                             "name it once with ntl_jax.losses.register(loss), in a module that any process "
                             "can import (docs/guides/losses.md, 'A loss of your own')")
        return self._text(IMPORTABLE.get(self.name))

    def _rebuilt(self):
        """This loss as its spec rebuilds it: the constructor its name is registered by,
        called with its parameters (None where that fails)."""
        constructor = LOSSES.get(self.name)
        if constructor is None:
            return None
        args = dict(self._args())
        mean_over = args.pop(MEAN_OVER, "counted")
        try:
            return with_mean_over(constructor(**args), mean_over)
        except (TypeError, ValueError):
            return None

    def _args(self) -> tuple:
        return self.params + ((("reweigh", True),) if self.reweigh else ())

    def _text(self, name: str | None = None, without: tuple = ()) -> str:
        return spec_text(name or self.name, tuple(arg for arg in self._args() if arg[0] not in without))

    @property
    def shown(self) -> str:
        """The loss as runs and tables name it: `label` (else its spec's name) and its
        parameters."""
        return self._text(self.label or IMPORTABLE.get(self.name))

    def shown_without(self, *params: str) -> str:
        """`shown` without the parameters `params` (`"mean_over"`: as runs of ntl_jax 0.4,
        which had no such parameter, named the loss)."""
        return self._text(self.label or IMPORTABLE.get(self.name), params)

    @property
    def needs_masses(self) -> bool:
        """Whether `at` reads the full-vocabulary probability on the number tokens."""
        return self.reweigh

    def at(self, stats: NumberStats, target: NumberTarget, number_tokens: NumberTokens, masses=None):
        """`(loss, counted)` `[batch, length]`: the loss per position (reweighed with
        `masses = (m, 1 - m)` when `reweigh`; anything where not counted) and the
        positions it counts."""
        loss, counted = self.loss(stats.read(self.reads), target, number_tokens)
        if self.reweigh:
            loss = apply_reweigh(loss, masses, self, number_tokens)
        return loss, counted

    def normalised(self, ntl_sum, ntl_weight_sum, weight_sum, factor=None):
        """The loss normalised as a cross-entropy `ce = sum(weights * CE) / factor` is
        (`factor` None: 1), from its weighted sum `ntl_sum` over the positions it counts,
        their weight `ntl_weight_sum`, and the cross-entropy's weight `weight_sum`.

        `mean_over="counted"`: its mean `ntl_sum / ntl_weight_sum` (0 where nothing is
        counted) times `weight_sum / factor`, so that it stands to `ce` as the mean to
        CE's mean over the target tokens, under any factor (1 where `factor` is
        `weight_sum`). `"targets"`: `ntl_sum / factor`."""
        factor = 1.0 if factor is None else factor
        if self.mean_over == "targets":
            return ntl_sum / factor
        counted = ntl_weight_sum > 0
        mean = jnp.where(counted, ntl_sum / jnp.where(counted, ntl_weight_sum, 1.0), 0.0)
        return mean * (weight_sum / factor)

    def term(self, ce, loss, weight):
        """What the loss adds to the cross-entropy `ce`: `weight * loss`, or with
        `combine="scale_to_ce"` `weight * stop_gradient(ce / loss) * loss` (0 where the
        loss is 0), `loss` the number loss normalised as `ce` is (`normalised`)."""
        if self.combine == "add":
            return weight * loss
        scale = jax.lax.stop_gradient(jnp.where(loss != 0, ce / jnp.where(loss != 0, loss, 1.0), 0.0))
        return weight * scale * loss

    def __repr__(self) -> str:
        return f"NumberLoss({self._text()})"


_NAME = re.compile(r"[A-Za-z_]\w*")


def apply_reweigh(loss, masses, number_loss: NumberLoss, number_tokens: NumberTokens):
    """ntloss's `reweigh`: `loss * m + 1.01 * ceiling * (1 - m)`, `masses = (m, 1 - m)` the
    full-vocabulary probability on the number tokens and on the others."""
    mass, rest = masses
    return loss * mass + _REWEIGH_MARGIN * number_loss.ceiling(number_tokens) * rest


# -- A constructor's parameters (their checks: loss_params.py) ---------------------------


def off_default(**params) -> tuple:
    """`(name, value)` pairs of `params = {name: (value, default)}` whose value is not the default."""
    return tuple((name, value) for name, (value, default) in params.items() if value != default)


def softmax_columns(z):
    return jax.nn.softmax(z, axis=-1)


def number_values(number_tokens: NumberTokens):
    return jnp.asarray(number_tokens.number_values, jnp.float32)


def value_range(number_tokens: NumberTokens):
    v = number_values(number_tokens)
    return jnp.max(v) - jnp.min(v)


def one_hot(target: NumberTarget, number_tokens: NumberTokens):
    return (target.ids[..., None] == jnp.asarray(number_tokens.ids)).astype(jnp.float32)


# -- Specs: the table a loss names itself by, and how it writes its spec ----------------


# The losses a spec names, each by its constructor (a NumberLoss registered as a value: a
# function returning it). `registry.py` fills it, with the shipped losses and those
# `register` adds; it is here so that a loss can write its own spec.
LOSSES: dict[str, Callable[..., NumberLoss]] = {}
# Losses of your own that a module holds, by name: the `"module:attribute"` their spec
# names them by, which any process imports.
IMPORTABLE: dict[str, str] = {}
# The parameter every loss's spec takes: how its term is normalised (`NumberLoss.mean_over`).
MEAN_OVER = "mean_over"


def spec_text(name: str, args: tuple) -> str:
    """`name` or `name(key=value, ...)` of `args`, `(key, value)` pairs."""
    if not args:
        return name
    return f"{name}({', '.join(f'{key}={_spec_value(value)}' for key, value in args)})"


def _spec_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    return str(value)


def with_mean_over(loss: NumberLoss, mean_over: str) -> NumberLoss:
    """`loss` with its sum over the positions it counts normalised as `mean_over` says
    (`MEAN_OVERS`); its spec then says so (`"was(mean_over=targets)"`, ntl_jax 0.4's
    normalisation of NTL-WAS). The same value for the same arguments."""
    check_choice(loss.name, MEAN_OVER, mean_over, MEAN_OVERS)
    return loss if mean_over == loss.mean_over else _with_mean_over(loss, mean_over)


@functools.lru_cache(maxsize=None)
def _with_mean_over(loss: NumberLoss, mean_over: str) -> NumberLoss:
    params = tuple(item for item in loss.params if item[0] != MEAN_OVER) + ((MEAN_OVER, mean_over),)
    return dataclasses.replace(loss, mean_over=mean_over, params=params)


def weight_of(number_loss: NumberLoss | None, ntl_weight: float | None) -> float:
    """λ for `number_loss`: `ntl_weight` as given, or where None the loss's own
    (`NumberLoss.default_weight`; `DEFAULT_WEIGHT` without a loss)."""
    if ntl_weight is not None:
        return ntl_weight
    return DEFAULT_WEIGHT if number_loss is None else number_loss.default_weight
