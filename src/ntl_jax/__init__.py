"""Number Token Loss (NTL) for JAX.

Zausinger et al., "Regress, Don't Guess - A Regression-like Loss on Number Tokens for
Language Models", ICML 2025 (arXiv:2411.02083).
"""

from ntl_jax import losses  # the number losses, each a value: ntl_jax.losses.was(...)
from ntl_jax._core.checks import check_targets
from ntl_jax._core.cross_entropy import weighted_cross_entropy
from ntl_jax._core.losses import (
    ntl_dot,
    ntl_from_number_logits,
    ntl_was,
    number_level_loss,
    number_token_loss,
    predict_numbers,
)
from ntl_jax._core.number_losses.number_loss import NumberLoss
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.objective import (
    cross_entropy_and_ntl,
    fused_cross_entropy_and_ntl,
    loss_normalizing_factor_and_weights,
    ntl_mean,
)
from ntl_jax._core.options import CrossEntropy
from ntl_jax._core.tokenizer_pieces import tokenizer_pieces, vocabulary_pieces

__all__ = [
    "CrossEntropy",
    "NumberLoss",
    "NumberTokens",
    "check_targets",
    "cross_entropy_and_ntl",
    "fused_cross_entropy_and_ntl",
    "losses",
    "loss_normalizing_factor_and_weights",
    "ntl_dot",
    "ntl_from_number_logits",
    "ntl_mean",
    "ntl_was",
    "number_level_loss",
    "number_token_loss",
    "predict_numbers",
    "tokenizer_pieces",
    "vocabulary_pieces",
    "weighted_cross_entropy",
]
__version__ = "0.6.0"
