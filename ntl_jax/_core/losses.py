"""The Number Token Loss family as pure JAX functions.

Zausinger et al., "Regress, Don't Guess - A Regression-like Loss on Number Tokens for
Language Models", ICML 2025 (arXiv:2411.02083). Every function here gives the same
numbers as the authors' PyTorch package `ntloss` 0.3.2 (`NTLoss`, `NTLossDotProduct`,
`NumberLevelLoss`), but with static shapes: masks instead of boolean indexing, no
host synchronisation, so they run under `jit`, `vmap`, `grad` and sharding. NTL-WAS-CDF
(`kind="was_cdf"`) and the Gaussian label (`cross_entropy_and_ntl(gce_sigma=...)`), which
ntloss lacks, follow the authors' paper code (tum-ai/number-token-loss); NTL's
successors DEL (`"del"`), DIST² (`"dist2"`) and SMMD (`"smmd"`) follow their papers (see
`number_token_loss`). What each loss computes is written in `variants.py`.

Conventions (optax style): arrays first, options keyword-only. `logits` is
`[batch, length, vocab]` (f32, bf16 or f16; every statistic computed in f32, of the
logits widened: a conversion XLA fuses into each pass, not a copy; how, on each
backend, is `number_stats`'s and the `formulation` argument's),
`targets` `[batch, length]` integer token ids,
`weights` `[batch, length]` finite and non-negative. `vocab` may exceed the
`NumberTokens` table's size (networks round their vocabulary up, e.g. to a multiple of
128): the ids beyond the table are not numbers. A position is
ignored, like ntloss's `ignore_index`, when its weight is 0 or its target
id is outside `[0, vocab)`: it contributes exactly 0 whatever its logits hold (NaN and
infinities included, gradients too) and it breaks a run of digits in the number-level
loss. Out-of-range targets are ignored without an error (T5X's rule), so ids off by an
offset quietly give a smaller loss: `check_targets(targets, vocab)` raises for them
(a `ValueError` outside `jit`; under `jit` through `jax.experimental.checkify`).
A position counts when its target is a number token and it is not ignored (for
the number-level loss: when it starts a number). `reduction`:

- `"none"` (the default): `[batch, length]`, loss x weight at counted positions, 0
  elsewhere. An array, not a scalar: `jax.grad` of it fails with "Gradient only
  defined for scalar-output functions", so to train on a loss pass `"mean"` or
  `"sum"` (or reduce it yourself);
- `"sum"`: the sum of that;
- `"mean"`: that sum over the sum of the weights at counted positions (0 if none).

`reweigh` defaults to False as in the paper; ntloss defaults to True.

Arguments are checked when the function is traced: shapes, dtypes, Python options, and
the values of weights that are concrete arrays (negative or non-finite weights raise
`ValueError`). Under `jit` the weights are traced and cannot be looked at: they are
assumed finite and non-negative.
"""

from __future__ import annotations

from typing import Callable, Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from ntl_jax._core import checks, digit_runs, head_stats, number_stats, variants
from ntl_jax._core.number_stats import NumberReads, expected_value
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.targets import number_target

Reduction = Literal["none", "sum", "mean"]
DotLoss = Literal["mse", "mae", "huber"]
_EPS = float(jnp.finfo(jnp.float32).eps)


def _checked_variant(kind, *, squash_factor, max_number_length, smmd=None):
    """The `Variant` that `kind` and its options name, each option checked (the table
    against `squash_factor` is the caller's to check, once the table is); `smmd`: the
    dict of SMMD's options, `smmd_mode`, `smmd_sigma`, `smmd_alpha`."""
    checks.check_squash_factor(squash_factor)
    checks.check_kind(kind, squash_factor)
    smmd = smmd or {}
    checks.check_smmd_options(kind, **smmd)
    if max_number_length is not None:
        max_number_length = checks.check_max_number_length(max_number_length)
    return variants.variant_of(kind, squash_factor=squash_factor, max_number_length=max_number_length, **smmd)


def _ntl(logits, targets, number_tokens, *, kind, weights, reweigh, squash_factor, reduction, formulation,
         max_number_length=None, smmd=None):
    """Every public loss: checks once, then the labels, the head's statistics, the
    variant's loss, the reduction."""
    checks.check_reduction(reduction)
    checks.check_bool("reweigh", reweigh)
    variant = _checked_variant(kind, squash_factor=squash_factor, max_number_length=max_number_length, smmd=smmd)
    checks.check_formulation(formulation)
    weights = checks.check_logits_and_targets(logits, targets, number_tokens, weights)
    if squash_factor is not None and kind == "was":  # SMMD's squash needs no third value
        number_tokens.check_squashable()
    if reweigh and variant.ceiling is None:
        raise ValueError(f"expected reweigh=False with ntl_kind={kind!r}, which has no largest value to charge "
                         "for probability off the number tokens; got reweigh=True")
    target = number_target(targets, weights, jnp.shape(logits)[-1], number_tokens)
    head = head_stats.from_logits(logits, target, number_tokens, variant.reads, reweigh=reweigh,
                                  formulation=formulation)
    loss, counted = variant.loss(head.numbers, target, number_tokens)
    if reweigh:
        loss = variants.reweigh(loss, head.masses, variant, number_tokens)
    return reduce_loss(loss, counted, weights, reduction)


def reduce_loss(loss, counted, weights, reduction: str):
    """ntloss's reductions of a per-position `loss` at the `counted` positions."""
    w = jnp.where(counted, 1.0 if weights is None else weights, 0.0)
    per_token = jnp.where(counted, loss, 0.0) * w
    if reduction == "none":
        return per_token
    total = jnp.sum(per_token)
    if reduction == "sum":
        return total
    return total / jnp.maximum(jnp.sum(w), _EPS)


def ntl_was(
    logits: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    weights: ArrayLike | None = None,
    reweigh: bool = False,
    squash_factor: float | None = None,
    reduction: Reduction = "none",
    formulation: str = "auto",
) -> jax.Array:
    """NTL-WAS: the Wasserstein-1 distance between the predicted number distribution
    and the one-hot label (the paper's default; ntloss's `NTLoss`).

    Per counted position: `sum_j p_j * D[y, j]` with `p` the softmax over the number
    tokens only and `D` the distance table (|v_y - v_j|, or its squashed form).

    Args:
      logits: `[batch, length, vocab]` floating.
      targets: `[batch, length]` integer token ids. Ids outside `[0, vocab)` are
        ignored positions, without an error (T5X's rule); `check_targets(targets,
        vocab)` raises for them instead.
      number_tokens: the vocabulary's `NumberTokens`.
      weights: optional `[batch, length]` non-negative weights.
      reweigh: scale by the full-vocabulary mass `m` on number tokens and add
        `1.01 * max_dist * (1 - m)`. The paper does not; ntloss defaults to True.
      squash_factor: if given (> 1), the farthest wrong token costs this many times
        the closest wrong one.
      formulation: how the number statistics are computed, as in
        `cross_entropy_and_ntl` (default "auto": each backend's own).
      reduction: `"none"` (the default, as ntloss's), `"sum"` or `"mean"` (see the
        module docstring). `"none"` gives the per-position array, not a scalar: pass
        `"mean"` or `"sum"` for a loss to differentiate, or `jax.grad` fails with
        "Gradient only defined for scalar-output functions".

    Returns:
      `[batch, length]` float32 for `"none"` (the default), else a float32 scalar.

    Examples:
      >>> import jax.numpy as jnp
      >>> nt = NumberTokens.from_pieces(["<pad>", "0", "1", "2"])
      >>> logits = jnp.log(jnp.array([[[1e-9, 0.5, 0.0, 0.5]]]) + 1e-30)
      >>> float(ntl_was(logits, jnp.array([[1]]), nt, reduction="sum"))  # 0.5*0 + 0.5*2
      1.0
      >>> ntl_was(logits, jnp.array([[1]]), nt).shape  # the default reduction="none": per position
      (1, 1)
    """
    return _ntl(logits, targets, number_tokens, kind="was", weights=weights, reweigh=reweigh,
                squash_factor=squash_factor, reduction=reduction, formulation=formulation)


def ntl_dot(
    logits: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    weights: ArrayLike | None = None,
    ntl_kind: DotLoss | Callable = "mse",
    reweigh: bool = False,
    reduction: Reduction = "none",
    formulation: str = "auto",
) -> jax.Array:
    """NTL-MSE / MAE / Huber, or any loss: a regression loss on the expected
    number-token value (the paper's NTL-L_p; ntloss's `NTLossDotProduct`).

    Per counted position: `f(sum_j p_j v_j - y)` with `p` the softmax over the number
    tokens only and `f` the squared error, absolute error, or Huber loss with delta 1
    (as `torch.nn.functional.huber_loss`); or `ntl_kind(sum_j p_j v_j, y)` for a function.

    Args:
      logits, targets, number_tokens, weights: as in `ntl_was`.
      reduction: as in `ntl_was`: the default `"none"` is the per-position array, not
        a scalar to differentiate; pass `"mean"` or `"sum"` to train on it.
      ntl_kind: `"mse"`, `"mae"`, `"huber"`, or a function `(prediction, target) -> loss`
        of two float32 `[batch, length]` arrays, elementwise and traceable (jnp
        operations), as ntloss's `loss_function`: e.g. log-cosh,
        `lambda p, y: jnp.log(jnp.cosh(p - y))`.
      reweigh: as in `ntl_was`, with `max_dist = f(max v - min v)`
        (`max(|f(lo, hi)|, |f(hi, lo)|)` for a function `f`, as ntloss). The paper
        does not reweigh; ntloss defaults to True.

    Returns:
      `[batch, length]` float32 for `"none"` (the default), else a float32 scalar.

    Examples:
      >>> import jax.numpy as jnp
      >>> nt = NumberTokens.from_pieces(["<pad>", "0", "1", "2"])
      >>> logits = jnp.log(jnp.array([[[1e-9, 0.5, 0.0, 0.5]]]) + 1e-30)
      >>> float(ntl_dot(logits, jnp.array([[3]]), nt, reduction="sum"))  # (1 - 2)^2
      1.0
    """
    if isinstance(ntl_kind, str) and ntl_kind not in ("mse", "mae", "huber") \
            or not (isinstance(ntl_kind, str) or callable(ntl_kind)):
        raise ValueError(f"expected ntl_kind in ('mse', 'mae', 'huber') or a function (prediction, target) -> loss, "
                         f"got {ntl_kind!r}")
    return _ntl(logits, targets, number_tokens, kind=ntl_kind, weights=weights, reweigh=reweigh,
                squash_factor=None, reduction=reduction, formulation=formulation)


def number_level_loss(
    logits: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    weights: ArrayLike | None = None,
    ntl_kind: Literal["number_level", "number_level_float"] = "number_level",
    reweigh: bool = False,
    reduction: Reduction = "none",
    max_number_length: int = digit_runs.MAX_NUMBER_LENGTH,
    formulation: str = "auto",
) -> jax.Array:
    """Number-level NTL: whole numbers scored with symmetric MAPE (ntloss's
    `NumberLevelLoss`), without leaving the device.

    Runs of digit targets are joined into numbers (`join_digit_runs`) on both the
    labels and the expected digit values; each number contributes
    `|yhat - y| / (|yhat| + |y| + eps)` at its first digit, weighted by that
    position's weight.

    A weight of 0 ignores a position as everywhere (its logits are never read), so
    inside a number it ends the number: weights `[1, 1, 0, 1, 1]` on "a 1 2 3 b" give
    the numbers "1" and "3". ntloss's `loss_weights` differ here: it joins 123 across the
    masked digit, reading that digit's prediction, and weighs it by the first digit's
    weight (its `ignore_index`, -100, splits as we do).

    Multi-digit number tokens (a table built with `digit_level=False`, e.g. LLaMA-3's
    "0".."999") go beyond ntloss, which takes single digits only here: a run of
    plain-digit tokens is one number, each token's value (the label's, or the expected
    value over all number tokens) placed by the digits the target tokens after it write
    (`NumberTokens.digit_counts`), so "123", "4" is 1234 against `10 E[v_1] + E[v_2]`
    and "12", "007" is 12007. Number tokens with a sign, point or exponent ("-1",
    "3.5") are numbers on their own. On single-digit tables nothing changes.

    Args:
      logits, targets, number_tokens, weights: as in `ntl_was`.
      reduction: as in `ntl_was`: the default `"none"` is the per-position array, not
        a scalar to differentiate; pass `"mean"` or `"sum"` to train on it.
      ntl_kind: `"number_level"`, or `"number_level_float"` to let a single `.` between
        digits join them (needs a `.` token; ntloss's `float_level=True`).
      reweigh: as in `ntl_was` with `max_dist = 1`. The paper does not reweigh;
        ntloss defaults to True.
      max_number_length: the most places a number has, as ntloss's (default 20): in a
        longer run the leading digits all take the highest place, 10^(max - 1), in the
        label and the prediction alike, as ntloss does.

    Returns:
      `[batch, length]` float32 for `"none"` (the default; non-zero only at first
      digits), else a float32 scalar.

    Examples:
      >>> import jax.numpy as jnp
      >>> nt = NumberTokens.from_pieces(["<pad>", "0", "1", "2"])
      >>> sure = lambda ids: jnp.log(jax.nn.one_hot(ids, 4) + 1e-30)
      >>> logits = sure(jnp.array([[3, 2, 0]]))  # predicts "21", label "12"
      >>> round(float(number_level_loss(logits, jnp.array([[2, 3, 0]]), nt, reduction="sum")), 4)
      0.2727
      >>> wide = NumberTokens.from_pieces(["<pad>", "4", "5", "123", "007"], digit_level=False)
      >>> logits = jnp.log(jax.nn.one_hot(jnp.array([[3, 2, 0]]), 5) + 1e-30)  # predicts "123", "5"
      >>> round(float(number_level_loss(logits, jnp.array([[3, 1, 0]]), wide, reduction="sum")), 6)  # 1/2469
      0.000405
    """
    if ntl_kind not in ("number_level", "number_level_float"):
        raise ValueError(f"expected ntl_kind in ('number_level', 'number_level_float'), got {ntl_kind!r}")
    max_number_length = checks.check_max_number_length(max_number_length)
    kind = variants.number_level(ntl_kind == "number_level_float", max_number_length)
    return _ntl(logits, targets, number_tokens, kind=kind, weights=weights, reweigh=reweigh,
                squash_factor=None, reduction=reduction, formulation=formulation)


def number_token_loss(
    logits: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    ntl_kind: str | Callable = "was",
    weights: ArrayLike | None = None,
    reweigh: bool = False,
    squash_factor: float | None = None,
    reduction: Reduction = "none",
    formulation: str = "auto",
    max_number_length: int | None = None,
    smmd_mode: str | None = None,
    smmd_sigma: float | None = None,
    smmd_alpha: float | None = None,
) -> jax.Array:
    """Any number loss by name: `ntl_kind` in `"was"`, `"mse"`, `"mae"`, `"huber"`,
    `"number_level"`, `"number_level_float"`, `"was_cdf"` (against the one-hot label;
    its Gaussian-smoothed label comes with `cross_entropy_and_ntl(gce_sigma=...)`),
    `"del"`, `"dist2"`, `"smmd"`, or a loss function `(prediction, target) -> loss` (as
    `ntl_dot`'s); the same name as `cross_entropy_and_ntl`'s and the T5X models'
    `ntl_kind`. Each is written, beside a plain reference, in `ntl_jax/_core/variants.py`.

    NTL's successors, at a number-token target `y` with `z` the number tokens' logits and
    `p = softmax(z)` over the number tokens only:

    - `"del"`, DEL (Zheng et al., arXiv 2605.20369): `w * sum_k p_k BCE(z_k, [k = y])`,
      BCE with logits, the gradient through both `p` and BCE; `w` the target's place in
      its number: an integer digit `k` places left of the decimal point (ones: 1) weighs
      `2k`, the `m`-th decimal digit `1.02^-(m + 1)` (see `digit_runs.place_weights`).
      Numbers are runs of number tokens within one sequence. The authors add
      `0.01 * mean over (digit positions x 10 digits)` to a token-mean cross-entropy:
      a mean of this loss over digit positions times 0.001 (docs/guides/losses.md).
    - `"dist2"`, DIST² (Chung et al., arXiv 2503.02379): `KL(q || p)` with
      `q_j ∝ exp(-(v_j - y)^2 / tau)` over the number tokens, tau = 1; the authors weigh
      it by 0.1 next to CE.
    - `"smmd"`, SMMD, Smooth MMD (arXiv 2606.27731; the authors' `SMMDLoss`):
      `relu(r'Kr + alpha r'(D - K)r)` with `r = p - onehot(y)`, `p` the softmax over
      SMMD's number tokens, `K_ij = exp(-d'(v_i, v_j)^2 / (2 sigma^2))` (`d'` the value
      distance squashed so the closest pair is 1 apart and the farthest
      `squash_factor`), `D = diag(sum_j K_ij)`; computed from one product `K p` per
      position (`N^2` multiply-adds), never `p p'`. Its number tokens are the authors':
      integers 0..999 written alone, without a leading zero (`variants.smmd_support`):
      a multi-digit table's "07", "-1", "3.5", "1000" are left out of its softmax, and
      a position whose target is one of them is not counted. Options, None for the
      authors' defaults: `smmd_mode` `"smmd"` (both terms, the default), `"mmd"`
      (r'Kr) or `"smooth"` (alpha r'(D - K)r); `smmd_sigma` (2); `squash_factor` (9;
      on digits squashing changes nothing); `smmd_alpha` (`1 / (2 mean_i sum_j K_ij)`).

    None has a largest value, so none takes `reweigh`.
    Other arguments as in `ntl_was` (`formulation` and `max_number_length` as in
    `cross_entropy_and_ntl`; `squash_factor` with `"was"` or `"smmd"`); as
    there, the default `reduction="none"` returns
    the per-position `[batch, length]` array, not a scalar: pass `"mean"` or `"sum"`
    for a loss to differentiate.

    Examples:
      >>> import jax.numpy as jnp
      >>> nt = NumberTokens.from_pieces(["<pad>", "2", "0", "1"])  # ids out of value order
      >>> logits = jnp.log(jnp.array([[[1e-9, 0.5, 0.5, 0.0]]]) + 1e-30)
      >>> cdf = number_token_loss(logits, jnp.array([[3]]), nt, ntl_kind="was_cdf", reduction="sum")
      >>> float(cdf)  # |.5-0| + |.5-1|
      1.0
      >>> digits = NumberTokens.from_pieces(["x"] + list("0123456789"))
      >>> sure_of_2 = jnp.log(jax.nn.one_hot(jnp.array([[3]]), 11) + 1e-30)
      >>> mmd = number_token_loss(sure_of_2, jnp.array([[1]]), digits, ntl_kind="smmd", smmd_mode="mmd")
      >>> round(float(mmd[0, 0]), 4)  # r = e_2 - e_0: 2 - 2 exp(-2^2 / 8)
      0.7869
    """
    return _ntl(logits, targets, number_tokens, kind=ntl_kind, weights=weights, reweigh=reweigh,
                squash_factor=squash_factor, reduction=reduction, formulation=formulation,
                max_number_length=max_number_length,
                smmd=dict(smmd_mode=smmd_mode, smmd_sigma=smmd_sigma, smmd_alpha=smmd_alpha))


def ntl_from_number_logits(
    number_logits: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    ntl_kind: str | Callable = "was",
    weights: ArrayLike | None = None,
    squash_factor: float | None = None,
    max_number_length: int | None = None,
    reduction: Reduction = "none",
    smmd_mode: str | None = None,
    smmd_sigma: float | None = None,
    smmd_alpha: float | None = None,
) -> jax.Array:
    """`number_token_loss` from the number tokens' logits alone, `[batch, length, N]`.

    NTL reads only the softmax over the number tokens, so a head that can compute their
    `N` columns (`hidden @ kernel[:, number_tokens.ids]`) never needs the
    `[batch, length, vocab]` logits for it: this is how a framework that computes its own
    cross-entropy, perhaps in vocabulary tiles, adds NTL beside it (`ntl_jax.maxtext`).
    The same numbers as `number_token_loss(logits, ...)` when
    `number_logits == logits[..., number_tokens.ids]`, to float32 rounding. Without the
    full log-normaliser there is no `reweigh`.

    Args:
      number_logits: `[batch, length, N]` floating, column `j` the logit of the token
        `number_tokens.ids[j]`.
      targets: `[batch, length]` integer token ids of the whole vocabulary. Ids outside
        `[0, number_tokens.vocab_size)` are no numbers.
      number_tokens, ntl_kind, weights, squash_factor, reduction: as in
        `number_token_loss`; `max_number_length` as in `cross_entropy_and_ntl`.
      smmd_mode, smmd_sigma, smmd_alpha: as in `number_token_loss`.

    Examples:
      >>> import jax.numpy as jnp
      >>> nt = NumberTokens.from_pieces(["<pad>", "0", "1", "2"])
      >>> logits = jnp.log(jnp.array([[[1e-9, 0.5, 0.5, 0.0]]]) + 1e-30)
      >>> float(ntl_from_number_logits(logits[..., 1:], jnp.array([[3]]), nt, reduction="sum"))  # .5*2 + .5*1
      1.5
    """
    checks.check_reduction(reduction)
    variant = _checked_variant(ntl_kind, squash_factor=squash_factor, max_number_length=max_number_length,
                               smmd=dict(smmd_mode=smmd_mode, smmd_sigma=smmd_sigma, smmd_alpha=smmd_alpha))
    checks.check_number_tokens(number_tokens)
    weights = checks.check_number_logits_and_targets(number_logits, targets, number_tokens, weights)
    if squash_factor is not None and ntl_kind == "was":
        number_tokens.check_squashable()
    target = number_target(targets, weights, number_tokens.vocab_size, number_tokens)
    # Ignored positions read zeros: whatever their logits hold reaches no value or gradient.
    columns = jnp.where(target.keep[..., None], jnp.asarray(number_logits).astype(jnp.float32), 0.0)
    stats = number_stats.from_columns(columns, target, number_tokens, variant.reads)
    loss, counted = variant.loss(stats, target, number_tokens)
    return reduce_loss(loss, counted, weights, reduction)


def predict_numbers(logits: ArrayLike, number_tokens: NumberTokens) -> tuple[jax.Array, jax.Array]:
    """The expected number-token value and the number-token mass at every position.

    Args:
      logits: `[batch, length, vocab]` floating.
      number_tokens: the vocabulary's `NumberTokens`.

    Returns:
      `(value, number_mass)`, both `[batch, length]` float32: `sum_j p_j v_j` with `p`
      the softmax over the number tokens only, and the full-vocabulary softmax
      probability on number tokens.

    Examples:
      >>> import jax.numpy as jnp
      >>> nt = NumberTokens.from_pieces(["a", "0", "1", "2"])
      >>> value, mass = predict_numbers(jnp.log(jnp.array([[[0.5, 0.25, 0.0, 0.25]]]) + 1e-30), nt)
      >>> round(float(value[0, 0]), 4), round(float(mass[0, 0]), 4)
      (1.0, 0.5)
    """
    checks.check_logits_and_targets(logits, None, number_tokens)
    everywhere = jnp.zeros(jnp.shape(logits)[:2], jnp.int32)  # every position kept; the ids are not read
    target = number_target(everywhere, None, jnp.shape(logits)[-1], number_tokens)
    head = head_stats.from_logits(logits, target, number_tokens, NumberReads(means=(expected_value,)), reweigh=True)
    return head.numbers.means[expected_value], head.masses[0]
