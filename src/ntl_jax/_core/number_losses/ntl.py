"""NTL's family, the paper's losses (ntloss 0.3.2 and the authors' paper code): NTL-WAS,
the losses on the expected value (MSE, MAE, Huber, one of your own), the number-level
loss, and NTL-WAS-CDF."""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax.numpy as jnp
import numpy as np

from ntl_jax._core import digit_runs
from ntl_jax._core.compat import is_traced
from ntl_jax._core.loss_params import check_bool, check_int, check_number
from ntl_jax._core.number_losses.number_loss import (
    NumberLoss,
    number_values,
    off_default,
    one_hot,
    softmax_columns,
    value_range,
)
from ntl_jax._core.number_stats import Columns, NumberReads, NumberStats, expected_value
from ntl_jax._core.number_tokens import NumberTokens, check_squashable, squash_distances
from ntl_jax._core.targets import NumberTarget, gaussian_label

_EPS = float(jnp.finfo(jnp.float32).eps)
# Up to this many number tokens NTL-WAS-CDF sorts them by value with static slices.
_STATIC_PERMUTATION_MAX = 64


# -- NTL-WAS: the Wasserstein-1 distance to the one-hot label --------------------------
# sum_j p_j D(v_j, y), D = |v_j - y| or its squashed form (ntloss's `NTLoss`; the
# closest wrong token costs 1 and the farthest `squash_factor`).



def distance_table(number_tokens: NumberTokens, *, squash_factor: float | None = None):
    """`[N, N]` float32 costs of predicting number token j for target token i: `|v_i -
    v_j|` (ntloss's `dist_lookup`), or with `squash_factor` its squashed form, as
    `was(squash_factor=...)` charges them."""
    if squash_factor is not None:
        squash_factor = check_number("was", "squash_factor", squash_factor, low=1.0, low_inclusive=False)
    return number_tokens.distance_table(squash_factor)


def was(*, squash_factor: float | None = None, reweigh: bool = False) -> NumberLoss:
    """NTL-WAS, the paper's default: `sum_j p_j D(v_j, y)`, `D = |v_j - y|`, or with
    `squash_factor` s > 1 rescaled so the closest wrong token costs 1 and the farthest s
    (ntloss's `NTLoss`)."""
    if squash_factor is not None:
        squash_factor = check_number("was", "squash_factor", squash_factor, low=1.0, low_inclusive=False)
    return _was(squash_factor, check_bool("was", "reweigh", reweigh))


@functools.lru_cache(maxsize=None)
def _was(squash_factor, reweigh) -> NumberLoss:
    def distance(columns: Columns, target: NumberTarget, number_tokens):
        return squash_distances(number_tokens, jnp.abs(columns.value - target.value[..., None]), squash_factor)

    def loss(stats: NumberStats, target, number_tokens):
        return stats.means[0], target.is_number

    def reference(z, target, number_tokens):
        d = squash_distances(number_tokens, jnp.abs(number_values(number_tokens) - target.value[..., None]),
                             squash_factor)
        return jnp.sum(softmax_columns(z) * d, axis=-1), target.is_number

    def ceiling(number_tokens):
        return value_range(number_tokens) if squash_factor is None else jnp.float32(squash_factor)

    return NumberLoss("was", NumberReads(means=(distance,)), loss, reference, ceiling, reweigh,
                      off_default(squash_factor=(squash_factor, None)),
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
    return _expected_value(fn, "expected_value_loss", check_bool("expected_value_loss", "reweigh", reweigh))


def mse(*, reweigh: bool = False) -> NumberLoss:
    """NTL-MSE: `(sum_j p_j v_j - y)^2`."""
    return _expected_value(_squared_error, "mse", check_bool("mse", "reweigh", reweigh))


def mae(*, reweigh: bool = False) -> NumberLoss:
    """NTL-MAE: `|sum_j p_j v_j - y|`."""
    return _expected_value(_absolute_error, "mae", check_bool("mae", "reweigh", reweigh))


def huber(*, reweigh: bool = False) -> NumberLoss:
    """NTL-Huber: the Huber loss (delta 1, as torch's) of `sum_j p_j v_j - y`."""
    return _expected_value(_huber_error, "huber", check_bool("huber", "reweigh", reweigh))


@functools.lru_cache(maxsize=None)
def _expected_value(fn: Callable, name: str, reweigh: bool) -> NumberLoss:
    def loss(stats: NumberStats, target, number_tokens):
        yhat = stats.means[0]
        # Where the target is no number the loss is not counted: the prediction stands
        # in for it there, so `fn` sees a difference of 0 rather than an arbitrary one.
        return fn(yhat, jnp.where(target.is_number, target.value, yhat)), target.is_number

    def reference(z, target, number_tokens):
        yhat = jnp.sum(softmax_columns(z) * number_values(number_tokens), axis=-1)
        return fn(yhat, jnp.where(target.is_number, target.value, yhat)), target.is_number

    def ceiling(number_tokens):
        v = number_values(number_tokens)
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
        return jnp.sum(softmax_columns(z) * fn(number_values(number_tokens), y), axis=-1), target.is_number

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
    return _number_level(check_bool(name, "float_level", float_level),
                         check_int(name, "max_number_length", max_number_length, low=1),
                         check_bool(name, "reweigh", reweigh))


# NumberLevelLoss's `float_level=True`, by its own name.
number_level_float = functools.partial(number_level, float_level=True)


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
        return score(jnp.sum(softmax_columns(z) * number_values(number_tokens), axis=-1), target, number_tokens)

    name = "number_level_float" if float_level else "number_level"
    return NumberLoss(name, NumberReads(means=(expected_value,)), loss, reference,
                      lambda number_tokens: jnp.float32(1.0), reweigh,
                      off_default(max_number_length=(max_number_length, digit_runs.MAX_PLACES)),
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
    return _was_cdf(check_number("was_cdf", "sigma", sigma, low=0.0), check_bool("was_cdf", "reweigh", reweigh))


@functools.lru_cache(maxsize=None)
def _was_cdf(sigma: float, reweigh: bool) -> NumberLoss:
    def label(target, number_tokens):
        hot = one_hot(target, number_tokens)
        if sigma == 0:
            return hot
        gaussian = gaussian_label(target, number_tokens, sigma)
        q = gaussian.at(number_values(number_tokens), number_tokens.at_numbers(number_tokens.digit_counts, jnp.int32))
        return jnp.where(gaussian.smoothed[..., None], q, hot)

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
        return _cdf_gap_sum(softmax_columns(z), label(target, number_tokens), number_tokens), target.is_number

    def ceiling(number_tokens):
        return jnp.float32(number_tokens.num_numbers - 1)

    # Paired with GCE (the authors' GCE + NTL-WAS-CDF), a loss without a width of its own
    # scores against GCE's label.
    with_label_width = (lambda width: _was_cdf(float(width), reweigh)) if sigma == 0 else None
    return NumberLoss("was_cdf", reads, loss, reference, ceiling, reweigh, off_default(sigma=(sigma, 0.0)),
                      label="ntl-was-cdf", with_label_width=with_label_width, across_positions=False)


