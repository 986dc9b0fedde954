"""The xVal baseline: numbers and scaling, the [NUM] features, the embedding multipliers, the loss,
decoding, the trainer and compare."""

import json
import math
import os

import numpy as np
import pytest

pytest.importorskip("flax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import linen as nn  # noqa: E402

from ntl_jax.flax import xval as flax_xval  # noqa: E402
from ntl_jax.train import data as data_lib  # noqa: E402
from ntl_jax.train import network, optim, xval  # noqa: E402
from ntl_jax.train import step as step_lib  # noqa: E402

# 10 / log10(3e9): the scaled value of 9 (log10(1 + 9) = 1)
S9 = 1.0551727398253916


def _data(vocabulary, n=64, batch=8, seed=0):
    from conftest import fake_data

    return fake_data(vocabulary, n=n, batch=batch, seed=seed)


def _batch(vocabulary, questions, answers, in_len=24, tgt_len=8):
    inputs = data_lib.encode_texts(vocabulary, questions, in_len)[0]
    targets = data_lib.encode_texts(vocabulary, answers, tgt_len)[0]
    return data_lib.to_features(inputs, targets)


def _model(vocabulary, batch, seed=0, **overrides):
    cfg = xval.model_config_with_num_token(network.make_config("micro", vocabulary.vocab_size, **overrides),
                                           vocabulary.vocab_size)
    model = xval.XvalTransformer(cfg)
    args, _ = step_lib.model_inputs(batch)
    params = model.init(jax.random.key(seed), *args, enable_dropout=False)["params"]
    return model, params


def test_numbers_and_scaling_against_hand_values():
    assert xval.extract_numbers("What is 5 - 3?") == ("What is [NUM] - [NUM]?", [5.0, 3.0])
    assert xval.extract_numbers("-3") == ("[NUM]", [-3.0])
    assert xval.extract_numbers("Calculate -4.25 + (0.5 - -12).") == ("Calculate [NUM] + ([NUM] - [NUM]).",
                                                                      [-4.25, 0.5, -12.0])
    assert xval.extract_numbers("Is 12. a number? 007") == ("Is [NUM]. a number? [NUM]", [12.0, 7.0])
    assert xval.extract_numbers("no digits") == ("no digits", [])
    # log10(1 + 9) = 1, log10(1 + 99) = 2, log10(1.5) = 0.17609125905568124; / (log10(3e9) / 10)
    np.testing.assert_allclose(xval.scale_values([0.0, 9.0, -99.0, 0.5]),
                               [0.0, S9, -2 * S9, 0.17609125905568124 * S9], rtol=1e-14)
    assert xval.scale_values(3e9) == pytest.approx(10.0, abs=1e-9)
    x = np.array([-3e9, -1234.5, -1.0, 0.0, 0.01, 7.0, 1e6])
    np.testing.assert_allclose(xval.unscale_values(xval.scale_values(x)), x, rtol=1e-12, atol=1e-12)
    assert xval.unscale_values(1e4) == math.inf and xval.unscale_values(-1e4) == -math.inf


def test_encode_and_decode_with_the_shipped_vocabulary():
    pytest.importorskip("sentencepiece")
    from ntl_jax.data.vocabulary import default_vocabulary

    vocabulary = default_vocabulary()
    codec = xval.XvalVocabulary(vocabulary)
    assert codec.num_id == vocabulary.vocab_size == 1000
    text = "What is -5 + 3.25 - (4 - 1)?"
    ids, values = codec.encode(text)
    pieces = [vocabulary.id_to_piece(i) if i != codec.num_id else "[NUM]" for i in ids]
    # the text around the numbers is tokenized as in context; a number's sign and digits are one [NUM]
    assert pieces == ["▁What", "▁is", "▁", "[NUM]", "▁+", "▁", "[NUM]", "▁-", "▁(", "[NUM]", "▁-", "▁", "[NUM]",
                      ")?"]
    at_num = np.array(ids) == codec.num_id
    np.testing.assert_array_equal(values[at_num], [-5, 3.25, 4, 1])
    assert np.isnan(values[~at_num]).all()
    assert codec.decode(ids, values) == text
    # decoding writes each [NUM]'s value with 2 decimals and stops at EOS
    predicted = values.copy()
    predicted[[3, 6]] = 11.996, -0.25
    assert codec.decode(ids + [1, codec.num_id], list(predicted) + [np.nan, 7.0]) == "What is 12 + -0.25 - (4 - 1)?"
    assert codec.decode([vocabulary.encode("x")[0], codec.num_id], [np.nan, 2.0]) == "x2"
    # token rows (0-padded, EOS) convert to [NUM] rows of the same length
    rows = data_lib.encode_texts(vocabulary, ["What is 5 - 3?", "-12"], 12)[0]
    conv, conv_values = codec.convert(rows)
    assert conv.shape == (2, 12) and conv.dtype == np.int32
    assert conv[1].tolist() == [vocabulary.encode("0")[0], codec.num_id, 1] + [0] * 9
    assert codec.decode(conv[0], conv_values[0]) == "What is 5 - 3?" and conv_values[1, 1] == -12


def test_encode_and_decode_with_a_character_vocabulary(vocabulary):
    codec = xval.XvalVocabulary(vocabulary)
    ids, values = codec.encode("what is 12+-3.5?")
    assert ids[:8] == vocabulary.encode("what is ") and ids[8:] == [codec.num_id, vocabulary.encode("+")[0],
                                                                    codec.num_id, vocabulary.encode("?")[0]]
    assert values[8] == 12 and values[10] == -3.5
    assert codec.decode(ids, values) == "what is 12+-3.5?"

    class WordVocabulary:  # not digit-split: "0" has no token of its own
        vocab_size = 5

        def encode(self, text):
            return [3] * len(text.split())

        def decode(self, ids):
            return "w" * len(ids)

    with pytest.raises(ValueError, match="expected a digit-split vocabulary with a token for '0', got ids"):
        xval.XvalVocabulary(WordVocabulary())


def test_features_shift_the_values_with_the_tokens(vocabulary):
    codec = xval.XvalVocabulary(vocabulary)
    batch = _batch(vocabulary, ["what is 9+-99?", "a"], ["90", "x 9 0.5"])
    f = xval.features(codec, batch)
    num, eos = codec.num_id, 1
    x_id, sp = vocabulary.encode("x")[0], vocabulary.encode(" ")[0]
    assert f["decoder_target_tokens"].tolist() == [[num, eos, 0, 0, 0, 0, 0, 0],
                                                   [x_id, sp, num, sp, num, eos, 0, 0]]
    assert f["decoder_input_tokens"].tolist() == [[0, num, eos, 0, 0, 0, 0, 0],
                                                  [0, x_id, sp, num, sp, num, eos, 0]]
    s90, s05 = math.log10(91) * S9, math.log10(1.5) * S9
    np.testing.assert_allclose(f["target_values"], [[s90, 0, 0, 0, 0, 0, 0, 0], [0, 0, S9, 0, s05, 0, 0, 0]],
                               rtol=1e-6)
    # the start position's multiplier is 1; a [NUM] input carries the scaled value of the target before it
    np.testing.assert_allclose(f["decoder_scale"], [[1, s90, 1, 1, 1, 1, 1, 1], [1, 1, 1, S9, 1, s05, 1, 1]],
                               rtol=1e-6)
    q = f["encoder_input_tokens"][0].tolist()
    assert q[8:12] == [num, vocabulary.encode("+")[0], num, vocabulary.encode("?")[0]]
    scale = f["encoder_scale"][0]
    np.testing.assert_allclose(scale[[8, 10]], [S9, -2 * S9], rtol=1e-6)
    assert (np.delete(scale, [8, 10]) == 1).all() and f["encoder_scale"].dtype == np.float32
    with pytest.raises(ValueError, match="expected encoder-decoder features"):
        xval.features(codec, {"decoder_target_tokens": batch["decoder_target_tokens"]})


def _layer_inputs(model, params, *args, **kwargs):
    """The input of each stack's first layer: the (scaled) token embeddings, dropout off."""
    seen = {}

    def record(next_fun, fargs, fkwargs, context):
        path = tuple(context.module.scope.path)
        if context.method_name == "__call__" and path[-1:] == ("layers_0",):
            seen[path[0]] = np.asarray(fargs[0])
        return next_fun(*fargs, **fkwargs)

    with nn.intercept_methods(record):
        out = model.apply({"params": params}, *args, enable_dropout=False, **kwargs)
    return seen, out


def test_the_input_embedding_at_num_is_its_embedding_times_the_scaled_value(vocabulary):
    codec = xval.XvalVocabulary(vocabulary)
    f = xval.features(codec, _batch(vocabulary, ["what is 9+-99?", "b 0.5"], ["90", "x 9"]))
    model, params = _model(vocabulary, f)
    table = np.asarray(params["token_embedder"]["embedding"])
    seen, (logits, numbers) = _layer_inputs(model, params, f["encoder_input_tokens"], f["decoder_input_tokens"],
                                            f["decoder_target_tokens"], encoder_scale=f["encoder_scale"],
                                            decoder_scale=f["decoder_scale"])
    for stack, ids, scale in (("encoder", "encoder_input_tokens", "encoder_scale"),
                              ("decoder", "decoder_input_tokens", "decoder_scale")):
        expected = table[f[ids]] * f[scale][..., None].astype(np.float64)
        np.testing.assert_allclose(seen[stack], expected, rtol=1e-6)
    np.testing.assert_allclose(seen["encoder"][0, 10], table[codec.num_id] * -2 * S9, rtol=1e-6)
    # without multipliers the network is the encoder-decoder of the same parameters
    ones = {k: np.ones_like(f[k]) for k in ("encoder_scale", "decoder_scale")}
    args = (f["encoder_input_tokens"], f["decoder_input_tokens"], f["decoder_target_tokens"])
    plain = network.Transformer(model.config).apply({"params": {k: v for k, v in params.items()
                                                                if k != "number_head"}},
                                                    *args, enable_dropout=False)
    got, _ = model.apply({"params": params}, *args, encoder_scale=ones["encoder_scale"],
                         decoder_scale=ones["decoder_scale"], enable_dropout=False)
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-6)
    assert not np.allclose(logits, plain, atol=1e-3)  # the multipliers change the logits
    with pytest.raises(ValueError, match=r"expected an embedding scale of shape \[batch, length\] = \(2, 24\), got"):
        model.apply({"params": params}, *args, encoder_scale=f["encoder_scale"][:, :5], enable_dropout=False)


def test_a_seed_initialises_the_encoder_decoder_as_the_ce_model(vocabulary):
    data = _data(vocabulary)
    cfg = network.make_config("micro", vocabulary.vocab_size)
    assert xval.model_config_with_num_token(cfg, vocabulary.vocab_size) is cfg  # 45 ids + [NUM] fit in 128
    assert xval.model_config_with_num_token(cfg, 128).vocab_size == 256
    optimizer = optim.make_optimizer(total_steps=4)
    ce = step_lib.create_train_state(network.Transformer(cfg), optimizer, data.batch(0), seed=5)
    xv = step_lib.create_train_state(xval.XvalTransformer(cfg), optimizer, data.batch(0), seed=5)
    assert sorted(xv.params) == sorted([*ce.params, "number_head"])
    for a, b in zip(jax.tree.leaves({k: xv.params[k] for k in ce.params}), jax.tree.leaves(ce.params)):
        np.testing.assert_array_equal(a, b)


def _gelu(x):  # flax's default (tanh) approximation
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def test_loss_and_number_head_against_numpy(vocabulary):
    from ntl_jax.flax import _linen

    codec = xval.XvalVocabulary(vocabulary)
    data = _data(vocabulary)
    batch = data.batch(0)
    f = xval.features(codec, batch)
    cfg = network.make_config("micro", vocabulary.vocab_size)
    model = xval.XvalTransformer(cfg)
    optimizer = optim.make_optimizer(learning_rate=3e-3, total_steps=40, warmup_steps=2)
    state = step_lib.create_train_state(model, optimizer, batch, seed=0)
    params = state.params
    args = (f["encoder_input_tokens"], f["decoder_input_tokens"], f["decoder_target_tokens"])
    logits, numbers = model.apply({"params": params}, *args, encoder_scale=f["encoder_scale"],
                                  decoder_scale=f["decoder_scale"], enable_dropout=False)
    # the head reads the hidden states the logits projection reads
    encoded = model.apply({"params": params}, args[0], enable_dropout=False, embedding_scale=f["encoder_scale"],
                          method=model.encode)
    with flax_xval.scaled_embeddings(jnp.asarray(f["decoder_scale"])):
        hidden, _ = _linen.hidden_states_and_kernel(model, {"params": params}, encoded, *args,
                                                       method=model.decode, enable_dropout=False)
    head = jax.tree.map(lambda a: np.asarray(a, np.float64), params["number_head"])
    h = _gelu(np.asarray(hidden, np.float64) @ head["hidden"]["kernel"] + head["hidden"]["bias"])
    np.testing.assert_allclose(numbers, h @ head["out"]["kernel"][:, 0] + head["out"]["bias"][0], rtol=1e-4,
                               atol=1e-5)
    # (CE + MSE) / 2 from the definitions, in float64
    z = np.asarray(logits, np.float64)
    t = f["decoder_target_tokens"]
    logp = z - z.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    token_ce = -np.take_along_axis(logp, t[..., None], -1)[..., 0]
    ce = token_ce[t > 0].mean()
    is_num = t == codec.num_id
    assert is_num.sum() == 8  # every answer is one number
    answers = [float(vocabulary.decode([i for i in row if i > 1])) for row in batch["decoder_target_tokens"]]
    mse = np.mean((np.asarray(numbers, np.float64)[is_num] - xval.scale_values(answers)) ** 2)
    new_state, metrics = xval.make_train_step(model, optimizer, codec)(state, batch)
    # float32 forward pass, a 128-way log-softmax: relative error ~ 1e-6
    assert float(metrics["cross_entropy"]) == pytest.approx(ce, rel=1e-5)
    assert float(metrics["mse"]) == pytest.approx(mse, rel=1e-5)
    assert float(metrics["loss"]) == pytest.approx((ce + mse) / 2, rel=1e-5)
    assert float(metrics["grad_norm"]) > 0 and int(new_state.step) == 1
    # without [NUM] targets the MSE is 0, not NaN
    loss, parts = xval.xval_loss(logits, numbers, jnp.where(is_num, 5, t), jnp.asarray(f["target_values"]),
                                 codec.num_id)
    assert float(parts["mse"]) == 0.0 and math.isfinite(float(loss))
    # a few steps fit the batch
    train_step = xval.make_train_step(model, optimizer, codec)
    losses = []
    for s in range(40):
        state, m = train_step(state, data.batch(s))
        losses.append(float(m["loss"]))
    assert np.mean(losses[-6:]) < 0.7 * np.mean(losses[:6])


def test_decoding_writes_the_heads_value_and_feeds_it_back(vocabulary):
    codec = xval.XvalVocabulary(vocabulary)
    f = xval.features(codec, _batch(vocabulary, ["what is 9+-99?", "b 0.5"], ["90", "x 9"]))
    # Two decoder layers: in one, later positions read a [NUM] only through the first layer's
    # pre-norm (RMSNorm(s * e) = sign(s) RMSNorm(e)), so only the fed-back value's sign would matter.
    model, params = _model(vocabulary, f, num_decoder_layers=2)
    num, sp, minus, eos = codec.num_id, vocabulary.encode(" ")[0], vocabulary.encode("-")[0], 1
    forced = np.array([num, sp, minus, sp, num, eos, eos, eos])

    def force(next_fun, args, kwargs, context):  # the token head emits `forced`, position by position
        out = next_fun(*args, **kwargs)
        if context.module.name == "logits_dense" and context.method_name == "__call__":
            return jnp.broadcast_to(100.0 * jax.nn.one_hot(forced[: out.shape[1]], out.shape[-1]), out.shape)
        return out

    enc, enc_scale = jnp.asarray(f["encoder_input_tokens"]), jnp.asarray(f["encoder_scale"])
    with nn.intercept_methods(force):
        out, nums = xval.greedy_decode(model, params, enc, enc_scale, 8, num)

        def teacher_forced(first_value):
            dec_in = np.concatenate([[0], forced[:-1]])[None].repeat(2, 0)
            scale = np.ones((2, 8), np.float32)
            scale[:, 1] = first_value
            return model.apply({"params": params}, enc, dec_in, np.ones((2, 8), np.int32), encoder_scale=enc_scale,
                               decoder_scale=scale, enable_dropout=False)[1]

        n0 = np.asarray(model.apply({"params": params}, enc, np.zeros((2, 8), np.int32), np.ones((2, 8), np.int32),
                                    encoder_scale=enc_scale, enable_dropout=False)[1])[:, 0]
        fed = np.asarray(teacher_forced(n0))
        others = [np.asarray(teacher_forced(v)) for v in (3 * n0, -n0)]
    assert np.asarray(out).tolist() == [[num, sp, minus, sp, num, eos, 0, 0]] * 2
    nums = np.asarray(nums)
    np.testing.assert_allclose(nums[:, 0], n0, rtol=1e-5, atol=1e-6)
    # the second number is predicted with the first one's value multiplying its embedding
    np.testing.assert_allclose(nums[:, 4], fed[:, 4], rtol=1e-5, atol=1e-6)
    assert all(np.abs(fed[:, 4] - other[:, 4]).min() > 1e-4 for other in others)
    assert (nums[:, [1, 2, 3, 5, 6, 7]] == 0).all()
    values = xval.unscale_values(nums)
    texts = [codec.decode(o, v) for o, v in zip(np.asarray(out), values)]
    assert texts == [f"{xval.format_value(v[0])} - {xval.format_value(v[4])}" for v in values]

    # evaluate: the same decoding, jitted and batched, scored like the other systems
    from ntl_jax.train import evaluate

    eval_set = data_lib.EvalSet(data_lib.encode_texts(vocabulary, ["what is 9+-99?", "b 0.5", "c 1"], 24)[0],
                                ["what is 9+-99?", "b 0.5", "c 1"], ["-90", "0.5", "1"])
    metrics, preds = xval.evaluate(model, params, {"test_interpolate": eval_set}, vocabulary, 6, batch_size=2)
    ids, ids_values = codec.convert(eval_set.inputs)
    out, nums = xval.greedy_decode(model, params, jnp.asarray(ids), jnp.asarray(xval.embedding_scale(
        ids, ids_values, num)), 6, num)
    expected = [codec.decode(o, v) for o, v in zip(np.asarray(out), xval.unscale_values(np.asarray(nums)))]
    assert preds["test_interpolate"] == expected
    assert metrics == {f"test_interpolate/{k}": pytest.approx(v, nan_ok=True)
                       for k, v in evaluate.score(expected, eval_set.answers).items()}


def test_trainer_runs_and_evaluates_xval(vocabulary, tmp_path):
    pytest.importorskip("orbax.checkpoint")
    from conftest import micro_config

    from ntl_jax.train import trainer

    data = _data(vocabulary)
    config = micro_config(data, loss=xval.LOSS, steps=4, log_every=1, checkpoint_every=2)
    out = str(tmp_path / "run")
    result = trainer.train(config, out, data=data, progress=False, tensorboard=False)
    assert result["step"] == 4 and "number_head" in result["state"].params
    assert set(result["train"]) == {"loss", "cross_entropy", "mse", "grad_norm"}
    # the step's first loss is the one computed from the seed's parameters on the first batch
    first = json.loads(open(os.path.join(out, "metrics.jsonl")).readline())
    model = xval.XvalTransformer(network.make_config("micro", vocabulary.vocab_size))
    optimizer = optim.make_optimizer(total_steps=4)
    state = step_lib.create_train_state(model, optimizer, data.batch(0), config.seed)
    f = xval.features(xval.XvalVocabulary(vocabulary), data.batch(0))
    logits, numbers = model.apply({"params": state.params}, f["encoder_input_tokens"], f["decoder_input_tokens"],
                                  f["decoder_target_tokens"], encoder_scale=f["encoder_scale"],
                                  decoder_scale=f["decoder_scale"], enable_dropout=False)
    loss, _ = xval.xval_loss(logits, numbers, f["decoder_target_tokens"], f["target_values"], vocabulary.vocab_size)
    assert first["step"] == 1 and first["train/loss"] == pytest.approx(float(loss), rel=1e-5)
    preds = json.load(open(os.path.join(out, "predictions.json")))["test_interpolate"]
    eval_set = data.eval_sets["test_interpolate"]
    assert [p["prediction"] for p in preds] == xval.predict(model, result["state"].params, eval_set, vocabulary,
                                                            data.target_length, batch_size=8)
    assert result["eval"]["test_interpolate/num_examples"] == 8
    with pytest.raises(ValueError, match="expected architecture 'encoder-decoder', got 'decoder-only'"):
        trainer.TrainConfig(loss=xval.LOSS, architecture="decoder-only",
                            data=data_lib.DataConfig(architecture="decoder-only")).validate()


@pytest.fixture(scope="module")
def real_data():
    pytest.importorskip("sentencepiece")
    pytest.importorskip("mathematics_dataset")
    pytest.importorskip("orbax.checkpoint")
    pytest.importorskip("matplotlib")


MICRO = ["--preset", "micro", "--train-examples", "16", "--eval-examples", "4", "--batch-size", "8",
         "--log-every", "1", "--checkpoint-every", "2", "--no-progress", "--no-tensorboard"]


def test_ntl_jax_train_loss_xval(real_data, tmp_path):
    from ntl_jax import cli

    out = str(tmp_path / "run")
    assert cli.main(["train", "--loss", "xval", "--steps", "3", "--out", out] + MICRO) == 0
    results = json.load(open(os.path.join(out, "results.json")))
    assert results["step"] == 3 and set(results["train"]) == {"loss", "cross_entropy", "mse", "grad_norm"}
    assert 0.0 <= results["eval"]["test_interpolate/number_accuracy"] <= 1.0
    assert results["eval"]["test_interpolate/num_examples"] == 4
    assert "test_extrapolate/mae" in results["eval"]
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in records if "train/mse" in r] == [1, 2, 3]


def test_compare_pairs_xval_with_the_ce_run_of_its_seed(real_data, tmp_path):
    from ntl_jax import cli
    from ntl_jax.cli import train as cli_train

    assert xval.LOSS in cli_train.CHOICES and xval.LOSS not in cli_train.LOSSES
    out = str(tmp_path / "cmp")
    assert cli.main(["compare", "--losses", "ce", "xval", "--seeds", "1", "--steps", "2", "--out", out] + MICRO) == 0
    result = json.load(open(os.path.join(out, "compare.json")))
    runs = {r["loss"]: r for r in result["runs"]}
    assert set(runs) == {"ce", "xval"} and runs["xval"]["seed"] == runs["ce"]["seed"] == 0
    paired = result["paired"]["xval"]["test_interpolate/number_accuracy"]
    assert paired["baseline"] == "ce" and paired["n"] == 1
    assert paired["mean_diff"] == pytest.approx(runs["xval"]["metrics"]["test_interpolate/number_accuracy"]
                                                - runs["ce"]["metrics"]["test_interpolate/number_accuracy"])


def test_docstring_examples():
    import doctest

    result = doctest.testmod(xval)
    assert result.attempted > 0 and result.failed == 0
