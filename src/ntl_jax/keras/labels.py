"""Labels as token ids, checked: an id outside the logits' vocabulary is an error, never
a position the loss leaves out (the objective ignores such ids, T5X's rule).

Outside `jit` the ids are concrete and `ntl_jax.check_targets` raises a `ValueError`
naming them. Keras's JAX trainer jits its step, so there the ids are traced: a host
callback raises the same kind of `ValueError` when the step runs (JAX reports it as a
`JaxRuntimeError` whose message holds it, and `fit` stops), and the loss is NaN in that
step, so that no value smaller than the true loss is ever returned, even where host
callbacks do not run.

`keras_mask` reads the mask Keras attaches to the predictions (an `Embedding` with
`mask_zero=True`, a `Masking` layer), which `keras.losses.Loss.__call__` and Keras's
metrics read the same way.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from keras.src.backend import get_keras_mask

from ntl_jax._core.checks import check_targets
from ntl_jax._core.compat import is_traced


def token_ids(y_true, sample_weight, ignore_class: int | None):
    """`(targets, weights)`: `y_true` `[batch, length]` (or `[batch, length, 1]`) as int32
    token ids, and `sample_weight` as float32 `[batch, length]` weights (ones if None),
    0 where the label is `ignore_class` (then the id itself is not checked)."""
    targets = jnp.asarray(y_true)
    if targets.ndim == 3 and targets.shape[-1] == 1:
        targets = targets[..., 0]
    if targets.ndim != 2:
        raise ValueError(f"expected y_true of token ids, shape [batch, length], got shape {targets.shape}")
    if not (jnp.issubdtype(targets.dtype, jnp.integer) or jnp.issubdtype(targets.dtype, jnp.floating)):
        raise TypeError(f"expected y_true of integer token ids, got {targets.dtype}")
    targets = targets.astype(jnp.int32)
    if sample_weight is None:
        weights = jnp.ones(targets.shape, jnp.float32)
    else:
        weights = jnp.asarray(sample_weight)
        if weights.ndim == 3 and weights.shape[-1] == 1:
            weights = weights[..., 0]
        if weights.ndim == 1:  # one weight per sequence
            weights = jnp.broadcast_to(weights[:, None], targets.shape)
        if weights.shape != targets.shape:
            raise ValueError(f"expected sample_weight of shape {targets.shape} (as y_true) or [batch], "
                             f"got {weights.shape}")
        weights = weights.astype(jnp.float32)
    if ignore_class is not None:
        ignored = targets == ignore_class
        weights = jnp.where(ignored, 0.0, weights)
        targets = jnp.where(ignored, 0, targets)
    return targets, weights


def keras_mask(y_true, y_pred, ignore_class: int | None = None):
    """The mask Keras reduces a loss under, bool `[batch, length]`, or None where there is
    none: the one Keras attached to `y_pred` (`[batch, length]` or `[batch, length, 1]`),
    and with `ignore_class` the labels that are not it (as Keras's sparse cross-entropy
    masks its output), both where both are given (`keras.losses.Loss.__call__`)."""
    ids = jnp.asarray(y_true)
    if ids.ndim == 3 and ids.shape[-1] == 1:
        ids = ids[..., 0]
    mask = get_keras_mask(y_pred)
    if mask is not None:
        mask = jnp.asarray(mask)
        if mask.ndim == 3 and mask.shape[-1] == 1:
            mask = mask[..., 0]
        if mask.shape != ids.shape:
            raise ValueError(f"expected the predictions' Keras mask of shape {ids.shape} (as y_true), got {mask.shape}")
        mask = mask.astype(bool)
    if ignore_class is not None:
        kept = ids != ignore_class
        mask = kept if mask is None else mask & kept
    return mask


def checked(loss, targets, vocab_size: int):
    """`loss`, after checking that every id of `targets` is in `[0, vocab_size)`: raises
    now (concrete ids), or when the step runs (traced ids; the loss is then NaN)."""
    if not is_traced(targets):
        check_targets(targets, vocab_size, ignore_index=None)
        return loss
    bad = (targets < 0) | (targets >= vocab_size)
    flat = bad.reshape(-1)
    first = jnp.argmax(flat)
    jax.debug.callback(_raise_if_out_of_range, jnp.sum(flat), targets.reshape(-1)[first], first, vocab_size)
    return jnp.where(jnp.any(flat), jnp.nan, loss)


def _raise_if_out_of_range(count, value, index, vocab_size):
    if int(count):
        raise ValueError(
            f"expected label token ids in [0, {vocab_size}) (the logits' vocabulary), got {int(count)} out of "
            f"range, the first {int(value)} at flat index {int(index)}; the loss would leave them out silently"
        )
