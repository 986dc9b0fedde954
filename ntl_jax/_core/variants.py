"""What each number loss is: one entry per loss, its formula beside a plain reference.

A `Variant` is written as its math: the per-position loss from statistics of the
number tokens' logits `z` (`number_stats.NumberStats`: expectations under
`p = softmax(z)` over the number tokens only, weighted sums of `z`, their
log-normaliser), with the functions it needs named in `reads`. Its `reference` is the
textbook formula on the `N` number-token columns (an explicit softmax), which the
tests hold every formulation of `number_stats` against. A new loss is one more entry
here and one more name in `VARIANTS`.

Notation, per position: `y` the target's value, `v_j` the number tokens' values,
`p_j = softmax(z)_j` over the number tokens. Positions whose target is no number token
are not counted (the number-level loss counts a number's first token).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntl_jax._core import digit_runs
from ntl_jax._core.compat import is_traced
from ntl_jax._core.number_stats import Columns, NumberReads, NumberStats, expected_value, of_logits
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.targets import NumberTarget

_EPS = float(jnp.finfo(jnp.float32).eps)
# reweigh: a position whose mass is off the number tokens costs slightly more than the
# worst number token (ntloss's constant).
_REWEIGH_MARGIN = 1.01
# Up to this many number tokens NTL-WAS-CDF sorts them by value with static slices.
_STATIC_PERMUTATION_MAX = 64


class Variant(NamedTuple):
    """A number loss.

    - `name`: as every API takes it (`ntl_kind`, the trainer's `--loss`);
    - `reads`: what `loss` reads of the number tokens' logits (`NumberReads`);
    - `loss(stats, target, number_tokens)`: `(loss, counted)`, each `[batch, length]`;
    - `reference(z, target, number_tokens)`: the same from the number tokens' logits
      `z` `[batch, length, N]`, written plainly (the tests' oracle);
    - `ceiling(number_tokens)`: the largest value the loss takes, which `reweigh`
      charges (x1.01) for probability off the number tokens; None: unbounded, no reweigh.
    """

    name: str
    reads: NumberReads
    loss: Callable
    reference: Callable
    ceiling: Callable | None


def reweigh(loss, masses, variant: Variant, number_tokens: NumberTokens):
    """ntloss's `reweigh`: `loss * m + 1.01 * ceiling * (1 - m)`, `masses = (m, 1 - m)` the
    full-vocabulary probability on the number tokens and on the others."""
    mass, rest = masses
    return loss * mass + _REWEIGH_MARGIN * variant.ceiling(number_tokens) * rest


def _softmax_columns(z):
    return jax.nn.softmax(z, axis=-1)


def _values(number_tokens: NumberTokens):
    return jnp.asarray(number_tokens.number_values, jnp.float32)


def _value_range(number_tokens: NumberTokens):
    v = _values(number_tokens)
    return jnp.max(v) - jnp.min(v)


# -- NTL-WAS: the Wasserstein-1 distance to the one-hot label --------------------------
# sum_j p_j D(v_j, y), D = |v_j - y| or its squashed form (ntloss's `NTLoss`; the
# closest wrong token costs 1 and the farthest `squash_factor`: `NumberTokens.squash`).


@functools.lru_cache(maxsize=16)
def was(squash_factor: float | None = None) -> Variant:
    def distance(columns: Columns, target: NumberTarget, number_tokens):
        return number_tokens.squash(jnp.abs(columns.value - target.value[..., None]), squash_factor)

    def loss(stats: NumberStats, target, number_tokens):
        return stats.means[distance], target.is_number

    def reference(z, target, number_tokens):
        d = number_tokens.squash(jnp.abs(_values(number_tokens) - target.value[..., None]), squash_factor)
        return jnp.sum(_softmax_columns(z) * d, axis=-1), target.is_number

    def ceiling(number_tokens):
        return _value_range(number_tokens) if squash_factor is None else jnp.float32(squash_factor)

    return Variant("was", NumberReads(means=(distance,)), loss, reference, ceiling)


# -- NTL-MSE / MAE / Huber, any loss on the expected value ------------------------------
# f(sum_j p_j v_j, y) (ntloss's `NTLossDotProduct`).


def _huber(d):
    # torch.nn.functional.huber_loss with delta 1.
    return jnp.where(jnp.abs(d) < 1.0, 0.5 * jnp.square(d), jnp.abs(d) - 0.5)


@functools.lru_cache(maxsize=64)
def dot(fn: Callable, name: str = "dot") -> Variant:
    """NTL-L_p with a loss `fn(prediction, target)` of two float32 `[batch, length]`
    arrays. `ceiling`: `max(|fn(lo, hi)|, |fn(hi, lo)|)` over the number tokens' lowest
    and highest values, as ntloss's."""

    def loss(stats: NumberStats, target, number_tokens):
        yhat = stats.means[expected_value]
        # Where the target is no number the loss is not counted: the prediction stands
        # in for it there, so `fn` sees a difference of 0 rather than an arbitrary one.
        return fn(yhat, jnp.where(target.is_number, target.value, yhat)), target.is_number

    def reference(z, target, number_tokens):
        yhat = jnp.sum(_softmax_columns(z) * _values(number_tokens), axis=-1)
        return fn(yhat, jnp.where(target.is_number, target.value, yhat)), target.is_number

    def ceiling(number_tokens):
        v = _values(number_tokens)
        lo, hi = jnp.min(v), jnp.max(v)
        return jnp.maximum(jnp.abs(fn(lo, hi)), jnp.abs(fn(hi, lo))).astype(jnp.float32)

    return Variant(name, NumberReads(means=(expected_value,)), loss, reference, ceiling)


def _difference(f):
    return lambda prediction, target: f(prediction - target)


_MSE = dot(_difference(jnp.square), "mse")
_MAE = dot(_difference(jnp.abs), "mae")
_HUBER = dot(_difference(_huber), "huber")


# -- The number-level loss: symmetric MAPE on whole numbers -----------------------------
# |yhat - y| / (|yhat| + |y| + eps) per number, at its first token (`NumberLevelLoss`):
# digit runs joined into numbers, the label's values and the expected values alike.


@functools.lru_cache(maxsize=16)
def number_level(float_level: bool = False, max_number_length: int = digit_runs.MAX_NUMBER_LENGTH) -> Variant:
    """Both the label and the prediction are placed by the target's digit counts, so a
    multi-digit tokenizer's "123", "4" is scored as 1234 against `10 E[v_1] + E[v_2]`
    (`digit_runs.join_digit_runs`, which also says what `max_number_length` does)."""

    def score(yhat_digits, target, number_tokens):
        join = functools.partial(
            digit_runs.join_digit_runs, targets=target.ids, dot_id=number_tokens.dot_id if float_level else None,
            digit_counts=target.digits, opens=target.opens, max_number_length=max_number_length)
        starts, y = join(target.is_number, target.value)
        _, yhat = join(target.is_number, yhat_digits)
        return jnp.abs(yhat - y) / (jnp.abs(yhat) + jnp.abs(y) + _EPS), starts  # in [0, 1]

    def loss(stats: NumberStats, target, number_tokens):
        return score(stats.means[expected_value], target, number_tokens)

    def reference(z, target, number_tokens):
        return score(jnp.sum(_softmax_columns(z) * _values(number_tokens), axis=-1), target, number_tokens)

    name = "number_level_float" if float_level else "number_level"
    return Variant(name, NumberReads(means=(expected_value,)), loss, reference, lambda number_tokens: jnp.float32(1.0))


# -- NTL-WAS-CDF: Wasserstein-1 between CDFs over the value-sorted number tokens ---------
# sum_k |CDF_p(k) - CDF_q(k)| (the authors' `WassersteinNumberTokenLoss`), without
# weighting by the gaps between values: measured in ranks, at most N - 1.


def _rank_distance(columns: Columns, target: NumberTarget, number_tokens):
    return jnp.abs(columns.rank - target.rank[..., None])


def _cdf_gap_sum(p, q, number_tokens: NumberTokens):
    """`sum_k |CDF_p(k) - CDF_q(k)|` over the number tokens sorted by value (ties in id
    order), for `[batch, length, N]` distributions `p` and `q`."""
    gap = p - q
    values = number_tokens.number_values
    if not is_traced(values):  # the usual closure constant: sorted once, on the host
        order = np.argsort(np.asarray(values, np.float32), kind="stable")
        if np.array_equal(order, np.arange(order.size)):
            pass  # ids already in value order (digits): nothing to permute
        elif order.size <= _STATIC_PERMUTATION_MAX:
            # Static slices, not a gather: on the TPU each gathered element (and each
            # scattered one in the gradient) costs a memory tile.
            gap = jnp.stack([gap[..., int(i)] for i in order], axis=-1)
        else:
            gap = jnp.take(gap, order, axis=-1)
    else:
        gap = jnp.take(gap, jnp.argsort(jnp.asarray(values, jnp.float32), stable=True), axis=-1)
    # One cumulative sum of the difference: its partial sums stay accurate where both
    # CDFs approach 1. The last term (1 - 1) is left out.
    return jnp.sum(jnp.abs(jnp.cumsum(gap, axis=-1)[..., :-1]), axis=-1)


def _one_hot(target: NumberTarget, number_tokens: NumberTokens):
    return (target.ids[..., None] == jnp.asarray(number_tokens.ids)).astype(jnp.float32)


def _was_cdf_ceiling(number_tokens):
    return jnp.float32(number_tokens.num_numbers - 1)


def _was_cdf_loss(stats: NumberStats, target, number_tokens):
    # Against a one-hot label at place t, CDF_q steps from 0 to 1 at t, so the sum is
    # the expected distance in rank sum_j p_j |r_j - r_t|: an expectation, no sort of p.
    return stats.means[_rank_distance], target.is_number


def _was_cdf_reference(z, target, number_tokens):
    return _cdf_gap_sum(_softmax_columns(z), _one_hot(target, number_tokens), number_tokens), target.is_number


WAS_CDF = Variant("was_cdf", NumberReads(means=(_rank_distance,)), _was_cdf_loss, _was_cdf_reference,
                  _was_cdf_ceiling)


def _gce_label(target: NumberTarget, number_tokens: NumberTokens):
    """The Gaussian-smoothed label over the number tokens `[batch, length, N]` where
    `target.label` smooths, the one-hot elsewhere."""
    q = target.label.at(_values(number_tokens), number_tokens.at_numbers(number_tokens.digit_counts, jnp.int32))
    return jnp.where(target.label.smoothed[..., None], q, _one_hot(target, number_tokens))


def _was_cdf_smoothed_loss(stats: NumberStats, target, number_tokens):
    return _cdf_gap_sum(stats.probs, _gce_label(target, number_tokens), number_tokens), target.is_number


def _was_cdf_smoothed_reference(z, target, number_tokens):
    return _cdf_gap_sum(_softmax_columns(z), _gce_label(target, number_tokens), number_tokens), target.is_number


# NTL-WAS-CDF against GCE's Gaussian-smoothed label (`cross_entropy_and_ntl(gce_sigma=...)`).
WAS_CDF_SMOOTHED = Variant("was_cdf", NumberReads(probs=True), _was_cdf_smoothed_loss, _was_cdf_smoothed_reference,
                           _was_cdf_ceiling)


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
    return weight * (stats.means[_softplus] - stats.means[_target_logit]), target.is_number


def _del_reference(z, target, number_tokens):
    bce = jax.nn.softplus(z) - _one_hot(target, number_tokens) * z
    weight = digit_runs.place_weights(target, number_tokens)
    return weight * jnp.sum(_softmax_columns(z) * bce, axis=-1), target.is_number


DEL = Variant("del", NumberReads(means=(_softplus, _target_logit)), _del_loss, _del_reference, None)


# -- DIST², KL to a distance-smoothed label (Chung et al., arXiv 2503.02379) ------------
# KL(q || p) with q_j ∝ exp(-(v_j - y)^2 / tau) over the number tokens:
# sum_j q_j log q_j - sum_j q_j z_j + log sum_j exp(z_j), a weighted sum of the logits
# and the log-normaliser (sum_j q_j = 1).


@functools.lru_cache(maxsize=16)
def dist2(tau: float = 1.0) -> Variant:
    def log_label(values, target: NumberTarget, number_tokens):
        """`log q` at the columns of `values`: the log-softmax of `-(v - y)^2 / tau`
        over the number tokens (its normaliser always over the `N` number tokens)."""
        def logit(v):
            return -jnp.square(v - target.value[..., None]) / tau
        return logit(values) - jax.nn.logsumexp(logit(_values(number_tokens)), axis=-1, keepdims=True)

    def label(columns: Columns, target: NumberTarget, number_tokens):
        q = jnp.exp(log_label(columns.value, target, number_tokens))
        return jnp.where(target.is_number[..., None], q, 0.0)

    def negative_entropy(target, number_tokens):
        log_q = log_label(_values(number_tokens), target, number_tokens)
        return jnp.sum(jnp.exp(log_q) * log_q, axis=-1)

    def loss(stats: NumberStats, target, number_tokens):
        kl = negative_entropy(target, number_tokens) - stats.sums[label] + stats.log_normalizer
        return kl, target.is_number

    def reference(z, target, number_tokens):
        log_q = log_label(_values(number_tokens), target, number_tokens)
        return jnp.sum(jnp.exp(log_q) * (log_q - jax.nn.log_softmax(z, axis=-1)), axis=-1), target.is_number

    return Variant("dist2", NumberReads(sums=(label,)), loss, reference, None)


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
        raise ValueError(f"expected number tokens writing an integer 0..{SMMD_MAX_VALUE} alone for ntl_kind='smmd' "
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
    q = _one_hot(target, number_tokens) * support
    counted = target.is_number & (jnp.sum(q, axis=-1) > 0)
    p = jax.nn.softmax(jnp.where(support, z, -jnp.inf), axis=-1)
    return jnp.where(support, p, 0.0), q, jnp.asarray(kernel), alpha, counted


def _smmd_combine(mmd, smooth, mode, alpha):
    # The quadratic forms are >= 0 (K and D - K are positive semidefinite); relu guards
    # against their rounding, as the authors'.
    return jax.nn.relu({"smmd": mmd + alpha * smooth, "mmd": mmd, "smooth": alpha * smooth}[mode])


@functools.lru_cache(maxsize=16)
def smmd(mode: str = "smmd", sigma: float = SMMD_SIGMA, squash_factor: float = SMMD_SQUASH_FACTOR,
         alpha: float | None = None) -> Variant:
    """SMMD with the authors' `loss_mode` (`"smmd"`: both terms; `"mmd"`: r'Kr;
    `"smooth"`: alpha r'(D - K)r), the kernel's width `sigma`, the distances' `squash_factor`
    and the smoothness weight `alpha` (None: `1 / (2 mean degree)`, the authors' "auto")."""

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

    return Variant("smmd", NumberReads(columns=True), loss, reference, None)


# The variants by the name every API takes (`kind`, `ntl_kind`, the trainer's
# `--loss ntl-<name>`); the ones with parameters at their defaults.
VARIANTS = {
    "was": was(),
    "mse": _MSE,
    "mae": _MAE,
    "huber": _HUBER,
    "number_level": number_level(False),
    "number_level_float": number_level(True),
    "was_cdf": WAS_CDF,
    "del": DEL,
    "dist2": dist2(),
    "smmd": smmd(),
}
KINDS = tuple(VARIANTS)
NUMBER_LEVEL_KINDS = ("number_level", "number_level_float")


def variant_of(kind, *, squash_factor=None, smoothed: bool = False, max_number_length=None, smmd_mode=None,
               smmd_sigma=None, smmd_alpha=None) -> Variant:
    """The `Variant` of a checked `kind`: a name in `VARIANTS`, a `Variant`, or a loss
    function `(prediction, target) -> loss` (`dot`); `squash_factor` for "was" and
    "smmd", `smoothed` (a Gaussian-smoothed label) for "was_cdf", `max_number_length`
    (None: the default) for the number-level kinds, `smmd_mode`, `smmd_sigma`,
    `smmd_alpha` for "smmd" (None: the authors' defaults)."""
    if isinstance(kind, Variant):
        return kind
    if not isinstance(kind, str):
        return dot(kind)
    if kind == "was":
        return was(squash_factor)
    if kind == "smmd":
        return smmd("smmd" if smmd_mode is None else smmd_mode,
                    SMMD_SIGMA if smmd_sigma is None else float(smmd_sigma),
                    SMMD_SQUASH_FACTOR if squash_factor is None else float(squash_factor),
                    None if smmd_alpha is None else float(smmd_alpha))
    if kind == "was_cdf" and smoothed:
        return WAS_CDF_SMOOTHED
    if kind in NUMBER_LEVEL_KINDS and max_number_length is not None:
        return number_level(kind == "number_level_float", max_number_length)
    return VARIANTS[kind]
