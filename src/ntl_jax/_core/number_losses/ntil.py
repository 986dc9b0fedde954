"""NTIL, the Numerical Token Integrity Loss."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ntl_jax._core import digit_runs
from ntl_jax._core.compat import is_traced
from ntl_jax._core.loss_params import check_choice, check_number
from ntl_jax._core.number_losses.number_loss import (
    COMBINES,
    NumberLoss,
    number_values,
    off_default,
)
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


