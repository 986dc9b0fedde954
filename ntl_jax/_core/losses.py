"""The Number Token Loss family as pure JAX functions.

Zausinger et al., "Regress, Don't Guess - A Regression-like Loss on Number Tokens for
Language Models", ICML 2025 (arXiv:2411.02083). Every function here gives the same
numbers as the authors' PyTorch package `ntloss` 0.3.2 (`NTLoss`, `NTLossDotProduct`,
`NumberLevelLoss`), but with static shapes: masks instead of boolean indexing, no
host synchronisation, so they run under `jit`, `vmap`, `grad` and sharding. NTL-WAS-CDF
(`kind="was_cdf"`) and the Gaussian label (`target_distribution`), which ntloss lacks,
follow the authors' paper code (tum-ai/number-token-loss).

Conventions (optax style): arrays first, options keyword-only. `logits` is
`[batch, length, vocab]` (f32, bf16 or f16; every statistic computed in f32, of the
logits widened: a conversion XLA fuses into each pass, not a copy; what the variants
read of the logits, and the two ways of computing it, is `number_stats`'s),
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

import functools
import math
import numbers
from typing import Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from ntl_jax._core.number_stats import DISTANCE, PROBS, RANK_DISTANCE, VALUE, NumberStats, number_ranks, number_stats
from ntl_jax._core.number_tokens import NumberTokens, check_squash_factor

Reduction = Literal["none", "sum", "mean"]
DotLoss = Literal["mse", "mae", "huber"]
_REDUCTIONS = ("none", "sum", "mean")
_EPS = float(jnp.finfo(jnp.float32).eps)
# ntloss's NumberLevelLoss precomputes powers of ten up to this many digits.
_MAX_NUMBER_LENGTH = 20
# reweigh: a position whose mass is off the number tokens costs slightly more than the
# worst number token (ntloss's constant).
_REWEIGH_MARGIN = 1.01


# -- input checks ---------------------------------------------------------------


def check_array(name: str, x, expected: str) -> None:
    """Raises TypeError unless `x` is an array (not a Python list, tuple or scalar)."""
    if isinstance(x, (list, tuple)):
        raise TypeError(
            f"expected {name} as an array of shape {expected} (jax.Array or numpy.ndarray), "
            f"got a Python {type(x).__name__}; convert it with jnp.asarray"
        )
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"expected {name} as an array of shape {expected}, got {type(x).__name__}")


def is_concrete(x) -> bool:
    """True when `x` holds values Python can read (not a tracer inside `jit`/`grad`)."""
    return not isinstance(x, jax.core.Tracer)


def check_weight_values(weights) -> None:
    """Raises ValueError if concrete `weights` hold a negative or non-finite value.

    Traced weights (inside `jit`) cannot be checked; they are assumed valid.
    """
    if weights is None or not is_concrete(weights):
        return
    w = np.asarray(weights, np.float32)
    if not np.isfinite(w).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(w))[0])
        raise ValueError(f"expected finite weights, got {w[where]} at index {where}")
    if (w < 0).any():
        where = tuple(int(i) for i in np.argwhere(w < 0)[0])
        raise ValueError(f"expected non-negative weights, got {w[where]} at index {where}")


def check_real(name: str, value, *, low: float, low_inclusive: bool = True, high: float | None = None) -> None:
    """Raises unless `value` is a finite real number in the given range.

    Python and numpy scalars and concrete 0-d arrays are checked; traced values are not.
    """
    if isinstance(value, (bool, np.bool_)) or not (
        isinstance(value, numbers.Real) or (hasattr(value, "shape") and hasattr(value, "dtype"))
    ):
        raise TypeError(f"expected {name} to be a real number, got {type(value).__name__} {value!r}")
    if hasattr(value, "dtype"):
        if not (jnp.issubdtype(value.dtype, jnp.floating) or jnp.issubdtype(value.dtype, jnp.integer)):
            raise TypeError(f"expected {name} to be a real number, got an array of {value.dtype}")
        if jnp.shape(value) != ():
            raise ValueError(f"expected {name} to be a scalar, got shape {jnp.shape(value)}")
        if not is_concrete(value):
            return
        value = float(np.asarray(value))
    bounds = f"{'>=' if low_inclusive else '>'} {low}" + (f" and < {high}" if high is not None else "")
    if not math.isfinite(value):
        raise ValueError(f"expected {name} finite and {bounds}, got {value}")
    if value < low or (value == low and not low_inclusive) or (high is not None and value >= high):
        raise ValueError(f"expected {name} {bounds}, got {value}")


def check_bool(name: str, value) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"expected {name} to be True or False, got {type(value).__name__} {value!r}")


def check_inputs(logits, targets, number_tokens: NumberTokens, weights=None):
    """Checks ranks, shapes and dtypes at trace time (and the values of concrete
    weights); returns `weights` as f32 or None."""
    if not isinstance(number_tokens, NumberTokens):
        raise TypeError(f"expected number_tokens to be a NumberTokens, got {type(number_tokens).__name__}")
    check_array("logits", logits, "[batch, length, vocab]")
    logits_shape = jnp.shape(logits)
    if len(logits_shape) != 3:
        raise ValueError(f"expected logits of rank 3 [batch, length, vocab], got shape {logits_shape}")
    if not jnp.issubdtype(jnp.result_type(logits), jnp.floating):
        raise TypeError(f"expected floating-point logits (f32, bf16 or f16), got {jnp.result_type(logits)}")
    if logits_shape[-1] < number_tokens.vocab_size:
        raise ValueError(
            f"expected logits with a last axis >= the vocabulary size of number_tokens "
            f"({number_tokens.vocab_size}), got {logits_shape[-1]}"
        )
    if targets is None:
        return None
    check_array("targets", targets, "[batch, length]")
    targets_shape = jnp.shape(targets)
    if len(targets_shape) != 2:
        raise ValueError(f"expected targets of rank 2 [batch, length], got shape {targets_shape}")
    if not jnp.issubdtype(jnp.result_type(targets), jnp.integer):
        raise TypeError(f"expected integer targets (token ids), got {jnp.result_type(targets)}")
    if targets_shape != logits_shape[:2]:
        raise ValueError(
            f"expected targets of shape {logits_shape[:2]} (logits' first two axes), got {targets_shape}"
        )
    return check_weights(weights, targets_shape)


def check_weights(weights, targets_shape):
    """Checks `weights` against the targets' shape; returns them as f32 (or None)."""
    if weights is None:
        return None
    check_array("weights", weights, "[batch, length]")
    weights_shape = jnp.shape(weights)
    if weights_shape != tuple(targets_shape):
        raise ValueError(
            f"expected weights of shape {tuple(targets_shape)} [batch, length] (as targets), got {weights_shape}"
        )
    dtype = jnp.result_type(weights)
    if not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_):
        raise TypeError(f"expected real-valued weights, got {dtype}")
    check_weight_values(weights)
    return jnp.asarray(weights, jnp.float32)


def in_vocabulary(targets, vocab_size: int):
    """The one rule for ignored targets: `[batch, length]` bool, False where the target
    id is outside `[0, vocab_size)` (T5X's rule; such positions add exactly 0)."""
    return (targets >= 0) & (targets < vocab_size)


def keep_positions(targets, weights, vocab_size: int):
    """`(keep, targets)`: `keep` `[batch, length]` bool is False at ignored positions
    (weight 0, or a target outside `[0, vocab_size)`), where the targets become -1 (so
    they are no number token and break digit runs).

    The logits are not touched here: each loss takes what it needs from them first
    (the `N` number-token columns) and sanitises that with `where`, before any
    arithmetic, so NaN or infinite logits at ignored positions reach neither the loss
    nor its gradient without a pass over `[batch, length, vocab]`.
    """
    keep = in_vocabulary(targets, vocab_size)
    if weights is not None:
        keep &= weights != 0
    return keep, jnp.where(keep, targets, -1)


# At most this many offending targets are named in `check_targets`' eager error.
_SHOWN_TARGETS = 5


def check_targets(targets: ArrayLike, vocab_size: int, *, ignore_index: int | None = -100) -> None:
    """Raises if a target id is outside `[0, vocab_size)` and is not `ignore_index`.

    Every loss here ignores such targets without an error (T5X's rule), so ids shifted
    by an offset (a tokenizer that adds special tokens, labels built for another
    vocabulary) quietly give a smaller loss. Call this on the targets before the loss to
    have them raise instead; it returns nothing and changes nothing.

    - Concrete targets (outside `jit`): raises `ValueError` naming the first offending
      values, their indices, how many there are, and `vocab_size`.
    - Traced targets (inside `jit`): the check is a `jax.experimental.checkify.check`,
      so the function that calls it must be functionalised with `checkify`, which
      returns the error as a value next to the output (below). Without `checkify`,
      tracing it under `jit` fails ("Cannot abstractly evaluate a checkify.check which
      was not functionalized").

    ```python
    from jax.experimental import checkify

    def loss_fn(params, batch):
        logits = model.apply(params, batch["inputs"])
        ntl_jax.check_targets(batch["targets"], logits.shape[-1])
        return ntl_jax.cross_entropy_and_ntl(logits, batch["targets"], number_tokens, ...)

    checked = checkify.checkify(jax.jit(loss_fn))  # errors: user checks (the default)
    err, out = checked(params, batch)
    err.throw()  # raises (a ValueError) if a target was out of range
    ```

    Args:
      targets: integer token ids, any shape (`[batch, length]` for the losses).
      vocab_size: the logits' last axis (the kernel's columns for
        `fused_cross_entropy_and_ntl`), which may exceed the tokenizer's vocabulary.
      ignore_index: one id that is allowed outside the vocabulary because it marks an
        ignored position, as ntloss's and PyTorch's `ignore_index` (default -100); None
        allows none. Positions to ignore can always be given weight 0 instead.

    Raises:
      ValueError: concrete targets out of range, or bad arguments.
      TypeError: targets that are not an integer array.

    Examples:
      >>> import jax.numpy as jnp
      >>> check_targets(jnp.array([[3, 1, -100]]), 5)  # in range, or the ignore value
      >>> check_targets(jnp.array([[3, 7, 9]]), 5)
      Traceback (most recent call last):
      ...
      ValueError: expected target ids in [0, 5) (the vocabulary size is 5) or the ignore value -100,
      got 2 out of range: 7 at (0, 1), 9 at (0, 2); the losses would ignore them silently
    """
    check_array("targets", targets, "[batch, length]")
    if not jnp.issubdtype(jnp.result_type(targets), jnp.integer):
        raise TypeError(f"expected integer targets (token ids), got {jnp.result_type(targets)}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral) or vocab_size < 1:
        raise ValueError(f"expected vocab_size to be an integer >= 1, got {vocab_size!r}")
    if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral)):
        raise ValueError(f"expected ignore_index to be an integer or None, got {ignore_index!r}")
    expected = f"target ids in [0, {vocab_size}) (the vocabulary size is {vocab_size})"
    if ignore_index is not None:
        expected += f" or the ignore value {ignore_index}"
        dtype_range = jnp.iinfo(jnp.result_type(targets))
        if not dtype_range.min <= ignore_index <= dtype_range.max:
            ignore_index = None  # the targets' dtype cannot hold it (e.g. -100 in uint32)
    if is_concrete(targets):
        ids = np.asarray(targets)
        bad = (ids < 0) | (ids >= vocab_size)
        if ignore_index is not None:
            bad &= ids != ignore_index
        if not bad.any():
            return
        where = np.argwhere(bad)
        shown = ", ".join(f"{ids[tuple(i)]} at {tuple(int(k) for k in i)}" for i in where[:_SHOWN_TARGETS])
        more = ", ..." if len(where) > _SHOWN_TARGETS else ""
        raise ValueError(f"expected {expected}, got {len(where)} out of range: {shown}{more}; "
                         "the losses would ignore them silently")
    targets = jnp.asarray(targets)
    in_vocab = in_vocabulary(targets, vocab_size)
    bad = ~in_vocab if ignore_index is None else ~in_vocab & (targets != ignore_index)
    flat = bad.reshape(-1)
    first = jnp.argmax(flat)
    # checkify formats the array arguments; the fixed numbers are part of the message.
    from jax.experimental import checkify

    checkify.check(
        ~jnp.any(flat),
        f"expected {expected}, got {{value}} at flat index {{index}} (out of range in all: {{count}}); "
        "the losses would ignore them silently",
        value=targets.reshape(-1)[first], index=first, count=jnp.sum(flat),
    )


def _check_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"expected reduction in {_REDUCTIONS}, got {reduction!r}")


# -- shared pieces ----------------------------------------------------------------


def target_values(targets, number_tokens: NumberTokens):
    """`(is_number, value)`, both `[batch, length]`: value 0 where not a number."""
    match = _number_match(targets, number_tokens)
    value = jnp.sum(jnp.where(match, jnp.asarray(number_tokens.number_values, jnp.float32), 0.0), axis=-1)
    return jnp.any(match, axis=-1), value


def target_ranks(targets, number_tokens: NumberTokens):
    """`[batch, length]` float32: each target's place among the number tokens sorted by
    value (`number_stats.number_ranks`), 0 where not a number."""
    match = _number_match(targets, number_tokens)
    return jnp.sum(jnp.where(match, number_ranks(number_tokens), 0.0), axis=-1)


def _number_match(targets, number_tokens: NumberTokens):
    """`[batch, length, N]` bool: which number token each target is (none for other ids).

    Per-target facts are read through this rather than gathered from `[vocab]` tables by
    target id: on the TPU each gathered element costs a memory tile (libtpu's compiler
    counts 4 KiB), 0.8 % of a cross-entropy's traffic at the T5 shape, while this is a
    compare and a sum fused with the other per-position arithmetic."""
    return targets[..., None] == jnp.asarray(number_tokens.ids)


def number_mass(wide, numbers: NumberStats, keep=None, *, logits=None):
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


def log_normalizer(wide, keep, *, logits=None):
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


def number_token_mask(number_tokens: NumberTokens, vocab_size: int):
    """`[vocab_size]` bool, True at the number tokens' ids (ids beyond the table: False)."""
    return jnp.zeros(vocab_size, bool).at[jnp.asarray(number_tokens.ids)].set(True)


def reduce_loss(loss, counted, weights, reduction: str):
    """Applies ntloss's reductions to a per-position `loss` at the `counted` positions."""
    _check_reduction(reduction)
    w = jnp.where(counted, 1.0 if weights is None else weights, 0.0)
    per_token = jnp.where(counted, loss, 0.0) * w
    if reduction == "none":
        return per_token
    total = jnp.sum(per_token)
    if reduction == "sum":
        return total
    return total / jnp.maximum(jnp.sum(w), _EPS)


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


def _shift_right(x, fill):
    """x[:, t-1] at position t, `fill` at t = 0."""
    return jnp.concatenate([jnp.full_like(x[:, :1], fill), x[:, :-1]], axis=1)


def _shift_left(x, fill):
    """x[:, t+1] at position t, `fill` at the last position."""
    return jnp.concatenate([x[:, 1:], jnp.full_like(x[:, :1], fill)], axis=1)


def _suffix_sums(x, ends):
    """`[batch, length]`: the sum of `x` from each position to the end of its segment
    along the length axis, segments ending at the positions `ends` (True)."""
    def add(later, earlier):  # in scan order: from the end of the row
        (x_later, end_later), (x_earlier, end_earlier) = later, earlier
        return jnp.where(end_earlier, x_earlier, x_later + x_earlier), end_later | end_earlier

    return jax.lax.associative_scan(add, (x, ends), reverse=True, axis=1)[0]


def target_digit_counts(targets, number_tokens: NumberTokens):
    """`(counts, opens)`, both `[batch, length]`: how many digits each target writes
    (`NumberTokens.digit_counts` of the target; 0 for ignored positions, ids beyond the
    table and non-numbers), and whether it begins a new number
    (`NumberTokens.opens_number`; False off the numbers)."""
    match = _number_match(targets, number_tokens)
    ids = jnp.asarray(number_tokens.ids)
    counts = jnp.sum(jnp.where(match, jnp.asarray(number_tokens.digit_counts, jnp.int32)[ids], 0), axis=-1)
    return counts, jnp.any(match & jnp.asarray(number_tokens.opens_number, bool)[ids], axis=-1)


def join_digit_runs(is_digit, digit_values, targets=None, dot_id=None, digit_counts=None, opens=None,
                    max_number_length=None):
    """Joins runs of number tokens into numbers, placing each number at its first token.

    The vectorised twin of ntloss's `NumberLevelLoss.convert_digits_to_numbers`: a run
    of consecutive digits d_1..d_k is the number sum_i d_i 10^(k-i); when `dot_id` is
    given, a single `.` between two digits does not break the run (and contributes
    nothing, so 12.34 reads as 1234, as in ntloss).

    Multi-digit tokens (beyond ntloss, whose number-level loss takes single digits only):
    with `digit_counts`, each token is placed by the digits the tokens after it in its
    run write, `sum_i v_i 10^(c_{i+1} + ... + c_k)`, so the pieces "123", "4" read 1234
    and "12", "007" read 12007 (leading zeros count). A number token that writes no
    plain digits (count 0: "-1", "3.5", "1e3") is a number of its own: it breaks runs on
    both sides and is its own value, since a sign, point or exponent has no place in a
    run of digits. Places beyond `10^(max_number_length - 1)` are clipped to it, as
    ntloss's powers of ten (its default `max_number_length` 20: 10^19).

    Args:
      is_digit: `[batch, length]` bool, the number-token positions.
      digit_values: `[batch, length]` values (any real values at number positions).
      targets: `[batch, length]` token ids, needed only with `dot_id`.
      dot_id: the id of `.`, or None to let a dot break numbers.
      digit_counts: `[batch, length]` int, the digits each position's target writes
        (`target_digit_counts`), or None for single-digit tokens (1 at every number).
      opens: `[batch, length]` bool, True where a target begins a new number whatever
        precedes it (a space-marked piece such as "Ġ12"), or None for none.
      max_number_length: the most places a number has (None: ntloss's 20); the digits
        of a longer number all take the highest place.

    Returns:
      `(starts, numbers)`: `starts` `[batch, length]` marks the first token of each
      number, `numbers` holds its value there (and 0 elsewhere).
    """
    if digit_counts is None:
        joins, counts = is_digit, is_digit.astype(jnp.int32)
    else:
        counts = jnp.where(is_digit, digit_counts, 0).astype(jnp.int32)
        joins = counts > 0
    alone = is_digit & ~joins  # count-0 number tokens: numbers of one token
    opens = jnp.zeros_like(joins) if opens is None else opens
    digit_prev = _shift_right(joins, False)
    in_number = joins
    continues = digit_prev & ~opens
    if dot_id is not None:
        is_dot = targets == dot_id
        dot_between_digits = is_dot & digit_prev & _shift_left(joins & ~opens, False)
        in_number = joins | dot_between_digits
        continues = (digit_prev | (_shift_right(is_dot, False) & _shift_right(digit_prev, False))) & ~opens
    starts = in_number & ~continues  # always a digit: a dot in a number continues it

    # Sums over the rest of each number, from each position on: a segmented scan from
    # the end of each row (no scatter or gather, which on the TPU cost a memory tile per
    # element), restarting after each number's last token.
    ends = _shift_left(starts | ~in_number, True)
    # Exponent of each token: how many digits of its number come after it.
    places = _MAX_NUMBER_LENGTH if max_number_length is None else max_number_length
    exponent = jnp.clip(_suffix_sums(counts, ends) - counts, 0, places - 1)
    contribution = jnp.where(joins, digit_values * (10.0 ** exponent.astype(jnp.float32)), 0.0)
    numbers = jnp.where(starts, _suffix_sums(contribution, ends), jnp.where(alone, digit_values, 0.0))
    return starts | alone, numbers


# -- the variants: one small function each of the number statistics and the target ----


class NumberTarget(NamedTuple):
    """The label, per position (ignored positions have id -1)."""

    ids: jax.Array  # [batch, length] token ids
    is_number: jax.Array  # [batch, length] bool: the id is a number token
    value: jax.Array  # [batch, length]: its value, 0 where not a number
    # [batch, length, N]: a Gaussian-smoothed label over the number tokens
    # (`target_distribution`), given only to the variants that read one
    # (`Variant.smoothed_reads`); None: the one-hot.
    distribution: jax.Array | None = None


def check_gce_sigma(gce_sigma) -> float:
    """`gce_sigma` as a Python float; raises unless it is a concrete finite number >= 0.

    It decides at trace time whether the label is smoothed, so a traced value is refused.
    """
    if isinstance(gce_sigma, jax.core.Tracer):
        raise TypeError("expected gce_sigma to be a concrete number (a Python float), got a traced array")
    check_real("gce_sigma", gce_sigma, low=0.0)
    return float(np.asarray(gce_sigma))


def target_distribution(targets, number_tokens: NumberTokens, gce_sigma: float = 0.0):
    """`(smoothed, q)`: the label of every position as a distribution over the number
    tokens, for Gaussian-smoothed cross-entropy (GCE) and NTL-WAS-CDF.

    `q` `[batch, length, N]` float32 is the one-hot of the target among the number
    tokens (`number_tokens.ids` order), zero where the target is no number token. With
    `gce_sigma` > 0, a number target of value `y` that writes `c` > 0 digits
    (`NumberTokens.digit_counts`) is smoothed (`smoothed` `[batch, length]` bool):
    `q_j = exp(-(v_j - y)^2 / (2 sigma^2))` over the number tokens that write `c` digits,
    normalised over them, 0 on the others. On single-digit tables that is all the digits,
    as in the authors' `GaussianLabelSmoother`; "07" is smoothed over the 2-digit pieces.
    Number tokens with a sign, point or exponent ("-1", "3.5", digit count 0) keep their
    one-hot. `gce_sigma` 0 gives the one-hot everywhere (nothing smoothed).
    """
    ids = jnp.asarray(number_tokens.ids)
    one_hot = (targets[..., None] == ids).astype(jnp.float32)
    if check_gce_sigma(gce_sigma) == 0:
        return jnp.zeros(jnp.shape(targets), bool), one_hot
    label = gaussian_label(targets, number_tokens, gce_sigma)
    q = label.at(jnp.asarray(number_tokens.number_values, jnp.float32),
                 jnp.asarray(number_tokens.digit_counts, jnp.int32)[ids])
    return label.smoothed, jnp.where(label.smoothed[..., None], q, one_hot)


class GaussianLabel(NamedTuple):
    """GCE's label at its smoothed positions (`target_distribution`), as a function of
    a number token's value and digit count (`at`), so it can be placed at any columns:
    the `N` number tokens', or the whole vocabulary's (`number_stats`)."""

    smoothed: jax.Array  # [batch, length] bool
    value: jax.Array  # [batch, length] the target's value y
    count: jax.Array  # [batch, length] int32, the digits the target writes
    scale: jax.Array  # 1 / (2 sigma^2)
    total: jax.Array  # [batch, length] the Gaussian's sum over the number tokens, >= 1 where smoothed

    def gaussian(self, values, counts):
        """`[batch, length, C]` `exp(-(v - y)^2 / (2 sigma^2))` at the columns of `values`
        that write as many digits as the target (`counts`, 0 off the numbers), 0 elsewhere."""
        same = self.smoothed[..., None] & (counts == self.count[..., None])
        return jnp.where(same, jnp.exp(-jnp.square(values - self.value[..., None]) * self.scale), 0.0)

    def at(self, values, counts):
        """`q` `[batch, length, C]` at the columns of `values` and `counts` (0 at
        positions not smoothed)."""
        return self.gaussian(values, counts) / jnp.where(self.smoothed, self.total, 1.0)[..., None]


def gaussian_label(targets, number_tokens: NumberTokens, gce_sigma: float) -> GaussianLabel:
    """The `GaussianLabel` of `targets` (sanitised) with `gce_sigma` > 0."""
    sigma = check_gce_sigma(gce_sigma)
    is_number, y = target_values(targets, number_tokens)
    counts, _ = target_digit_counts(targets, number_tokens)
    # 1 / (2 sigma^2), held finite so a tiny sigma gives the one-hot rather than 0 * inf.
    with np.errstate(over="ignore", divide="ignore"):
        scale = float(min(np.float64(0.5) / np.float64(sigma) ** 2, np.finfo(np.float32).max))
    label = GaussianLabel(is_number & (counts > 0), y, counts, jnp.float32(scale), jnp.ones(jnp.shape(y)))
    ids = jnp.asarray(number_tokens.ids)
    gaussian = label.gaussian(jnp.asarray(number_tokens.number_values, jnp.float32),
                              jnp.asarray(number_tokens.digit_counts, jnp.int32)[ids])
    # The target itself is among them at distance 0, so a smoothed row sums to >= 1.
    return label._replace(total=jnp.sum(gaussian, axis=-1))


def _was(stats, target, number_tokens, squash_factor):
    # sum_j p_j D(v_j, y): the expected (squashed) distance to the target's value.
    return stats.distance, target.is_number


def _was_cdf(stats, target, number_tokens, squash_factor):
    """`sum_k |CDF_p(k) - CDF_q(k)|` over the number tokens sorted by value (ties in id
    order), as the authors' `WassersteinNumberTokenLoss`: no gap weights (see `VARIANTS`).

    Against a one-hot label at place `t` the sum is `sum_j p_j |j - t|` over the places
    `j`: `CDF_q` steps from 0 to 1 at `t`, so the sum counts each token below `t` once
    for every place it lies under, and each above likewise, with no absolute value of a
    difference of sums left. That expected distance in rank is a statistic like NTL-WAS's
    (`NumberStats.rank_distance`), with no `p` over the number tokens to sort. A smoothed
    label (GCE) needs the cumulative sums themselves."""
    if target.distribution is None:
        return stats.rank_distance, target.is_number
    values = number_tokens.number_values
    gap = stats.probs - target.distribution
    if is_concrete(values):  # the usual closure constant: sorted once, on the host
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
    cdf_gap = jnp.cumsum(gap, axis=-1)[..., :-1]
    return jnp.sum(jnp.abs(cdf_gap), axis=-1), target.is_number


# Up to this many number tokens NTL-WAS-CDF sorts them by value with static slices.
_STATIC_PERMUTATION_MAX = 64


def _value_range(number_tokens):
    v = jnp.asarray(number_tokens.number_values, jnp.float32)
    return jnp.max(v) - jnp.min(v)


def _was_ceiling(number_tokens, squash_factor):
    if squash_factor is not None:
        return jnp.asarray(squash_factor, jnp.float32)
    return _value_range(number_tokens)


def _huber(d):
    # torch.nn.functional.huber_loss with delta 1.
    return jnp.where(jnp.abs(d) < 1.0, 0.5 * jnp.square(d), jnp.abs(d) - 0.5)


def _regression(fn):
    """A loss on the expected value (ntloss's `NTLossDotProduct`)."""

    def loss(stats, target, number_tokens, squash_factor):
        return fn(stats.value - target.value), target.is_number

    return loss


def _number_level(float_level: bool, max_number_length=None):
    """Symmetric MAPE on whole numbers, placed at their first token (`NumberLevelLoss`).

    Both the label and the prediction are placed by the target's digit counts, so a
    multi-digit tokenizer's "123", "4" is scored as 1234 against `10 E[v_1] + E[v_2]`
    (see `join_digit_runs`, and for `max_number_length`)."""

    def loss(stats, target, number_tokens, squash_factor):
        dot_id = number_tokens.dot_id if float_level else None
        counts, opens = target_digit_counts(target.ids, number_tokens)
        join = functools.partial(join_digit_runs, dot_id=dot_id, digit_counts=counts, opens=opens,
                                 max_number_length=max_number_length)
        starts, y = join(target.is_number, target.value, target.ids)
        _, yhat = join(target.is_number, stats.value, target.ids)
        # Bounded in [0, 1].
        return jnp.abs(yhat - y) / (jnp.abs(yhat) + jnp.abs(y) + _EPS), starts

    return loss


class Variant(NamedTuple):
    """An NTL variant: `loss(stats, target, number_tokens, squash_factor)` gives
    `(per-position loss, counted)` from the `NumberStats` it `reads`;
    `ceiling(number_tokens, squash_factor)` is the largest value it takes, which
    `reweigh` charges (x1.01) for mass off the numbers; `smoothed_reads`: what it reads
    instead against a Gaussian-smoothed label, which it is then given as
    `target.distribution` (variants without ignore the label)."""

    loss: Callable
    ceiling: Callable
    reads: tuple
    smoothed_reads: tuple | None = None


# The one table of NTL variants, by the name every API takes (`kind`, `ntl_kind`,
# and the trainer's `--loss ntl-<name>`).
VARIANTS = {
    "was": Variant(_was, _was_ceiling, (DISTANCE,)),
    "mse": Variant(_regression(jnp.square), lambda nt, _: jnp.square(_value_range(nt)), (VALUE,)),
    "mae": Variant(_regression(jnp.abs), lambda nt, _: _value_range(nt), (VALUE,)),
    "huber": Variant(_regression(_huber), lambda nt, _: _huber(_value_range(nt)), (VALUE,)),
    "number_level": Variant(_number_level(False), lambda nt, _: jnp.float32(1.0), (VALUE,)),
    "number_level_float": Variant(_number_level(True), lambda nt, _: jnp.float32(1.0), (VALUE,)),
    # NTL-WAS-CDF: the authors sum |CDF_p - CDF_q| over the sorted number tokens without
    # weighting by the gaps between their values, so it is measured in ranks: NTL-WAS on
    # evenly spaced unit values (digits), and at most N - 1.
    "was_cdf": Variant(_was_cdf, lambda nt, _: jnp.float32(nt.num_numbers - 1), (RANK_DISTANCE,),
                       smoothed_reads=(PROBS,)),
}
KINDS = tuple(VARIANTS)


@functools.lru_cache(maxsize=64)
def dot_variant(fn: Callable) -> Variant:
    """NTL-L_p with any loss `fn(prediction, target)`, elementwise on `[batch, length]`
    float32 arrays of the expected value and the label's (ntloss's
    `NTLossDotProduct(loss_function=fn)`). `reweigh` charges `max(|fn(lo, hi)|,
    |fn(hi, lo)|)` over the number tokens' lowest and highest values, as ntloss does."""

    def loss(stats, target, number_tokens, squash_factor):
        # Where the target is no number the loss is not counted: the prediction stands
        # in for it there, so `fn` sees a difference of 0 rather than an arbitrary one.
        return fn(stats.value, jnp.where(target.is_number, target.value, stats.value)), target.is_number

    def ceiling(number_tokens, squash_factor):
        v = jnp.asarray(number_tokens.number_values, jnp.float32)
        lo, hi = jnp.min(v), jnp.max(v)
        return jnp.maximum(jnp.abs(fn(lo, hi)), jnp.abs(fn(hi, lo))).astype(jnp.float32)

    return Variant(loss, ceiling, (VALUE,))


@functools.lru_cache(maxsize=64)
def number_level_variant(float_level: bool, max_number_length: int) -> Variant:
    """The number-level loss with numbers of at most `max_number_length` places."""
    return Variant(_number_level(float_level, max_number_length), lambda nt, _: jnp.float32(1.0), (VALUE,))


def variant_of(kind) -> Variant:
    """The `Variant` of `kind`: a name in `VARIANTS`, a `Variant`, or a loss function
    `(prediction, target) -> loss` (`dot_variant`)."""
    if isinstance(kind, Variant):
        return kind
    if isinstance(kind, str):
        return VARIANTS[kind]
    return dot_variant(kind)


def check_kind(kind, squash_factor=None, name: str = "kind") -> None:
    """Raises ValueError unless `kind` names a variant, is a `Variant` or a loss
    function `(prediction, target) -> loss` (and `squash_factor` suits it)."""
    if isinstance(kind, str):
        if kind not in VARIANTS:
            raise ValueError(f"expected {name} in {KINDS} or a function (prediction, target) -> loss, got {kind!r}")
    elif not (isinstance(kind, Variant) or callable(kind)):
        raise ValueError(f"expected {name} in {KINDS} or a function (prediction, target) -> loss, got {kind!r}")
    if squash_factor is not None and kind != "was":
        raise ValueError(f"squash_factor applies only to {name}='was', got {name}={kind!r}")


def ntl_per_position(stats: NumberStats, targets, number_tokens, *, kind="was", masses=None, squash_factor=None,
                     distribution=None):
    """`(loss, counted)`, both `[batch, length]`: the NTL `kind` at every position, from
    the number tokens' statistics alone (`NumberStats` with what `variant_of(kind).reads`).

    `masses` is `(mass, rest)`, the full-vocabulary probability on the number tokens and
    on the others, to reweigh with; None does not reweigh. `distribution` is a
    Gaussian-smoothed label over the number tokens (`target_distribution`) for the
    variants that read one (`stats` then holds their `smoothed_reads`); None is the
    one-hot. Inputs are assumed checked and ignored positions sanitised (target -1).
    """
    check_kind(kind, squash_factor)
    variant = variant_of(kind)
    target = NumberTarget(targets, *target_values(targets, number_tokens),
                          distribution=distribution if variant.smoothed_reads else None)
    loss, counted = variant.loss(stats, target, number_tokens, squash_factor)
    if masses is not None:
        mass, rest = masses
        loss = loss * mass + _REWEIGH_MARGIN * variant.ceiling(number_tokens, squash_factor) * rest
    return loss, counted


def variant_reads(kind, smoothed=False, reads=()):
    """The `NumberStats` the variant `kind` reads (`kind` None for none), with a
    Gaussian-smoothed label if `smoothed`, and `reads` besides, as a sorted tuple."""
    variant = None if kind is None else variant_of(kind)
    own = () if variant is None else variant.smoothed_reads if smoothed and variant.smoothed_reads else variant.reads
    return tuple(sorted(set(reads) | set(own)))


def target_stats_inputs(targets, number_tokens, reads):
    """`(target_value, target_rank)` for `number_stats` (the rank None unless read)."""
    _, value = target_values(targets, number_tokens)
    return value, target_ranks(targets, number_tokens) if RANK_DISTANCE in reads else None


def variant_stats(kind, wide, keep, targets, number_tokens, *, squash_factor=None, label=None, reads=(),
                  logits=None):
    """The `NumberStats` the variant `kind` reads (and `reads`; `kind` None for none)
    of the float32 logits `wide` (see `number_stats`), `targets` sanitised (-1 where not
    `keep`); `label` (a Gaussian-smoothed one, or None) and `logits` as in `number_stats`."""
    reads = variant_reads(kind, label is not None, reads)
    value, rank = target_stats_inputs(targets, number_tokens, reads)
    return number_stats(wide, keep, value, number_tokens, reads=reads, target_rank=rank,
                        squash_factor=squash_factor if DISTANCE in reads else None, label=label, logits=logits)


def _ntl(logits, targets, number_tokens, *, kind, weights, reweigh, squash_factor, reduction):
    """Every public loss: checks, sanitises ignored positions, computes, reduces."""
    _check_reduction(reduction)
    check_squash_factor(squash_factor)
    check_bool("reweigh", reweigh)
    check_kind(kind, squash_factor, name="ntl_kind")
    weights = check_inputs(logits, targets, number_tokens, weights)
    # The logits are read widened to float32 (a conversion XLA fuses into each pass,
    # not a copy) and only through the number statistics (and, to reweigh, the maximum
    # and the exponentials' sum a cross-entropy computes too).
    keep, targets = keep_positions(targets, weights, jnp.shape(logits)[-1])
    logits = jnp.asarray(logits)
    wide = logits.astype(jnp.float32)
    stats = variant_stats(kind, wide, keep, targets, number_tokens, squash_factor=squash_factor, logits=logits)
    masses = number_mass(wide, stats, keep, logits=logits)[1] if reweigh else None
    loss, counted = ntl_per_position(
        stats, targets, number_tokens, kind=kind, masses=masses, squash_factor=squash_factor,
    )
    return reduce_loss(loss, counted, weights, reduction)


# -- public losses ---------------------------------------------------------------


def ntl_was(
    logits: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    weights: ArrayLike | None = None,
    reweigh: bool = False,
    squash_factor: float | None = None,
    reduction: Reduction = "none",
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
                squash_factor=squash_factor, reduction=reduction)


def ntl_dot(
    logits: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    weights: ArrayLike | None = None,
    ntl_kind: DotLoss | Callable = "mse",
    reweigh: bool = False,
    reduction: Reduction = "none",
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
                squash_factor=None, reduction=reduction)


def number_level_loss(
    logits: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    weights: ArrayLike | None = None,
    ntl_kind: Literal["number_level", "number_level_float"] = "number_level",
    reweigh: bool = False,
    reduction: Reduction = "none",
    max_number_length: int = _MAX_NUMBER_LENGTH,
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
    if isinstance(max_number_length, bool) or not isinstance(max_number_length, numbers.Integral) \
            or max_number_length < 1:
        raise ValueError(f"expected max_number_length to be an integer >= 1, got {max_number_length!r}")
    kind = ntl_kind
    if max_number_length != _MAX_NUMBER_LENGTH:
        kind = number_level_variant(ntl_kind == "number_level_float", int(max_number_length))
    return _ntl(logits, targets, number_tokens, kind=kind, weights=weights, reweigh=reweigh,
                squash_factor=None, reduction=reduction)


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
) -> jax.Array:
    """Any NTL variant by name: `ntl_kind` in `"was"`, `"mse"`, `"mae"`, `"huber"`,
    `"number_level"`, `"number_level_float"`, `"was_cdf"` (against the one-hot label;
    its Gaussian-smoothed label comes with `cross_entropy_and_ntl(gce_sigma=...)`), or a
    loss function `(prediction, target) -> loss` (as `ntl_dot`'s); the same name as
    `cross_entropy_and_ntl`'s and the T5X models' `ntl_kind`.
    Other arguments as in `ntl_was`; as there, the default `reduction="none"` returns
    the per-position `[batch, length]` array, not a scalar: pass `"mean"` or `"sum"`
    for a loss to differentiate.

    Examples:
      >>> import jax.numpy as jnp
      >>> nt = NumberTokens.from_pieces(["<pad>", "2", "0", "1"])  # ids out of value order
      >>> logits = jnp.log(jnp.array([[[1e-9, 0.5, 0.5, 0.0]]]) + 1e-30)
      >>> cdf = number_token_loss(logits, jnp.array([[3]]), nt, ntl_kind="was_cdf", reduction="sum")
      >>> float(cdf)  # |.5-0| + |.5-1|
      1.0
    """
    return _ntl(logits, targets, number_tokens, kind=ntl_kind, weights=weights, reweigh=reweigh,
                squash_factor=squash_factor, reduction=reduction)


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
    check_inputs(logits, None, number_tokens)
    logits = jnp.asarray(logits)
    wide = logits.astype(jnp.float32)
    keep = jnp.ones(wide.shape[:-1], bool)
    stats = number_stats(wide, keep, jnp.zeros(keep.shape, jnp.float32), number_tokens, reads=(VALUE,), logits=logits)
    return stats.value, number_mass(wide, stats, keep, logits=logits)[1][0]
