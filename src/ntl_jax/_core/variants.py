"""The number losses, each one value: a constructor per loss that checks that loss's own
parameters, its formula as code, and a plain reference beside it.

A `NumberLoss` computes the per-position loss from statistics of the number tokens'
logits `z` (`number_stats.NumberStats`: expectations under `p = softmax(z)` over the
number tokens only, weighted sums of `z`, their log-normaliser), reading what its
`reads` names. Its `reference` is the textbook formula on the `N` number-token columns,
which the tests hold every formulation of `number_stats` against. Every entry point
takes one such value, or a spec string (`parse`: `"was"`, `"smmd(sigma=2, mode=smooth)"`),
so a new loss is one constructor here and one name in `LOSSES`.

Notation, per position: `y` the target's value, `v_j` the number tokens' values,
`p_j = softmax(z)_j` over the number tokens. Positions whose target is no number token
are not counted (the number-level loss counts a number's first token).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
import re
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ntl_jax._core import digit_runs
from ntl_jax._core.compat import is_traced
from ntl_jax._core.number_stats import Columns, NumberReads, NumberStats, expected_value, of_logits
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.targets import NumberTarget, gaussian_label

_EPS = float(jnp.finfo(jnp.float32).eps)
# reweigh: a position whose mass is off the number tokens costs slightly more than the
# worst number token (ntloss's constant).
_REWEIGH_MARGIN = 1.01
# Up to this many number tokens NTL-WAS-CDF sorts them by value with static slices.
_STATIC_PERMUTATION_MAX = 64


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
        _check_bool(self.name, "reweigh", self.reweigh)
        _check_bool(self.name, "across_positions", self.across_positions)
        _check_number(self.name, "default_weight", self.default_weight, low=0.0)
        _check_choice(self.name, "combine", self.combine, COMBINES)
        _check_choice(self.name, "mean_over", self.mean_over, MEAN_OVERS)
        if self.reweigh and self.ceiling is None:
            raise ValueError(f"number loss {self.name!r}: expected reweigh=False (the loss has no largest value to "
                             "charge for probability off the number tokens), got reweigh=True")

    @property
    def spec(self) -> str:
        """The loss as a spec string, which `parse` reads back to this loss.

        Raises:
          ValueError: a loss `parse` cannot read back (one of your own, not registered).
        """
        text = self._text()
        try:
            readable = parse(text) is self
        except (TypeError, ValueError):
            readable = False
        if not readable:
            raise ValueError(f"number loss {self.name!r} has no spec that parse reads back (got {text!r}); "
                             "name it once with ntl_jax.losses.register(loss)")
        return text

    def _text(self, name: str | None = None, without: tuple = ()) -> str:
        args = self.params + ((("reweigh", True),) if self.reweigh else ())
        return _spec_text(name or self.name, tuple(arg for arg in args if arg[0] not in without))

    @property
    def shown(self) -> str:
        """The loss as runs and tables name it: `label` (else `name`) and its parameters."""
        return self._text(self.label)

    def shown_without(self, *params: str) -> str:
        """`shown` without the parameters `params` (`"mean_over"`: as runs of ntl_jax 0.4,
        which had no such parameter, named the loss)."""
        return self._text(self.label, params)

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


# -- Checking a constructor's arguments -------------------------------------------------


def _check_bool(loss: str, param: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"number loss {loss!r}: expected {param} True or False, got {type(value).__name__} {value!r}")
    return bool(value)


def _check_number(loss: str, param: str, value, *, low: float, low_inclusive: bool = True) -> float:
    """`value` as a Python float; raises unless it is a finite Python number above `low`
    (a constant of the program: the losses build their tables on the host)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"number loss {loss!r}: expected {param} to be a Python number, "
                        f"got {type(value).__name__} {value!r}")
    bound = f"{'>=' if low_inclusive else '>'} {low:g}"
    if not math.isfinite(value) or value < low or (value == low and not low_inclusive):
        raise ValueError(f"number loss {loss!r}: expected {param} finite and {bound}, got {value!r}")
    return float(value)


def _check_int(loss: str, param: str, value, *, low: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"number loss {loss!r}: expected {param} to be an integer >= {low}, got {value!r}")
    return int(value)


def _check_choice(loss: str, param: str, value, choices: tuple) -> str:
    if value not in choices:
        raise ValueError(f"number loss {loss!r}: expected {param} in {choices}, got {value!r}")
    return value


def _off_default(**params) -> tuple:
    """`(name, value)` pairs of `params = {name: (value, default)}` whose value is not the default."""
    return tuple((name, value) for name, (value, default) in params.items() if value != default)


def _softmax_columns(z):
    return jax.nn.softmax(z, axis=-1)


def _values(number_tokens: NumberTokens):
    return jnp.asarray(number_tokens.number_values, jnp.float32)


def _value_range(number_tokens: NumberTokens):
    v = _values(number_tokens)
    return jnp.max(v) - jnp.min(v)


def _one_hot(target: NumberTarget, number_tokens: NumberTokens):
    return (target.ids[..., None] == jnp.asarray(number_tokens.ids)).astype(jnp.float32)


# -- NTL-WAS: the Wasserstein-1 distance to the one-hot label --------------------------
# sum_j p_j D(v_j, y), D = |v_j - y| or its squashed form (ntloss's `NTLoss`; the
# closest wrong token costs 1 and the farthest `squash_factor`).


def squash_distances(number_tokens: NumberTokens, distances, squash_factor: float | None):
    """Maps |v_i - v_j| distances (any shape) to their squashed costs: off-diagonal
    distances linearly, so the table's closest wrong token costs 1 and its farthest
    `squash_factor`; a zero distance stays 0. None leaves them as they are."""
    if squash_factor is None:
        return distances
    v = _values(number_tokens)
    table = jnp.abs(v[:, None] - v[None, :])
    closest = jnp.min(jnp.where(table == 0, jnp.finfo(jnp.float32).max, table))
    spread = jnp.max(table) - closest
    # A traced table with fewer than three distinct values: every wrong token costs 1.
    scale = jnp.where(spread > 0, (squash_factor - 1.0) / jnp.where(spread > 0, spread, 1.0), 0.0)
    return jnp.where(distances == 0, 0.0, 1.0 + (distances - closest) * scale)


def distance_table(number_tokens: NumberTokens, *, squash_factor: float | None = None):
    """`[N, N]` float32 costs of predicting number token j for target token i: `|v_i -
    v_j|` (ntloss's `dist_lookup`), or with `squash_factor` its squashed form, as
    `was(squash_factor=...)` charges them."""
    if squash_factor is not None:
        squash_factor = _check_number("was", "squash_factor", squash_factor, low=1.0, low_inclusive=False)
        check_squashable(number_tokens)
    v = _values(number_tokens)
    return squash_distances(number_tokens, jnp.abs(v[:, None] - v[None, :]), squash_factor)


def check_squashable(number_tokens: NumberTokens) -> None:
    """Raises ValueError unless a concrete table has three distinct values: squashing maps
    the closest wrong distance to 1 and the farthest to `squash_factor`."""
    if is_traced(number_tokens.number_values):
        return
    values = np.asarray(number_tokens.number_values, np.float64)
    distinct, counts = np.unique(values, return_counts=True)
    if len(distinct) >= 3:
        return
    duplicated = [float(d) for d, c in zip(distinct, counts) if c > 1]
    dup = f"; value(s) {duplicated} appear on more than one token" if duplicated else ""
    raise ValueError(
        "number loss 'was': expected number tokens with at least 3 distinct values for squash_factor (the "
        f"closest and farthest wrong tokens must differ), got values {[float(x) for x in values]}{dup}")


def was(*, squash_factor: float | None = None, reweigh: bool = False) -> NumberLoss:
    """NTL-WAS, the paper's default: `sum_j p_j D(v_j, y)`, `D = |v_j - y|`, or with
    `squash_factor` s > 1 rescaled so the closest wrong token costs 1 and the farthest s
    (ntloss's `NTLoss`)."""
    if squash_factor is not None:
        squash_factor = _check_number("was", "squash_factor", squash_factor, low=1.0, low_inclusive=False)
    return _was(squash_factor, _check_bool("was", "reweigh", reweigh))


@functools.lru_cache(maxsize=None)
def _was(squash_factor, reweigh) -> NumberLoss:
    def distance(columns: Columns, target: NumberTarget, number_tokens):
        return squash_distances(number_tokens, jnp.abs(columns.value - target.value[..., None]), squash_factor)

    def loss(stats: NumberStats, target, number_tokens):
        return stats.means[0], target.is_number

    def reference(z, target, number_tokens):
        d = squash_distances(number_tokens, jnp.abs(_values(number_tokens) - target.value[..., None]), squash_factor)
        return jnp.sum(_softmax_columns(z) * d, axis=-1), target.is_number

    def ceiling(number_tokens):
        return _value_range(number_tokens) if squash_factor is None else jnp.float32(squash_factor)

    return NumberLoss("was", NumberReads(means=(distance,)), loss, reference, ceiling, reweigh,
                      _off_default(squash_factor=(squash_factor, None)),
                      check_squashable if squash_factor is not None else None, label="ntl-was",
                      across_positions=False)


# -- NTL-MSE / MAE / Huber, any loss on the expected value ------------------------------
# f(sum_j p_j v_j, y) (ntloss's `NTLossDotProduct`).


def _huber(d):
    # torch.nn.functional.huber_loss with delta 1.
    return jnp.where(jnp.abs(d) < 1.0, 0.5 * jnp.square(d), jnp.abs(d) - 0.5)


def _squared_error(prediction, target):
    return jnp.square(prediction - target)


def _absolute_error(prediction, target):
    return jnp.abs(prediction - target)


def _huber_error(prediction, target):
    return _huber(prediction - target)


def expected_value_loss(fn: Callable, *, reweigh: bool = False) -> NumberLoss:
    """NTL-L_p with any loss `fn(prediction, target)` of two float32 `[batch, length]`
    arrays (elementwise, traceable): `fn(sum_j p_j v_j, y)` (ntloss's `loss_function`).
    With `reweigh`, the ceiling is `max(|fn(lo, hi)|, |fn(hi, lo)|)` over the lowest and
    highest values, as ntloss's."""
    if not callable(fn):
        raise TypeError(f"number loss 'expected_value_loss': expected fn to be a function (prediction, target) "
                        f"-> loss, got {fn!r}")
    return _expected_value(fn, "expected_value_loss", _check_bool("expected_value_loss", "reweigh", reweigh))


def mse(*, reweigh: bool = False) -> NumberLoss:
    """NTL-MSE: `(sum_j p_j v_j - y)^2`."""
    return _expected_value(_squared_error, "mse", _check_bool("mse", "reweigh", reweigh))


def mae(*, reweigh: bool = False) -> NumberLoss:
    """NTL-MAE: `|sum_j p_j v_j - y|`."""
    return _expected_value(_absolute_error, "mae", _check_bool("mae", "reweigh", reweigh))


def huber(*, reweigh: bool = False) -> NumberLoss:
    """NTL-Huber: the Huber loss (delta 1, as torch's) of `sum_j p_j v_j - y`."""
    return _expected_value(_huber_error, "huber", _check_bool("huber", "reweigh", reweigh))


@functools.lru_cache(maxsize=None)
def _expected_value(fn: Callable, name: str, reweigh: bool) -> NumberLoss:
    def loss(stats: NumberStats, target, number_tokens):
        yhat = stats.means[0]
        # Where the target is no number the loss is not counted: the prediction stands
        # in for it there, so `fn` sees a difference of 0 rather than an arbitrary one.
        return fn(yhat, jnp.where(target.is_number, target.value, yhat)), target.is_number

    def reference(z, target, number_tokens):
        yhat = jnp.sum(_softmax_columns(z) * _values(number_tokens), axis=-1)
        return fn(yhat, jnp.where(target.is_number, target.value, yhat)), target.is_number

    def ceiling(number_tokens):
        v = _values(number_tokens)
        lo, hi = jnp.min(v), jnp.max(v)
        return jnp.maximum(jnp.abs(fn(lo, hi)), jnp.abs(fn(hi, lo))).astype(jnp.float32)

    params = (("fn", getattr(fn, "__name__", repr(fn))),) if name == "expected_value_loss" else ()
    label = None if name == "expected_value_loss" else "ntl-" + name
    return NumberLoss(name, NumberReads(means=(expected_value,)), loss, reference, ceiling, reweigh, params,
                      label=label, across_positions=False)


def of_expected_value(name: str, fn: Callable, **fields) -> NumberLoss:
    """A loss of your own on the expected value, in one line: `fn(sum_j p_j v_j, y)`,
    `fn` elementwise on two float32 `[batch, length]` arrays, e.g.
    `of_expected_value("log_error", lambda yhat, y: jnp.log1p(jnp.abs(yhat - y)))`.
    `fields`: `NumberLoss`'s (`default_weight`, `label`, ...)."""
    if not callable(fn):
        raise TypeError(f"number loss {name!r}: expected fn(prediction, target) -> loss, got {fn!r}")
    return dataclasses.replace(_expected_value(fn, "expected_value_loss", False), name=name, params=(),
                               label=None, **fields)


def expectation(name: str, fn: Callable, **fields) -> NumberLoss:
    """A loss of your own as an expectation under the number tokens' softmax, in one
    line: `sum_j p_j fn(v_j, y)`, `fn` elementwise on float32 arrays (`v` `[..., N]`, `y`
    `[..., 1]`), e.g. `expectation("squared", lambda v, y: (v - y) ** 2)`. `fields`:
    `NumberLoss`'s (`default_weight`, `label`, ...)."""
    if not callable(fn):
        raise TypeError(f"number loss {name!r}: expected fn(value, target) -> loss, got {fn!r}")

    def at_columns(columns: Columns, target: NumberTarget, number_tokens):
        # Off the number targets the target's value stands in as 0: not counted.
        y = jnp.where(target.is_number, target.value, 0.0)[..., None]
        return fn(columns.value, y)

    def loss(stats: NumberStats, target, number_tokens):
        return stats.means[0], target.is_number

    def reference(z, target, number_tokens):
        y = jnp.where(target.is_number, target.value, 0.0)[..., None]
        return jnp.sum(_softmax_columns(z) * fn(_values(number_tokens), y), axis=-1), target.is_number

    return NumberLoss(name, NumberReads(means=(at_columns,)), loss, reference, **{"across_positions": False, **fields})


# -- The number-level loss: symmetric MAPE on whole numbers -----------------------------
# |yhat - y| / (|yhat| + |y| + eps) per number, at its first token (`NumberLevelLoss`):
# digit runs joined into numbers, the label's values and the expected values alike.


def number_level(*, float_level: bool = False, max_number_length: int = digit_runs.MAX_PLACES,
                 reweigh: bool = False) -> NumberLoss:
    """ntloss's `NumberLevelLoss`: runs of digit targets joined into numbers, each scored
    `|yhat - y| / (|yhat| + |y| + eps)` at its first token; `float_level` lets one `.`
    between digits join them; a number has at most `max_number_length` places (the
    leading digits of a longer one share the highest, as ntloss's). On multi-digit tables
    each token is placed by the digits the tokens after it write (`digit_runs`)."""
    name = "number_level_float" if float_level else "number_level"
    return _number_level(_check_bool(name, "float_level", float_level),
                         _check_int(name, "max_number_length", max_number_length, low=1),
                         _check_bool(name, "reweigh", reweigh))


@functools.lru_cache(maxsize=None)
def _number_level(float_level: bool, max_number_length: int, reweigh: bool) -> NumberLoss:
    def score(yhat_digits, target, number_tokens):
        join = functools.partial(
            digit_runs.join_digit_runs, targets=target.ids, dot_id=number_tokens.dot_id if float_level else None,
            digit_counts=target.digits, opens=target.opens, max_places=max_number_length)
        starts, y = join(target.is_number, target.value)
        _, yhat = join(target.is_number, yhat_digits)
        return jnp.abs(yhat - y) / (jnp.abs(yhat) + jnp.abs(y) + _EPS), starts  # in [0, 1]

    def loss(stats: NumberStats, target, number_tokens):
        return score(stats.means[0], target, number_tokens)

    def reference(z, target, number_tokens):
        return score(jnp.sum(_softmax_columns(z) * _values(number_tokens), axis=-1), target, number_tokens)

    name = "number_level_float" if float_level else "number_level"
    return NumberLoss(name, NumberReads(means=(expected_value,)), loss, reference,
                      lambda number_tokens: jnp.float32(1.0), reweigh,
                      _off_default(max_number_length=(max_number_length, digit_runs.MAX_PLACES)),
                      label="ntl-" + name.replace("_", "-"), across_positions=True)


# -- NTL-WAS-CDF: Wasserstein-1 between CDFs over the value-sorted number tokens ---------
# sum_k |CDF_p(k) - CDF_q(k)| (the authors' `WassersteinNumberTokenLoss`), without
# weighting by the gaps between values: measured in ranks, at most N - 1.


def _rank_distance(columns: Columns, target: NumberTarget, number_tokens):
    return jnp.abs(columns.rank - target.rank[..., None])


def _cdf_gap_sum(p, q, number_tokens: NumberTokens):
    """`sum_k |CDF_p(k) - CDF_q(k)|` over the number tokens sorted by value (ties in id
    order), for `[batch, length, N]` distributions `p` and `q`."""
    gap = p - q
    values = number_tokens.number_values
    if not is_traced(values):  # the usual closure constant: sorted once, on the host
        order = np.argsort(np.asarray(values, np.float32), kind="stable")
        if np.array_equal(order, np.arange(order.size)):
            pass  # ids already in value order (digits): nothing to permute
        elif order.size <= _STATIC_PERMUTATION_MAX:
            # Static slices, not a gather: on the TPU each gathered element (and each
            # scattered one in the gradient) costs a memory tile.
            gap = jnp.stack([gap[..., int(i)] for i in order], axis=-1)
        else:
            gap = jnp.take(gap, order, axis=-1)
    else:
        gap = jnp.take(gap, jnp.argsort(jnp.asarray(values, jnp.float32), stable=True), axis=-1)
    # One cumulative sum of the difference: its partial sums stay accurate where both
    # CDFs approach 1. The last term (1 - 1) is left out.
    return jnp.sum(jnp.abs(jnp.cumsum(gap, axis=-1)[..., :-1]), axis=-1)


def was_cdf(*, sigma: float = 0.0, reweigh: bool = False) -> NumberLoss:
    """NTL-WAS-CDF (the authors' paper code): `sum_k |CDF_p(k) - CDF_q(k)|` over the number
    tokens sorted by value, against the one-hot label `q`, or with `sigma` > 0 against a
    Gaussian label of that width (as GCE's, `targets.gaussian_label`; the authors pair it
    with GCE of the same width)."""
    return _was_cdf(_check_number("was_cdf", "sigma", sigma, low=0.0), _check_bool("was_cdf", "reweigh", reweigh))


@functools.lru_cache(maxsize=None)
def _was_cdf(sigma: float, reweigh: bool) -> NumberLoss:
    def label(target, number_tokens):
        one_hot = _one_hot(target, number_tokens)
        if sigma == 0:
            return one_hot
        gaussian = gaussian_label(target, number_tokens, sigma)
        q = gaussian.at(_values(number_tokens), number_tokens.at_numbers(number_tokens.digit_counts, jnp.int32))
        return jnp.where(gaussian.smoothed[..., None], q, one_hot)

    if sigma == 0:
        # Against a one-hot label at place t, CDF_q steps from 0 to 1 at t, so the sum is
        # the expected distance in rank sum_j p_j |r_j - r_t|: an expectation, no sort of p.
        def loss(stats: NumberStats, target, number_tokens):
            return stats.means[0], target.is_number

        reads = NumberReads(means=(_rank_distance,))
    else:
        def loss(stats: NumberStats, target, number_tokens):
            return _cdf_gap_sum(stats.probs, label(target, number_tokens), number_tokens), target.is_number

        reads = NumberReads(probs=True)

    def reference(z, target, number_tokens):
        return _cdf_gap_sum(_softmax_columns(z), label(target, number_tokens), number_tokens), target.is_number

    def ceiling(number_tokens):
        return jnp.float32(number_tokens.num_numbers - 1)

    # Paired with GCE (the authors' GCE + NTL-WAS-CDF), a loss without a width of its own
    # scores against GCE's label.
    with_label_width = (lambda width: _was_cdf(float(width), reweigh)) if sigma == 0 else None
    return NumberLoss("was_cdf", reads, loss, reference, ceiling, reweigh, _off_default(sigma=(sigma, 0.0)),
                      label="ntl-was-cdf", with_label_width=with_label_width, across_positions=False)


# -- DEL, the Digit Entropy Loss (Zheng et al., arXiv 2605.20369) -----------------------
# w * sum_k p_k BCE(z_k, [k = y]), BCE(z, t) = softplus(z) - t z the binary
# cross-entropy with logits, gradient through both p and BCE; w the target's place
# weight in its number (`digit_runs.place_weights`). Since BCE's target term is
# nonzero at k = y only: sum_k p_k softplus(z_k) - p_y z_y, two expectations.


@of_logits
def _softplus(columns: Columns, target: NumberTarget, number_tokens):
    return jax.nn.softplus(columns.logit)


@of_logits
def _target_logit(columns: Columns, target: NumberTarget, number_tokens):
    return jnp.where(columns.id == target.ids[..., None], columns.logit, 0.0)


def _del_loss(stats: NumberStats, target, number_tokens):
    weight = digit_runs.place_weights(target, number_tokens)
    return weight * (stats.means[0] - stats.means[1]), target.is_number


def _del_reference(z, target, number_tokens):
    bce = jax.nn.softplus(z) - _one_hot(target, number_tokens) * z
    weight = digit_runs.place_weights(target, number_tokens)
    return weight * jnp.sum(_softmax_columns(z) * bce, axis=-1), target.is_number


# The authors' weight on this objective (docs/guides/losses.md, "Weights").
_DEL = NumberLoss("del", NumberReads(means=(_softplus, _target_logit)), _del_loss, _del_reference,
                  across_positions=True, default_weight=0.001)


def digit_entropy() -> NumberLoss:
    """DEL, the Digit Entropy Loss (Zheng et al., arXiv 2605.20369), named `"del"` in a
    spec: `w * sum_k p_k BCE(z_k, [k = y])`, BCE with logits, the gradient through both;
    `w` the target's place in its number: an integer digit `k` places left of the point
    (ones: 1) weighs `2k`, the `m`-th decimal digit `1.02^-(m + 1)`. The authors add
    `0.01 * mean over (digit positions x 10 digits)` to a token-mean CE."""
    return _DEL


# -- DIST², KL to a distance-smoothed label (Chung et al., arXiv 2503.02379) ------------
# KL(q || p) with q_j ∝ exp(-(v_j - y)^2 / tau) over the number tokens:
# sum_j q_j log q_j - sum_j q_j z_j + log sum_j exp(z_j), a weighted sum of the logits
# and the log-normaliser (sum_j q_j = 1).


def dist2(*, tau: float = 1.0) -> NumberLoss:
    """DIST² (Chung et al., arXiv 2503.02379): `KL(q || p)`, `q_j ∝ exp(-(v_j - y)^2 / tau)`
    over the number tokens; the authors weigh it by 0.1 next to CE."""
    return _dist2(_check_number("dist2", "tau", tau, low=0.0, low_inclusive=False))


@functools.lru_cache(maxsize=None)
def _dist2(tau: float) -> NumberLoss:
    def log_label(values, target: NumberTarget, number_tokens):
        """`log q` at the columns of `values`: the log-softmax of `-(v - y)^2 / tau`
        over the number tokens (its normaliser always over the `N` number tokens)."""
        def logit(v):
            return -jnp.square(v - target.value[..., None]) / tau
        return logit(values) - jax.nn.logsumexp(logit(_values(number_tokens)), axis=-1, keepdims=True)

    def label(columns: Columns, target: NumberTarget, number_tokens):
        q = jnp.exp(log_label(columns.value, target, number_tokens))
        return jnp.where(target.is_number[..., None], q, 0.0)

    def negative_entropy(target, number_tokens):
        log_q = log_label(_values(number_tokens), target, number_tokens)
        return jnp.sum(jnp.exp(log_q) * log_q, axis=-1)

    def loss(stats: NumberStats, target, number_tokens):
        kl = negative_entropy(target, number_tokens) - stats.sums[0] + stats.log_normalizer
        return kl, target.is_number

    def reference(z, target, number_tokens):
        log_q = log_label(_values(number_tokens), target, number_tokens)
        return jnp.sum(jnp.exp(log_q) * (log_q - jax.nn.log_softmax(z, axis=-1)), axis=-1), target.is_number

    return NumberLoss("dist2", NumberReads(sums=(label,)), loss, reference, params=_off_default(tau=(tau, 1.0)),
                      default_weight=0.1, across_positions=False)  # the authors' weight


# -- SMMD, Smooth MMD (arXiv 2606.27731; code Zuozhuo/smmd-loss) -----------------------
# At a target t of SMMD's number tokens (integers 0..999 written alone), with p the
# softmax over those tokens only and r = p - onehot(t): relu(r'Kr + alpha r'(D - K)r),
# K_ij = exp(-d'(v_i, v_j)^2 / (2 sigma^2)) clipped to [0, 1], d' the value distance
# squashed affinely (0 stays 0, the closest pair 1, the farthest `squash_factor`),
# D = diag(sum_j K_ij). One matvec K p per position: with K symmetric,
# r'Kr = p'Kp - 2 (Kp)_t + K_tt and r'Dr = sum_j deg_j p_j^2 - 2 deg_t p_t + deg_t.

SMMD_MODES = ("smmd", "mmd", "smooth")
# The authors' defaults (`SMMDLoss`): both terms, sigma 2, distances squashed to [1, 9],
# integers up to 999 (`build_integer_vnum_from_tokenizer`'s `max_value`).
SMMD_SIGMA = 2.0
SMMD_SQUASH_FACTOR = 9.0
SMMD_MAX_VALUE = 999


def smmd_support(number_tokens: NumberTokens, xp=jnp):
    """`[N]` bool: the number tokens SMMD scores, those the authors' tokenizer probe finds:
    an integer 0..`SMMD_MAX_VALUE` written as its plain digits, so "7" and "120" but not
    "07", "00" (a leading zero), "3.5", "-1" (a point or sign: no digit count), "1000".
    A prefixed piece read with `prefixed_numbers=True` ("Ġ12") counts by its digits."""
    v = xp.asarray(number_tokens.number_values, xp.float32)
    if xp is jnp:
        digits = number_tokens.at_numbers(number_tokens.digit_counts, jnp.int32)
    else:  # on the host (`at_numbers` would stage a conversion under `jit`)
        digits = np.asarray(number_tokens.digit_counts)[np.asarray(number_tokens.ids)]
    written = 1 + (v >= 10).astype(xp.int32) + (v >= 100).astype(xp.int32)  # "0" writes one digit
    return (v == xp.floor(v)) & (v >= 0) & (v <= SMMD_MAX_VALUE) & (digits == written)


def smmd_kernel(number_tokens: NumberTokens, sigma: float = SMMD_SIGMA, squash_factor: float = SMMD_SQUASH_FACTOR):
    """`(support, K, alpha)`: `smmd_support`, the `[N, N]` kernel over the number tokens
    (0 in every row and column off the support) and the default smoothness weight
    `1 / (2 mean_i sum_j K_ij)` over the support, float32. As the authors' `squash_distances`,
    distances are left as they are where the support has fewer than three distinct values.
    Built on the host for a concrete table (constants of the program).

    Raises:
      ValueError: a concrete table without a number token in SMMD's support.
    """
    traced = is_traced(number_tokens.number_values) or is_traced(number_tokens.digit_counts) \
        or is_traced(number_tokens.ids)
    xp = jnp if traced else np
    support = smmd_support(number_tokens, xp)
    if not traced and not support.any():
        raise ValueError(f"number loss 'smmd': expected number tokens writing an integer 0..{SMMD_MAX_VALUE} alone "
                         f"(no leading zero, sign or point), got none among the values "
                         f"{np.asarray(number_tokens.number_values).tolist()[:20]}")
    v = xp.asarray(number_tokens.number_values, xp.float64 if xp is np else xp.float32)
    pair = support[:, None] & support[None, :]
    d = xp.abs(v[:, None] - v[None, :])
    closest = xp.min(xp.where(pair & (d > 0), d, xp.inf))
    farthest = xp.max(xp.where(pair, d, 0.0))
    squashes = farthest > closest  # false with fewer than three distinct values
    scale = (squash_factor - 1.0) / xp.where(squashes, farthest - closest, 1.0)
    d = xp.where(squashes & (d > 0), 1.0 + (d - closest) * scale, d)
    kernel = xp.where(pair, xp.clip(xp.exp(-xp.square(d) / (2.0 * sigma ** 2)), 0.0, 1.0), 0.0)
    mean_degree = xp.sum(kernel) / xp.maximum(xp.sum(support), 1)
    alpha = 0.5 / xp.maximum(mean_degree, 1e-12)
    return support, xp.asarray(kernel, xp.float32), xp.asarray(alpha, xp.float32)


def _smmd_terms(z, target: NumberTarget, number_tokens, sigma, squash_factor):
    """`(p, q, K, alpha, counted)` of the number tokens' logits `z` `[batch, length, N]`:
    `p` the softmax over SMMD's support (0 off it), `q` the one-hot label on it."""
    support, kernel, alpha = smmd_kernel(number_tokens, sigma, squash_factor)
    support = jnp.asarray(support)
    q = _one_hot(target, number_tokens) * support
    counted = target.is_number & (jnp.sum(q, axis=-1) > 0)
    p = jax.nn.softmax(jnp.where(support, z, -jnp.inf), axis=-1)
    return jnp.where(support, p, 0.0), q, jnp.asarray(kernel), alpha, counted


def _smmd_combine(mmd, smooth, mode, alpha):
    # The quadratic forms are >= 0 (K and D - K are positive semidefinite); relu guards
    # against their rounding, as the authors'.
    return jax.nn.relu({"smmd": mmd + alpha * smooth, "mmd": mmd, "smooth": alpha * smooth}[mode])


def smmd(*, mode: str = "smmd", sigma: float = SMMD_SIGMA, alpha: float | None = None,
         squash_factor: float = SMMD_SQUASH_FACTOR) -> NumberLoss:
    """SMMD, Smooth MMD (arXiv 2606.27731; the authors' `SMMDLoss`): `relu(r'Kr + alpha
    r'(D - K)r)`, `r = p - onehot(y)` over SMMD's number tokens (integers 0..999 written
    alone, `smmd_support`), `K_ij = exp(-d'(v_i, v_j)^2 / (2 sigma^2))` with `d'` the
    value distance squashed to [1, `squash_factor`], `D = diag(sum_j K_ij)`. `mode`:
    `"smmd"` (both terms), `"mmd"` (r'Kr) or `"smooth"` (alpha r'(D - K)r); `alpha` None
    is `1 / (2 mean degree)`, the authors' "auto"."""
    return _smmd(_check_choice("smmd", "mode", mode, SMMD_MODES),
                 _check_number("smmd", "sigma", sigma, low=0.0, low_inclusive=False),
                 None if alpha is None else _check_number("smmd", "alpha", alpha, low=0.0),
                 _check_number("smmd", "squash_factor", squash_factor, low=1.0, low_inclusive=False))


@functools.lru_cache(maxsize=None)
def _smmd(mode: str, sigma: float, alpha: float | None, squash_factor: float) -> NumberLoss:
    def loss(stats: NumberStats, target, number_tokens):
        p, q, kernel, default_alpha, counted = _smmd_terms(stats.columns, target, number_tokens, sigma,
                                                             squash_factor)
        kp = p @ kernel  # N^2 multiply-adds per position; K is symmetric
        degree = jnp.sum(kernel, axis=-1)
        mmd = jnp.sum(p * kp, axis=-1) - 2.0 * jnp.sum(q * kp, axis=-1) + jnp.sum(q * jnp.diagonal(kernel), axis=-1)
        diagonal = jnp.sum(degree * p * (p - 2.0 * q), axis=-1) + jnp.sum(q * degree, axis=-1)  # r'Dr
        return _smmd_combine(mmd, diagonal - mmd, mode, default_alpha if alpha is None else alpha), counted

    def reference(z, target, number_tokens):
        p, q, kernel, default_alpha, counted = _smmd_terms(z, target, number_tokens, sigma, squash_factor)
        r = p - q
        laplacian = jnp.diag(jnp.sum(kernel, axis=-1)) - kernel
        mmd = jnp.einsum("...i,ij,...j->...", r, kernel, r)
        smooth = jnp.einsum("...i,ij,...j->...", r, laplacian, r)
        return _smmd_combine(mmd, smooth, mode, default_alpha if alpha is None else alpha), counted

    params = _off_default(mode=(mode, "smmd"), sigma=(sigma, SMMD_SIGMA), alpha=(alpha, None),
                          squash_factor=(squash_factor, SMMD_SQUASH_FACTOR))
    # The authors' module adds the loss unweighted.
    return NumberLoss("smmd", NumberReads(columns=True), loss, reference, params=params,
                      check_table=lambda number_tokens: smmd_kernel(number_tokens, sigma, squash_factor),
                      default_weight=1.0, across_positions=False)


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
        return _check_number("ntil", param, value, low=0.0, low_inclusive=False)

    return _ntil(_check_number("ntil", "digit_alpha", digit_alpha, low=0.0),
                 _check_number("ntil", "abs_alpha", abs_alpha, low=0.0),
                 _check_number("ntil", "mag_alpha", mag_alpha, low=0.0), positive("digit_exp", digit_exp),
                 positive("tau", tau), _check_choice("ntil", "combine", combine, COMBINES))


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
    v = _values(number_tokens)
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

    params = _off_default(digit_alpha=(digit_alpha, NTIL_DIGIT_ALPHA), abs_alpha=(abs_alpha, NTIL_ABS_ALPHA),
                          mag_alpha=(mag_alpha, NTIL_MAG_ALPHA), digit_exp=(digit_exp, NTIL_DIGIT_EXP),
                          tau=(tau, NTIL_TAU), combine=(combine, "scale_to_ce"))
    return NumberLoss("ntil", NumberReads(columns=True), loss, at_first, params=params,
                      check_table=check_digit_table, across_positions=True, combine=combine)


# -- By name, and from a spec string -------------------------------------------------


# The losses a spec names, each by its constructor: the shipped ones, then those
# `register` adds.
LOSSES: dict[str, Callable[..., NumberLoss]] = {
    "was": was,
    "mse": mse,
    "mae": mae,
    "huber": huber,
    "number_level": number_level,
    "number_level_float": functools.partial(number_level, float_level=True),
    "was_cdf": was_cdf,
    "del": digit_entropy,
    "dist2": dist2,
    "smmd": smmd,
    "ntil": ntil,
}
# The shipped losses' names.
NAMES = tuple(LOSSES)
# What a spec for no number loss at all (cross-entropy alone) says.
NONE = "none"
_SPEC = re.compile(r"\s*([A-Za-z_][\w-]*)\s*(?:\((.*)\))?\s*", re.S)
_EXAMPLE = "a spec such as 'was' or 'smmd(sigma=2, mode=smooth)'"


def register(loss):
    """Names `loss` for every surface configured by strings: `parse`, gin, MaxText's
    key, the trainer's `--loss`, a run's recorded identity, Keras saving. `loss` is a
    `NumberLoss` (its spec is then its `name`) or a constructor returning one (keyword
    parameters become the spec's). Returns `loss`, so it can decorate a constructor.
    Another process (a launcher, a loader) finds it where a package names it as an entry
    point of the group `"ntl_jax.losses"`.

    Raises:
      ValueError: the name is already another loss's.
    """
    made = loss if isinstance(loss, NumberLoss) else None
    if made is None:
        if not callable(loss):
            raise TypeError(f"expected a NumberLoss or a function returning one, got {type(loss).__name__} {loss!r}")
        made = loss()
        if not isinstance(made, NumberLoss):
            raise TypeError(f"expected {loss!r}() to return a NumberLoss, got {type(made).__name__}")
    name = made.name
    taken = LOSSES.get(name) or _by_label().get(name)
    if taken is not None and taken is not loss and not (isinstance(loss, NumberLoss) and _made(taken) is loss):
        raise ValueError(f"expected a number loss name not yet taken, got {name!r}, already "
                         f"{'shipped' if name in NAMES else 'registered'}: choose another name")
    LOSSES[name] = (lambda: loss) if isinstance(loss, NumberLoss) else loss
    _by_label.cache_clear()
    return loss


# Packages name their losses for every process (a launcher, a saved model's loader) as
# entry points of this group: `squared = "my_package.losses:squared"`, a NumberLoss or a
# constructor, registered the first time a spec names it.
ENTRY_POINTS = "ntl_jax.losses"


def _from_entry_points(name: str) -> bool:
    """Registers the loss an installed package names `name` in `ENTRY_POINTS`; whether
    one did."""
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINTS, name=name):
        loss = point.load()
        made = loss if isinstance(loss, NumberLoss) else loss()
        if made.name != name:
            raise ValueError(f"expected the entry point {point.value!r} ({ENTRY_POINTS}) to give the number loss "
                             f"{name!r}, got {made.name!r}")
        register(loss)
        return True
    return False


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


def _spec_text(name: str, args: tuple) -> str:
    if not args:
        return name
    return f"{name}({', '.join(f'{key}={_spec_value(value)}' for key, value in args)})"


def _spec_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    return str(value)


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
    `LOSSES` (or the label runs show it by: `"ntl-was"`), values numbers, `true`/`false`,
    `none` or words (`"smmd(sigma=2, mode=smooth)"`). The one parser of every surface
    configured by strings (gin, MaxText's keys, the command line, a run's recorded
    identity); `NumberLoss.spec` writes it back.

    Raises:
      ValueError: a malformed spec, an unknown loss or parameter, or a bad value, named.
    """
    if not isinstance(spec, str):
        raise TypeError(f"expected {_EXAMPLE}, got {type(spec).__name__} {spec!r}")
    match = _SPEC.fullmatch(spec)
    if match is None:
        raise ValueError(f"expected {_EXAMPLE}, got {spec!r}")
    name, arguments = match.group(1), match.group(2)
    if name not in LOSSES and name not in _by_label() and not _from_entry_points(name):
        raise ValueError(f"expected a number loss in {tuple(LOSSES)} (or one of their labels "
                         f"{tuple(_by_label())}, or {NONE!r}), got {name!r} in the spec {spec!r}; a loss of "
                         "your own is named once with ntl_jax.losses.register(loss)")
    kwargs = {}
    for item in filter(str.strip, (arguments or "").split(",")):
        key, equals, value = item.partition("=")
        key = key.strip()
        if not equals or not key.isidentifier():
            raise ValueError(f"number loss {name!r}: expected param=value in the spec {spec!r}, got {item.strip()!r}")
        if key not in parameters(name) and key != MEAN_OVER:
            raise ValueError(f"number loss {name!r} has no parameter {key!r} (it takes {parameters(name)}, and "
                             f"every loss {MEAN_OVER}); in the spec {spec!r}")
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


# The parameter every loss's spec takes: how its term is normalised (`NumberLoss.mean_over`).
MEAN_OVER = "mean_over"


def with_mean_over(loss: NumberLoss, mean_over: str) -> NumberLoss:
    """`loss` with its sum over the positions it counts normalised as `mean_over` says
    (`MEAN_OVERS`); its spec then says so (`"was(mean_over=targets)"`, ntl_jax 0.4's
    normalisation of NTL-WAS). The same value for the same arguments."""
    _check_choice(loss.name, MEAN_OVER, mean_over, MEAN_OVERS)
    return loss if mean_over == loss.mean_over else _with_mean_over(loss, mean_over)


@functools.lru_cache(maxsize=None)
def _with_mean_over(loss: NumberLoss, mean_over: str) -> NumberLoss:
    params = tuple(item for item in loss.params if item[0] != MEAN_OVER) + ((MEAN_OVER, mean_over),)
    return dataclasses.replace(loss, mean_over=mean_over, params=params)


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


def weight_of(number_loss: NumberLoss | None, ntl_weight: float | None) -> float:
    """λ for `number_loss`: `ntl_weight` as given, or where None the loss's own
    (`NumberLoss.default_weight`; `DEFAULT_WEIGHT` without a loss)."""
    if ntl_weight is not None:
        return ntl_weight
    return DEFAULT_WEIGHT if number_loss is None else number_loss.default_weight
