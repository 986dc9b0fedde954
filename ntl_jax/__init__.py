"""Number Token Loss (NTL) for JAX.

Zausinger et al., "Regress, Don't Guess - A Regression-like Loss on Number Tokens for
Language Models", ICML 2025 (arXiv:2411.02083).
"""

from ntl_jax.number_tokens import NumberTokens
from ntl_jax.losses import ntl_was
from ntl_jax.losses import ntl_dot
from ntl_jax.losses import number_level_loss
from ntl_jax.losses import number_token_loss
from ntl_jax.losses import predict_numbers
from ntl_jax.objective import cross_entropy_and_ntl
from ntl_jax.fused import fused_cross_entropy_and_ntl
from ntl_jax.objective import loss_normalizing_factor_and_weights
from ntl_jax.objective import weighted_cross_entropy

__version__ = "0.1.0"
