"""One small, randomly initialised model of each of Tunix's families, float32, with the
batch its trainer hands a loss function."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("tunix")

from flax import nnx  # noqa: E402
from tunix.models.gemma import model as gemma  # noqa: E402
from tunix.models.gemma3 import model as gemma3  # noqa: E402
from tunix.models.llama3 import model as llama3  # noqa: E402
from tunix.models.qwen2 import model as qwen2  # noqa: E402
from tunix.models.qwen3 import model as qwen3  # noqa: E402

import ntl_jax  # noqa: E402
from tests.objective_options import SQUARED_DISTANCE  # noqa: E402, F401  (the tunix tests take it from here)

# A Qwen-like vocabulary: one token per digit. 61 ids: no power of two.
PIECES = ["<pad>", "<eos>", "<unk>", *"0123456789 *+-=?.,W"] + [f"w{i}" for i in range(39)]
NUMBERS = ntl_jax.NumberTokens.from_pieces(PIECES)
VOCAB = len(PIECES)
SHAPE = dict(num_layers=2, embed_dim=32, hidden_dim=64, num_heads=4, head_dim=8, num_kv_heads=2)


def squared_distance_mean(logits, targets, weights) -> float:
    """SQUARED_DISTANCE's mean over the counted number targets, written plainly:
    `sum_j softmax(z)_j (v_j - y)^2` over the number tokens' logits `z`."""
    logits, targets, weights = (np.asarray(a, np.float64) for a in (logits, targets, weights))
    z = logits[..., NUMBERS.ids]
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    table = dict(zip(np.asarray(NUMBERS.ids).tolist(), np.asarray(NUMBERS.number_values).tolist()))
    is_number = np.isin(targets, list(table)) & (weights > 0)
    y = np.vectorize(lambda t: table.get(int(t), 0.0))(targets)
    per_position = np.sum(p * np.square(np.asarray(NUMBERS.number_values) - y[..., None]), axis=-1)
    return float(np.sum(per_position * weights * is_number) / np.sum(weights * is_number))


def perturbed(model, seed: int = 0, scale: float = 0.1):
    """`model` with noise added to every parameter (LoRA's too): Tunix initialises its
    MLPs and LoRA's B to zeros, for weights loaded from a checkpoint, which would leave
    some gradients zero."""
    state = nnx.state(model, nnx.Param)
    leaves, treedef = jax.tree_util.tree_flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [leaf + scale * jax.random.normal(key, leaf.shape, leaf.dtype) for key, leaf in zip(keys, leaves)]
    nnx.update(model, jax.tree_util.tree_unflatten(treedef, noisy))
    return model


def qwen2_model(tied: bool, vocab: int = VOCAB):
    config = qwen2.ModelConfig(vocab_size=vocab, rope_theta=10_000, norm_eps=1e-6, use_tied_embedding=tied, **SHAPE)
    return perturbed(qwen2.Qwen2(config, rngs=nnx.Rngs(0)))


def qwen3_model():
    config = qwen3.ModelConfig(vocab_size=VOCAB, rope_theta=10_000, norm_eps=1e-6, use_tied_embedding=True, **SHAPE)
    return perturbed(qwen3.Qwen3(config, rngs=nnx.Rngs(0)))


def llama3_model():
    config = llama3.ModelConfig(vocab_size=VOCAB, rope_theta=10_000, norm_eps=1e-5, **SHAPE)
    return perturbed(llama3.Llama3(config, rngs=nnx.Rngs(0)))


def gemma3_model():
    config = gemma3.ModelConfig(num_embed=VOCAB, sliding_window_size=8, param_dtype=jnp.float32, **SHAPE)
    return perturbed(gemma3.Gemma3(config, rngs=nnx.Rngs(0)))


def gemma2_model(softcap: float | None = 30.0):
    config = gemma.ModelConfig(
        num_embed=VOCAB, final_logit_softcap=softcap, use_post_attn_norm=True, use_post_ffw_norm=True,
        attention_types=(gemma.AttentionType.GLOBAL,) * SHAPE["num_layers"], **SHAPE)
    return perturbed(gemma.Gemma(config, rngs=nnx.Rngs(0)))


# The families whose logits are linear in the final hidden states (the fused loss's).
LINEAR_HEADS = {
    "qwen2": lambda: qwen2_model(tied=False),
    "qwen2-tied": lambda: qwen2_model(tied=True),
    "qwen3": qwen3_model,
    "llama3": llama3_model,
    "gemma3": gemma3_model,
    "gemma-no-softcap": lambda: gemma2_model(softcap=None),
}


def batch(seed: int = 0, batch_size: int = 4, length: int = 12) -> dict:
    """`PeftTrainer`'s loss inputs: digits and words, a row padded at the end, the loss
    on the last part of each row (the answer)."""
    rng = np.random.default_rng(seed)
    digits = [PIECES.index(str(d)) for d in range(10)]
    tokens = rng.integers(3, VOCAB, (batch_size, length))
    tokens[:, length // 2:] = rng.choice(digits, (batch_size, length - length // 2))
    present = np.ones((batch_size, length), bool)
    present[1, length - 3:] = False
    tokens[~present] = 0
    mask = present.copy()
    mask[:, : length // 2] = False
    positions = np.cumsum(present, axis=-1) - 1
    attention = present[:, None, :] & np.tril(np.ones((length, length), bool))[None]
    return {"input_tokens": jnp.asarray(tokens, jnp.int32), "input_mask": jnp.asarray(mask),
            "positions": jnp.asarray(positions, jnp.int32), "attention_mask": jnp.asarray(attention)}


def max_abs(tree) -> float:
    return max(float(jnp.max(jnp.abs(leaf))) for leaf in jax.tree_util.tree_leaves(tree))
