"""NTL in MaxText, Google's JAX framework for pretraining LLMs on TPU pods (needs
Python >= 3.12 and maxtext: the `maxtext` extra).

MaxText has no hook for a loss, so its programs run here with theirs wrapped (`install`):

- `python -m ntl_jax.maxtext.train CONFIG.yml ... ntl_weight=0.3 ntl_number_loss=was`: pretraining
  (the loss one spec, `ntl_number_loss="smmd(sigma=2, mode=smooth)"`);
- `python -m ntl_jax.maxtext.train_compile ...`: its ahead-of-time compile for a topology;
- `python -m ntl_jax.maxtext.sft ...`: supervised fine-tuning through Tunix.

The objective is MaxText's cross-entropy plus `ntl_weight` x NTL, computed from the final
hidden states through the output head's number-token columns (`loss`), or under
vocabulary tiling inside MaxText's own tiles (`tiles`), so vocabulary tiling, gradient
accumulation, packing, sharding and checkpoints stay MaxText's own.
`learning/ntl` and `eval/avg_ntl` (the number loss's mean over the positions it counts)
and `learning/ntl_term` (what `ntl_weight` x NTL adds to the loss) are logged beside
MaxText's `lm_loss` and `eval/avg_loss`, which stay cross-entropy only. From Python, each
program's `main(argv, number_loss=...)` takes a `NumberLoss` of your own.
"""

from ntl_jax.maxtext.loss import number_logits, number_loss_fn
from ntl_jax.maxtext.settings import NumberLossSettings, check_config, split_argv
from ntl_jax.maxtext.tokens import number_tokens

__all__ = [
    "NumberLossSettings",
    "check_config",
    "number_logits",
    "number_loss_fn",
    "number_tokens",
    "split_argv",
]
