"""T5X's loss-normalising factor and the effective weights it implies.

`get_loss_normalizing_factor_and_weights` and `_sum_weights_per_segment` ported exactly,
with one rule for what a special factor is, which the T5X models share; the
cross-entropy and every number loss are divided by the same resolved factor, under the
same weights, so `ntl_weight` means the same thing under every factor.
"""

from __future__ import annotations

import enum
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ntl_jax._core.targets import in_vocabulary


class LossNormalizingFactor(enum.Enum):
    """T5X's `SpecialLossNormalizingFactor`, by the same names and values."""

    NUM_REAL_TARGET_TOKENS = 1
    NUM_TOTAL_TARGET_TOKENS = 2
    AVERAGE_PER_SEQUENCE = 3


def special_factor(factor: Any) -> LossNormalizingFactor | None:
    """The special factor named by a string (any case) or an enum member (ours or
    T5X's), else None (None and numbers); raises ValueError for another name."""
    if isinstance(factor, str):
        name = factor.upper()
    elif isinstance(factor, enum.Enum):
        name = factor.name
    else:
        return None
    try:
        return LossNormalizingFactor[name]
    except KeyError:
        choices = ", ".join(m.name for m in LossNormalizingFactor)
        raise ValueError(
            f"expected loss_normalizing_factor None, a number or one of {choices}; got {factor!r}"
        ) from None


def factor_and_weights(targets, weights, vocab: int, loss_normalizing_factor, *,
                       decoder_segment_ids=None, decoder_positions=None):
    """`(factor, weights)` for checked inputs, as every objective uses them: targets
    outside the vocabulary weighted 0 before anything is counted, then T5X's resolution
    of the factor; a special factor that comes out 0 (nothing counted) becomes 1, so
    every sum is 0 rather than NaN. `weights` comes out float32 `[batch, length]`."""
    special = special_factor(loss_normalizing_factor)
    if weights is None and special is not None:
        weights = jnp.asarray(targets > 0, jnp.float32)  # T5X's default for special factors
    weights = jnp.where(in_vocabulary(targets, vocab), 1.0 if weights is None else weights, 0.0)
    factor, weights = resolve(special, loss_normalizing_factor, targets, weights, decoder_segment_ids,
                               decoder_positions)
    if special is not None:
        factor = max(factor, 1) if isinstance(factor, int) else jnp.where(factor > 0, factor, 1.0)
    return factor, weights


def _sum_weights_per_segment(positions, segment_ids, weights):
    """Total weight of the packed segment each position belongs to (one row).

    A port of T5X's `_sum_weights_per_segment`: segments start where `positions == 0`,
    padding (`segment_ids == 0`) is assumed to come only at the end of a row.
    """

    def repeat_last_nonzero(xs, reverse=False):
        def step(prev, x):
            y = jnp.where(x == 0, prev, x)
            return y, y

        return jax.lax.scan(step, jnp.zeros_like(xs[0]), xs, reverse=reverse)[1]

    starts = positions == 0
    final = jnp.concatenate([starts[1:], jnp.ones(1, dtype=bool)]) & (segment_ids != 0)
    final_cumulative = jnp.where(final, jnp.cumsum(weights), 0.0)
    final_totals = jnp.concatenate(
        [final_cumulative[:1], jnp.diff(repeat_last_nonzero(final_cumulative))]
    )
    return repeat_last_nonzero(final_totals, reverse=True)


def resolve(special, loss_normalizing_factor, targets, weights, decoder_segment_ids, decoder_positions):
    """`(factor, weights)`: T5X's `get_loss_normalizing_factor_and_weights` for checked
    inputs, `special` the special factor named (`special_factor`) or None."""
    if special is None:
        return loss_normalizing_factor, weights
    if weights is None:
        weights = jnp.asarray(targets > 0, jnp.float32)
    weights = jnp.asarray(weights, jnp.float32)
    if special is LossNormalizingFactor.NUM_REAL_TARGET_TOKENS:
        return jnp.sum(weights), weights
    if special is LossNormalizingFactor.NUM_TOTAL_TARGET_TOKENS:
        return int(np.prod(jnp.shape(targets))), weights
    if decoder_segment_ids is not None:
        per_sequence = jax.vmap(_sum_weights_per_segment)(decoder_positions, decoder_segment_ids, weights)
    else:
        per_sequence = jnp.sum(weights, axis=-1, keepdims=True)
    # 0/0 gives 0, without a NaN on the way (it would reach the gradient).
    nonzero = per_sequence != 0
    weights = jnp.where(nonzero, weights / jnp.where(nonzero, per_sequence, 1.0), 0.0)
    return jnp.sum(weights), weights
