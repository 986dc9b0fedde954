"""SMMD, the Smooth MMD loss."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ntl_jax._core.compat import is_traced
from ntl_jax._core.loss_params import check_choice, check_number
from ntl_jax._core.number_losses.number_loss import (
    NumberLoss,
    off_default,
    one_hot,
)
from ntl_jax._core.number_stats import NumberReads, NumberStats
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.targets import NumberTarget

# -- SMMD, Smooth MMD (arXiv 2606.27731; code Zuozhuo/smmd-loss) -----------------------
# At a target t of SMMD's number tokens (integers 0..999 written alone), with p the
# softmax over those tokens only and r = p - onehot(t): relu(r'Kr + alpha r'(D - K)r),
# K_ij = exp(-d'(v_i, v_j)^2 / (2 sigma^2)) clipped to [0, 1], d' the value distance
# squashed affinely (0 stays 0, the closest pair 1, the farthest `squash_factor`),
# D = diag(sum_j K_ij). One matvec K p per position: with K symmetric,
# r'Kr = p'Kp - 2 (Kp)_t + K_tt and r'Dr = sum_j deg_j p_j^2 - 2 deg_t p_t + deg_t.

SMMD_MODES = ("smmd", "mmd", "smooth")
# The authors' defaults (`SMMDLoss`): both terms, sigma 2, distances squashed to [1, 9],
# integers up to 999 (`build_integer_vnum_from_tokenizer`'s `max_value`).
SMMD_SIGMA = 2.0
SMMD_SQUASH_FACTOR = 9.0
SMMD_MAX_VALUE = 999


def smmd_support(number_tokens: NumberTokens, xp=jnp):
    """`[N]` bool: the number tokens SMMD scores, those the authors' tokenizer probe finds:
    an integer 0..`SMMD_MAX_VALUE` written as its plain digits, so "7" and "120" but not
    "07", "00" (a leading zero), "3.5", "-1" (a point or sign: no digit count), "1000".
    A prefixed piece read with `prefixed_numbers=True` ("Ġ12") counts by its digits."""
    v = xp.asarray(number_tokens.number_values, xp.float32)
    if xp is jnp:
        digits = number_tokens.at_numbers(number_tokens.digit_counts, jnp.int32)
    else:  # on the host (`at_numbers` would stage a conversion under `jit`)
        digits = np.asarray(number_tokens.digit_counts)[np.asarray(number_tokens.ids)]
    written = 1 + (v >= 10).astype(xp.int32) + (v >= 100).astype(xp.int32)  # "0" writes one digit
    return (v == xp.floor(v)) & (v >= 0) & (v <= SMMD_MAX_VALUE) & (digits == written)


def smmd_kernel(number_tokens: NumberTokens, sigma: float = SMMD_SIGMA, squash_factor: float = SMMD_SQUASH_FACTOR):
    """`(support, K, alpha)`: `smmd_support`, the `[N, N]` kernel over the number tokens
    (0 in every row and column off the support) and the default smoothness weight
    `1 / (2 mean_i sum_j K_ij)` over the support, float32. As the authors' `squash_distances`,
    distances are left as they are where the support has fewer than three distinct values.
    Built on the host for a concrete table (constants of the program).

    Raises:
      ValueError: a concrete table without a number token in SMMD's support.
    """
    traced = is_traced(number_tokens.number_values) or is_traced(number_tokens.digit_counts) \
        or is_traced(number_tokens.ids)
    xp = jnp if traced else np
    support = smmd_support(number_tokens, xp)
    if not traced and not support.any():
        raise ValueError(f"number loss 'smmd': expected number tokens writing an integer 0..{SMMD_MAX_VALUE} alone "
                         f"(no leading zero, sign or point), got none among the values "
                         f"{np.asarray(number_tokens.number_values).tolist()[:20]}")
    v = xp.asarray(number_tokens.number_values, xp.float64 if xp is np else xp.float32)
    pair = support[:, None] & support[None, :]
    d = xp.abs(v[:, None] - v[None, :])
    closest = xp.min(xp.where(pair & (d > 0), d, xp.inf))
    farthest = xp.max(xp.where(pair, d, 0.0))
    squashes = farthest > closest  # false with fewer than three distinct values
    scale = (squash_factor - 1.0) / xp.where(squashes, farthest - closest, 1.0)
    d = xp.where(squashes & (d > 0), 1.0 + (d - closest) * scale, d)
    kernel = xp.where(pair, xp.clip(xp.exp(-xp.square(d) / (2.0 * sigma ** 2)), 0.0, 1.0), 0.0)
    mean_degree = xp.sum(kernel) / xp.maximum(xp.sum(support), 1)
    alpha = 0.5 / xp.maximum(mean_degree, 1e-12)
    return support, xp.asarray(kernel, xp.float32), xp.asarray(alpha, xp.float32)


def _smmd_terms(z, target: NumberTarget, number_tokens, sigma, squash_factor):
    """`(p, q, K, alpha, counted)` of the number tokens' logits `z` `[batch, length, N]`:
    `p` the softmax over SMMD's support (0 off it), `q` the one-hot label on it."""
    support, kernel, alpha = smmd_kernel(number_tokens, sigma, squash_factor)
    support = jnp.asarray(support)
    q = one_hot(target, number_tokens) * support
    counted = target.is_number & (jnp.sum(q, axis=-1) > 0)
    p = jax.nn.softmax(jnp.where(support, z, -jnp.inf), axis=-1)
    return jnp.where(support, p, 0.0), q, jnp.asarray(kernel), alpha, counted


def _smmd_combine(mmd, smooth, mode, alpha):
    # The quadratic forms are >= 0 (K and D - K are positive semidefinite); relu guards
    # against their rounding, as the authors'.
    return jax.nn.relu({"smmd": mmd + alpha * smooth, "mmd": mmd, "smooth": alpha * smooth}[mode])


def smmd(*, mode: str = "smmd", sigma: float = SMMD_SIGMA, alpha: float | None = None,
         squash_factor: float = SMMD_SQUASH_FACTOR) -> NumberLoss:
    """SMMD, Smooth MMD (arXiv 2606.27731; the authors' `SMMDLoss`): `relu(r'Kr + alpha
    r'(D - K)r)`, `r = p - onehot(y)` over SMMD's number tokens (integers 0..999 written
    alone, `smmd_support`), `K_ij = exp(-d'(v_i, v_j)^2 / (2 sigma^2))` with `d'` the
    value distance squashed to [1, `squash_factor`], `D = diag(sum_j K_ij)`. `mode`:
    `"smmd"` (both terms), `"mmd"` (r'Kr) or `"smooth"` (alpha r'(D - K)r); `alpha` None
    is `1 / (2 mean degree)`, the authors' "auto"."""
    return _smmd(check_choice("smmd", "mode", mode, SMMD_MODES),
                 check_number("smmd", "sigma", sigma, low=0.0, low_inclusive=False),
                 None if alpha is None else check_number("smmd", "alpha", alpha, low=0.0),
                 check_number("smmd", "squash_factor", squash_factor, low=1.0, low_inclusive=False))


@functools.lru_cache(maxsize=None)
def _smmd(mode: str, sigma: float, alpha: float | None, squash_factor: float) -> NumberLoss:
    def loss(stats: NumberStats, target, number_tokens):
        p, q, kernel, default_alpha, counted = _smmd_terms(stats.columns, target, number_tokens, sigma,
                                                             squash_factor)
        kp = p @ kernel  # N^2 multiply-adds per position; K is symmetric
        degree = jnp.sum(kernel, axis=-1)
        mmd = jnp.sum(p * kp, axis=-1) - 2.0 * jnp.sum(q * kp, axis=-1) + jnp.sum(q * jnp.diagonal(kernel), axis=-1)
        diagonal = jnp.sum(degree * p * (p - 2.0 * q), axis=-1) + jnp.sum(q * degree, axis=-1)  # r'Dr
        return _smmd_combine(mmd, diagonal - mmd, mode, default_alpha if alpha is None else alpha), counted

    def reference(z, target, number_tokens):
        p, q, kernel, default_alpha, counted = _smmd_terms(z, target, number_tokens, sigma, squash_factor)
        r = p - q
        laplacian = jnp.diag(jnp.sum(kernel, axis=-1)) - kernel
        mmd = jnp.einsum("...i,ij,...j->...", r, kernel, r)
        smooth = jnp.einsum("...i,ij,...j->...", r, laplacian, r)
        return _smmd_combine(mmd, smooth, mode, default_alpha if alpha is None else alpha), counted

    params = off_default(mode=(mode, "smmd"), sigma=(sigma, SMMD_SIGMA), alpha=(alpha, None),
                          squash_factor=(squash_factor, SMMD_SQUASH_FACTOR))
    # The authors' module adds the loss unweighted.
    return NumberLoss("smmd", NumberReads(columns=True), loss, reference, params=params,
                      check_table=lambda number_tokens: smmd_kernel(number_tokens, sigma, squash_factor),
                      default_weight=1.0, across_positions=False)


