"""NTL in EasyDeL, the JAX framework for training Hugging Face architectures (Llama,
Qwen, Gemma, Mistral, ...) on TPUs and GPUs (needs easydel: the `easydel` extra, in an
environment of its own: docs/guides/easydel.md).

- `use(model_or_trainer, tokenizer, number_loss="was")`: one line; the model (and the
  copies EasyDeL's trainers rebuild from its state) trains on CE + lambda x NTL, the
  trainer's steps are guarded and log `ntl` and `ntl_term`;
- `NumberLossStrategy`: the loss, on EasyDeL's two-phase seam (`BaseLossStrategy`):
  the headless forward pass, then CE + NTL from the hidden states and the head's
  kernel through `ntl_jax.fused_cross_entropy_and_ntl`, never the `[batch, length,
  vocab]` logits;
- `number_tokens(tokenizer)`: the number tokens of the model's tokenizer;
- `check_easydel_version()`, `check_loss_config(config)`, `check_head(model)`: what
  the integration relies on, checked.
"""

from ntl_jax.easydel.heads import check_head
from ntl_jax.easydel.install import guard_trainer, use
from ntl_jax.easydel.strategy import NumberLossStrategy, check_loss_config
from ntl_jax.easydel.tokens import number_tokens
from ntl_jax.easydel.versions import TESTED_EASYDEL, check_easydel_version

__all__ = [
    "TESTED_EASYDEL",
    "NumberLossStrategy",
    "check_easydel_version",
    "check_head",
    "check_loss_config",
    "guard_trainer",
    "number_tokens",
    "use",
]
