"""The xVal baseline (Golkar et al. 2023, "xVal: A Continuous Number Encoding for LLMs").

Every number of the text becomes one `[NUM]` token whose input embedding is multiplied
by the number's (scaled) value, and a number head (an MLP on the decoder's output,
d_model -> mlp_dim -> 1) predicts the value at the positions whose target is `[NUM]`.
As in the paper authors' T5 (tum-ai/number-token-loss, `t5_xval.py`), the encoder's and
the decoder's inputs are scaled, the decoder's multipliers shift right with its tokens
(the start position's multiplier is 1), and every other token's multiplier is 1.

Numbers are the matches of `-?[0-9]+(\\.[0-9]+)?`: a leading "-" belongs to the number,
so "5 - 3" keeps its operator but "-3" is one number (and "5-3", without spaces, reads
as 5 and -3; the mathematics generator spaces its binary operators).

Scaling (`ntl_jax.data.number_scaling`): a value x enters as
`s = sign(x) * log10(1 + |x|) / (log10(V_MAX) / 10)` with V_MAX = 3e9, so |s| <= 10 up
to V_MAX. Caveat: xVal's embedding-times-value encoding works for values in about
[-5, 5] (xVal normalises its data to that range): a layer's input norm divides a
vector's scale out, so a value is seen only relative to what else the residual stream
holds (the authors also add learned absolute position embeddings to the inputs; our T5
has relative position biases only, so the first layer's normed input at a `[NUM]`
carries just the value's sign). The log scaling brings values up to V_MAX into
[-10, 10] at the price of resolution: near x = 1000 one unit of x is about 4.6e-4 of
s, so the head must be that precise to get an integer answer right.

Loss: `(CE + MSE) / 2`, CE the mean token cross-entropy over the non-padding targets
(`[NUM]` being one token), MSE the mean squared error of the head against the scaled
target values over the `[NUM]` targets (0 without any). The authors z-score head and
targets together within each batch before the MSE; we do not: the scaled values are
already O(1), and a batch statistic makes an example's loss depend on its batch (and is
degenerate with one or two numbers in a batch).

Decoding is greedy, re-running the decoder on the whole prefix at each step; an emitted
`[NUM]` takes the head's prediction at that step as its value, which multiplies its
embedding when fed back. Predictions are written as text: each `[NUM]` as its value
mapped back from the scaled space, with the regression head's format (2 decimals,
trailing zeros dropped: `regression_head.format_prediction`). `number_accuracy` thus
counts answers within rounding to 2 decimals of the target (an integer answer needs
|error| < 0.005); we do not round to integers, which would tell the model the answers'
type. The batches of the trainer are the shared digit-level ones: each is converted on
the host (decoded to text, numbers replaced), so every system of a seed sees the same
problems. `[NUM]` has the id `vocabulary.vocab_size`, a row of the network's embedding
that the vocabulary's padding to a multiple of 128 already provides.

In the trainer this is `--loss xval` (encoder-decoder only); it pairs with the CE run of
the same seed.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from ntl_jax.data.number_scaling import SCALE_DIVISOR, V_MAX, scale_values, unscale_values  # noqa: F401  (this module's API too)
from ntl_jax.train import network
from ntl_jax.train.data import EOS_ID, EvalSet

LOSS = "xval"  # the trainer's `loss` value for this baseline
NUM_TOKEN = "[NUM]"
NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_PLACEHOLDER = "0"  # a digit: its own token in a digit-split vocabulary, absent from number-free text
_CACHE_LIMIT = 1 << 18


def extract_numbers(text: str, placeholder: str = NUM_TOKEN) -> tuple[str, list[float]]:
    """`text` with each number replaced by `placeholder`, and the numbers in order.

    >>> extract_numbers("What is -4 + 2.5 - 3?")
    ('What is [NUM] + [NUM] - [NUM]?', [-4.0, 2.5, 3.0])
    """
    values: list[float] = []

    def replace(match):
        values.append(float(match.group()))
        return placeholder

    return NUMBER.sub(replace, text), values


class XvalVocabulary:
    """A digit-level vocabulary with xVal's `[NUM]` token (id `vocabulary.vocab_size`).

    `encode(text)` gives the ids of `text` with each number as `[NUM]` and the numbers'
    values (NaN at the other ids); `decode(ids, values)` writes each `[NUM]` as its value.
    A number is encoded as the text with the number replaced by the digit "0", whose
    token then becomes `[NUM]`: the surrounding text is tokenized as it is in context.
    """

    def __init__(self, vocabulary: Any):
        self.vocabulary = vocabulary
        self.vocab_size = int(vocabulary.vocab_size)
        self.num_id = self.vocab_size
        ids = list(vocabulary.encode(_PLACEHOLDER))
        self._placeholder = ids[-1] if ids else -1
        if not ids or vocabulary.decode([self._placeholder]) != _PLACEHOLDER:
            raise ValueError(f"xVal expected a digit-split vocabulary with a token for '0', got ids {ids} "
                             f"for '0' from {vocabulary!r}")
        self._cache: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}

    def encode(self, text: str) -> tuple[list[int], np.ndarray]:
        """`(ids, values)`: `ids` with `num_id` for each number, `values` float64 of the
        same length, the number at its `[NUM]` and NaN elsewhere (no EOS added)."""
        masked, numbers = extract_numbers(text, _PLACEHOLDER)
        ids = list(self.vocabulary.encode(masked))
        where = [k for k, i in enumerate(ids) if i == self._placeholder]
        if len(where) != len(numbers):
            raise ValueError(f"xVal expected one '0' token per number of {text!r} ({len(numbers)}), got "
                             f"{len(where)}: the vocabulary must keep digits as tokens of their own")
        values = np.full(len(ids), np.nan)
        for k, v in zip(where, numbers):
            ids[k] = self.num_id
            values[k] = v
        return ids, values

    def decode(self, ids, values) -> str:
        """The text of `ids` up to the first EOS, each `[NUM]` written as its value
        (`values`, same length, in the answers' scale) by `format_value`."""
        parts: list[str] = []
        segment: list[int] = []

        def flush():
            if segment:
                text = self.vocabulary.decode(segment)
                # A piece's leading "▁" is a space, which decoding drops at the start.
                if parts and self._leading_space(segment[0]):
                    text = " " + text
                parts.append(text)
                segment.clear()

        for i, v in zip(np.asarray(ids).tolist(), np.asarray(values, np.float64).tolist()):
            if i == EOS_ID:
                break
            if i == self.num_id:
                flush()
                parts.append(format_value(v))
            elif i > 0:
                segment.append(i)
        flush()
        return "".join(parts).strip()

    def _leading_space(self, i: int) -> bool:
        return 0 <= i < self.vocab_size and str(self.vocabulary.id_to_piece(i)).startswith("\u2581")

    def _convert_row(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        key = row.tobytes()
        hit = self._cache.get(key)
        if hit is None:
            ids = row.tolist()
            if EOS_ID in ids:
                ids = ids[: ids.index(EOS_ID)]
            new_ids, values = self.encode(self.vocabulary.decode([i for i in ids if i > 0]))
            hit = (np.array(new_ids + [EOS_ID], np.int32), np.append(values, np.nan))
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def convert(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(ids, values)` `[B, L']` of `[B, L]` digit-vocabulary rows (0-padded, EOS at
        the end): each row decoded to text and re-encoded, values NaN except at `[NUM]`.
        `L'` is `L` unless a row grew (not seen with the shipped vocabulary, where a
        number's digits become one token), then the longest row rounded up to 8."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 2:
            raise ValueError(f"expected [batch, length] token ids, got shape {tokens.shape}")
        rows = [self._convert_row(row) for row in tokens]
        need = max((len(ids) for ids, _ in rows), default=0)
        length = tokens.shape[1] if need <= tokens.shape[1] else -(-need // 8) * 8
        ids = np.zeros((len(rows), length), np.int32)
        values = np.full((len(rows), length), np.nan)
        for k, (row_ids, row_values) in enumerate(rows):
            ids[k, : len(row_ids)] = row_ids
            values[k, : len(row_values)] = row_values
        return ids, values


def format_value(value: float) -> str:
    """A predicted number as text: the regression head's format (2 decimals).

    >>> format_value(11.996), format_value(-3.0)
    ('12', '-3')
    """
    from ntl_jax.train.regression_head import format_prediction

    return format_prediction(value)


def embedding_scale(ids: np.ndarray, values: np.ndarray, num_id: int) -> np.ndarray:
    """`[B, L]` float32 multipliers: the scaled value at `[NUM]`, 1 elsewhere."""
    is_num = np.asarray(ids) == num_id
    return np.where(is_num, scale_values(np.where(is_num, values, 0.0)), 1.0).astype(np.float32)


def features(codec: XvalVocabulary, batch: dict) -> dict[str, np.ndarray]:
    """xVal's features of one of the trainer's encoder-decoder batches.

    `encoder_input_tokens`/`encoder_scale`, `decoder_target_tokens`, `target_values`
    (scaled, 0 off `[NUM]`) and the decoder's inputs shifted right from the targets with
    their multipliers (`decoder_input_tokens`/`decoder_scale`; 0 and 1 at the start).
    """
    if "encoder_input_tokens" not in batch:
        raise ValueError(f"xVal expected encoder-decoder features (with encoder_input_tokens), got "
                         f"{sorted(batch)}")
    enc, enc_values = codec.convert(batch["encoder_input_tokens"])
    tgt, tgt_values = codec.convert(batch["decoder_target_tokens"])
    tgt_scale = embedding_scale(tgt, tgt_values, codec.num_id)
    dec_in = np.zeros_like(tgt)
    dec_in[:, 1:] = tgt[:, :-1]
    dec_scale = np.ones_like(tgt_scale)
    dec_scale[:, 1:] = tgt_scale[:, :-1]
    return {
        "encoder_input_tokens": enc,
        "encoder_scale": embedding_scale(enc, enc_values, codec.num_id),
        "decoder_input_tokens": dec_in,
        "decoder_scale": dec_scale,
        "decoder_target_tokens": tgt,
        "target_values": np.where(tgt == codec.num_id, tgt_scale, 0.0).astype(np.float32),
    }


class NumberHead(nn.Module):
    """`[..., D]` -> `[...]` float32: Dense(mlp_dim) -> GELU -> Dense(1), as the authors'."""

    mlp_dim: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.initializers.xavier_uniform()
        h = nn.gelu(nn.Dense(self.mlp_dim, kernel_init=init, dtype=jnp.float32, name="hidden")(x))
        return nn.Dense(1, kernel_init=init, dtype=jnp.float32, name="out")(h)[..., 0]


class XvalTransformer(network.Transformer):
    """The trainer's encoder-decoder with per-position embedding multipliers and a number
    head: `(logits [B, Lt, V], numbers [B, Lt])`, `numbers` in the scaled space.

    The parameters are the encoder-decoder's, under the same names (a seed initialises
    them as it does the CE run's), plus `number_head`.

    Example:
      >>> cfg = network.make_config("micro", vocab_size=100)
      >>> model = XvalTransformer(cfg)
      >>> enc, dec = jnp.ones((2, 5), jnp.int32), jnp.ones((2, 3), jnp.int32)
      >>> params = model.init(jax.random.key(0), enc, dec, dec, enable_dropout=False)
      >>> logits, numbers = model.apply(params, enc, dec, dec, enable_dropout=False)
      >>> logits.shape, numbers.shape
      ((2, 3, 128), (2, 3))
    """

    def setup(self):
        super().setup()
        self.number_head = NumberHead(self.config.mlp_dim)

    def decode_numbers(self, encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
                       decoder_scale=None, *, enable_dropout: bool = True):
        """Teacher-forced decoder pass -> `(logits, numbers)`; the head reads the hidden
        states the logits projection reads."""
        from ntl_jax.flax._linen import LOGITS_MODULE

        hidden = []

        def capture(next_fun, args, kwargs, context):
            if ((context.module.name == LOGITS_MODULE and context.method_name == "__call__")
                    or context.method_name == "attend"):
                hidden.append(args[0])
            return next_fun(*args, **kwargs)

        with nn.intercept_methods(capture):
            logits = self.decode(encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
                                 enable_dropout=enable_dropout, embedding_scale=decoder_scale)
        if len(hidden) != 1:
            raise ValueError(f"expected one logits projection in the decoder, found {len(hidden)}")
        return logits, self.number_head(hidden[0])

    def __call__(self, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens, encoder_scale=None,
                 decoder_scale=None, *, enable_dropout: bool = True):
        encoded = self.encode(encoder_input_tokens, enable_dropout=enable_dropout, embedding_scale=encoder_scale)
        return self.decode_numbers(encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
                                   decoder_scale, enable_dropout=enable_dropout)


def xval_loss(logits: jax.Array, numbers: jax.Array, targets: jax.Array, target_values: jax.Array,
              num_id: int) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`(loss, {"cross_entropy", "mse"})`: `(CE + MSE) / 2` (see the module docstring).

    `logits` `[B, L, V]`, `numbers`, `target_values` (scaled) `[B, L]` float, `targets`
    `[B, L]` int (0 is padding, `num_id` is `[NUM]`).
    """
    real = targets > 0
    token_ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    ce = jnp.sum(jnp.where(real, token_ce, 0.0)) / jnp.maximum(jnp.sum(real), 1)
    is_num = targets == num_id
    err = jnp.where(is_num, numbers - target_values, 0.0)
    mse = jnp.sum(jnp.square(err)) / jnp.maximum(jnp.sum(is_num), 1)
    return (ce + mse) / 2, {"cross_entropy": ce, "mse": mse}


def make_train_step(model: XvalTransformer, optimizer: optax.GradientTransformation, codec: XvalVocabulary):
    """`train_step(state, batch) -> (state, metrics)` on the trainer's batches: each is
    converted on the host (`features`), the update is jitted. Metrics: `loss`,
    `cross_entropy`, `mse` (scaled space) and `grad_norm`."""
    num_id = codec.num_id

    @jax.jit
    def update(state, f):
        rng = jax.random.fold_in(jax.random.wrap_key_data(state.dropout_rng), state.step)

        def loss_fn(params):
            logits, numbers = model.apply(
                {"params": params}, f["encoder_input_tokens"], f["decoder_input_tokens"],
                f["decoder_target_tokens"], f["encoder_scale"], f["decoder_scale"], enable_dropout=True,
                rngs={"dropout": rng})
            return xval_loss(logits, numbers, f["decoder_target_tokens"], f["target_values"], num_id)

        (loss, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, **parts, "grad_norm": optax.tree.norm(grads)}
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    def train_step(state, batch: dict):
        return update(state, {k: jnp.asarray(v) for k, v in features(codec, batch).items()})

    return train_step


def model_config_with_num_token(model_config: network.T5Config, vocab_size: int) -> network.T5Config:
    """`model_config`, or a copy one padded row larger, so that id `vocab_size` (`[NUM]`)
    has an embedding (the shipped vocabulary's 1,000 pieces are padded to 1,024: unchanged)."""
    if model_config.vocab_size > vocab_size:
        return model_config
    padded = int(math.ceil((vocab_size + 1) / 128) * 128)  # as network.make_config rounds
    return dataclasses.replace(model_config, vocab_size=padded)


def build(config, model_config: network.T5Config, vocabulary):
    """`(model, optimizer, train_step)` of a trainer run (`config` a `TrainConfig`)."""
    from ntl_jax.train import optim

    if config.architecture != "encoder-decoder":
        raise ValueError(f"xVal expected architecture 'encoder-decoder', got {config.architecture!r}")
    codec = XvalVocabulary(vocabulary)
    model = XvalTransformer(model_config_with_num_token(model_config, codec.vocab_size))
    optimizer = optim.make_optimizer(
        config.optimizer, learning_rate=config.learning_rate, total_steps=config.steps,
        warmup_steps=config.warmup_steps, schedule=config.schedule,
        weight_decay=config.weight_decay, clip_norm=config.clip_norm)
    return model, optimizer, make_train_step(model, optimizer, codec)


def _greedy(model: XvalTransformer, params, encoder_input_tokens, encoder_scale, max_length: int, num_id: int):
    """`(ids [B, max_length], numbers [B, max_length])`: greedy tokens (0 after the first
    EOS) and, at each `[NUM]`, the head's scaled value (0 elsewhere)."""
    variables = {"params": params}
    encoded = model.apply(variables, encoder_input_tokens, enable_dropout=False, embedding_scale=encoder_scale,
                          method=model.encode)
    batch = encoder_input_tokens.shape[0]
    ones = jnp.ones((batch, max_length), jnp.int32)  # only the causal mask applies

    def body(i, carry):
        out, nums, done = carry
        dec_in = jnp.pad(out[:, :-1], ((0, 0), (1, 0)))  # shift right, 0 is the start
        prev = jnp.pad(nums[:, :-1], ((0, 0), (1, 0)))
        dec_scale = jnp.where(dec_in == num_id, prev, 1.0)
        logits, numbers = model.apply(variables, encoded, encoder_input_tokens, dec_in, ones, dec_scale,
                                      enable_dropout=False, method=model.decode_numbers)
        token = jnp.where(done, 0, jnp.argmax(logits[:, i], axis=-1).astype(jnp.int32))
        nums = nums.at[:, i].set(jnp.where(token == num_id, numbers[:, i], 0.0))
        return out.at[:, i].set(token), nums, done | (token == EOS_ID)

    init = (jnp.zeros((batch, max_length), jnp.int32), jnp.zeros((batch, max_length), jnp.float32),
            jnp.zeros((batch,), bool))
    out, nums, _ = jax.lax.fori_loop(0, max_length, body, init)
    return out, nums


greedy_decode = jax.jit(_greedy, static_argnames=("model", "max_length", "num_id"))


def predict(model: XvalTransformer, params, eval_set: EvalSet, vocabulary, max_length: int,
            batch_size: int = 256) -> list[str]:
    """Greedy answers (text, each `[NUM]` written as its value) for the questions of
    `eval_set`, read from its token ids (truncated as the other systems see them)."""
    codec = XvalVocabulary(vocabulary)
    inputs, values = codec.convert(eval_set.inputs)
    scales = embedding_scale(inputs, values, codec.num_id)
    preds: list[str] = []
    for start in range(0, len(inputs), batch_size):
        ids, scale = inputs[start:start + batch_size], scales[start:start + batch_size]
        real = len(ids)
        if real < batch_size:  # one static shape: a single compilation
            ids = np.concatenate([ids, np.zeros((batch_size - real, ids.shape[1]), ids.dtype)])
            scale = np.concatenate([scale, np.ones((batch_size - real, scale.shape[1]), scale.dtype)])
        out, nums = greedy_decode(model, params, jnp.asarray(ids), jnp.asarray(scale), max_length, codec.num_id)
        out, nums = np.asarray(out)[:real], unscale_values(np.asarray(nums)[:real])
        preds.extend(codec.decode(row, row_values) for row, row_values in zip(out, nums))
    return preds


def evaluate(model: XvalTransformer, params, eval_sets: dict[str, EvalSet], vocabulary, max_length: int,
             batch_size: int = 256) -> tuple[dict[str, float], dict[str, list[str]]]:
    """`evaluate.evaluate` for xVal: the same metrics of its written answers."""
    from ntl_jax.train.evaluate import score_predictions

    return score_predictions(
        eval_sets, lambda eval_set: predict(model, params, eval_set, vocabulary, max_length, batch_size))

