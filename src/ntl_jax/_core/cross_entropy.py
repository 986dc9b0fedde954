"""The cross-entropy term: T5X's `compute_weighted_cross_entropy` (label smoothing,
z-loss) and Gaussian-smoothed cross-entropy (GCE, the paper's baseline, its label
`targets.GaussianLabel`), per position
from the head's statistics (`head_stats.HeadStats`), so that the logits path and the
fused head share it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from ntl_jax._core import checks, head_stats
from ntl_jax._core.head_stats import HeadStats
from ntl_jax._core.number_stats import Columns, NumberReads
from ntl_jax._core.targets import NumberTarget, number_target


def gce_weights(columns: Columns, target: NumberTarget, number_tokens):
    """GCE's label `q_j` at the number tokens, as the weights of `sum_j q_j z_j`."""
    return target.label.at(columns.value, columns.digits)


# What the GCE cross-entropy reads of the number tokens' logits.
GCE_READS = NumberReads(sums=(gce_weights,))


def per_position(head: HeadStats, target: NumberTarget, vocab: int, *, label_smoothing: float, z_loss: float):
    """`(ce, z_term)` `[batch, length]`: T5X's per-token cross-entropy with label
    smoothing and z-loss (`ce` includes `z_term`), without materialising the soft
    targets: `lse * sum(q) - sum(q * logits) - H(q)`.

    Where `target.label` smooths (GCE), the cross-entropy is `lse - sum_j q_j z_j` over the
    number tokens, without subtracting `H(q)` (as the authors' `GaussianLabelSmoother`)."""
    confidence = 1.0 - label_smoothing
    # As T5X: a one-token vocabulary has no other token to smooth onto.
    low = (1.0 - confidence) / (vocab - 1) if vocab > 1 else 1.0 - confidence
    normalizing_constant = -(confidence * np.log(confidence) + (vocab - 1) * low * np.log(low + 1e-20))
    on = jnp.where(target.ids >= 0, confidence, 0.0)
    if low > 0:
        mass = on + low * (vocab - (target.ids >= 0))
        weighted_logits = on * head.target_logit + low * (head.logit_sum - head.target_logit)
    else:
        mass, weighted_logits = on, on * head.target_logit
    z_term = z_loss * jnp.square(head.log_normalizer)
    ce = head.log_normalizer * mass - weighted_logits - normalizing_constant
    if target.label is not None:
        # Sanitised first: q is 0 outside the smoothed rows, so this is finite everywhere.
        ce = jnp.where(target.label.smoothed, head.log_normalizer - head.numbers.sums[gce_weights], ce)
    return ce + z_term, z_term


def weighted_sums(head: HeadStats, target: NumberTarget, weights, vocab: int, *, label_smoothing: float,
                  z_loss: float, loss_normalizing_factor=None):
    """`(loss, z_loss, weight_sum)` of `weighted_cross_entropy` from the head's
    statistics; `weights` 0 at ignored positions."""
    total, z_term = per_position(head, target, vocab, label_smoothing=label_smoothing, z_loss=z_loss)
    total, z_term = total * weights, z_term * weights
    if loss_normalizing_factor is not None:
        total, z_term = total / loss_normalizing_factor, z_term / loss_normalizing_factor
    return jnp.sum(total), jnp.sum(z_term), jnp.sum(weights)


def weighted_cross_entropy(
    logits: ArrayLike, targets: ArrayLike, *, weights: ArrayLike | None = None, label_smoothing: float = 0.0,
    z_loss: float = 0.0, loss_normalizing_factor=None, log_normalizer: ArrayLike | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """T5X's `compute_weighted_cross_entropy`, computed in float32.

    `loss = sum_i w_i (CE_i + z_loss * logsumexp_i^2) / loss_normalizing_factor`, where
    `CE_i` uses T5X's label smoothing (true class `1 - ls`, the rest share `ls`).

    Args:
      logits: `[batch, length, vocab]`; targets: `[batch, length]` integer.
      weights: optional `[batch, length]`; without it every position counts, pad id 0 included.
      loss_normalizing_factor: a number (resolve special factors with
        `loss_normalizing_factor_and_weights`) or None for a plain sum.
      log_normalizer: optional precomputed `logsumexp(logits, -1)`.

    Positions with weight 0 or a target outside `[0, vocab)` add exactly 0 and do not
    count (`check_targets` raises for such ids instead).

    Returns:
      `(loss, z_loss, weight_sum)`; `loss` includes the z-loss term.

    Examples:
      >>> import jax.numpy as jnp
      >>> loss, z, n = weighted_cross_entropy(jnp.zeros((1, 2, 4)), jnp.array([[1, 2]]))
      >>> round(float(loss), 4), float(z), int(n)  # 2 * log(4)
      (2.7726, 0.0, 2)
    """
    weights = checks.check_cross_entropy_inputs(logits, targets, weights, label_smoothing=label_smoothing,
                                                z_loss=z_loss, loss_normalizing_factor=loss_normalizing_factor)
    vocab = jnp.shape(logits)[-1]
    target = number_target(targets, weights, vocab, None)
    weights = jnp.where(target.keep, 1.0 if weights is None else weights, 0.0)
    head = head_stats.from_logits(logits, target, None, None, label_smoothing=label_smoothing)
    if log_normalizer is not None:
        head = head._replace(log_normalizer=jnp.where(target.keep, log_normalizer, 0.0))
    return weighted_sums(head, target, weights, vocab, label_smoothing=label_smoothing, z_loss=z_loss,
                         loss_normalizing_factor=loss_normalizing_factor)
