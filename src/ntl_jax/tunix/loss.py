"""CE + `ntl_weight` x NTL as the loss function of Tunix's `PeftTrainer`.

`PeftTrainer.with_loss_fn(loss_fn, has_aux=True)` calls `loss_fn(model, **inputs)` with
the inputs its `gen_model_input_fn` makes: `input_tokens`, `input_mask`, `positions`,
`attention_mask` (and `images` for vision models). As Tunix's own cross-entropy, the
model predicts `input_tokens[:, 1:]` from each prefix, `input_mask[:, 1:]` says which
targets count, and the loss is a mean over them.
"""

from __future__ import annotations

from typing import Callable

import jax
from flax import nnx

from ntl_jax._core.migration import refuses_old_keywords
from ntl_jax._core.number_losses import registry
from ntl_jax._core.number_losses.number_loss import DEFAULT, NumberLoss
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.objective import cross_entropy_and_ntl, fused_cross_entropy_and_ntl
from ntl_jax.tunix.heads import hidden_states_and_kernel

# Tunix's cross-entropy divides by the number of targets its mask keeps.
LOSS_NORMALIZING_FACTOR = "NUM_REAL_TARGET_TOKENS"
# The loss parts the trainer logs as Tunix logs its loss, the mean of the batches' values
# (each a mean over its batch's targets); `ntl` beside them is pooled (`trainer.buffer_ntl`).
AVERAGED_PARTS = ("cross_entropy", "ntl_term")


@refuses_old_keywords
def number_token_loss_fn(number_tokens: NumberTokens, *, number_loss: NumberLoss | str | None = DEFAULT,
                         ntl_weight: float | None = None, fused: bool = False, **options) -> Callable:
    """A `PeftTrainer` loss function: `CE + ntl_weight * NTL` of the model's prediction
    of each next token, and its parts.

    Args:
      number_tokens: the model's vocabulary's `NumberTokens` (`ntl_jax.tunix.number_tokens`).
      number_loss, ntl_weight: as in `ntl_jax.cross_entropy_and_ntl` (a `ntl_jax.losses`
        value, yours too, a spec such as `"smmd(sigma=2)"`, or None for CE alone).
      fused: compute the loss from the final hidden states and the logits projection
        (`ntl_jax.fused_cross_entropy_and_ntl`), never holding the `[batch, length,
        vocab]` logits; the same loss and gradients to float32 rounding. Not with a
        soft-capped head (Gemma 2) or a LoRA adapter on the head.
      **options: the objective's other options (`cross_entropy`, an
        `ntl_jax.CrossEntropy`, or its fields `gce_sigma`, `z_loss`, `label_smoothing`;
        `chunk_size` and `device_kind` with `fused`, ...).

    Returns:
      `loss_fn(model, input_tokens, input_mask, positions, attention_mask, images=None)`
      returning `(loss, parts)` (`parts["ntl"]`: the number loss's mean over the number
      targets; `parts["ntl_term"]`: what it adds to the loss); give it to
      `PeftTrainer.with_loss_fn(loss_fn, has_aux=True)`, or use `NumberTokenLossTrainer`.
    """
    if not isinstance(number_tokens, NumberTokens):
        raise TypeError(f"expected NumberTokens (ntl_jax.tunix.number_tokens(tokenizer)), "
                        f"got {type(number_tokens).__name__}")
    registry.resolve(number_loss)  # a bad spec fails here, not at the first training step
    objective = dict(options, number_loss=number_loss, ntl_weight=ntl_weight,
                     loss_normalizing_factor=LOSS_NORMALIZING_FACTOR)

    def loss_fn(model: nnx.Module, input_tokens: jax.Array, input_mask: jax.Array, positions: jax.Array,
                attention_mask: jax.Array, images: jax.Array | None = None):
        extra = {} if images is None else {"images": images}
        targets, weights = input_tokens[:, 1:], input_mask[:, 1:]
        if fused:
            hidden, kernel = hidden_states_and_kernel(model, input_tokens, positions, None, attention_mask, **extra)
            return fused_cross_entropy_and_ntl(hidden[:, :-1], kernel, targets, number_tokens, weights=weights,
                                               **objective)
        logits, _ = model(input_tokens, positions, None, attention_mask, **extra)
        return cross_entropy_and_ntl(logits[:, :-1], targets, number_tokens, weights=weights, **objective)

    return loss_fn
