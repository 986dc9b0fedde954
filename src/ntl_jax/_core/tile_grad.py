"""The gradient of the fused head's statistics with respect to a tile of its logits: the
one formula both backward passes recompute, XLA's chunk loop (`fused`) and the Pallas
kernels (`fused_pallas`)."""

from __future__ import annotations

import jax.numpy as jnp


def logits_grad(logits, shift, g_rest, g_target, g_sum, is_target, dropped, dtype):
    """The gradient of the statistics with respect to a tile's float32 logits
    `[tokens, columns]`, in `dtype` (the logits', as the unfused path rounds it):
    `g_rest * exp(logit - shift)` (the non-number tokens' log-normaliser), plus
    `g_target` where `is_target` and `g_sum` everywhere (label smoothing; None: none),
    zero where `dropped` (the number tokens' columns, whose share the caller adds).
    The per-token terms are `[tokens, 1]`, `is_target` and `dropped` broadcast to the
    tile."""
    d = g_rest * jnp.exp(logits - shift)
    d += jnp.where(is_target, g_target, 0.0)
    if g_sum is not None:
        d += g_sum
    return jnp.where(dropped, 0.0, d).astype(dtype)
