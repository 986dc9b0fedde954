"""Tiny EasyDeL causal LMs built from their configs (nothing downloaded), the
Qwen-style tokenizer they are trained with (every digit its own token, ids 48-57), and
batches with number targets, masked prompts and padding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tests import tokenizer_builders

VOCAB = 264  # the tokenizer's 260 ids, rounded up to a multiple of 8 (the head's columns shard evenly)
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def tokenizer():
    return tokenizer_builders.transformers_fast(tokenizer_builders.qwen_style())


def llama(seed: int = 0, **config):
    """A 2-layer Llama with an untied head."""
    import easydel as ed

    return ed.LlamaForCausalLM(config=ed.LlamaConfig(**{**SIZES, **config}), dtype=jnp.float32,
                               param_dtype=jnp.float32, rngs=nnx.Rngs(seed))


def qwen(seed: int = 0, **config):
    """A 2-layer Qwen3 with its head tied to the input embedding."""
    import easydel as ed

    return ed.Qwen3ForCausalLM(config=ed.Qwen3Config(**{**SIZES, "head_dim": 8, "tie_word_embeddings": True, **config}),
                               dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(seed))


MODELS = {"llama": llama, "qwen3": qwen}


def batch(seed: int = 0, size: int = 4, length: int = 16, *, padded: bool = True) -> dict:
    """`input_ids`, `labels` (the prompt's first 3 positions `-100`) and, with `padded`,
    an `attention_mask` that ends each row but the first with 1-3 pads; digits at
    positions 5-11."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(60, 256, (size, length))
    ids[:, 5:12] = rng.integers(48, 58, (size, 7))
    labels = ids.copy()
    labels[:, :3] = -100
    out = {"input_ids": jnp.asarray(ids, jnp.int32), "labels": jnp.asarray(labels, jnp.int32)}
    if padded:
        mask = np.ones((size, length), np.int32)
        for row in range(1, size):
            mask[row, length - row:] = 0
        out["attention_mask"] = jnp.asarray(mask)
    return out


def targets_and_weights(batch: dict):
    """The next-token targets (`-1` where the label is `-100`) and EasyDeL's weights: the
    shifted attention mask, else the labels that are not `-100`."""
    labels = batch["labels"]
    targets = jnp.where(labels[:, 1:] == -100, -1, labels[:, 1:])
    if "attention_mask" in batch:
        return targets, batch["attention_mask"][:, 1:].astype(jnp.float32)
    return targets, (labels[:, 1:] != -100).astype(jnp.float32)


def loss_and_grads(model, batch: dict, loss_config=None):
    """`(loss, metrics, grads)` of the model's own `compute_loss` (its loss strategy),
    differentiated with respect to its parameters as EasyDeL's trainer does."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss_fn(params):
        module = nnx.merge(graphdef, params, rest)
        _, metrics = module.compute_loss(loss_config=loss_config, **batch)
        return metrics.loss, metrics

    with model.mesh:
        (loss, metrics), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
    return loss, metrics, grads


def logits_loss_and_grads(model, batch: dict, objective):
    """`(loss, parts, grads)` of `objective(logits, targets, weights)` on the model's own
    logits (the forward pass with its LM head)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    targets, weights = targets_and_weights(batch)
    call = {k: v for k, v in batch.items() if k != "labels"}

    def loss_fn(params):
        logits = nnx.merge(graphdef, params, rest)(**call).logits
        return objective(logits[:, :-1], targets, weights)

    with model.mesh:
        (loss, parts), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
    return loss, parts, grads


def assert_trees_close(actual, expected, rtol: float = 1e-4) -> None:
    """Each leaf within `rtol` of the expected one in relative L2 norm, and every element
    within `rtol` x 10 of the leaf's largest value: float32 gradients summed in another
    order (the fused head's chunks, a tied embedding's two paths)."""
    flat_actual = jax.tree_util.tree_leaves_with_path(actual)
    flat_expected = jax.tree_util.tree_leaves(expected)
    assert len(flat_actual) == len(flat_expected) > 0
    for (path, a), e in zip(flat_actual, flat_expected):
        a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
        name = jax.tree_util.keystr(path)
        assert np.linalg.norm(a - e) <= rtol * np.linalg.norm(e), (name, np.linalg.norm(a - e), np.linalg.norm(e))
        np.testing.assert_allclose(a, e, rtol=0, atol=10 * rtol * np.max(np.abs(e)), err_msg=name)
