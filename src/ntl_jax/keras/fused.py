"""Training a KerasHub `CausalLM` without its logits: `FusedNumberTokenLossModel`.

A `CausalLM`'s `call` ends in the logits (`backbone.token_embedding(hidden, reverse=True)`,
`[batch, length, vocab]`), and Keras hands a loss only what `call` returns. This model
shares the `CausalLM`'s layers and weights but returns the backbone's final hidden
states; its `compute_loss` reads the output embedding (`token_embedding.embeddings`
transposed when tied, as Gemma's; `reverse_embeddings` when not, as Llama 3's)
inside Keras's stateless step, so its gradient flows, and computes the same loss with
`ntl_jax.fused_cross_entropy_and_ntl`, a chunk of the vocabulary at a time.

Train it, then use (generate with, save) the `CausalLM` itself: the weights are the
same variables.
"""

from __future__ import annotations

import keras
from keras import ops

from ntl_jax._core.objective import fused_cross_entropy_and_ntl
from ntl_jax.keras import labels
from ntl_jax.keras.backend import require_jax_backend
from ntl_jax.keras.loss import NumberTokenLoss, weights_and_factor
from ntl_jax.keras.metrics import NumberLossMean


def output_kernel(backbone):
    """The `[hidden, vocab]` kernel of the backbone's logits projection, read now (inside
    Keras's stateless step: the traced weights); raises for a head the fused loss
    cannot take."""
    embedding = getattr(backbone, "token_embedding", None)
    if embedding is None or not hasattr(embedding, "tie_weights"):
        raise ValueError(f"expected a KerasHub backbone whose logits are token_embedding(hidden, reverse=True) "
                         f"(a ReversibleEmbedding), got {type(backbone).__name__} without one")
    if getattr(embedding, "logit_soft_cap", None) is not None:
        raise ValueError(f"expected a logits projection without a soft cap, got {type(backbone).__name__} with "
                         f"logit_soft_cap={embedding.logit_soft_cap} (Gemma 2): tanh after the projection cannot be "
                         "streamed; train with NumberTokenLoss on the logits")
    if getattr(embedding, "quantization_mode", None):
        raise ValueError(f"expected an unquantized output embedding, got quantization_mode="
                         f"{embedding.quantization_mode!r}")
    if embedding.tie_weights:  # `embeddings` adds a LoRA adapter's product when the embedding has one
        return ops.transpose(ops.convert_to_tensor(embedding.embeddings))
    return ops.convert_to_tensor(embedding.reverse_embeddings)


class FusedNumberTokenLossModel(keras.Model):
    """Trains `causal_lm`'s weights with `loss` (a `NumberTokenLoss`) computed from the
    final hidden states and the output embedding, never forming the logits.

    Args:
      causal_lm: a KerasHub `CausalLM` whose logits are
        `backbone.token_embedding(backbone(x), reverse=True)` (Gemma, Gemma 3, Llama,
        Llama 3, Mistral, Qwen, ...), LoRA enabled or not; not Gemma 2 (soft-capped).
      loss: the `NumberTokenLoss` to compute, its reduction included.
      chunk_size: vocabulary columns per chunk (None: about 8M logits per chunk).
      device_kind: the chip the step is compiled for, a `jax.Device.device_kind`
        (None: the platform the step is lowered for decides, a TPU getting a TPU's
        program; name the chip where its generation matters, docs/guides/fused-head.md).

    `compile(optimizer=...)` takes no loss (it is `loss`) and no metrics on `y_pred` (the
    hidden states); `fit` logs `ntl`, the number loss's mean over the number targets.
    `fit`/`evaluate` take preprocessed batches: `x, y, sample_weight =
    causal_lm.preprocessor(texts)`, or a `tf.data` pipeline mapped with it.
    """

    def __init__(self, causal_lm, loss: NumberTokenLoss, *, chunk_size: int | None = None,
                 device_kind: str | None = None, **kwargs):
        require_jax_backend("ntl_jax.keras.FusedNumberTokenLossModel")
        if not isinstance(loss, NumberTokenLoss):
            raise TypeError(f"expected loss to be a NumberTokenLoss, got {type(loss).__name__}")
        super().__init__(**kwargs)
        output_kernel(causal_lm.backbone)  # a head it cannot take fails here, not in fit
        self.causal_lm = causal_lm
        self.number_token_loss = loss
        self.chunk_size = chunk_size
        self.device_kind = device_kind
        self.ntl_tracker = NumberLossMean("ntl")

    def call(self, inputs, training=False):
        return self.causal_lm.backbone(inputs, training=training)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss_fn = self.number_token_loss
        mask = labels.keras_mask(y, y_pred, loss_fn.ignore_class)  # as NumberTokenLoss reads it
        targets, weights = labels.token_ids(y, sample_weight, loss_fn.ignore_class)
        weights, factor = weights_and_factor(loss_fn.reduction, weights, sample_weight, mask)
        kernel = output_kernel(self.causal_lm.backbone)
        loss, parts = fused_cross_entropy_and_ntl(
            y_pred, kernel, targets, loss_fn.number_tokens, weights=weights, chunk_size=self.chunk_size,
            device_kind=self.device_kind, loss_normalizing_factor=factor, **loss_fn.objective_options())
        loss = labels.checked(loss, targets, ops.shape(kernel)[1])
        if loss_fn.number_loss is not None:
            self.ntl_tracker.update_state(parts["ntl_sum"], parts["ntl_weight_sum"])
        return loss + sum(self.losses) if self.losses else loss
