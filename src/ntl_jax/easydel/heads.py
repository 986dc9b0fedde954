"""An EasyDeL causal LM's output head as the fused head reads it: the hidden states
that enter the projection, and the projection's kernel `[d_model, vocab]`.

EasyDeL's causal LMs project `prepare_lm_head_inputs(last_hidden_state)` through their
`lm_head` (a linear layer with a `kernel` `[d_model, vocab]`), or, with tied
embeddings, through the input embedding's transpose; some models then scale or
soft-cap the logits (`make_lm_head_fn`). The fused head needs logits that are
`hidden @ kernel`: `check_head` computes the model's own projection of a probe and
refuses a model whose head is anything else, so a scaled, capped or biased head, or a
release that reads its weights elsewhere, stops before the first step.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# EasyDeL's names for tying the head to the embedding, the first one the config has decides.
TIE_KEYS = ("tie_word_embeddings", "use_lm_head", "share_input_output_layers")


def supports_headless_forward(model: Any) -> bool:
    """Whether the model's call takes `apply_lm_head` (EasyDeL's headless forward pass,
    which returns `last_hidden_state` and no logits)."""
    try:
        parameters = inspect.signature(model.__call__).parameters
    except (TypeError, ValueError):
        return False
    return "apply_lm_head" in parameters


def tied(model: Any) -> bool:
    """Whether the model's logits come from its input embedding (EasyDeL's rule)."""
    return bool(next((getattr(model.config, key) for key in TIE_KEYS if hasattr(model.config, key)), False))


def head_kernel(model: Any) -> jax.Array:
    """The projection's kernel `[d_model, vocab]`: the LM head's `kernel`, or the input
    embedding transposed when the model ties them.

    Raises:
      TypeError: the model has no such head (a model this integration was not made for).
    """
    if tied(model):
        embedding = getattr(_call(model, "get_embedding"), "embedding", None)
        if embedding is None or jnp.ndim(embedding[...]) != 2:
            raise TypeError(f"expected {type(model).__name__}'s tied head to read an input embedding [vocab, "
                            f"d_model] (get_embedding().embedding), got {embedding!r}")
        return jnp.transpose(embedding[...])
    head = _call(model, "get_lm_head")
    kernel = getattr(head, "kernel", None)
    if kernel is None or jnp.ndim(kernel[...]) != 2:
        raise TypeError(f"expected {type(model).__name__}'s lm_head to hold a kernel [d_model, vocab], got "
                        f"{type(head).__name__} without one")
    return kernel[...]


def hidden_states(model: Any, outputs: Any) -> jax.Array:
    """The hidden states that enter the projection, `[batch, length, d_model]`, from the
    outputs of a headless forward pass (`apply_lm_head=False`).

    Raises:
      TypeError: the outputs hold no `last_hidden_state`.
    """
    hidden = getattr(outputs, "last_hidden_state", None)
    if hidden is None:
        raise TypeError(f"expected {type(model).__name__} called with apply_lm_head=False to return "
                        f"last_hidden_state, got {type(outputs).__name__} without it")
    prepare = getattr(model, "prepare_lm_head_inputs", None)
    return prepare(hidden) if prepare is not None else hidden


def _call(model: Any, name: str):
    method = getattr(model, name, None)
    if method is None:
        raise TypeError(f"expected an EasyDeL causal LM with {name}(), got {type(model).__name__}")
    return method()


def check_head(model: Any) -> None:
    """Raises unless the model's own logits are `hidden @ head_kernel(model)`: its
    projection (`make_lm_head_fn`, else `compute_lm_logits`) applied to a probe, scaled
    so that the logits are large (a soft cap then shows), against the product.

    Raises:
      TypeError: no headless forward pass (`apply_lm_head`), or no kernel to read.
      ValueError: the logits are not that product (a soft cap, a logit scale, a bias).
    """
    name = type(model).__name__
    if not supports_headless_forward(model):
        raise TypeError(f"expected an EasyDeL causal LM whose call takes apply_lm_head (its headless forward "
                        f"pass), got {name}: the fused head needs the hidden states before the LM head")
    kernel = head_kernel(model)
    d_model, vocab = kernel.shape
    bias = None if tied(model) else getattr(model.get_lm_head(), "bias", None)
    if bias is not None:
        raise ValueError(f"expected {name}'s lm_head without a bias (logits hidden @ kernel), got one: a bias after "
                         "the projection, which the fused head cannot apply; use EasyDeL's own loss for this model")
    # Within the rounding of the kernel's dtype, at logits up to 60.
    rtol = 1e-4 if jnp.dtype(kernel.dtype).itemsize >= 4 else 2e-2
    project = model.make_lm_head_fn() if hasattr(model, "make_lm_head_fn") else model.compute_lm_logits
    probe = np.random.default_rng(0).standard_normal((1, 2, d_model)).astype(np.float32)
    logits = np.asarray(jnp.asarray(probe) @ jnp.asarray(kernel, jnp.float32), np.float64)
    scale = 60.0 / max(float(np.max(np.abs(logits))), 1e-12)  # logits up to 60: a soft cap at 30 shows
    probe = jnp.asarray(probe * scale, kernel.dtype)
    expected = np.asarray(probe.astype(jnp.float32) @ kernel.astype(jnp.float32), np.float64)
    got = np.asarray(jnp.asarray(project(probe), jnp.float32), np.float64)
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=rtol, atol=rtol * 60.0):
        detail = (f"shape {got.shape}" if got.shape != expected.shape
                  else f"largest difference {float(np.max(np.abs(got - expected))):.4g} at logits up to 60")
        raise ValueError(f"expected {name}'s logits to be hidden @ kernel [{d_model}, {vocab}] (its "
                         f"{'tied embedding' if tied(model) else 'lm_head kernel'}), got otherwise ({detail}): a "
                         "soft cap, a logit scale or a bias after the projection, which the fused head cannot "
                         "apply; use EasyDeL's own loss for this model")
