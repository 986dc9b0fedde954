"""The training objective, `CE + ntl_weight * NTL` with T5X's weighting, from the logits
(`cross_entropy_and_ntl`) or from the decoder's hidden states without forming the logits
(`fused_cross_entropy_and_ntl`): one pass (`pipeline.run`) for the head's statistics,
then `objective_from_head` assembles the cross-entropy (`cross_entropy`) and the number
loss from them. T5X's semantics exactly (`t5x.losses.compute_weighted_cross_entropy`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from ntl_jax._core import checks, cross_entropy, fused, fused_plan, head_stats, normalization, pipeline, vocab_parallel
from ntl_jax._core.head_stats import HeadStats
from ntl_jax._core.migration import refuses_old_keywords
from ntl_jax._core.number_losses.number_loss import DEFAULT, NumberLoss
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.options import CrossEntropy, Options, takes_cross_entropy_fields


@refuses_old_keywords
@takes_cross_entropy_fields
def cross_entropy_and_ntl(
    logits: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    weights: ArrayLike | None = None,
    number_loss: NumberLoss | str | None = DEFAULT,
    ntl_weight: float | None = None,
    cross_entropy: CrossEntropy | None = None,
    loss_normalizing_factor=None,
    decoder_segment_ids=None,
    decoder_positions=None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`CE + ntl_weight * term`: CE T5X's (a weighted sum over the tokens over the
    resolved loss-normalising factor), the term normalised as the loss's authors do
    (`NumberLoss.mean_over`; for NTL, DEL, DIST², SMMD `ntl_weight * mean * weight_sum /
    factor`, the paper's ratio to CE: docs/guides/losses.md).

    Args:
      logits: `[batch, length, vocab]` floating (`vocab` may exceed the table).
      targets: `[batch, length]` integer; ids outside `[0, vocab)` are ignored.
      number_tokens: the output vocabulary's `NumberTokens`.
      weights: `[batch, length]`, e.g. `targets > 0`. None: every target counts, pads
        too, unless `loss_normalizing_factor` is a special one (then `targets > 0`).
      number_loss: a `ntl_jax.losses` value, a spec (`"was"`, `"smmd(mode=mmd)"`), or None.
      ntl_weight: lambda; None: the loss's own (`NumberLoss.default_weight`: 0.3 for
        NTL, the paper's).
      cross_entropy: the cross-entropy's options, `ntl_jax.CrossEntropy(label_smoothing=,
        z_loss=, gce_sigma=)` (None: none); or those fields as keywords.
      loss_normalizing_factor: None, a number or a special factor's name.
      decoder_segment_ids, decoder_positions: for packed batches.

    Returns:
      `(loss, parts)`; `parts`: `cross_entropy`, `z_loss`, `ntl_sum` and `ntl_weight_sum`
      (the number loss's weighted sum over the positions it counts, and their weight),
      `ntl` (their mean, `ntl_mean`), `ntl_term` (what it adds to `loss`), `weight_sum`,
      `loss_normalizing_factor` (docs/guides/losses.md).
    """
    options = Options(number_loss=number_loss, ntl_weight=ntl_weight, cross_entropy=cross_entropy)
    weights = checks.check_logits_and_targets(logits, targets, number_tokens, weights)
    vocab = jnp.shape(logits)[-1]
    head_of = functools.partial(_head_from_logits, logits, number_tokens, options.cross_entropy.label_smoothing)
    run = pipeline.run(head_of, targets, weights, vocab, number_tokens, options.number_loss,
                       options.cross_entropy, loss_normalizing_factor=loss_normalizing_factor,
                       decoder_segment_ids=decoder_segment_ids, decoder_positions=decoder_positions)
    return objective_from_head(run, number_tokens, options, vocab=vocab)


def _head_from_logits(logits, number_tokens, label_smoothing, target, reads, with_masses) -> HeadStats:
    return head_stats.from_logits(logits, target, number_tokens, reads, label_smoothing=label_smoothing,
                                  with_masses=with_masses)


@refuses_old_keywords
@takes_cross_entropy_fields
def fused_cross_entropy_and_ntl(
    hidden: ArrayLike,
    kernel: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    weights: ArrayLike | None = None,
    number_loss: NumberLoss | str | None = DEFAULT,
    ntl_weight: float | None = None,
    cross_entropy: CrossEntropy | None = None,
    loss_normalizing_factor=None,
    decoder_segment_ids=None,
    decoder_positions=None,
    chunk_size: int | None = None,
    vocab_axis: str | None = None,
    sequence_parallel: bool = False,
    mesh=None,
    backward: str = "xla",
    device_kind: str | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`cross_entropy_and_ntl(hidden @ kernel, ...)` streamed over vocabulary chunks: the
    same loss, parts and gradients (to float32 rounding), never holding the logits.

    Args:
      hidden: `[batch, length, d_model]`, the decoder's output before the projection.
      kernel: `[d_model, vocab]` (tied embeddings: `embedding.T`, any logit scaling
        folded into `hidden`).
      targets, number_tokens, weights, number_loss, ...: as `cross_entropy_and_ntl`.
      chunk_size: vocabulary columns per chunk (None: about 8M logits per chunk).
      vocab_axis: the mesh axis the kernel's columns are sharded over (T5X: `"model"`):
        each device streams its own columns, the kernel is never gathered.
      sequence_parallel: with `vocab_axis`, `hidden` arrives with its sequence split
        over that axis too (Megatron-LM's sequence parallelism).
      mesh: the mesh for `vocab_axis` (None: the mesh in context).
      backward: "xla" (XLA's chunk loop) or, on a TPU only, "pallas": two Pallas kernels
        that keep every tile of the backward pass on chip (docs/guides/fused-head.md);
        "pallas_interpret" runs them in Pallas' interpret mode on any backend (slow).
      device_kind: the chip the program is for, a `jax.Device.device_kind` ("TPU v5
        lite"; "cpu": the other backends'). None: the platform the program is lowered
        for decides (a TPU's program, with a v5e's chunk, on a TPU), never this
        process's devices.

    Returns:
      `(loss, parts)` as `cross_entropy_and_ntl` (docs/guides/fused-head.md).
    """
    options = Options(number_loss=number_loss, ntl_weight=ntl_weight, cross_entropy=cross_entropy)
    weights = checks.check_hidden_and_kernel(hidden, kernel, targets, number_tokens, weights, chunk_size)
    vocab = jnp.shape(kernel)[1]
    shards = vocab_parallel.vocab_shards(vocab_axis, mesh, vocab, jnp.shape(hidden)[0], jnp.shape(hidden)[1],
                                         sequence_parallel)
    plan = fused_plan.plan(jnp.shape(hidden), vocab, shards, device_kind=device_kind, chunk_size=chunk_size,
                           backward=backward)

    def head_of(target, reads, with_masses):
        return fused.head_stats_from_hidden(hidden, kernel, target, number_tokens, reads, plan,
                                            label_smoothing=options.cross_entropy.label_smoothing,
                                            with_masses=with_masses, shards=shards)[0]

    run = pipeline.run(head_of, targets, weights, vocab, number_tokens, options.number_loss,
                       options.cross_entropy, loss_normalizing_factor=loss_normalizing_factor,
                       decoder_segment_ids=decoder_segment_ids, decoder_positions=decoder_positions)
    return objective_from_head(run, number_tokens, options, vocab=vocab)


def loss_normalizing_factor_and_weights(
    loss_normalizing_factor,
    targets,
    weights=None,
    *,
    decoder_segment_ids=None,
    decoder_positions=None,
):
    """`(factor, weights)`: T5X's `get_loss_normalizing_factor_and_weights`.

    None or a number pass through with `weights` unchanged. A special factor (its name,
    any case, or an enum member) makes `weights` default to `targets > 0`, then:
    `NUM_REAL_TARGET_TOKENS`: the sum of the weights; `NUM_TOTAL_TARGET_TOKENS`:
    batch x length; `AVERAGE_PER_SEQUENCE`: each weight over its sequence's (or packed
    segment's, with `decoder_segment_ids` and `decoder_positions`) total, 0/0 giving 0,
    and the factor their sum. A factor of 0 (nothing counted) makes `cross_entropy_and_ntl`
    divide by 1. A number must be finite and > 0; anything else raises `TypeError` or
    `ValueError`.

    Examples:
      >>> import jax.numpy as jnp
      >>> factor, w = loss_normalizing_factor_and_weights(
      ...     "AVERAGE_PER_SEQUENCE", jnp.array([[5, 6, 1, 0], [7, 1, 0, 0]]))
      >>> float(factor), w.tolist()
      (2.0, [[0.3333333432674408, 0.3333333432674408, 0.3333333432674408, 0.0], [0.5, 0.5, 0.0, 0.0]])
    """
    checks.check_integer_targets(targets)
    checks.check_segments(targets, decoder_segment_ids, decoder_positions)
    checks.check_loss_normalizing_factor(loss_normalizing_factor)
    return normalization.resolve(normalization.special_factor(loss_normalizing_factor), loss_normalizing_factor,
                                 targets, weights, decoder_segment_ids, decoder_positions)


def objective_from_head(run: pipeline.Pass, number_tokens: NumberTokens, options: Options, *, vocab: int):
    """`(loss, parts)` of the objective from one pass (`pipeline.run`) over a `vocab`-wide
    head; the pass's weights are 0 wherever `target.keep` is False."""
    head, target, weights, factor = run
    ce, z, weight_sum = cross_entropy.weighted_sums(
        head, target, weights, vocab, label_smoothing=options.cross_entropy.label_smoothing,
        z_loss=options.cross_entropy.z_loss, loss_normalizing_factor=factor,
    )
    if options.number_loss is None:
        ntl_sum = ntl_weight_sum = jnp.float32(0.0)
    else:
        per_position, counted = pipeline.number_loss_at(head, target, number_tokens, options.number_loss)
        counted_weights = jnp.where(counted, weights, 0.0)
        ntl_sum = jnp.sum(jnp.where(counted, per_position, 0.0) * counted_weights)
        ntl_weight_sum = jnp.sum(counted_weights)
    if options.number_loss is None:
        ntl_term = 0.0
    else:
        normalised = options.number_loss.normalised(ntl_sum, ntl_weight_sum, weight_sum, factor)
        # A term scaled to the cross-entropy is scaled to it without the z-loss.
        ntl_term = options.number_loss.term(ce - z, normalised, options.ntl_weight)
    loss = ce + ntl_term
    parts = {
        "loss": loss,
        "cross_entropy": ce - z,
        "z_loss": z,
        "ntl": ntl_mean(ntl_sum, ntl_weight_sum),
        "ntl_term": ntl_term,
        "weight_sum": jnp.asarray(weight_sum, jnp.float32),
        "ntl_sum": jnp.asarray(ntl_sum, jnp.float32),
        "ntl_weight_sum": jnp.asarray(ntl_weight_sum, jnp.float32),
        "loss_normalizing_factor": jnp.asarray(1.0 if factor is None else factor, jnp.float32),
    }
    return loss, parts


def ntl_mean(ntl_sum: ArrayLike, ntl_weight_sum: ArrayLike) -> jax.Array:
    """The number loss's mean, pooled: `sum(ntl_sum) / sum(ntl_weight_sum)`, 0 where
    nothing is counted (never NaN).

    `parts["ntl"]` of one step is `ntl_mean(parts["ntl_sum"], parts["ntl_weight_sum"])`.
    Over several steps (a logging window, an evaluation) pass each step's sum and count:
    the mean of the steps' means would weigh a step with one number target as much as one
    with a thousand. Every logger of `ntl` in the package reports this.

    Args:
      ntl_sum: the number loss's weighted sum: a scalar, or one per step (any shape).
      ntl_weight_sum: the weight it was summed over, shaped as `ntl_sum`.

    Returns:
      A float32 scalar; differentiable, with finite gradients where the count is 0.

    Examples:
      >>> float(ntl_mean([6.0, 1.0], [3.0, 1.0])), float(ntl_mean(0.0, 0.0))
      (1.75, 0.0)
    """
    total = jnp.sum(jnp.asarray(ntl_sum, jnp.float32))
    count = jnp.sum(jnp.asarray(ntl_weight_sum, jnp.float32))
    counted = count > 0
    return jnp.where(counted, total / jnp.where(counted, count, 1.0), 0.0)
