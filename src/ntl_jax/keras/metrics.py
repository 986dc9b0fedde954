"""Keras metrics of the number targets, for `compile(weighted_metrics=[...])`.

Each is a `keras.metrics.Metric` with state: the sums of a batch's weighted values and
weights, accumulated over an epoch (reset by `fit` each epoch and by `evaluate`), so the
progress bar and `History` show the epoch's mean over its number targets, the targets
whose label is a number token and whose weight (`sample_weight`, KerasHub's padding
mask) is not 0 and that a mask Keras attached to the predictions keeps (as Keras's own
metrics read it):

- `NumberTokenLossMetric` (`"ntl"`): the number loss (NTL-WAS by default), as
  `parts["ntl"]` of `ntl_jax.cross_entropy_and_ntl`;
- `NumberAccuracy` (`"number_accuracy"`): the share whose argmax over the whole
  vocabulary is the target token;
- `NumberAbsoluteError` (`"number_abs_error"`): `|E[v] - y|`, the expected value over
  the number tokens (`ntl_jax.predict_numbers`) against the target token's value (a
  token's value: for Llama 3's three-digit tokens, up to 999).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import keras

from ntl_jax._core.losses import predict_numbers
from ntl_jax._core.number_losses import registry
from ntl_jax._core.number_losses.number_loss import DEFAULT, NumberLoss
from ntl_jax._core.objective import cross_entropy_and_ntl, ntl_mean
from ntl_jax.keras import labels
from ntl_jax.keras.backend import require_jax_backend
from ntl_jax.keras.loss import number_loss_spec
from ntl_jax.keras.tokens import number_tokens_config, resolve_number_tokens


class SumsMean(keras.metrics.Metric):
    """`total / count` of the sums handed to `update_state` (0 before any count)."""

    def __init__(self, name: str, dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.total = self.add_variable(shape=(), initializer="zeros", dtype="float32", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", dtype="float32", name="count")

    def update_state(self, total, count):
        self.total.assign_add(total)
        self.count.assign_add(count)

    def result(self):
        return keras.ops.divide_no_nan(self.total, self.count)


class NumberLossMean(SumsMean):
    """The number loss's mean of the sums and counts handed (`parts["ntl_sum"]`,
    `parts["ntl_weight_sum"]`): `ntl_jax.ntl_mean`, as every logger of `ntl`."""

    def result(self):
        return ntl_mean(self.total, self.count)


class _NumberTargetMean(SumsMean):
    """The mean of a per-batch sum over the number targets: `total / count`."""

    def __init__(self, number_tokens: Any, *, name: str, dtype=None):
        require_jax_backend(f"ntl_jax.keras.{type(self).__name__}")
        super().__init__(name=name, dtype=dtype)
        self.number_tokens = resolve_number_tokens(number_tokens)

    def sums(self, logits, targets, weights):
        """`(total, count)` of one batch."""
        raise NotImplementedError

    def number_target_weights(self, targets, weights):
        """The weights at the targets that are number tokens, 0 elsewhere."""
        values = jnp.asarray(self.number_tokens.values)
        in_table = (targets >= 0) & (targets < values.shape[0])
        is_number = in_table & ~jnp.isnan(values[jnp.where(in_table, targets, 0)])
        return jnp.where(is_number, weights, 0.0)

    def update_state(self, y_true, y_pred, sample_weight=None):
        mask = labels.keras_mask(y_true, y_pred)
        targets, weights = labels.token_ids(y_true, sample_weight, None)
        if mask is not None:  # Keras's metrics weigh a masked position 0 (`apply_mask`, "sum")
            weights = jnp.where(mask, weights, 0.0)
        super().update_state(*self.sums(jnp.asarray(y_pred), targets, weights))

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype, "number_tokens": number_tokens_config(self.number_tokens)}


@keras.saving.register_keras_serializable(package="ntl_jax")
class NumberTokenLossMetric(_NumberTargetMean):
    """The number loss's mean over the number targets (`parts["ntl"]`), whatever its
    weight in the training loss (`ntl_weight=0` trains with CE and still shows it)."""

    def __init__(self, number_tokens: Any, *, number_loss: NumberLoss | str = DEFAULT, name: str = "ntl", dtype=None):
        super().__init__(number_tokens, name=name, dtype=dtype)
        self.number_loss = registry.resolve(number_loss)
        if self.number_loss is None:
            raise ValueError("expected a number loss to show, got None")

    def sums(self, logits, targets, weights):
        _, parts = cross_entropy_and_ntl(logits, targets, self.number_tokens, weights=weights,
                                         number_loss=self.number_loss, ntl_weight=0.0)
        return parts["ntl_sum"], parts["ntl_weight_sum"]

    result = NumberLossMean.result  # ntl_jax.ntl_mean, as every logger of `ntl`

    def get_config(self):
        return {**super().get_config(), "number_loss": number_loss_spec(self.number_loss)}


@keras.saving.register_keras_serializable(package="ntl_jax")
class NumberAccuracy(_NumberTargetMean):
    """The share of the number targets whose argmax over the vocabulary is the target."""

    def __init__(self, number_tokens: Any, *, name: str = "number_accuracy", dtype=None):
        super().__init__(number_tokens, name=name, dtype=dtype)

    def sums(self, logits, targets, weights):
        weights = self.number_target_weights(targets, weights)
        right = jnp.argmax(logits, axis=-1) == targets
        return jnp.sum(jnp.where(right, weights, 0.0)), jnp.sum(weights)


@keras.saving.register_keras_serializable(package="ntl_jax")
class NumberAbsoluteError(_NumberTargetMean):
    """`|E[v] - y|` at the number targets: the expected value over the number tokens'
    softmax (`ntl_jax.predict_numbers`) against the target token's value."""

    def __init__(self, number_tokens: Any, *, name: str = "number_abs_error", dtype=None):
        super().__init__(number_tokens, name=name, dtype=dtype)

    def sums(self, logits, targets, weights):
        weights = self.number_target_weights(targets, weights)
        expected, _ = predict_numbers(logits, self.number_tokens)
        values = jnp.asarray(self.number_tokens.values)
        target_values = values[jnp.clip(targets, 0, values.shape[0] - 1)]
        error = jnp.where(weights > 0, jnp.abs(expected - target_values), 0.0)
        return jnp.sum(error * weights), jnp.sum(weights)


def number_metrics(number_tokens: Any, *, number_loss: NumberLoss | str = DEFAULT) -> list[keras.metrics.Metric]:
    """`[NumberTokenLossMetric, NumberAccuracy, NumberAbsoluteError]` of the same number
    tokens: `compile(weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(),
    *number_metrics(tokenizer)])`."""
    table = resolve_number_tokens(number_tokens)
    return [NumberTokenLossMetric(table, number_loss=number_loss), NumberAccuracy(table), NumberAbsoluteError(table)]
