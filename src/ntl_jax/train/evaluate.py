"""Greedy decoding and number metrics on the test splits."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ntl_jax.train.data import EOS_ID, EvalSet


@functools.partial(jax.jit, static_argnames=("model", "max_length", "use_cache"))
def greedy_decode(model, params, encoder_input_tokens: jax.Array, max_length: int,
                  use_cache: bool = True) -> jax.Array:
    """Argmax decoding: `[B, Lin]` inputs -> `[B, max_length]` ids, 0 after the first EOS.

    The encoder runs once. With `use_cache` the decoder runs one position per step on
    its key/value cache (`decode=True`); without, it re-runs on the whole fixed-length
    buffer at every step (slower, no decoding state). Both give the same tokens.
    """
    variables = {"params": params}
    encoded = model.apply(variables, encoder_input_tokens, enable_dropout=False,
                          method=model.encode)
    batch = encoder_input_tokens.shape[0]
    # All-ones targets: only the causal mask applies while decoding.
    ones = jnp.ones((batch, max_length), jnp.int32)
    out = jnp.zeros((batch, max_length), jnp.int32)
    done = jnp.zeros((batch,), bool)

    def pick(i, logits, out, done):
        token = jnp.where(done, 0, jnp.argmax(logits, axis=-1).astype(jnp.int32))
        return out.at[:, i].set(token), done | (token == EOS_ID), token

    if not use_cache:
        def body(i, carry):
            out, done = carry
            dec_in = jnp.pad(out[:, :-1], ((0, 0), (1, 0)))  # shift right, 0 is BOS
            logits = model.apply(variables, encoded, encoder_input_tokens, dec_in, ones,
                                 enable_dropout=False, method=model.decode)
            out, done, _ = pick(i, logits[:, i], out, done)
            return out, done

        return jax.lax.fori_loop(0, max_length, body, (out, done))[0]

    def decode_step(cache, tokens):
        logits, mutated = model.apply(
            {"params": params, "cache": cache}, encoded, encoder_input_tokens, tokens,
            ones[:, : tokens.shape[1]], enable_dropout=False, decode=True,
            max_decode_length=max_length, method=model.decode, mutable=["cache"])
        return logits, mutated["cache"]

    # A first call on the full length only allocates the cache.
    _, cache = model.apply(variables, encoded, encoder_input_tokens, out, ones,
                           enable_dropout=False, decode=True, max_decode_length=max_length,
                           method=model.decode, mutable=["cache"])
    cache = cache["cache"]

    def cached_body(i, carry):
        out, done, prev, cache = carry
        logits, cache = decode_step(cache, prev)
        out, done, token = pick(i, logits[:, 0], out, done)
        return out, done, token[:, None], cache

    start = jnp.zeros((batch, 1), jnp.int32)  # BOS
    return jax.lax.fori_loop(0, max_length, cached_body, (out, done, start, cache))[0]


@functools.partial(jax.jit, static_argnames=("model", "max_length", "prefix_lm"))
def greedy_decode_decoder_only(model, params, prompt_tokens: jax.Array, max_length: int,
                               prefix_lm: bool = True) -> jax.Array:
    """Argmax continuation of `[B, Lp]` prompts -> `[B, max_length]` ids, 0 after EOS.

    Each prompt row is its tokens (question ids + EOS) right-padded with 0; the answer
    starts right after them. A `[B, Lp + max_length]` buffer holds prompt and answer so
    far and the whole model re-runs on it at every step (no cache): step `t` reads the
    logits at position `prompt_length + t`, as teacher forcing does. With `prefix_lm`
    the prompt positions attend both ways (`decoder_causal_attention`, as in training
    on prefix-LM features).
    """
    variables = {"params": params}
    batch, prompt_len = prompt_tokens.shape
    total = prompt_len + max_length
    lengths = jnp.sum(prompt_tokens > 0, axis=1).astype(jnp.int32)  # [B]
    seq = jnp.pad(prompt_tokens.astype(jnp.int32), ((0, 0), (0, max_length)))
    positions = jnp.arange(total)[None, :]
    causal_attention = ((positions <= lengths[:, None]).astype(jnp.int32)
                        if prefix_lm else None)
    ones = jnp.ones((batch, total), jnp.int32)  # no padding: the causal mask hides the rest
    rows = jnp.arange(batch)

    def body(t, carry):
        seq, out, done = carry
        dec_in = jnp.pad(seq[:, :-1], ((0, 0), (1, 0)))  # shift right, 0 is BOS
        logits = model.apply(variables, dec_in, ones,
                             decoder_causal_attention=causal_attention,
                             enable_dropout=False)
        pos = lengths + t
        token = jnp.argmax(logits[rows, pos], axis=-1).astype(jnp.int32)
        token = jnp.where(done, 0, token)
        seq = seq.at[rows, pos].set(token)
        return seq, out.at[:, t].set(token), done | (token == EOS_ID)

    out = jnp.zeros((batch, max_length), jnp.int32)
    done = jnp.zeros((batch,), bool)
    return jax.lax.fori_loop(0, max_length, body, (seq, out, done))[1]


def decode_texts(vocabulary, ids: np.ndarray) -> list[str]:
    """Token ids (up to the first EOS) -> strings."""
    texts = []
    for row in np.asarray(ids):
        row = row.tolist()
        if EOS_ID in row:
            row = row[: row.index(EOS_ID)]
        texts.append(vocabulary.decode([t for t in row if t > 0]))
    return texts


def _is_decoder_only(model) -> bool:
    from ntl_jax.train import network

    return isinstance(model, network.DecoderOnlyTransformer)


def predict(model, params, eval_set: EvalSet, vocabulary, max_length: int,
            batch_size: int = 256) -> list[str]:
    """Greedy predictions (strings) for every question of `eval_set`."""
    preds: list[str] = []
    n = len(eval_set.answers)
    for start in range(0, n, batch_size):
        chunk = eval_set.inputs[start:start + batch_size]
        real = len(chunk)
        if real < batch_size:  # pad to one static shape: a single compilation
            chunk = np.concatenate([chunk, np.zeros((batch_size - real, chunk.shape[1]),
                                                    chunk.dtype)])
        if _is_decoder_only(model):
            ids = greedy_decode_decoder_only(model, params, jnp.asarray(chunk), max_length)
        else:
            ids = greedy_decode(model, params, jnp.asarray(chunk), max_length)
        preds.extend(decode_texts(vocabulary, np.asarray(ids)[:real]))
    return preds


def score(predictions: list[str], targets: list[str]) -> dict[str, float]:
    """Number metrics of decoded answers (see `ntl_jax.data.metrics`)."""
    from ntl_jax.data import metrics

    values = metrics.number_metrics(targets, predictions) | metrics.exact_match(targets, predictions)
    return {k: float(v) for k, v in values.items()}


def evaluate(model, params, eval_sets: dict[str, EvalSet], vocabulary, max_length: int,
             batch_size: int = 256) -> tuple[dict[str, float], dict[str, list[str]]]:
    """`{"<split>/<metric>": value}` over all eval sets, and the predictions per split
    (see `score_predictions`)."""
    return score_predictions(
        eval_sets, lambda eval_set: predict(model, params, eval_set, vocabulary, max_length, batch_size))


def score_predictions(eval_sets: dict[str, EvalSet], predict_answers) -> tuple[dict[str, float], dict[str, list[str]]]:
    """`{"<split>/<metric>": value}` and the predictions per split, the predictions being
    `predict_answers(eval_set)` (answer texts). The metrics are `score`'s, plus those of
    the eval set's `metrics_fn` if it has one."""
    results: dict[str, float] = {}
    all_preds: dict[str, list[str]] = {}
    for split, eval_set in eval_sets.items():
        preds = predict_answers(eval_set)
        all_preds[split] = preds
        values = score(preds, eval_set.answers)
        if getattr(eval_set, "metrics_fn", None) is not None:
            values |= eval_set.metrics_fn(eval_set.questions, eval_set.answers, preds)
        for name, value in values.items():
            results[f"{split}/{name}"] = float(value)
    return results, all_preds
