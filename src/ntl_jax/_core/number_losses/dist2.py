"""DIST², the KL divergence to a distance-smoothed label."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ntl_jax._core.loss_params import check_number
from ntl_jax._core.number_losses.number_loss import (
    NumberLoss,
    number_values,
    off_default,
)
from ntl_jax._core.number_stats import Columns, NumberReads, NumberStats
from ntl_jax._core.targets import NumberTarget

# -- DIST², KL to a distance-smoothed label (Chung et al., arXiv 2503.02379) ------------
# KL(q || p) with q_j ∝ exp(-(v_j - y)^2 / tau) over the number tokens:
# sum_j q_j log q_j - sum_j q_j z_j + log sum_j exp(z_j), a weighted sum of the logits
# and the log-normaliser (sum_j q_j = 1).


def dist2(*, tau: float = 1.0) -> NumberLoss:
    """DIST² (Chung et al., arXiv 2503.02379): `KL(q || p)`, `q_j ∝ exp(-(v_j - y)^2 / tau)`
    over the number tokens; the authors weigh it by 0.1 next to CE."""
    return _dist2(check_number("dist2", "tau", tau, low=0.0, low_inclusive=False))


@functools.lru_cache(maxsize=None)
def _dist2(tau: float) -> NumberLoss:
    def log_label(values, target: NumberTarget, number_tokens):
        """`log q` at the columns of `values`: the log-softmax of `-(v - y)^2 / tau`
        over the number tokens (its normaliser always over the `N` number tokens)."""
        def logit(v):
            return -jnp.square(v - target.value[..., None]) / tau
        return logit(values) - jax.nn.logsumexp(logit(number_values(number_tokens)), axis=-1, keepdims=True)

    def label(columns: Columns, target: NumberTarget, number_tokens):
        q = jnp.exp(log_label(columns.value, target, number_tokens))
        return jnp.where(target.is_number[..., None], q, 0.0)

    def negative_entropy(target, number_tokens):
        log_q = log_label(number_values(number_tokens), target, number_tokens)
        return jnp.sum(jnp.exp(log_q) * log_q, axis=-1)

    def loss(stats: NumberStats, target, number_tokens):
        kl = negative_entropy(target, number_tokens) - stats.sums[0] + stats.log_normalizer
        return kl, target.is_number

    def reference(z, target, number_tokens):
        log_q = log_label(number_values(number_tokens), target, number_tokens)
        return jnp.sum(jnp.exp(log_q) * (log_q - jax.nn.log_softmax(z, axis=-1)), axis=-1), target.is_number

    return NumberLoss("dist2", NumberReads(sums=(label,)), loss, reference, params=off_default(tau=(tau, 1.0)),
                      default_weight=0.1, across_positions=False)  # the authors' weight


