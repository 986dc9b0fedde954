"""NTL in Keras 3 on the JAX backend, for KerasHub's `CausalLM`s (Gemma, Llama 3, Qwen,
...): `pip install -e '.[keras]'`, and `KERAS_BACKEND=jax` set before Keras is imported.

- `NumberTokenLoss(number_tokens, number_loss="was", ntl_weight=None)`: CE + λ·NTL as a
  `keras.losses.Loss`, for `causal_lm.compile(loss=...)`; saved with the model;
- `number_tokens(tokenizer)`: the number tokens of a KerasHub tokenizer;
- `NumberTokenLossMetric` (`"ntl"`), `NumberAccuracy` (`"number_accuracy"`),
  `NumberAbsoluteError` (`"number_abs_error"`), and `number_metrics(...)` for all three:
  Keras metrics over the number targets, for `compile(weighted_metrics=[...])`;
- `FusedNumberTokenLossModel(causal_lm, loss)`: trains the same weights with the loss
  computed from the final hidden states and the output embedding, never holding the
  logits;
- `load_model(path)`: a saved `.keras` model compiled again with its loss and metrics
  (Keras leaves a KerasHub `CausalLM` uncompiled).

`import ntl_jax` never imports Keras; this package does.
"""

from ntl_jax.keras.fused import FusedNumberTokenLossModel
from ntl_jax.keras.loss import NumberTokenLoss
from ntl_jax.keras.metrics import NumberAbsoluteError, NumberAccuracy, NumberTokenLossMetric, number_metrics
from ntl_jax.keras.saving import load_model
from ntl_jax.keras.tokens import number_tokens

__all__ = [
    "FusedNumberTokenLossModel",
    "NumberAbsoluteError",
    "NumberAccuracy",
    "NumberTokenLoss",
    "NumberTokenLossMetric",
    "load_model",
    "number_metrics",
    "number_tokens",
]
