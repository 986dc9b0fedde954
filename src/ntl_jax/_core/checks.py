"""Every input check, run once at the public boundary (never inside the math).

Each raises `TypeError`/`ValueError` saying what was expected and what came. Shapes,
dtypes and Python options are checked when a function is traced; the values of weights
only when they are concrete (outside `jit`; traced weights are assumed finite and
non-negative).
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from ntl_jax._core.compat import is_traced
from ntl_jax._core.normalization import special_factor
from ntl_jax._core.number_tokens import NumberTokens

REDUCTIONS = ("none", "sum", "mean")
# At most this many offending targets are named in `check_targets`' eager error.
_SHOWN_TARGETS = 5


def check_array(name: str, x, expected: str) -> None:
    """Raises TypeError unless `x` is an array (not a Python list, tuple or scalar)."""
    if isinstance(x, (list, tuple)):
        raise TypeError(
            f"expected {name} as an array of shape {expected} (jax.Array or numpy.ndarray), "
            f"got a Python {type(x).__name__}; convert it with jnp.asarray"
        )
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"expected {name} as an array of shape {expected}, got {type(x).__name__}")


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
        if is_traced(value):
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


def check_weight_values(weights) -> None:
    """Raises ValueError if concrete `weights` hold a negative or non-finite value.

    Traced weights (inside `jit`) cannot be checked; they are assumed valid.
    """
    if weights is None or is_traced(weights):
        return
    w = np.asarray(weights, np.float32)
    if not np.isfinite(w).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(w))[0])
        raise ValueError(f"expected finite weights, got {w[where]} at index {where}")
    if (w < 0).any():
        where = tuple(int(i) for i in np.argwhere(w < 0)[0])
        raise ValueError(f"expected non-negative weights, got {w[where]} at index {where}")


def check_logits_and_targets(logits, targets, number_tokens: NumberTokens, weights=None):
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
    _check_integer_dtype(targets)
    if targets_shape != logits_shape[:2]:
        raise ValueError(
            f"expected targets of shape {logits_shape[:2]} (logits' first two axes), got {targets_shape}"
        )
    return check_weights(weights, targets_shape)


def check_number_logits_and_targets(number_logits, targets, number_tokens: NumberTokens, weights=None):
    """`check_logits_and_targets` for the number tokens' logits `[batch, length, N]`;
    returns `weights` as f32 or None."""
    check_array("number_logits", number_logits, "[batch, length, N]")
    shape = jnp.shape(number_logits)
    if len(shape) != 3 or shape[-1] != number_tokens.num_numbers:
        raise ValueError(f"expected number_logits of shape [batch, length, {number_tokens.num_numbers}] (a column per "
                         f"number token), got {shape}")
    if not jnp.issubdtype(jnp.result_type(number_logits), jnp.floating):
        raise TypeError(f"expected floating-point number_logits, got {jnp.result_type(number_logits)}")
    check_array("targets", targets, "[batch, length]")
    _check_integer_dtype(targets)
    if jnp.shape(targets) != shape[:2]:
        raise ValueError(f"expected targets of shape {shape[:2]} (number_logits' first two axes), "
                         f"got {jnp.shape(targets)}")
    return check_weights(weights, shape[:2])


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


def check_hidden_and_kernel(hidden, kernel, targets, number_tokens, weights=None, chunk_size=None):
    """The checks of the fused head's arrays at trace time; returns `weights` as float32
    (or None)."""
    if not isinstance(number_tokens, NumberTokens):
        raise TypeError(f"expected number_tokens to be a NumberTokens, got {type(number_tokens).__name__}")
    check_array("hidden", hidden, "[batch, length, d_model]")
    check_array("kernel", kernel, "[d_model, vocab]")
    check_array("targets", targets, "[batch, length]")
    if jnp.ndim(hidden) != 3:
        raise ValueError(f"expected hidden of rank 3 [batch, length, d_model], got shape {jnp.shape(hidden)}")
    if jnp.ndim(kernel) != 2:
        raise ValueError(f"expected kernel of rank 2 [d_model, vocab], got shape {jnp.shape(kernel)}")
    for name, x in (("hidden", hidden), ("kernel", kernel)):
        if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
            raise TypeError(f"expected floating-point {name} (f32, bf16 or f16), got {jnp.result_type(x)}")
    if jnp.shape(kernel)[0] != jnp.shape(hidden)[-1]:
        raise ValueError(
            f"expected kernel of shape [d_model={jnp.shape(hidden)[-1]}, vocab] (hidden's last axis), "
            f"got {jnp.shape(kernel)}"
        )
    if jnp.shape(kernel)[1] < number_tokens.vocab_size:
        raise ValueError(
            f"expected a kernel with >= {number_tokens.vocab_size} columns (the vocabulary size of "
            f"number_tokens), got {jnp.shape(kernel)[1]}"
        )
    if jnp.ndim(targets) != 2 or jnp.shape(targets) != jnp.shape(hidden)[:2]:
        raise ValueError(
            f"expected targets of shape {jnp.shape(hidden)[:2]} (hidden's first two axes), got {jnp.shape(targets)}"
        )
    _check_integer_dtype(targets)
    check_chunk_size(chunk_size)
    return check_weights(weights, jnp.shape(targets))


def check_chunk_size(chunk_size, name: str = "chunk_size") -> None:
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1
    ):
        raise ValueError(f"expected {name} None or a positive int, got {chunk_size!r}")


def check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"expected reduction in {REDUCTIONS}, got {reduction!r}")


def check_gce_sigma(gce_sigma) -> float:
    """`gce_sigma` as a Python float; raises unless it is a concrete finite number >= 0.

    It decides at trace time whether the label is smoothed, so a traced value is refused.
    """
    if is_traced(gce_sigma):
        raise TypeError("expected gce_sigma to be a concrete number (a Python float), got a traced array")
    check_real("gce_sigma", gce_sigma, low=0.0)
    return float(np.asarray(gce_sigma))


def check_targets(targets: ArrayLike, vocab_size: int, *, ignore_index: int | None = -100) -> None:
    """Raises if a target id is outside `[0, vocab_size)` and is not `ignore_index`.

    The losses ignore such ids silently (T5X's rule), so ids off by an offset give a
    smaller loss; call this first to have them raise. Concrete targets raise a
    `ValueError` naming the ids, their indices and `vocab_size`; traced targets add a
    `jax.experimental.checkify` check, so wrap the caller in `checkify.checkify` (the
    getting-started guide shows it).

    Args:
      targets: integer token ids, any shape.
      vocab_size: the logits' last axis (the kernel's columns for the fused head).
      ignore_index: one id allowed outside the vocabulary (ntloss's -100); None: none.

    Examples:
      >>> import jax.numpy as jnp
      >>> check_targets(jnp.array([[3, 1, -100]]), 5)  # in range, or the ignore value
      >>> check_targets(jnp.array([[3, 7, 9]]), 5)
      Traceback (most recent call last):
      ...
      ValueError: expected target ids in [0, 5) (the vocabulary size is 5) or the ignore value -100,
      got 2 out of range: 7 at (0, 1), 9 at (0, 2); the losses would ignore them silently
    """
    check_integer_targets(targets)
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
    if not is_traced(targets):
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
    in_vocab = (targets >= 0) & (targets < vocab_size)
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


def check_integer_targets(targets) -> None:
    """Raises unless `targets` is an array of integers."""
    check_array("targets", targets, "[batch, length]")
    _check_integer_dtype(targets)


def _check_integer_dtype(targets) -> None:
    if not jnp.issubdtype(jnp.result_type(targets), jnp.integer):
        raise TypeError(f"expected integer targets (token ids), got {jnp.result_type(targets)}")


def check_normalizing_factor_number(loss_normalizing_factor) -> None:
    """Raises unless a factor that is no special one is None or a finite number > 0."""
    if loss_normalizing_factor is None:
        return
    if not isinstance(loss_normalizing_factor, (int, float, np.number, jax.Array, np.ndarray)):
        raise TypeError(
            "expected loss_normalizing_factor None, a number, a string or an enum member; "
            f"got {type(loss_normalizing_factor).__name__}"
        )
    check_real("loss_normalizing_factor", loss_normalizing_factor, low=0.0, low_inclusive=False)


def check_segments(targets, decoder_segment_ids, decoder_positions) -> None:
    """Raises unless the packing features are None or `[batch, length]` as the targets,
    the positions given with the segment ids."""
    targets_shape = jnp.shape(targets)
    for name, value in (("decoder_segment_ids", decoder_segment_ids), ("decoder_positions", decoder_positions)):
        if value is None:
            continue
        check_array(name, value, "[batch, length]")
        if jnp.shape(value) != targets_shape:
            raise ValueError(
                f"expected {name} of shape {targets_shape} [batch, length] (as targets), got {jnp.shape(value)}"
            )
    if decoder_segment_ids is not None and decoder_positions is None:
        raise ValueError("expected decoder_positions with decoder_segment_ids (a packed batch), got None")


def check_cross_entropy_inputs(logits, targets, weights, *, label_smoothing, z_loss, loss_normalizing_factor):
    """The checks of `weighted_cross_entropy` (logits of any rank, targets one less);
    returns `weights` as float32 (or None)."""
    check_array("logits", logits, "[batch, length, vocab]")
    check_array("targets", targets, "[batch, length]")
    if jnp.ndim(logits) != jnp.ndim(targets) + 1:
        raise ValueError(
            f"expected logits of rank targets.ndim + 1, got logits {jnp.shape(logits)} and targets {jnp.shape(targets)}"
        )
    if jnp.shape(logits)[:-1] != jnp.shape(targets):
        raise ValueError(
            f"expected targets of shape {jnp.shape(logits)[:-1]} (logits' leading axes), got {jnp.shape(targets)}"
        )
    if not jnp.issubdtype(jnp.result_type(logits), jnp.floating):
        raise TypeError(f"expected floating-point logits (f32, bf16 or f16), got {jnp.result_type(logits)}")
    _check_integer_dtype(targets)
    check_real("label_smoothing", label_smoothing, low=0.0, high=1.0)
    check_real("z_loss", z_loss, low=0.0)
    check_normalizing_factor_number(loss_normalizing_factor)
    return check_weights(weights, jnp.shape(targets))


def check_number_tokens(number_tokens) -> None:
    if not isinstance(number_tokens, NumberTokens):
        raise TypeError(f"expected number_tokens to be a NumberTokens, got {type(number_tokens).__name__}")


def check_loss_normalizing_factor(loss_normalizing_factor) -> None:
    """Raises unless the factor is None, a finite number > 0, or names a special factor."""
    if special_factor(loss_normalizing_factor) is None:
        check_normalizing_factor_number(loss_normalizing_factor)
