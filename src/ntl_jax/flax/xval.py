"""xVal (Golkar et al. 2023) on a T5-style network: the pieces the trainer's xVal
(`ntl_jax.train.xval`) and T5X's (`ntl_jax.t5x.xval`) share.

- `XvalNetwork`: mixin for a Linen encoder-decoder with T5X's interface whose input
  embedding is a module named `token_embedder` (ours, `ntl_jax.train.network`, and
  T5X's `t5x.examples.t5.network`): `class XvalTransformer(XvalNetwork, Transformer)`.
  Each position's input embedding is multiplied by its `[NUM]` value (`encoder_scale`,
  `decoder_scale`, `[B, L]`, 1 at other tokens), and a number head (`NumberHead`) reads
  the hidden states the logits projection reads: `__call__` returns `(logits, numbers)`.
- `xval_loss`: `(CE + MSE) / 2`, as the paper authors' xVal T5.
- `greedy_decode`: greedy tokens, with the head's value at each emitted `[NUM]`, fed back
  as that position's multiplier.
"""

from __future__ import annotations

import contextlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.linen import partitioning as nn_partitioning

from ntl_jax.flax._linen import LOGITS_MODULE
from ntl_jax.flax.number_embeddings import EMBEDDER


@contextlib.contextmanager
def scaled_embeddings(scale):
    """Within this context, the `token_embedder` module's lookup of ids `[B, L]` returns
    its embedding times `scale[..., None]` (`scale` `[B, L]`; None: unchanged)."""
    if scale is None:
        yield
        return

    def multiply(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if context.module.name == EMBEDDER and context.method_name == "__call__":
            if scale.shape != out.shape[:-1]:
                raise ValueError(f"expected an embedding scale of shape [batch, length] = {out.shape[:-1]}, got "
                                 f"{scale.shape}")
            out = out * scale[..., None].astype(out.dtype)
        return out

    with nn.intercept_methods(multiply):
        yield


def xval_scale(ids: jax.Array, values: jax.Array, num_id: int) -> jax.Array:
    """`[B, L]` float32 multipliers: `values` at `[NUM]` (`num_id`), 1 elsewhere."""
    return jnp.where(ids == num_id, values, 1.0).astype(jnp.float32)


class _Dense(nn.Module):
    """A dense layer with a bias whose parameters carry T5X's logical axis names."""

    features: int
    axes: tuple[str, str]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = nn_partitioning.param_with_axes(
            "kernel", nn.initializers.xavier_uniform(), (x.shape[-1], self.features), jnp.float32, axes=self.axes)
        bias = nn_partitioning.param_with_axes(
            "bias", nn.initializers.zeros_init(), (self.features,), jnp.float32, axes=self.axes[1:])
        return jnp.dot(x.astype(jnp.float32), kernel) + bias


class NumberHead(nn.Module):
    """`[..., D]` -> `[...]` float32: Dense(mlp_dim) -> GELU -> Dense(1), as the authors'."""

    mlp_dim: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.gelu(_Dense(self.mlp_dim, ("embed", "mlp"), name="hidden")(x))
        return _Dense(1, ("mlp", "mlp_activations"), name="out")(h)[..., 0]


class XvalNetwork:
    """Mixin: an encoder-decoder with xVal's scaled input embeddings and number head.

    The parameters are the network's, under the same names, plus `number_head`.
    """

    def setup(self):
        super().setup()
        self.number_head = NumberHead(self.config.mlp_dim)

    def encode(self, encoder_input_tokens, *args, embedding_scale=None, **kwargs):
        """The network's `encode`, each input embedding times `embedding_scale` `[B, L]`."""
        with scaled_embeddings(embedding_scale):
            return super().encode(encoder_input_tokens, *args, **kwargs)

    def decode_numbers(self, encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens, *args,
                       decoder_scale=None, **kwargs):
        """The network's teacher-forced `decode` with the decoder's input embeddings times
        `decoder_scale` -> `(logits, numbers)`; the head reads what the logits projection reads."""
        hidden = []

        def capture(next_fun, fun_args, fun_kwargs, context):
            if ((context.module.name == LOGITS_MODULE and context.method_name == "__call__")
                    or (context.module.name == EMBEDDER and context.method_name == "attend")):
                hidden.append(fun_args[0])
            return next_fun(*fun_args, **fun_kwargs)

        with scaled_embeddings(decoder_scale), nn.intercept_methods(capture):
            logits = super().decode(encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
                                    *args, **kwargs)
        if len(hidden) != 1:
            raise ValueError(f"expected one logits projection in the decoder, found {len(hidden)}")
        return logits, self.number_head(hidden[0])

    def __call__(self, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens, encoder_segment_ids=None,
                 decoder_segment_ids=None, encoder_positions=None, decoder_positions=None, *, encoder_scale=None,
                 decoder_scale=None, enable_dropout: bool = True, decode: bool = False,
                 max_decode_length: int | None = None):
        """The network's full pass -> `(logits [B, Lt, V], numbers [B, Lt])`."""
        del encoder_positions  # relative attention uses the layout only, as in T5X
        if decode:
            raise ValueError("xVal decodes with `greedy_decode` (the head's values feed back), not with a cache")
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, enable_dropout=enable_dropout,
                              embedding_scale=encoder_scale)
        return self.decode_numbers(encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
                                   encoder_segment_ids, decoder_segment_ids, decoder_positions,
                                   decoder_scale=decoder_scale, enable_dropout=enable_dropout)


def xval_loss(logits: jax.Array, numbers: jax.Array, targets: jax.Array, target_values: jax.Array, num_id: int,
              weights: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`(loss, {"cross_entropy", "mse"})`: `(CE + MSE) / 2`.

    CE is the mean token cross-entropy over the counted targets (`weights > 0`, or
    `targets > 0` without weights; `[NUM]` is one token), MSE the mean squared error of
    the head against the scaled target values over the counted `[NUM]` targets (0
    without any). `logits` `[B, L, V]`, `numbers`, `target_values` `[B, L]` float
    (read at `[NUM]` only), `targets` `[B, L]` int (`num_id` is `[NUM]`).
    """
    real = targets > 0 if weights is None else weights > 0
    token_ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    ce = jnp.sum(jnp.where(real, token_ce, 0.0)) / jnp.maximum(jnp.sum(real), 1)
    is_num = real & (targets == num_id)
    err = jnp.where(is_num, numbers - target_values, 0.0)
    mse = jnp.sum(jnp.square(err)) / jnp.maximum(jnp.sum(is_num), 1)
    return (ce + mse) / 2, {"cross_entropy": ce, "mse": mse}


def greedy_decode(module: nn.Module, params, encoder_input_tokens: jax.Array, encoder_scale: jax.Array,
                  max_length: int, num_id: int, eos_id: int = 1) -> tuple[jax.Array, jax.Array]:
    """`(ids [B, max_length], numbers [B, max_length])` of an `XvalNetwork` `module`:
    greedy tokens (0 after the first EOS) and, at each `[NUM]`, the head's value in the
    scaled space (0 elsewhere). Each step re-runs the decoder on the whole prefix."""
    variables = {"params": params}
    encoded = module.apply(variables, encoder_input_tokens, enable_dropout=False, embedding_scale=encoder_scale,
                           method=module.encode)
    batch = encoder_input_tokens.shape[0]
    ones = jnp.ones((batch, max_length), jnp.int32)  # only the causal mask applies

    def body(i, carry):
        out, nums, done = carry
        dec_in = jnp.pad(out[:, :-1], ((0, 0), (1, 0)))  # shift right, 0 is the start
        prev = jnp.pad(nums[:, :-1], ((0, 0), (1, 0)))
        logits, numbers = module.apply(variables, encoded, encoder_input_tokens, dec_in, ones,
                                       decoder_scale=xval_scale(dec_in, prev, num_id), enable_dropout=False,
                                       method=module.decode_numbers)
        token = jnp.where(done, 0, jnp.argmax(logits[:, i], axis=-1).astype(jnp.int32))
        nums = nums.at[:, i].set(jnp.where(token == num_id, numbers[:, i], 0.0))
        return out.at[:, i].set(token), nums, done | (token == eos_id)

    init = (jnp.zeros((batch, max_length), jnp.int32), jnp.zeros((batch, max_length), jnp.float32),
            jnp.zeros((batch,), bool))
    out, nums, _ = jax.lax.fori_loop(0, max_length, body, init)
    return out, nums
