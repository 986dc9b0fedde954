"""A Flax network's hidden states before its logits projection, and that projection's
kernel, for `ntl_jax.fused_cross_entropy_and_ntl` (needs flax: the `train` extra).

- `nnx_hidden_states_and_kernel`: NNX models (decoder-only LLMs with an `lm_head`);
- `linen_hidden_states_and_kernel`: Linen networks with T5's heads (ours and T5X's).
"""

from ntl_jax.flax._linen import hidden_states_and_kernel as linen_hidden_states_and_kernel
from ntl_jax.flax._nnx import hidden_states_and_kernel as nnx_hidden_states_and_kernel

__all__ = ["linen_hidden_states_and_kernel", "nnx_hidden_states_and_kernel"]
