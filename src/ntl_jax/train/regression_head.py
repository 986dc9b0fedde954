"""The regression-head baseline: the encoder's mean-pooled output -> a linear layer -> one number.

The paper claims NTL lets a language model's token head match a dedicated regression
head on a regression task. This is that head on the trainer's encoder (the same
`network.Encoder` and token embedding as the encoder-decoder, under the same parameter
names, so a seed initialises them as it does the CE run's), trained with the MSE of its
output against the answer's number, optionally on `sign(x) * log1p(|x|)` of it
(`log_targets`, the default: scores of 25-346 become 3.3-5.9, a scale a zero-mean head
reaches quickly; `sign(s) * expm1(|s|)` maps predictions back). The answer's number is read from the batch's target
tokens with the vocabulary and `ntl_jax.data.metrics.parse_number`, so any task whose
answers are numbers works. Evaluation writes each prediction as a number string
(`format_prediction`, 2 decimals) and scores it with the same metrics as the
generative models' decoded answers; exact-answer accuracy is thus near 0 by
construction and not comparable.

In the trainer this is `--loss regression-head` (encoder-decoder features only); it
pairs with the CE run of the same seed through the same batches.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from ntl_jax.data.metrics import PREDICTION_DECIMALS, format_prediction  # noqa: F401  (this module's API too)
from ntl_jax.train import network
from ntl_jax.train.data import EOS_ID, EvalSet

LOSS = "regression-head"  # the trainer's `loss` value for this baseline


class RegressionHead(nn.Module):
    """`[B, Lin]` question tokens -> `[B]` float32 predictions (in the training scale).

    Example:
      >>> cfg = network.make_config("micro", vocab_size=100)
      >>> model = RegressionHead(cfg)
      >>> tokens = jnp.array([[5, 6, 1, 0], [7, 1, 0, 0]])
      >>> params = model.init(jax.random.key(0), tokens, enable_dropout=False)
      >>> model.apply(params, tokens, enable_dropout=False).shape
      (2,)
    """

    config: network.T5Config
    log_targets: bool = True

    def setup(self):
        cfg = self.config
        # Named as in `network.Transformer`: the same seed gives the same encoder.
        self.token_embedder = nn.Embed(cfg.vocab_size, cfg.emb_dim,
                                       embedding_init=nn.initializers.normal(stddev=1.0))
        self.encoder = network.Encoder(cfg, self.token_embedder)
        self.head = nn.Dense(1, dtype=jnp.float32)

    def pooled(self, encoder_input_tokens: jax.Array, *, enable_dropout: bool = True) -> jax.Array:
        """`[B, D]`: the encodings' mean over the non-padding positions (0 is padding)."""
        if encoder_input_tokens.ndim != 2:
            raise ValueError(f"encoder_input_tokens must be [batch, length], got shape "
                             f"{encoder_input_tokens.shape}")
        real = encoder_input_tokens > 0
        mask = network.make_attention_mask(real, real)
        encoded = self.encoder(encoder_input_tokens, mask, deterministic=not enable_dropout)
        keep = real[..., None].astype(jnp.float32)
        total = jnp.sum(encoded.astype(jnp.float32) * keep, axis=1)
        return total / jnp.maximum(jnp.sum(keep, axis=1), 1.0)

    def __call__(self, encoder_input_tokens: jax.Array, decoder_input_tokens: Any = None,
                 decoder_target_tokens: Any = None, *, enable_dropout: bool = True) -> jax.Array:
        # The decoder features of the trainer's batches are accepted and unused: the
        # head reads the question only.
        del decoder_input_tokens, decoder_target_tokens
        pooled = self.pooled(encoder_input_tokens, enable_dropout=enable_dropout)
        return self.head(pooled)[:, 0].astype(jnp.float32)


def to_training_scale(values: np.ndarray, log_targets: bool) -> np.ndarray:
    """`sign(x) * log1p(|x|)` with `log_targets` (`log1p` for the answers >= 0 of a
    regression task; the sign keeps the negative answers of arithmetic), else the values."""
    values = np.asarray(values, np.float64)
    return np.sign(values) * np.log1p(np.abs(values)) if log_targets else values


def from_training_scale(values: np.ndarray, log_targets: bool) -> np.ndarray:
    """The inverse of `to_training_scale`."""
    values = np.asarray(values, np.float64)
    return np.sign(values) * np.expm1(np.abs(values)) if log_targets else values


def answer_values(vocabulary, target_tokens: np.ndarray) -> np.ndarray:
    """`[B]` float64: the number of each row's answer (token ids up to EOS, decoded)."""
    from ntl_jax.data.metrics import parse_number

    out = np.empty(len(target_tokens), np.float64)
    for i, row in enumerate(np.asarray(target_tokens).tolist()):
        if EOS_ID in row:
            row = row[: row.index(EOS_ID)]
        text = vocabulary.decode([t for t in row if t > 0])
        out[i] = parse_number(text)
        if not math.isfinite(out[i]):
            raise ValueError(f"the regression head expected a number as every answer, got {text!r}")
    return out


def make_train_step(model: RegressionHead, optimizer: optax.GradientTransformation, vocabulary):
    """`train_step(state, batch) -> (state, metrics)`: one optax step on the MSE of the
    head's outputs against the answers' numbers (signed-log1p-scaled with `model.log_targets`).

    The numbers are read on the host; the update is jitted (one compilation per shape).
    Metrics: `loss` (= `mse`, in the training scale) and `grad_norm`.
    """

    @jax.jit
    def update(state, tokens, targets):
        rng = jax.random.fold_in(jax.random.wrap_key_data(state.dropout_rng), state.step)

        def loss_fn(params):
            pred = model.apply({"params": params}, tokens, enable_dropout=True, rngs={"dropout": rng})
            return jnp.mean(jnp.square(pred - targets))

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, "mse": loss, "grad_norm": optax.tree.norm(grads)}
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    def train_step(state, batch: dict):
        if "encoder_input_tokens" not in batch:
            raise ValueError(f"the regression head expected encoder-decoder features (with "
                             f"encoder_input_tokens), got {sorted(batch)}")
        targets = to_training_scale(answer_values(vocabulary, batch["decoder_target_tokens"]),
                                    model.log_targets)
        return update(state, jnp.asarray(batch["encoder_input_tokens"]), jnp.asarray(targets, jnp.float32))

    return train_step


def build(config, model_config: network.T5Config, vocabulary):
    """`(model, optimizer, train_step)` of a trainer run (`config` a `TrainConfig`)."""
    from ntl_jax.train import optim

    if config.architecture != "encoder-decoder":
        raise ValueError(f"the regression head expected architecture 'encoder-decoder', got "
                         f"{config.architecture!r}")
    model = RegressionHead(model_config)
    optimizer = optim.make_optimizer(
        config.optimizer, learning_rate=config.learning_rate, total_steps=config.steps,
        warmup_steps=config.warmup_steps, schedule=config.schedule,
        weight_decay=config.weight_decay, clip_norm=config.clip_norm)
    return model, optimizer, make_train_step(model, optimizer, vocabulary)


@functools.partial(jax.jit, static_argnames=("model",))
def _apply(model, params, tokens):
    return model.apply({"params": params}, tokens, enable_dropout=False)


def predict_values(model: RegressionHead, params, inputs: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """`[n]` float64 predictions for `[n, Lin]` question tokens, in the answers' scale."""
    out = []
    for start in range(0, len(inputs), batch_size):
        chunk = inputs[start:start + batch_size]
        real = len(chunk)
        if real < batch_size:  # one static shape: a single compilation
            chunk = np.concatenate([chunk, np.zeros((batch_size - real, chunk.shape[1]), chunk.dtype)])
        out.append(np.asarray(_apply(model, params, jnp.asarray(chunk)))[:real])
    raw = np.concatenate(out) if out else np.zeros(0)
    return from_training_scale(raw, model.log_targets)


def evaluate(model: RegressionHead, params, eval_sets: dict[str, EvalSet], vocabulary,
             max_length: int, batch_size: int = 256) -> tuple[dict[str, float], dict[str, list[str]]]:
    """`evaluate.evaluate` for the head: the same metrics of its formatted predictions.

    `vocabulary` and `max_length` (decoding arguments) are unused.
    """
    from ntl_jax.train.evaluate import score_predictions

    del vocabulary, max_length
    return score_predictions(
        eval_sets,
        lambda eval_set: [format_prediction(v) for v in predict_values(model, params, eval_set.inputs, batch_size)])
