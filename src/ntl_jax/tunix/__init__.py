"""NTL in Tunix, Google's JAX library for post-training LLMs (needs google-tunix: the
`tunix` extra).

- `number_tokens(tokenizer)`: the number tokens of a Tunix model's tokenizer;
- `number_token_loss_fn(...)`: CE + `ntl_weight` x NTL with `PeftTrainer`'s loss
  signature, from the logits or fused from the final hidden states;
- `NumberTokenLossTrainer`: `PeftTrainer` with that loss, logging its parts;
- `training_inputs(pairs, tokenizer, ...)`, `model_input_fn(pad_id)`: question-answer
  pairs as `PeftTrainer` batches, the loss on the answers;
- `hidden_states_and_kernel(model, ...)`: a Qwen, Llama or Gemma model's hidden states
  before its logits projection, and the projection's kernel.
"""

from ntl_jax.tunix.data import model_input_fn, training_inputs
from ntl_jax.tunix.heads import hidden_states_and_kernel
from ntl_jax.tunix.loss import number_token_loss_fn
from ntl_jax.tunix.tokens import number_tokens
from ntl_jax.tunix.trainer import NumberTokenLossTrainer

__all__ = [
    "NumberTokenLossTrainer",
    "hidden_states_and_kernel",
    "model_input_fn",
    "number_token_loss_fn",
    "number_tokens",
    "training_inputs",
]
