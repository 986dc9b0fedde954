"""`NumberTokenLoss`: CE + `ntl_weight` x NTL as a `keras.losses.Loss`, for
`causal_lm.compile(loss=...)`.

Keras calls a loss as `loss(y_true, y_pred, sample_weight)`: for a KerasHub `CausalLM`,
`y_true` the next-token ids `[batch, length]`, `y_pred` the logits `[batch, length,
vocab]`, `sample_weight` the preprocessor's padding mask. The loss is one call of
`ntl_jax.cross_entropy_and_ntl` with the mask as its weights and Keras's reduction as its
loss-normalising factor:

| `reduction` | `loss_normalizing_factor` | divides the weighted sum by |
|---|---|---|
| `"sum_over_batch_size"` (Keras's default), `"mean"` | `batch * length` | every position, padding included |
| `"mean_with_sample_weight"` | `"NUM_REAL_TARGET_TOKENS"` | the sum of the weights |
| `"sum"` | None | 1 |

So with `ntl_weight=0` it is Keras's `SparseCategoricalCrossentropy(from_logits=True)`
under the same reduction, and the number loss's term stands to that cross-entropy as its
authors' term stands to CE's mean over the tokens (the objective's rule: `ntl_weight` x
the loss's mean over the positions it counts x the weights' sum / the divisor).
A mask that Keras attaches to the logits (an `Embedding` with `mask_zero=True`, a
`Masking` layer) and, with `ignore_class`, the labels that are not that class are merged
with `sample_weight` as Keras's own losses merge them (`keras.losses.Loss.__call__`):
a masked position weighs 0, and the divisor counts only what the mask keeps:

| `reduction` | with a mask, divides the weighted sum by |
|---|---|
| `"sum_over_batch_size"`, `"mean"` | the positions the mask keeps, whatever their weights |
| `"mean_with_sample_weight"` | the sum of the weights at the positions the mask keeps |
| `"sum"` | 1 |

`reduction=None`/`"none"` is refused: the number-level losses read whole numbers across
positions, so the loss has no per-token form.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import keras
import numpy as np

from ntl_jax._core.checks import check_real
from ntl_jax._core.number_losses import registry
from ntl_jax._core.number_losses.number_loss import DEFAULT, NumberLoss, weight_of
from ntl_jax._core.objective import cross_entropy_and_ntl
from ntl_jax._core.options import CrossEntropy
from ntl_jax.keras import labels
from ntl_jax.keras.backend import require_jax_backend
from ntl_jax.keras.tokens import number_tokens_config, resolve_number_tokens

REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight", "sum")


def loss_normalizing_factor(reduction: str, targets_shape, sample_weight) -> Any:
    """The objective's `loss_normalizing_factor` that divides as Keras's `reduction`."""
    if reduction == "sum":
        return None
    if reduction == "mean_with_sample_weight" and sample_weight is not None:
        return "NUM_REAL_TARGET_TOKENS"
    return float(np.prod(targets_shape))


def weights_and_factor(reduction: str, weights, sample_weight, mask) -> tuple[Any, Any]:
    """`(weights, loss_normalizing_factor)` for the objective: `weights`
    (`labels.token_ids`') 0 where `mask` (`labels.keras_mask`; None: no mask) is False,
    and the factor that divides as Keras's `reduction` does with that mask
    (`keras.src.losses.loss.apply_mask`, `reduce_weighted_values`)."""
    if mask is None:
        return weights, loss_normalizing_factor(reduction, weights.shape, sample_weight)
    weights = jnp.where(mask, weights, 0.0)
    if reduction == "sum":
        return weights, None
    if reduction == "mean_with_sample_weight":
        return weights, "NUM_REAL_TARGET_TOKENS"
    # Keras weighs each kept position total / kept and divides by total: a division by
    # the count kept. None kept: every weight is 0, so the loss is 0, as Keras's.
    return weights, jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)


def number_loss_spec(number_loss: NumberLoss | None) -> str | None:
    """The spec a config stores for `number_loss` (None: none); raises for a loss of
    your own that is not registered (`ntl_jax.losses.register`), which no spec names."""
    return None if number_loss is None else number_loss.spec


@keras.saving.register_keras_serializable(package="ntl_jax")
class NumberTokenLoss(keras.losses.Loss):
    """Cross-entropy + `ntl_weight` x a number loss on a language model's logits.

    Args:
      number_tokens: the vocabulary's `ntl_jax.NumberTokens`, or a KerasHub tokenizer
        (`causal_lm.preprocessor.tokenizer`) to read them from
        (`ntl_jax.keras.number_tokens`).
      number_loss: a `ntl_jax.losses` value (yours too), a spec string (`"was"`,
        `"smmd(sigma=2, mode=smooth)"`), or None for cross-entropy alone.
      ntl_weight: lambda; None: the loss's own (`NumberLoss.default_weight`); 0 leaves
        Keras's sparse categorical cross-entropy. The number loss's term is normalised
        as its authors normalise it, beside the cross-entropy under every reduction
        (`NumberLoss.normalised`).
      label_smoothing, z_loss, gce_sigma: the objective's (T5X's label smoothing and
        z-loss, the Gaussian label's width); 0 by default.
      ignore_class: a label id that counts for nothing (Keras's `ignore_class`), or None.
      reduction: `"sum_over_batch_size"` (Keras's default), `"mean"`,
        `"mean_with_sample_weight"` or `"sum"` (the module's table).
      name, dtype: as every Keras loss; the loss is computed in float32 whatever the
        logits' dtype, and returned in float32.

    A label outside `[0, vocab)` raises (see `ntl_jax.keras.labels`): concrete labels at
    once, traced ones (inside `fit`'s jitted step) when the step runs.
    """

    def __init__(self, number_tokens: Any, *, number_loss: NumberLoss | str | None = DEFAULT,
                 ntl_weight: float | None = None,
                 label_smoothing: float = 0.0, z_loss: float = 0.0, gce_sigma: float = 0.0,
                 ignore_class: int | None = None, reduction: str = "sum_over_batch_size",
                 name: str = "number_token_loss", dtype=None):
        require_jax_backend("ntl_jax.keras.NumberTokenLoss")
        if reduction not in REDUCTIONS:
            raise ValueError(
                f"expected reduction in {REDUCTIONS}, got {reduction!r}; the loss has no per-token form (the "
                "number-level losses read whole numbers): for per-position values use "
                "ntl_jax.number_token_loss(..., reduction='none')"
            )
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.number_tokens = resolve_number_tokens(number_tokens)
        self.number_loss = registry.resolve(number_loss)  # a bad spec fails here, not in fit
        ntl_weight = weight_of(self.number_loss, ntl_weight)
        check_real("ntl_weight", ntl_weight, low=0.0)
        if ignore_class is not None and (isinstance(ignore_class, bool) or not isinstance(ignore_class, int)):
            raise TypeError(f"expected ignore_class an int or None, got {ignore_class!r}")
        self.ntl_weight = float(ntl_weight)
        self.cross_entropy = CrossEntropy(label_smoothing=float(label_smoothing), z_loss=float(z_loss),
                                          gce_sigma=float(gce_sigma))  # a bad option fails here, not in fit
        self.ignore_class = ignore_class

    def __call__(self, y_true, y_pred, sample_weight=None):
        # Keras's Loss.__call__ would cast the token ids and the (bf16) logits to float32
        # first, a full copy of the logits: the objective reads them as they are, and
        # `loss_and_parts` reads the mask as Keras's Loss.__call__ does.
        loss, _ = self.loss_and_parts(y_true, y_pred, sample_weight)
        return loss

    def call(self, y_true, y_pred):
        return self(y_true, y_pred)

    def loss_and_parts(self, y_true, y_pred, sample_weight=None):
        """`(loss, parts)`: the loss Keras reduces to, and the objective's parts
        (`parts["ntl"]`, the number loss's mean over the number targets, ...), with
        the mask Keras attached to `y_pred` merged with `sample_weight` as Keras does."""
        mask = labels.keras_mask(y_true, y_pred, self.ignore_class)
        logits = jnp.asarray(y_pred)
        targets, weights = labels.token_ids(y_true, sample_weight, self.ignore_class)
        weights, factor = weights_and_factor(self.reduction, weights, sample_weight, mask)
        loss, parts = cross_entropy_and_ntl(logits, targets, self.number_tokens, weights=weights,
                                            loss_normalizing_factor=factor, **self.objective_options())
        return labels.checked(loss, targets, logits.shape[-1]), parts

    def objective_options(self) -> dict:
        """The objective's arguments this loss sets (the fused model passes the same)."""
        return {"number_loss": self.number_loss, "ntl_weight": self.ntl_weight, "cross_entropy": self.cross_entropy}

    def get_config(self):
        return {
            **super().get_config(),
            "number_tokens": number_tokens_config(self.number_tokens),
            "number_loss": number_loss_spec(self.number_loss),
            "ntl_weight": self.ntl_weight,
            **dataclasses.asdict(self.cross_entropy),  # label_smoothing, z_loss, gce_sigma
            "ignore_class": self.ignore_class,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)
