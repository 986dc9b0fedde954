"""DEL, the Digit Entropy Loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ntl_jax._core import digit_runs
from ntl_jax._core.number_losses.number_loss import (
    NumberLoss,
    one_hot,
    softmax_columns,
)
from ntl_jax._core.number_stats import Columns, NumberReads, NumberStats, of_logits
from ntl_jax._core.targets import NumberTarget

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
    bce = jax.nn.softplus(z) - one_hot(target, number_tokens) * z
    weight = digit_runs.place_weights(target, number_tokens)
    return weight * jnp.sum(softmax_columns(z) * bce, axis=-1), target.is_number


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


