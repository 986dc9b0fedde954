"""The xVal baseline (Golkar et al. 2023, "xVal: A Continuous Number Encoding for LLMs").

Every number of the text becomes one `[NUM]` token whose input embedding is multiplied
by the number's (scaled) value, and a number head (an MLP on the decoder's output,
d_model -> mlp_dim -> 1) predicts the value at the positions whose target is `[NUM]`.
As in the paper authors' T5 (tum-ai/number-token-loss, `t5_xval.py`), the encoder's and
the decoder's inputs are scaled, the decoder's multipliers shift right with its tokens
(the start position's multiplier is 1), and every other token's multiplier is 1.

The text codec (numbers to `[NUM]` and back) is `ntl_jax.data.xval_vocabulary`; the
network, loss and decoding are `ntl_jax.flax.xval`, which T5X's xVal (`ntl_jax.t5x.xval`)
shares; this module runs them on the trainer's batches.

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
trailing zeros dropped: `ntl_jax.data.metrics.format_prediction`). `number_accuracy` thus
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

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ntl_jax.data.number_scaling import SCALE_DIVISOR, V_MAX, scale_values, unscale_values  # noqa: F401  (this module's API too)
from ntl_jax.data.xval_vocabulary import (  # noqa: F401  (this module's API too)
    NUM_TOKEN,
    XvalVocabulary,
    embedding_scale,
    extract_numbers,
    format_value,
)
from ntl_jax.flax import xval as flax_xval
from ntl_jax.flax.xval import NumberHead, XvalNetwork, xval_loss  # noqa: F401  (this module's API too)
from ntl_jax.train import network
from ntl_jax.train.data import EvalSet

LOSS = "xval"  # the trainer's `loss` value for this baseline
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


class XvalTransformer(XvalNetwork, network.Transformer):
    """The trainer's encoder-decoder with xVal's scaled input embeddings and number head
    (`ntl_jax.flax.xval.XvalNetwork`): `(logits [B, Lt, V], numbers [B, Lt])`, `numbers`
    in the scaled space.

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
                f["decoder_target_tokens"], encoder_scale=f["encoder_scale"], decoder_scale=f["decoder_scale"],
                enable_dropout=True, rngs={"dropout": rng})
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


greedy_decode = jax.jit(flax_xval.greedy_decode, static_argnames=("module", "max_length", "num_id", "eos_id"))


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

