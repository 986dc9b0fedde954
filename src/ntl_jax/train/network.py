"""A T5.1.1-style encoder-decoder in Flax linen.

The module interface follows `t5x.examples.t5.network.Transformer` (`encode`,
`decode`, `__call__` on the T5X batch features), so the network can also serve as
`MODEL.module` in a T5X gin file. T5.1.1 differs from the original T5 in its gated-GELU
feed-forward, no dropout in pre-training by default and untied output logits; we keep
those choices. Written from the T5 papers (Raffel et al. 2020; Shazeer 2020, "GLU
Variants Improve Transformer").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from ntl_jax.flax.number_embeddings import RtFloatEncodings

Array = jax.Array
NEG_INF = -1e10  # large finite negative: masked logits never become NaN


@dataclasses.dataclass(frozen=True)
class T5Config:
    """Sizes and options of the encoder-decoder (field names as in T5X's T5Config)."""

    vocab_size: int
    dtype: Any = jnp.float32
    emb_dim: int = 512
    num_heads: int = 6
    num_encoder_layers: int = 8
    num_decoder_layers: int = 8
    head_dim: int = 64
    mlp_dim: int = 1024
    mlp_activations: Sequence[str] = ("gelu", "linear")
    dropout_rate: float = 0.0
    logits_via_embedding: bool = False
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128


# Sizes per preset; `vocab_size` is added from the vocabulary at build time.
PRESETS: dict[str, dict[str, Any]] = {
    # For tests: compiles and runs in well under a second on a CPU.
    "micro": dict(emb_dim=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                  head_dim=8, mlp_dim=32),
    # Trains on a 2-core CPU in minutes.
    "tiny": dict(emb_dim=64, num_heads=4, num_encoder_layers=2, num_decoder_layers=2,
                 head_dim=16, mlp_dim=128),
    # T5.1.1 small and base (t5x/examples/t5/t5_1_1/{small,base}.gin).
    "small": dict(emb_dim=512, num_heads=6, num_encoder_layers=8, num_decoder_layers=8,
                  head_dim=64, mlp_dim=1024),
    "base": dict(emb_dim=768, num_heads=12, num_encoder_layers=12, num_decoder_layers=12,
                 head_dim=64, mlp_dim=2048),
}


def make_config(preset: str, vocab_size: int, **overrides: Any) -> T5Config:
    """Returns the `T5Config` of a named preset for a vocabulary size.

    Args:
      preset: one of `PRESETS` ("micro", "tiny", "small", "base").
      vocab_size: number of output classes; rounded up to a multiple of 128 as in T5X
        (the spare rows are never targets).
      **overrides: any other `T5Config` field.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {sorted(PRESETS)}")
    if not isinstance(vocab_size, (int, np.integer)) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an int >= 2, got {vocab_size!r}")
    padded = int(math.ceil(vocab_size / 128) * 128)
    return T5Config(vocab_size=padded, **{**PRESETS[preset], **overrides})


# ---------------------------------------------------------------------------- masks


def make_attention_mask(query_input: Array, key_input: Array,
                        pairwise_fn: Callable = jnp.multiply) -> Array:
    """`[B, 1, Lq, Lk]` mask from `[B, Lq]` and `[B, Lk]` per-position values."""
    mask = pairwise_fn(query_input[..., :, None], key_input[..., None, :])
    return mask[..., None, :, :].astype(jnp.float32)


def combine_masks(*masks: Array | None) -> Array | None:
    masks = [m for m in masks if m is not None]
    if not masks:
        return None
    out = masks[0]
    for m in masks[1:]:
        out = jnp.logical_and(out, m)
    return out.astype(jnp.float32)


def causal_mask(length: int, batch: int) -> Array:
    idx = jnp.arange(length)
    m = (idx[None, :] <= idx[:, None]).astype(jnp.float32)
    return jnp.broadcast_to(m, (batch, 1, length, length))


def mask_to_bias(mask: Array | None) -> Array | None:
    if mask is None:
        return None
    return jnp.where(mask > 0, 0.0, NEG_INF).astype(jnp.float32)


# --------------------------------------------------------------------------- layers


class RMSNorm(nn.Module):
    """T5 layer norm: scale only, no mean subtraction, no bias."""

    epsilon: float = 1e-6
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        y = x32 * jax.lax.rsqrt(var + self.epsilon)
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        return (y * scale).astype(self.dtype)


def relative_position_bucket(relative_position: np.ndarray, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """Maps key-minus-query offsets to T5's log-spaced buckets (host-side, static)."""
    ret = np.zeros_like(relative_position)
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(np.int32) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    with np.errstate(divide="ignore"):
        large = max_exact + (
            np.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
            / np.log(max_distance / max_exact) * (num_buckets - max_exact)
        ).astype(np.int32)
    large = np.minimum(large, num_buckets - 1)
    return ret + np.where(is_small, n, large)


class RelativePositionBiases(nn.Module):
    """Per-head attention bias from bucketed relative positions, shared across layers."""

    num_heads: int
    bidirectional: bool
    num_buckets: int = 32
    max_distance: int = 128

    @nn.compact
    def __call__(self, qlen: int, klen: int) -> Array:
        context = np.arange(qlen, dtype=np.int32)[:, None]
        memory = np.arange(klen, dtype=np.int32)[None, :]
        buckets = relative_position_bucket(memory - context, self.bidirectional,
                                           self.num_buckets, self.max_distance)
        table = self.param("rel_embedding", nn.initializers.normal(stddev=1.0),
                           (self.num_heads, self.num_buckets), jnp.float32)
        values = table[:, buckets]  # [H, qlen, klen]
        return values[None]  # [1, H, qlen, klen]


class MultiHeadAttention(nn.Module):
    """Dot-product attention without the 1/sqrt(d) factor (folded into the query init)."""

    num_heads: int
    head_dim: int
    dtype: Any = jnp.float32
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, inputs_q: Array, inputs_kv: Array, bias: Array | None,
                 deterministic: bool, decode: bool = False) -> Array:
        """Attends `inputs_q` to `inputs_kv`; `bias` is `[B or 1, H, Lq, Lk]` or None.

        With `decode=True` (self-attention only) the keys and values are kept in the
        "cache" collection: the first call, on the full-length input, only allocates it;
        each later call takes one position, appends it and attends to the positions so
        far, taking row `i` of the full-length `bias`.
        """
        features = inputs_q.shape[-1]
        kernel = nn.initializers.variance_scaling(1.0, "fan_in", "normal")

        def query_init(key, shape, dtype=jnp.float32):
            return kernel(key, shape, dtype) / math.sqrt(self.head_dim)

        def proj(name, x, init):
            return nn.DenseGeneral((self.num_heads, self.head_dim), use_bias=False,
                                   kernel_init=init, dtype=self.dtype, name=name)(x)

        q = proj("query", inputs_q, query_init)
        k = proj("key", inputs_kv, kernel)
        v = proj("value", inputs_kv, kernel)
        if decode:
            initialized = self.has_variable("cache", "cached_key")
            cached_key = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
            cached_value = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
            cache_index = self.variable("cache", "cache_index",
                                        lambda: jnp.zeros((), jnp.int32))
            if initialized:
                if inputs_q.shape[1] != 1:
                    raise ValueError(f"decode=True takes one position per call, got "
                                     f"{inputs_q.shape[1]}")
                i = cache_index.value
                k = jax.lax.dynamic_update_slice(cached_key.value, k, (0, i, 0, 0))
                v = jax.lax.dynamic_update_slice(cached_value.value, v, (0, i, 0, 0))
                cached_key.value, cached_value.value, cache_index.value = k, v, i + 1
                visible = jnp.where(jnp.arange(k.shape[1]) <= i, 0.0, NEG_INF)
                row = (0.0 if bias is None
                       else jax.lax.dynamic_slice_in_dim(bias, i, 1, axis=2))
                bias = row + visible[None, None, None, :]
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
        if bias is not None:
            logits = logits + bias
        weights = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
        if not deterministic and self.dropout_rate > 0:
            weights = nn.Dropout(self.dropout_rate)(weights, deterministic=False)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        return nn.DenseGeneral(features, axis=(-2, -1), use_bias=False, kernel_init=kernel,
                               dtype=self.dtype, name="out")(out)


class MlpBlock(nn.Module):
    """Gated feed-forward: `wo(act_0(wi_0 x) * act_1(wi_1 x))` (gated-GELU for T5.1.1)."""

    mlp_dim: int
    activations: Sequence[str] = ("gelu", "linear")
    dtype: Any = jnp.float32
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        kernel = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
        h = None
        for i, act in enumerate(self.activations):
            y = nn.Dense(self.mlp_dim, use_bias=False, kernel_init=kernel, dtype=self.dtype,
                         name=f"wi_{i}" if len(self.activations) > 1 else "wi")(x)
            if act != "linear":
                y = getattr(nn, act)(y)
            h = y if h is None else h * y
        h = nn.Dropout(self.dropout_rate, broadcast_dims=(-2,))(h, deterministic=deterministic)
        return nn.Dense(x.shape[-1], use_bias=False, kernel_init=kernel, dtype=self.dtype,
                        name="wo")(h)


class EncoderLayer(nn.Module):
    config: T5Config

    @nn.compact
    def __call__(self, x: Array, bias: Array, deterministic: bool) -> Array:
        cfg = self.config
        drop = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        h = RMSNorm(dtype=cfg.dtype, name="pre_attention_layer_norm")(x)
        h = MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.dtype, cfg.dropout_rate,
                               name="attention")(h, h, bias, deterministic)
        x = x + drop(h, deterministic=deterministic)
        h = RMSNorm(dtype=cfg.dtype, name="pre_mlp_layer_norm")(x)
        h = MlpBlock(cfg.mlp_dim, cfg.mlp_activations, cfg.dtype, cfg.dropout_rate,
                     name="mlp")(h, deterministic)
        return x + drop(h, deterministic=deterministic)


class DecoderLayer(nn.Module):
    config: T5Config

    @nn.compact
    def __call__(self, x: Array, encoded: Array, self_bias: Array, cross_bias: Array | None,
                 deterministic: bool, decode: bool = False) -> Array:
        cfg = self.config
        drop = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        h = RMSNorm(dtype=cfg.dtype, name="pre_self_attention_layer_norm")(x)
        h = MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.dtype, cfg.dropout_rate,
                               name="self_attention")(h, h, self_bias, deterministic, decode)
        x = x + drop(h, deterministic=deterministic)
        h = RMSNorm(dtype=cfg.dtype, name="pre_cross_attention_layer_norm")(x)
        h = MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.dtype, cfg.dropout_rate,
                               name="encoder_decoder_attention")(h, encoded, cross_bias,
                                                                 deterministic)
        x = x + drop(h, deterministic=deterministic)
        h = RMSNorm(dtype=cfg.dtype, name="pre_mlp_layer_norm")(x)
        h = MlpBlock(cfg.mlp_dim, cfg.mlp_activations, cfg.dtype, cfg.dropout_rate,
                     name="mlp")(h, deterministic)
        return x + drop(h, deterministic=deterministic)


class Encoder(nn.Module):
    config: T5Config
    shared_embedding: nn.Module

    @nn.compact
    def __call__(self, tokens: Array, mask: Array | None, deterministic: bool) -> Array:
        cfg = self.config
        rel = RelativePositionBiases(cfg.num_heads, True, cfg.relative_attention_num_buckets,
                                     cfg.relative_attention_max_distance, name="relpos_bias")
        length = tokens.shape[-1]
        bias = rel(length, length)
        if mask is not None:
            bias = bias + mask_to_bias(mask)
        x = self.shared_embedding(tokens.astype(jnp.int32)).astype(cfg.dtype)
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        for i in range(cfg.num_encoder_layers):
            x = EncoderLayer(cfg, name=f"layers_{i}")(x, bias, deterministic)
        x = RMSNorm(dtype=cfg.dtype, name="encoder_norm")(x)
        return nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)


class Decoder(nn.Module):
    config: T5Config
    shared_embedding: nn.Module

    @nn.compact
    def __call__(self, encoded: Array, decoder_input_tokens: Array, self_mask: Array | None,
                 cross_mask: Array | None, deterministic: bool, decode: bool = False,
                 max_decode_length: int | None = None) -> Array:
        cfg = self.config
        rel = RelativePositionBiases(cfg.num_heads, False, cfg.relative_attention_num_buckets,
                                     cfg.relative_attention_max_distance, name="relpos_bias")
        length = max_decode_length if decode else decoder_input_tokens.shape[-1]
        self_bias = rel(length, length)
        if self_mask is not None:
            self_bias = self_bias + mask_to_bias(self_mask)
        cross_bias = mask_to_bias(cross_mask)
        x = self.shared_embedding(decoder_input_tokens.astype(jnp.int32)).astype(cfg.dtype)
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        for i in range(cfg.num_decoder_layers):
            x = DecoderLayer(cfg, name=f"layers_{i}")(x, encoded, self_bias, cross_bias,
                                                      deterministic, decode)
        x = RMSNorm(dtype=cfg.dtype, name="decoder_norm")(x)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        if cfg.logits_via_embedding:
            logits = self.shared_embedding.attend(x) / math.sqrt(x.shape[-1])
        else:
            logits = nn.DenseGeneral(cfg.vocab_size, use_bias=False, dtype=jnp.float32,
                                     kernel_init=nn.initializers.variance_scaling(
                                         1.0, "fan_in", "truncated_normal"),
                                     name="logits_dense")(x)
        return logits.astype(jnp.float32)


class Transformer(nn.Module):
    """T5.1.1 encoder-decoder with the `t5x.examples.t5.network.Transformer` interface.

    Example:
      >>> cfg = make_config("micro", vocab_size=100)
      >>> model = Transformer(cfg)
      >>> enc, dec = jnp.ones((2, 5), jnp.int32), jnp.ones((2, 3), jnp.int32)
      >>> params = model.init(jax.random.key(0), enc, dec, dec, enable_dropout=False)
      >>> model.apply(params, enc, dec, dec, enable_dropout=False).shape
      (2, 3, 128)
    """

    config: T5Config

    def setup(self):
        cfg = self.config
        self.token_embedder = nn.Embed(cfg.vocab_size, cfg.emb_dim,
                                       embedding_init=nn.initializers.normal(stddev=1.0),
                                       name="token_embedder")
        self.encoder = Encoder(cfg, self.token_embedder)
        self.decoder = Decoder(cfg, self.token_embedder)

    def encode(self, encoder_input_tokens: Array, encoder_segment_ids: Array | None = None,
               *, enable_dropout: bool = True) -> Array:
        """`[B, Lin]` tokens -> `[B, Lin, D]` encodings (0 is padding)."""
        if encoder_input_tokens.ndim != 2:
            raise ValueError(f"encoder_input_tokens must be [batch, length], got shape "
                             f"{encoder_input_tokens.shape}")
        mask = make_attention_mask(encoder_input_tokens > 0, encoder_input_tokens > 0)
        if encoder_segment_ids is not None:
            mask = combine_masks(mask, make_attention_mask(
                encoder_segment_ids, encoder_segment_ids, jnp.equal))
        return self.encoder(encoder_input_tokens, mask, deterministic=not enable_dropout)

    def decode(self, encoded: Array, encoder_input_tokens: Array, decoder_input_tokens: Array,
               decoder_target_tokens: Array, encoder_segment_ids: Array | None = None,
               decoder_segment_ids: Array | None = None, decoder_positions: Array | None = None,
               *, enable_dropout: bool = True, decode: bool = False,
               max_decode_length: int | None = None) -> Array:
        """Decoder pass -> `[B, Ltgt, V]` f32 logits.

        Teacher-forced by default. With `decode=True` (incremental decoding, as T5X's
        `decode`): initialise the "cache" collection by calling once on full-length
        `[B, max_decode_length]` inputs with `mutable=["cache"]`, then call with one
        position `[B, 1]` at a time; `max_decode_length` is required.
        """
        del decoder_positions  # relative positions come from the layout, as in T5X
        if decode:
            if max_decode_length is None:
                raise ValueError("decode=True needs max_decode_length")
            # The cache masks future positions; only the encoder padding matters here.
            self_mask = None
            cross_mask = make_attention_mask(jnp.ones_like(decoder_target_tokens) > 0,
                                             encoder_input_tokens > 0)
            return self.decoder(encoded, decoder_input_tokens, self_mask, cross_mask,
                                deterministic=not enable_dropout, decode=True,
                                max_decode_length=max_decode_length)
        batch, length = decoder_input_tokens.shape
        self_mask = combine_masks(
            causal_mask(length, batch),
            make_attention_mask(decoder_target_tokens > 0, decoder_target_tokens > 0))
        cross_mask = make_attention_mask(decoder_target_tokens > 0, encoder_input_tokens > 0)
        if decoder_segment_ids is not None:
            self_mask = combine_masks(self_mask, make_attention_mask(
                decoder_segment_ids, decoder_segment_ids, jnp.equal))
            if encoder_segment_ids is not None:
                cross_mask = combine_masks(cross_mask, make_attention_mask(
                    decoder_segment_ids, encoder_segment_ids, jnp.equal))
        return self.decoder(encoded, decoder_input_tokens, self_mask, cross_mask,
                            deterministic=not enable_dropout)

    def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
                 decoder_target_tokens: Array, encoder_segment_ids: Array | None = None,
                 decoder_segment_ids: Array | None = None,
                 encoder_positions: Array | None = None,
                 decoder_positions: Array | None = None, *, enable_dropout: bool = True,
                 decode: bool = False, max_decode_length: int | None = None) -> Array:
        """Full pass on T5X batch features -> `[B, Ltgt, vocab_size]` f32 logits."""
        del encoder_positions  # relative attention uses the layout only, as in T5X
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids,
                              enable_dropout=enable_dropout)
        return self.decode(encoded, encoder_input_tokens, decoder_input_tokens,
                           decoder_target_tokens, encoder_segment_ids, decoder_segment_ids,
                           decoder_positions, enable_dropout=enable_dropout, decode=decode,
                           max_decode_length=max_decode_length)


# ------------------------------------------------------------------- decoder-only

ARCHITECTURES: tuple[str, ...] = ("encoder-decoder", "decoder-only")


def decoder_only_layers(config: T5Config) -> int:
    """Layers of the decoder-only stack: the encoder-decoder's two stacks, end to end.

    A preset then has the same depth and, but for the cross-attention weights, the same
    parameters in both architectures, so the two compare at one size.
    """
    return config.num_encoder_layers + config.num_decoder_layers


def make_decoder_mask(decoder_target_tokens: Array,
                      decoder_causal_attention: Array | None = None,
                      decoder_segment_ids: Array | None = None) -> Array:
    """`[B, 1, L, L]` self-attention mask of a decoder-only model (T5X's make_decoder_mask).

    Causal, except that positions where `decoder_causal_attention` is 1 (the prefix of a
    prefix LM) also see each other both ways; 0 tokens are padding; segments (packing)
    only see themselves.
    """
    batch, length = decoder_target_tokens.shape
    mask = causal_mask(length, batch)
    if decoder_causal_attention is not None:
        prefix = make_attention_mask(decoder_causal_attention, decoder_causal_attention)
        mask = jnp.logical_or(mask > 0, prefix > 0).astype(jnp.float32)
    return combine_masks(
        mask,
        make_attention_mask(decoder_target_tokens > 0, decoder_target_tokens > 0),
        None if decoder_segment_ids is None else make_attention_mask(
            decoder_segment_ids, decoder_segment_ids, jnp.equal))


class DecoderOnlyLayer(nn.Module):
    """Pre-norm self-attention and gated MLP (a `DecoderLayer` without cross-attention)."""

    config: T5Config

    @nn.compact
    def __call__(self, x: Array, bias: Array, deterministic: bool) -> Array:
        cfg = self.config
        drop = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        h = RMSNorm(dtype=cfg.dtype, name="pre_self_attention_layer_norm")(x)
        h = MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.dtype, cfg.dropout_rate,
                               name="self_attention")(h, h, bias, deterministic)
        x = x + drop(h, deterministic=deterministic)
        h = RMSNorm(dtype=cfg.dtype, name="pre_mlp_layer_norm")(x)
        h = MlpBlock(cfg.mlp_dim, cfg.mlp_activations, cfg.dtype, cfg.dropout_rate,
                     name="mlp")(h, deterministic)
        return x + drop(h, deterministic=deterministic)


class DecoderOnlyTransformer(nn.Module):
    """A T5.1.1-block decoder-only LM with the `t5x.examples.decoder_only` interface.

    `decoder_only_layers(config)` layers of self-attention + gated-GELU MLP, RMSNorm,
    relative position biases shared across layers, untied logits. With
    `decoder_causal_attention` (seqio's prefix-LM feature) the question positions attend
    both ways; without it the model is plain causal. The relative position buckets are
    bidirectional (T5X uses causal ones) so that prefix positions can tell keys after
    them apart; under the causal mask those buckets are never used.

    Incremental decoding (`decode=True`) is not implemented: `evaluate` re-runs the
    model on a fixed-length buffer, which costs little for these short sequences.

    Example:
      >>> cfg = make_config("micro", vocab_size=100)
      >>> model = DecoderOnlyTransformer(cfg)
      >>> tokens = jnp.ones((2, 6), jnp.int32)
      >>> params = model.init(jax.random.key(0), tokens, tokens, enable_dropout=False)
      >>> model.apply(params, tokens, tokens, enable_dropout=False).shape
      (2, 6, 128)
    """

    config: T5Config

    @nn.compact
    def __call__(self, decoder_input_tokens: Array, decoder_target_tokens: Array,
                 decoder_segment_ids: Array | None = None,
                 decoder_positions: Array | None = None,
                 decoder_causal_attention: Array | None = None, *,
                 enable_dropout: bool = True, decode: bool = False,
                 max_decode_length: int | None = None, prefill: bool = False,
                 prefill_lengths: Array | None = None) -> Array:
        """Teacher-forced pass on T5X decoder-only features -> `[B, L, vocab_size]` f32."""
        del decoder_positions, max_decode_length, prefill_lengths  # layout-relative only
        if decode or prefill:
            raise NotImplementedError(
                "DecoderOnlyTransformer has no incremental decoding; run it on the whole "
                "sequence (see ntl_jax.train.evaluate.greedy_decode_decoder_only)")
        if decoder_input_tokens.ndim != 2:
            raise ValueError(f"decoder_input_tokens must be [batch, length], got shape "
                             f"{decoder_input_tokens.shape}")
        cfg = self.config
        deterministic = not enable_dropout
        embed = nn.Embed(cfg.vocab_size, cfg.emb_dim,
                         embedding_init=nn.initializers.normal(stddev=1.0),
                         name="token_embedder")
        length = decoder_input_tokens.shape[-1]
        bias = RelativePositionBiases(cfg.num_heads, True, cfg.relative_attention_num_buckets,
                                      cfg.relative_attention_max_distance,
                                      name="relpos_bias")(length, length)
        bias = bias + mask_to_bias(make_decoder_mask(
            decoder_target_tokens, decoder_causal_attention, decoder_segment_ids))
        x = embed(decoder_input_tokens.astype(jnp.int32)).astype(cfg.dtype)
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        for i in range(decoder_only_layers(cfg)):
            x = DecoderOnlyLayer(cfg, name=f"layers_{i}")(x, bias, deterministic)
        x = RMSNorm(dtype=cfg.dtype, name="decoder_norm")(x)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        if cfg.logits_via_embedding:
            logits = embed.attend(x) / math.sqrt(x.shape[-1])
        else:
            logits = nn.DenseGeneral(cfg.vocab_size, use_bias=False, dtype=jnp.float32,
                                     kernel_init=nn.initializers.variance_scaling(
                                         1.0, "fan_in", "truncated_normal"),
                                     name="logits_dense")(x)
        return logits.astype(jnp.float32)


class RtTransformer(RtFloatEncodings, Transformer):
    """`Transformer` with the Regression Transformer's float encodings added to its
    input embeddings (`ntl_jax.flax.number_embeddings`); on the RT vocabulary."""


class RtDecoderOnlyTransformer(RtFloatEncodings, DecoderOnlyTransformer):
    """`DecoderOnlyTransformer` with the RT float encodings, as `RtTransformer`."""


# What a network adds to its input embeddings: nothing, or the RT float encodings.
FLOAT_ENCODINGS: tuple[str, ...] = ("none", "rt")


def make_model(architecture: str, config: T5Config, float_encodings: str = "none") -> nn.Module:
    """`Transformer` for "encoder-decoder", `DecoderOnlyTransformer` for "decoder-only";
    with `float_encodings="rt"`, their RT versions."""
    if float_encodings not in FLOAT_ENCODINGS:
        raise ValueError(f"float_encodings must be one of {FLOAT_ENCODINGS}, got {float_encodings!r}")
    rt = float_encodings == "rt"
    if architecture == "encoder-decoder":
        return RtTransformer(config) if rt else Transformer(config)
    if architecture == "decoder-only":
        return RtDecoderOnlyTransformer(config) if rt else DecoderOnlyTransformer(config)
    raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {architecture!r}")
