"""The labels, per position: which positions count, what each target is among the
number tokens, and GCE's Gaussian-smoothed label. Built once per call, from checked
inputs, and read by every term.

A position is ignored when its weight is 0 or its target id is outside `[0, vocab)`
(T5X's rule, without an error; ntloss's `ignore_index`): its target becomes -1, no
number token and no digit, so it breaks digit runs, and whatever its logits hold
reaches no loss and no gradient.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntl_jax._core.compat import is_traced
from ntl_jax._core.number_tokens import NumberTokens


class NumberTarget(NamedTuple):
    """The label of every position, `[batch, length]` each.

    - `ids`: the target ids, -1 at ignored positions;
    - `keep`: bool, False at ignored positions;
    - `is_number`: bool, the target is a number token;
    - `value`: its value (0 where no number);
    - `rank`: its place among the number tokens sorted by value (`number_ranks`; 0 where
      no number);
    - `digits`: how many plain digits it writes (`NumberTokens.digit_counts`; 0 where
      no number, and for number tokens with a sign, point or exponent);
    - `opens`: bool, it begins a new number whatever precedes it (`opens_number`);
    - `label`: Gaussian-smoothed cross-entropy's label (`GaussianLabel`), or None for
      the one-hot.
    """

    ids: jax.Array
    keep: jax.Array
    is_number: jax.Array
    value: jax.Array
    rank: jax.Array
    digits: jax.Array
    opens: jax.Array
    label: Any = None


class GaussianLabel(NamedTuple):
    """GCE's label at its smoothed positions, as a function of a number token's value
    and digit count (`at`), so it can be placed at any columns: the `N` number tokens',
    or the whole vocabulary's (`number_stats`)."""

    smoothed: jax.Array  # [batch, length] bool
    value: jax.Array  # [batch, length] the target's value y
    count: jax.Array  # [batch, length] int32, the digits the target writes
    scale: jax.Array  # 1 / (2 sigma^2)
    total: jax.Array  # [batch, length] the Gaussian's sum over the number tokens, >= 1 where smoothed

    def gaussian(self, values, counts):
        """`[batch, length, C]` `exp(-(v - y)^2 / (2 sigma^2))` at the columns of `values`
        that write as many digits as the target (`counts`, 0 off the numbers), 0 elsewhere."""
        same = self.smoothed[..., None] & (counts == self.count[..., None])
        return jnp.where(same, jnp.exp(-jnp.square(values - self.value[..., None]) * self.scale), 0.0)

    def at(self, values, counts):
        """`q` `[batch, length, C]` at the columns of `values` and `counts` (0 at
        positions not smoothed)."""
        return self.gaussian(values, counts) / jnp.where(self.smoothed, self.total, 1.0)[..., None]


def gaussian_label(target: NumberTarget, number_tokens: NumberTokens, gce_sigma: float) -> GaussianLabel:
    """GCE's label with a checked `gce_sigma` > 0: at a number target of value `y` that
    writes `c` > 0 digits, `q_j = exp(-(v_j - y)^2 / (2 sigma^2))` over the number tokens
    that write `c` digits, normalised over them, 0 on the others. On single-digit tables
    that is all the digits, as in the authors' `GaussianLabelSmoother`; "07" is smoothed
    over the 2-digit pieces. Number tokens with a sign, point or exponent ("-1", "3.5",
    digit count 0), and other targets, keep their one-hot."""
    # 1 / (2 sigma^2), held finite so a tiny sigma gives the one-hot rather than 0 * inf.
    with np.errstate(over="ignore", divide="ignore"):
        scale = float(min(np.float64(0.5) / np.float64(gce_sigma) ** 2, np.finfo(np.float32).max))
    label = GaussianLabel(target.is_number & (target.digits > 0), target.value, target.digits, jnp.float32(scale),
                          jnp.ones(jnp.shape(target.value)))
    gaussian = label.gaussian(jnp.asarray(number_tokens.number_values, jnp.float32),
                              number_tokens.at_numbers(number_tokens.digit_counts, jnp.int32))
    # The target itself is among them at distance 0, so a smoothed row sums to >= 1.
    return label._replace(total=jnp.sum(gaussian, axis=-1))


def in_vocabulary(targets, vocab_size: int):
    """`[batch, length]` bool, False where the target id is outside `[0, vocab_size)`."""
    return (targets >= 0) & (targets < vocab_size)


def number_target(targets, weights, vocab_size: int, number_tokens: NumberTokens | None, *,
                  gce_sigma: float = 0.0) -> NumberTarget:
    """The `NumberTarget` of checked `targets` under `weights` (None: all 1) for logits
    with `vocab_size` columns, with GCE's Gaussian label for a checked `gce_sigma` > 0;
    with `number_tokens` None (cross-entropy alone) no target is a number.

    Per-target facts are read through a compare with the `N` number-token ids rather
    than gathered from `[vocab]` tables by target id: on the TPU each gathered element
    costs a memory tile (libtpu's compiler counts 4 KiB), while this is a compare and a
    sum fused with the other per-position arithmetic."""
    keep = in_vocabulary(targets, vocab_size)
    if weights is not None:
        keep &= weights != 0
    ids = jnp.where(keep, targets, -1)
    if number_tokens is None:
        no = jnp.zeros(jnp.shape(ids), bool)
        zero = jnp.zeros(jnp.shape(ids), jnp.float32)
        return NumberTarget(ids, keep, no, zero, zero, jnp.zeros(jnp.shape(ids), jnp.int32), no)
    numbers = jnp.asarray(number_tokens.ids)
    match = ids[..., None] == numbers

    def pick(table, dtype):
        return jnp.sum(jnp.where(match, jnp.asarray(table, dtype), jnp.zeros((), dtype)), axis=-1)

    target = NumberTarget(
        ids=ids,
        keep=keep,
        is_number=jnp.any(match, axis=-1),
        value=pick(number_tokens.number_values, jnp.float32),
        rank=pick(number_ranks(number_tokens), jnp.float32),
        digits=pick(number_tokens.at_numbers(number_tokens.digit_counts, jnp.int32), jnp.int32),
        opens=jnp.any(match & number_tokens.at_numbers(number_tokens.opens_number, bool), axis=-1),
    )
    if gce_sigma > 0:
        target = target._replace(label=gaussian_label(target, number_tokens, gce_sigma))
    return target


def number_ranks(number_tokens: NumberTokens):
    """`[N]` float32: each number token's place (0 to N - 1) when the number tokens are
    sorted by value, ties in `number_tokens.ids` order (as NTL-WAS-CDF sorts them); a
    NumPy array (a constant of the program) unless the values are traced."""
    values = number_tokens.number_values
    if is_traced(values):
        order = jnp.argsort(jnp.asarray(values, jnp.float32), stable=True)
        return jnp.zeros(order.shape, jnp.float32).at[order].set(jnp.arange(order.shape[0], dtype=jnp.float32))
    order = np.argsort(np.asarray(values, np.float32), kind="stable")
    ranks = np.empty(order.shape, np.float32)
    ranks[order] = np.arange(order.shape[0])
    return ranks
