"""The decoder-only network, its prefix-LM features, decoding and training on multiplication."""

import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")
import jax.numpy as jnp  # noqa: E402

from ntl_jax.train import data as data_lib  # noqa: E402
from ntl_jax.train import evaluate, network, optim, trainer  # noqa: E402
from ntl_jax.train import step as step_lib


def _model(vocab_size=48, **overrides):
    cfg = network.make_config("micro", vocab_size, **overrides)
    return network.DecoderOnlyTransformer(cfg), cfg


def _data(vocabulary, n=64, batch=8, eval_examples=8, architecture="decoder-only"):
    cfg = data_lib.DataConfig(module="multiplication", train_examples=n,
                              eval_examples=eval_examples, batch_size=batch, seed=0,
                              architecture=architecture)
    return data_lib.ProblemData(cfg, vocabulary=vocabulary)


def test_make_model_and_architectures():
    cfg = network.make_config("micro", 48)
    assert network.ARCHITECTURES == data_lib.ARCHITECTURES
    assert isinstance(network.make_model("encoder-decoder", cfg), network.Transformer)
    assert isinstance(network.make_model("decoder-only", cfg), network.DecoderOnlyTransformer)
    with pytest.raises(ValueError, match="architecture must be one of"):
        network.make_model("encoder-only", cfg)


def test_shape_parameters_and_causality():
    model, cfg = _model()
    tokens = jax.random.randint(jax.random.key(1), (2, 10), 3, 40)
    params = model.init(jax.random.key(0), tokens, tokens, enable_dropout=False)["params"]
    assert set(params) == {"token_embedder", "relpos_bias", "decoder_norm", "logits_dense"} | {
        f"layers_{i}" for i in range(network.decoder_only_layers(cfg))}
    assert network.decoder_only_layers(cfg) == 2  # micro: 1 encoder + 1 decoder layer
    assert set(params["layers_0"]) == {"pre_self_attention_layer_norm", "self_attention",
                                       "pre_mlp_layer_norm", "mlp"}

    @jax.jit
    def run(tok, causal_attention=None):
        return model.apply({"params": params}, tok, tok,
                           decoder_causal_attention=causal_attention, enable_dropout=False)

    logits = run(tokens)
    assert logits.shape == (2, 10, 128) and logits.dtype == jnp.float32
    changed = tokens.at[:, 6].set(41)
    after = run(changed)
    np.testing.assert_allclose(after[:, :6], logits[:, :6], rtol=1e-6, atol=1e-6)
    assert not np.allclose(after[:, 6:], logits[:, 6:])
    # prefix LM: positions 0..4 see each other both ways, later ones stay causal
    prefix = jnp.broadcast_to((jnp.arange(10) <= 4).astype(jnp.int32), (2, 10))
    base = run(tokens, prefix)
    moved = run(tokens.at[:, 3].set(41), prefix)
    assert not np.allclose(moved[:, :3], base[:, :3])  # earlier prefix positions see it
    late = run(tokens.at[:, 7].set(41), prefix)
    np.testing.assert_allclose(late[:, :7], base[:, :7], rtol=1e-6, atol=1e-6)
    with pytest.raises(NotImplementedError):
        model.apply({"params": params}, tokens, tokens, decode=True, enable_dropout=False)


def test_prefix_lm_features(vocabulary):
    inputs = np.array([[5, 6, 1, 0], [7, 1, 0, 0]], np.int32)
    targets = np.array([[8, 1, 0], [9, 10, 1]], np.int32)
    seq, prefix = data_lib.concatenate(inputs, targets)
    np.testing.assert_array_equal(seq, [[5, 6, 1, 8, 1], [7, 1, 9, 10, 1]])
    np.testing.assert_array_equal(prefix, [3, 2])
    f = data_lib.to_decoder_only_features(seq, prefix)
    np.testing.assert_array_equal(f["decoder_input_tokens"], [[0, 5, 6, 1, 8], [0, 7, 1, 9, 10]])
    np.testing.assert_array_equal(f["decoder_target_tokens"], seq)
    np.testing.assert_array_equal(f["decoder_loss_weights"], [[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]])
    np.testing.assert_array_equal(f["decoder_causal_attention"],
                                  [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])

    data = _data(vocabulary, n=16, batch=8)
    b = data.batch(1)
    assert set(b) == {"decoder_input_tokens", "decoder_target_tokens", "decoder_loss_weights",
                      "decoder_causal_attention"}
    assert b["decoder_target_tokens"].shape[1] == data.sequence_length
    assert data.sequence_length % 8 == 0
    np.testing.assert_array_equal(b["decoder_input_tokens"][:, 1:],
                                  b["decoder_target_tokens"][:, :-1])
    # weights on the answer + its EOS only: one EOS weighted per row, answer decodes back
    w = b["decoder_loss_weights"].astype(bool)
    assert ((b["decoder_target_tokens"] == data_lib.EOS_ID) & w).sum(axis=1).tolist() == [1] * 8
    again = _data(vocabulary, n=16, batch=8)
    for k, v in again.batch(1).items():
        np.testing.assert_array_equal(v, b[k])
    assert data_lib.eval_splits("multiplication") == ("test_interpolate", "test_extrapolate")
    assert data_lib.check_task("multiplication") == "multiplication"
    assert data_lib.check_task("arithmetic__mul") == "arithmetic__mul"
    with pytest.raises(ValueError, match="multiplication"):
        data_lib.check_task("multiply")


def test_answers_weighted_are_the_answers(vocabulary):
    data = _data(vocabulary, n=8, batch=8)
    b = data.batch(0)
    order = data._permutation(0)
    for row, i in enumerate(order):
        ids = b["decoder_target_tokens"][row][b["decoder_loss_weights"][row] > 0].tolist()
        expected = list(vocabulary.encode(data_lib.default_example_source()(
            "multiplication", "train", 8, 0)[i][1])) + [data_lib.EOS_ID]
        assert ids == expected


def _setup(vocabulary, n=32, lr=1e-2):
    data = _data(vocabulary, n=n, batch=8)
    model, cfg = _model(vocabulary.vocab_size)
    nt = trainer.number_tokens_of(vocabulary)
    opt = optim.make_optimizer("adamw", learning_rate=lr, total_steps=1000, warmup_steps=0,
                               weight_decay=0.0)
    state = step_lib.create_train_state(model, opt, data.batch(0), seed=0)
    return data, model, step_lib.make_train_step(model, opt, nt, loss="ntl-was"), state


def test_trains_and_greedy_decode_matches_teacher_forcing(vocabulary):
    data, model, train_step, state = _setup(vocabulary)
    losses = []
    for s in range(30):
        state, m = train_step(state, data.batch(s % 4))
        losses.append(float(m["loss"]))
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4])
    assert float(m["ntl"]) > 0

    prompts = data.eval_sets["test_interpolate"].inputs
    max_length = data.target_length
    ids = np.asarray(evaluate.greedy_decode_decoder_only(model, state.params,
                                                         jnp.asarray(prompts), max_length))
    # Teacher-force the greedy answers (up to and with EOS): argmax reproduces them.
    answers = np.zeros((len(ids), max_length), np.int32)
    for r, row in enumerate(ids):
        row = row.tolist()
        row = row[: row.index(data_lib.EOS_ID) + 1] if data_lib.EOS_ID in row else row
        answers[r, : len(row)] = row
    seq, prefix = data_lib.concatenate(prompts, answers,
                                       prompts.shape[1] + max_length)
    feats = data_lib.to_decoder_only_features(seq, prefix)
    logits = model.apply({"params": state.params}, feats["decoder_input_tokens"],
                         feats["decoder_target_tokens"],
                         decoder_causal_attention=feats["decoder_causal_attention"],
                         enable_dropout=False)
    argmax = np.asarray(jnp.argmax(logits, -1))
    w = feats["decoder_loss_weights"] > 0
    np.testing.assert_array_equal(argmax[w], seq[w])
    # The teacher-forced prediction after the question is the first greedy token even
    # when greedy decoding never emits EOS (rows not covered above are checked here).
    np.testing.assert_array_equal(argmax[np.arange(len(ids)), prefix], ids[:, 0])


def test_train_decoder_only_multiplication_end_to_end(vocabulary, tmp_path):
    data = _data(vocabulary, n=32, batch=8, eval_examples=6)
    cfg = trainer.TrainConfig(loss="ntl-was", preset="micro", steps=20, seed=0,
                              learning_rate=3e-3, warmup_steps=2, log_every=5,
                              checkpoint_every=20, eval_batch_size=8, data=data.config,
                              architecture="decoder-only")
    out = trainer.train(cfg, str(tmp_path / "run"), data=data, progress=False,
                        tensorboard=False)
    assert out["step"] == 20
    ev = out["eval"]
    for split in ("test_interpolate", "test_extrapolate"):
        assert np.isfinite(ev[f"{split}/mape"])
        assert f"{split}/number_accuracy" in ev
        assert any(k.startswith(f"{split}/rel_error/k") for k in ev)
    assert os.path.exists(tmp_path / "run" / "results.json")
    with pytest.raises(ValueError, match="data.architecture"):
        trainer.train(cfg.__class__(**{**cfg.__dict__, "architecture": "encoder-decoder"}),
                      str(tmp_path / "other"), data=data, progress=False, tensorboard=False)
