"""What every term of the objective needs from the `[batch, length, vocab]` logits: a
few numbers per position (`HeadStats`), computed here from the logits; the fused head
computes the same from the hidden states without forming the logits (`fused.py`).

Every statistic reads the logits widened to float32, a conversion XLA fuses into each
pass rather than a copy, so the gradients of all of them add up in float32 and are
rounded to the logits' dtype once. Whatever the logits hold at ignored positions (NaN,
inf) reaches no statistic and no gradient: each statistic is masked where it is
`[batch, length]` or `[batch, length, N]`, and the gradients that read the logits
select it away. Each gradient is elementwise (the target's a select, the
log-normaliser's below, the number statistics' see `number_stats`), so XLA computes the
whole logits gradient in one fused pass.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ntl_jax._core import number_stats
from ntl_jax._core.number_stats import NumberReads, NumberStats
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.targets import NumberTarget


class HeadStats(NamedTuple):
    """Per position, all float32 `[batch, length]`: the cross-entropy, z-loss and every
    number loss are functions of these, so the logits themselves can be streamed.

    - `log_normalizer`: `logsumexp(logits)` over the vocabulary;
    - `target_logit`: the target's logit (0 where the target is ignored);
    - `logit_sum`: the sum of the logits over the vocabulary (label smoothing only, else None);
    - `numbers`: the number tokens' statistics (`NumberStats`), or None (cross-entropy only);
    - `masses`: `(mass, rest)`, the probability on number tokens and on the others
      (`with_masses` only, else None).
    """

    log_normalizer: jax.Array
    target_logit: jax.Array
    logit_sum: jax.Array | None
    numbers: NumberStats | None
    masses: tuple | None


def from_logits(logits, target: NumberTarget, number_tokens: NumberTokens, reads: NumberReads | None, *,
                label_smoothing: float = 0.0, with_masses: bool = False) -> HeadStats:
    """`HeadStats` of checked logits (any float dtype) at the positions `target.keep`:
    the number statistics `reads` (None: none, cross-entropy only), the logit sum with
    `label_smoothing`, the masses with `with_masses` (from the same sums as the
    log-normaliser)."""
    logits = jnp.asarray(logits)
    wide = logits.astype(jnp.float32)
    keep = target.keep
    numbers = None
    if reads is not None:
        numbers = number_stats.number_stats(wide, target, number_tokens, reads, logits=logits)
    masses = None
    if with_masses:
        log_normalizer, masses = _number_mass(wide, numbers, keep, logits)
        log_normalizer = jnp.where(keep, log_normalizer, 0.0)
    else:
        log_normalizer = log_normalizer_of(wide, keep, logits=logits)
    # The sum's gradient does not read the logits, so masking its value is enough.
    logit_sum = jnp.where(keep, jnp.sum(wide, axis=-1), 0.0) if label_smoothing > 0 else None
    in_vocab = target.ids >= 0
    target_logit = take_target_logit(wide, jnp.where(in_vocab, target.ids, 0), logits)
    return HeadStats(
        log_normalizer=log_normalizer,
        target_logit=jnp.where(in_vocab, target_logit, 0.0),
        logit_sum=logit_sum,
        numbers=numbers,
        masses=masses,
    )


def _number_mass(wide, numbers: NumberStats, keep, logits):
    """`(log_normalizer, (mass, rest))`, each `[batch, length]` float32: the logsumexp
    of the float32 logits `wide` over the vocabulary, and the full-vocabulary
    probability on the number tokens and on the other tokens, from the number tokens'
    statistics `numbers` (`number_stats`). `logits`, the logits in their own dtype
    (default `wide`), give the shift (see `log_normalizer`).

    `keep` (`[batch, length]` bool, or None for all) marks the positions whose logits
    are used: elsewhere they count as 0, whatever they hold (all mass on the numbers).
    The shift (the largest logit), the exponentials and their sum are those
    `jax.nn.logsumexp` computes, so XLA computes them once for this and a caller's
    cross-entropy. `mass` (the number tokens' sum over the total) is accurate to a few
    float32 ulps even when the logits are large; `rest` (the difference of the two sums
    over their total) to a few ulps of 1, not of itself, but its derivative is exactly
    minus the mass's, `p_v m` off the number tokens: differentiating the difference
    would cancel where the rest is near 1 (a small number mass).
    """
    kept = jnp.ones(wide.shape[:-1], bool) if keep is None else keep
    shift, total = _shift_and_exp_sum(wide, kept, logits)
    # Ignored positions: a shift of 0, as the number statistics have there.
    shift = jnp.where(kept, shift, jnp.zeros((), shift.dtype))
    number_sum = jnp.exp(numbers.shift - shift) * numbers.exp_sum
    total = jnp.where(kept, total, number_sum)  # ignored positions: all mass on the numbers
    mass = number_sum / total
    # Summation order can put the number sum a few ulps above the total.
    rest = jax.lax.stop_gradient(jnp.maximum(total - number_sum, 0.0) / total)
    rest = rest - (mass - jax.lax.stop_gradient(mass))
    return shift + jnp.log(total), (mass, rest)


def _exp(logits, shift):
    """`exp(logits - shift)` as `jax.nn.logsumexp` writes it (in the logits' dtype, so
    XLA shares it with a caller's cross-entropy), widened to float32."""
    return jnp.exp(logits - shift.astype(logits.dtype)).astype(jnp.float32)


@jax.custom_jvp
def _exp_sum(logits, shift, keep):
    """`sum(exp(logits - shift))` over the last axis at the positions `keep`
    (`[batch, length]` bool), 0 elsewhere, in float32, written as `jax.nn.logsumexp`
    writes it. The derivative is a JVP rule whose transpose, the gradient, is one
    elementwise expression, fused with the caller's other logits gradients, in which
    whatever the logits hold at the positions not kept (NaN, inf) is selected away, in
    the value as in the gradient."""
    return jnp.where(keep, jnp.sum(_exp(logits, shift), axis=-1), 0.0)


@_exp_sum.defjvp
def _exp_sum_jvp(primals, tangents):
    logits, shift, keep = primals
    # The shift is a stop-gradient constant; `keep` is boolean.
    weight = jnp.where(keep[..., None], _exp(logits, shift), 0.0)
    return _exp_sum(logits, shift, keep), jnp.sum(weight * tangents[0].astype(jnp.float32), axis=-1)


def log_normalizer_of(wide, keep, *, logits=None):
    """`logsumexp(wide)` over the last axis in float32, `[batch, length]`, 0 where
    `keep` (`[batch, length]` bool) is False: the value and gradient of
    `jax.nn.logsumexp` at the kept positions, while whatever the logits hold elsewhere
    (NaN, inf) reaches neither, without a pass over the logits to sanitise them.

    `wide` are float32 logits, perhaps widened from `logits` (default `wide`): the
    maximum (the shift) is taken of those, in their own dtype, since it commutes with
    widening and XLA then fuses it with a cross-entropy's own maximum (on the TPU, a
    maximum of the widened logits next to a cross-entropy that keeps a widened copy is
    a pass of its own)."""
    shift, total = _shift_and_exp_sum(wide, keep, logits)
    return jnp.where(keep, shift.astype(jnp.float32) + jnp.log(jnp.where(keep, total, 1.0)), 0.0)


def _shift_and_exp_sum(wide, keep, logits=None):
    """`(shift, total)`, each `[batch, length]`: the shift (of `logits`, default `wide`)
    and the sum of exponentials of `wide` `jax.nn.logsumexp` computes (`_shift`,
    `_exp_sum` at the positions `keep`)."""
    shift = _shift(wide if logits is None else logits).astype(wide.dtype)
    return shift, _exp_sum(wide, jax.lax.expand_dims(shift, (wide.ndim - 1,)), keep)


def _shift(logits):
    """The largest logit of each position (0 where it is not finite), a constant to
    the gradient: the shift `jax.nn.logsumexp` takes."""
    shift = jnp.max(logits, axis=-1, initial=-jnp.inf)
    return jax.lax.stop_gradient(jax.lax.select(jnp.isfinite(shift), shift, jnp.zeros_like(shift)))


def take_target_logit(wide, ids, logits=None):
    """`wide[..., ids]` at every position, in float32: `ids` `[batch, length]` in
    `[0, vocab)`; `logits` (default `wide`) are the logits in their own dtype, `wide`
    widened from them. The value is gathered from `logits` and widened (exact): a
    gather from `wide` would make XLA write a widened copy of all the logits to gather
    from. The gradient, with respect to `wide`, is a select (`ids` compared with the
    column index) that XLA fuses into the caller's other logits gradients, where
    `take_along_axis`'s scatter would need a buffer the size of the logits (on XLA's
    CPU backend a float32 one when they are 16-bit). Forward mode pays a pass over the
    vocabulary instead."""
    return _take_target_logit(wide, jax.lax.stop_gradient(wide if logits is None else logits), ids)


@jax.custom_jvp
def _take_target_logit(wide, logits, ids):
    return jnp.take_along_axis(logits, ids[..., None], axis=-1)[..., 0].astype(jnp.float32)


@_take_target_logit.defjvp
def _take_target_logit_jvp(primals, tangents):
    wide, logits, ids = primals
    column = jax.lax.broadcasted_iota(jnp.int32, wide.shape, wide.ndim - 1)
    tangent = jnp.sum(jnp.where(column == ids[..., None], tangents[0].astype(jnp.float32), 0.0), axis=-1)
    return _take_target_logit(wide, logits, ids), tangent
