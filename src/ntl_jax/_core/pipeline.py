"""The one path from a loss's inputs to its terms, which every entry point takes: the
standalone number losses, the objective from the logits or from the hidden states, and
the T5X models' loss.

Check (the table against the loss, the factor, the packing) -> weights and the
loss-normalising factor (`normalization`) -> the labels (`targets`) -> the head's
statistics (the caller's `head_of`: from the logits, the hidden states or the number
tokens' logits) -> the number loss (`NumberLoss`). The caller checks its own
arrays first, and reduces or assembles the objective after.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from ntl_jax._core import checks, normalization, number_stats
from ntl_jax._core.cross_entropy import GCE_READS
from ntl_jax._core.head_stats import HeadStats
from ntl_jax._core.number_losses.number_loss import NumberLoss
from ntl_jax._core.number_stats import NumberReads, expected_value
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.options import CrossEntropy
from ntl_jax._core.targets import NumberTarget, number_target


class Pass(NamedTuple):
    """What one pass computed: `head` (`HeadStats`), `target` (`NumberTarget`), `weights`
    (resolved, float32 `[batch, length]`, 0 at ignored positions) and `factor` (the
    resolved loss-normalising factor; None: a plain sum)."""

    head: HeadStats
    target: NumberTarget
    weights: jax.Array
    factor: Any


def reads(number_loss: NumberLoss | None, *, smoothed: bool = False, with_value: bool = False) -> NumberReads | None:
    """What a pass reads of the number tokens' logits: the number loss's own, the GCE
    label's sum (`smoothed`), the expected value (`with_value`, for metrics); None when
    nothing (cross-entropy alone)."""
    if number_loss is None and not (smoothed or with_value):
        return None
    out = NumberReads(means=(expected_value,)) if with_value else NumberReads()
    if number_loss is not None:
        out |= number_loss.reads
    if smoothed:
        out |= GCE_READS
    return out


def run(head_of: Callable[[NumberTarget, NumberReads | None, bool], HeadStats], targets, weights, vocab: int,
        number_tokens: NumberTokens, number_loss: NumberLoss | None, cross_entropy: CrossEntropy = CrossEntropy(),
        *, loss_normalizing_factor=None, decoder_segment_ids=None, decoder_positions=None,
        with_value: bool = False) -> Pass:
    """One pass over checked arrays: `targets` `[batch, length]`, `weights` (float32 or
    None) for a `vocab`-wide head, the cross-entropy's label as `cross_entropy` says.
    `head_of(target, reads, with_masses)` computes the head's statistics at the positions
    `target.keep` (the number mass with `with_masses`)."""
    checks.check_segments(targets, decoder_segment_ids, decoder_positions)
    checks.check_loss_normalizing_factor(loss_normalizing_factor)
    if number_loss is not None and number_loss.check_table is not None:
        number_loss.check_table(number_tokens)
    factor, weights = normalization.factor_and_weights(
        targets, weights, vocab, loss_normalizing_factor,
        decoder_segment_ids=decoder_segment_ids, decoder_positions=decoder_positions)
    target = number_target(targets, weights, vocab, number_tokens, gce_sigma=cross_entropy.gce_sigma)
    head = head_of(target, reads(number_loss, smoothed=cross_entropy.smoothed, with_value=with_value),
                   number_loss is not None and number_loss.needs_masses)
    return Pass(head, target, weights, factor)


def number_loss_at(head: HeadStats, target: NumberTarget, number_tokens: NumberTokens, number_loss: NumberLoss):
    """`(loss, counted)` `[batch, length]` of the number loss from the head's statistics."""
    return number_loss.at(head.numbers, target, number_tokens, head.masses)


def counted_weight(targets, weights, number_tokens: NumberTokens, number_loss: NumberLoss) -> jax.Array:
    """The weight of the positions `number_loss` counts (`weights` `[batch, length]`):
    what its mean divides by, `cross_entropy_and_ntl`'s `ntl_weight_sum`. Read from the
    targets alone, with stand-in logits: the positions a loss counts are its targets'
    (the number targets, or each number's first token), never its predictions'."""
    def head_of(target, reads, with_masses):
        stand_in = jnp.zeros(target.keep.shape + (number_tokens.num_numbers,), jnp.float32)
        return HeadStats(None, None, None, number_stats.from_columns(stand_in, target, number_tokens, reads), None)

    run_ = run(head_of, targets, jnp.asarray(weights, jnp.float32), number_tokens.vocab_size, number_tokens,
               number_loss)
    _, counted = number_loss_at(run_.head, run_.target, number_tokens, number_loss)
    return jnp.sum(jnp.where(counted, run_.weights, 0.0))
