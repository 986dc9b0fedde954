"""A Tunix model's hidden states before its logits projection, and that projection's
kernel `[d_model, vocab]`, for the fused loss.

Tunix's decoders (Qwen2, Qwen3, Llama3, Gemma, Gemma3) end the same way: a final norm,
then the logits from an `lm_head` (an `Einsum` module, `BTD,DV->BTV` with its weight `w`)
or, with tied embeddings, from the `embedder`'s `decode` (`x @ input_embedding.T`).
`hidden_states_and_kernel` calls the model with both projections returning their input
(the mechanism of `ntl_jax.flax.nnx_hidden_states_and_kernel`), so the call returns the
final norm's output, and reads the kernel of the one it called. Gemma 2's soft-capping
of the logits is no linear map and cannot move before the projection: the fused loss
refuses it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ntl_jax.flax._nnx import Projection, describe, hidden_states_through, module_names

EINSUM_LOGITS = "BTD,DV->BTV"


def _compute_dtype(module: Any, hidden, weight):
    """The dtype the projection multiplies in: the module's `dtype` where it casts to one
    (Qwen's), else the promotion of its operands (Llama's, Gemma's)."""
    dtype = getattr(module, "dtype", None)
    return jnp.result_type(hidden, weight) if dtype is None else dtype


EINSUM = Projection(
    "__call__",
    lambda module, x: jnp.asarray(x, _compute_dtype(module, x, module.w[...])),
    lambda module: module.w[...],
)
DECODE = Projection(
    "decode",
    lambda module, x: jnp.asarray(x, _compute_dtype(module, x, module.input_embedding[...])),
    lambda module: jnp.transpose(module.input_embedding[...]),
)


def _projections(model: nnx.Module) -> list[tuple[Any, Projection]]:
    heads = []
    lm_head = getattr(model, "lm_head", None)
    if lm_head is not None:
        if getattr(lm_head, "einsum_str", None) != EINSUM_LOGITS or not hasattr(lm_head, "w"):
            raise TypeError(
                f"expected the model's lm_head to be Tunix's Einsum computing {EINSUM_LOGITS!r} with a weight w, "
                f"got {type(lm_head).__name__} ({getattr(lm_head, 'einsum_str', 'no einsum_str')})"
            )
        heads.append((lm_head, EINSUM))
    embedder = getattr(model, "embedder", None)
    if embedder is not None and hasattr(embedder, "decode") and hasattr(embedder, "input_embedding"):
        heads.append((embedder, DECODE))
    if not heads:
        raise TypeError(
            f"expected a Tunix decoder with an lm_head (Einsum) or an embedder with decode, got {type(model).__name__}"
        )
    return heads


def _check_linear_after_projection(model: nnx.Module) -> None:
    softcap = getattr(model, "final_logits_softcap", None)
    if softcap is not None:
        raise ValueError(
            f"expected logits that are linear in the hidden states for the fused loss, got "
            f"{type(model).__name__} with final_logits_softcap={softcap} (tanh after the projection); "
            f"compute the loss from the logits (fused=False)"
        )


def _check_no_lora_on_head(heads: list[tuple[Any, Projection]], names: dict[int, str]) -> None:
    # qwix's LoRA adds `w_lora_a`/`w_lora_b` to a module and intercepts its einsum; the
    # fused loss reads the kernel `w` alone, so an adapter there would be left out.
    for module, projection in heads:
        if jax.tree_util.tree_leaves(nnx.state(module, nnx.LoRAParam)):
            raise ValueError(
                f"expected no LoRA adapter on the logits projection for the fused loss, got one on "
                f"{describe(module, projection, names)}; leave the head out of LoRA's module_path, "
                f"or compute the loss from the logits (fused=False)"
            )


def hidden_states_and_kernel(model: nnx.Module, *args, **kwargs):
    """`(hidden, kernel)`: `model(*args, **kwargs)`'s logits computed up to, not through,
    their projection (`logits == hidden @ kernel`), both in the dtype the projection
    multiplies in. The model is left as it was, also when the call raises.

    Raises:
      TypeError: the model has neither an `lm_head` Einsum nor an `embedder.decode`.
      ValueError: the model soft-caps its logits, has a LoRA adapter on the projection,
        or called the projections other than once.
    """
    _check_linear_after_projection(model)
    heads = _projections(model)
    names = module_names(model)
    _check_no_lora_on_head(heads, names)
    expected = " or ".join(describe(m, p, names) for m, p in heads)
    return hidden_states_through(lambda: model(*args, **kwargs)[0], heads, names, expected)
