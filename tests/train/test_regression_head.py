"""The regression-head baseline: pooling, the head, targets, the step's loss, evaluation, the trainer."""

import math

import numpy as np
import pytest

pytest.importorskip("flax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from ntl_jax.train import data as data_lib  # noqa: E402
from ntl_jax.train import network, optim  # noqa: E402
from ntl_jax.train import regression_head as rh  # noqa: E402
from ntl_jax.train import step as step_lib  # noqa: E402


def _tokens(vocabulary, texts, length):
    return data_lib.encode_texts(vocabulary, texts, length)[0]


def _params(cfg, tokens, seed=0, **kwargs):
    return rh.RegressionHead(cfg, **kwargs).init(jax.random.key(seed), jnp.asarray(tokens),
                                                 enable_dropout=False)["params"]


def test_mean_pooling_and_linear_head_against_numpy(vocabulary):
    cfg = network.make_config("micro", vocabulary.vocab_size)
    tokens = _tokens(vocabulary, ["what is 3+4?", "what is 12+30?", "7"], 16)
    model = rh.RegressionHead(cfg)
    params = _params(cfg, tokens)
    # the encodings from the encoder-decoder's own encode(), with the head's encoder parameters
    t5 = network.Transformer(cfg)
    t5_params = t5.init(jax.random.key(1), jnp.asarray(tokens), jnp.asarray(tokens), jnp.asarray(tokens),
                        enable_dropout=False)["params"]
    t5_params = dict(t5_params, encoder=params["encoder"], token_embedder=params["token_embedder"])
    encoded = np.asarray(t5.apply({"params": t5_params}, jnp.asarray(tokens), enable_dropout=False,
                                  method=t5.encode), np.float64)
    real = tokens > 0
    pooled = np.stack([encoded[i][real[i]].mean(axis=0) for i in range(len(tokens))])
    kernel, bias = np.asarray(params["head"]["kernel"], np.float64), np.asarray(params["head"]["bias"], np.float64)
    expected = pooled @ kernel[:, 0] + bias[0]
    got = np.asarray(model.apply({"params": params}, jnp.asarray(tokens), enable_dropout=False))
    assert got.shape == (3,) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # more padding changes nothing: the pool and attention skip padding
    padded = np.concatenate([tokens, np.zeros((3, 8), tokens.dtype)], axis=1)
    np.testing.assert_allclose(model.apply({"params": params}, jnp.asarray(padded), enable_dropout=False),
                               got, rtol=1e-5, atol=1e-5)
    # decoder features, as the trainer's batches carry them, are accepted and ignored
    np.testing.assert_array_equal(model.apply({"params": params}, jnp.asarray(tokens), tokens, tokens,
                                              enable_dropout=False), got)
    with pytest.raises(ValueError, match="must be \\[batch, length\\], got shape \\(16,\\)"):
        model.apply({"params": params}, jnp.asarray(tokens[0]), enable_dropout=False)


def test_a_seed_initialises_the_encoder_as_the_ce_model(vocabulary):
    data = _data(vocabulary)
    cfg = network.make_config("micro", vocabulary.vocab_size)
    optimizer = optim.make_optimizer(total_steps=4)
    ce = step_lib.create_train_state(network.Transformer(cfg), optimizer, data.batch(0), seed=5)
    head = step_lib.create_train_state(rh.RegressionHead(cfg), optimizer, data.batch(0), seed=5)
    for name in ("encoder", "token_embedder"):
        for a, b in zip(jax.tree.leaves(ce.params[name]), jax.tree.leaves(head.params[name])):
            np.testing.assert_array_equal(a, b)
    assert sorted(head.params) == ["encoder", "head", "token_embedder"]
    np.testing.assert_array_equal(jax.random.key_data(ce.dropout_rng), jax.random.key_data(head.dropout_rng))


def test_answer_values_and_scales(vocabulary):
    targets = _tokens(vocabulary, ["151", "-3", "0.25", "25"], 8)
    np.testing.assert_array_equal(rh.answer_values(vocabulary, targets), [151.0, -3.0, 0.25, 25.0])
    with pytest.raises(ValueError, match="expected a number as every answer, got 'abc'"):
        rh.answer_values(vocabulary, _tokens(vocabulary, ["7", "abc"], 8))
    y = np.array([25.0, 151.0, 346.0, 0.0])
    np.testing.assert_array_equal(rh.to_training_scale(y, True), np.log1p(y))
    np.testing.assert_allclose(rh.from_training_scale(rh.to_training_scale(y, True), True), y, rtol=1e-15)
    np.testing.assert_array_equal(rh.to_training_scale(y, False), y)
    # Negative answers (arithmetic) keep their sign: -log1p(3) for -3.
    signed = np.array([-3.0, -0.5, 4.0, -1e6])
    np.testing.assert_allclose(rh.to_training_scale(signed, True),
                               [-np.log(4.0), -np.log(1.5), np.log(5.0), -np.log(1e6 + 1)], rtol=1e-15)
    np.testing.assert_allclose(rh.from_training_scale(rh.to_training_scale(signed, True), True), signed,
                               rtol=1e-12)


def _data(vocabulary, n=64, batch=8, seed=0):
    from conftest import fake_data

    return fake_data(vocabulary, n=n, batch=batch, seed=seed)


@pytest.mark.parametrize("log_targets", [True, False])
def test_train_step_minimises_the_mse_of_the_answers(vocabulary, log_targets):
    data = _data(vocabulary)
    cfg = network.make_config("micro", vocabulary.vocab_size)
    model = rh.RegressionHead(cfg, log_targets=log_targets)
    # raw answers (0-98) are far from a fresh head's outputs: a larger rate to get there in 60 steps
    optimizer = optim.make_optimizer(learning_rate=3e-3 if log_targets else 3e-2, total_steps=60, warmup_steps=2)
    state = step_lib.create_train_state(model, optimizer, data.batch(0), seed=0)
    train_step = rh.make_train_step(model, optimizer, vocabulary)
    batch = data.batch(0)
    answers = np.array([float(vocabulary.decode([t for t in row if t > 1])) for row in batch["decoder_target_tokens"]])
    y = np.log1p(answers) if log_targets else answers
    pred = np.asarray(model.apply({"params": state.params}, jnp.asarray(batch["encoder_input_tokens"]),
                                  enable_dropout=False), np.float64)
    new_state, metrics = train_step(state, batch)
    # float32 forward pass: relative error of the squares ~ 1e-6
    assert float(metrics["loss"]) == pytest.approx(np.mean((pred - y) ** 2), rel=1e-5)
    assert float(metrics["mse"]) == float(metrics["loss"]) and float(metrics["grad_norm"]) > 0
    assert int(new_state.step) == 1
    losses = []
    for s in range(60):
        state, metrics = train_step(state, data.batch(s))
        losses.append(float(metrics["loss"]))
    assert np.mean(losses[-8:]) < 0.5 * np.mean(losses[:8])
    with pytest.raises(ValueError, match="expected encoder-decoder features"):
        train_step(state, {"decoder_input_tokens": batch["decoder_target_tokens"],
                           "decoder_target_tokens": batch["decoder_target_tokens"]})


def test_format_prediction():
    assert rh.format_prediction(151.374) == "151.37"
    assert rh.format_prediction(151.0) == "151" and rh.format_prediction(-0.5) == "-0.5"
    assert rh.format_prediction(3.2e12) == "3200000000000"  # never an exponent
    assert rh.format_prediction(math.nan) == "nan" and rh.format_prediction(math.inf) == "inf"
    from ntl_jax.data.metrics import parse_number

    for v in (0.004, 12.345, -999.5, 1e-7):
        assert parse_number(rh.format_prediction(v)) == pytest.approx(round(v, 2), abs=1e-12)
    assert math.isnan(parse_number(rh.format_prediction(math.nan)))


@pytest.mark.parametrize("log_targets", [True, False])
def test_evaluate_scores_the_formatted_predictions(vocabulary, log_targets):
    from ntl_jax.data import diabetes
    from ntl_jax.train import evaluate

    data = _data(vocabulary)
    cfg = network.make_config("micro", vocabulary.vocab_size)
    model = rh.RegressionHead(cfg, log_targets=log_targets)
    params = _params(cfg, data.batch(0)["encoder_input_tokens"], log_targets=log_targets)
    eval_set = data.eval_sets["test_interpolate"]
    eval_set = data_lib.EvalSet(eval_set.inputs, eval_set.questions, eval_set.answers, diabetes.metrics)
    metrics, preds = rh.evaluate(model, params, {"test_interpolate": eval_set}, vocabulary, 8, batch_size=3)
    raw = np.asarray(model.apply({"params": params}, jnp.asarray(eval_set.inputs), enable_dropout=False), np.float64)
    values = np.expm1(raw) if log_targets else raw
    assert preds["test_interpolate"] == [rh.format_prediction(v) for v in values]
    expected = evaluate.score(preds["test_interpolate"], eval_set.answers) | diabetes.metrics(
        eval_set.questions, eval_set.answers, preds["test_interpolate"])
    assert metrics == {f"test_interpolate/{k}": pytest.approx(v, nan_ok=True) for k, v in expected.items()}
    assert metrics["test_interpolate/num_examples"] == 8


def test_docstring_examples():
    import doctest

    result = doctest.testmod(rh)
    assert result.attempted > 0 and result.failed == 0


def test_trainer_runs_resumes_and_evaluates_the_head(vocabulary, tmp_path):
    pytest.importorskip("orbax.checkpoint")
    import json
    import os

    from conftest import micro_config

    from ntl_jax.train import trainer

    data = _data(vocabulary)
    config = micro_config(data, loss=rh.LOSS, steps=6, checkpoint_every=2)
    whole = trainer.train(config, str(tmp_path / "whole"), data=data, progress=True, tensorboard=False)
    out = str(tmp_path / "resumed")
    assert trainer.train(config, out, data=data, progress=False, tensorboard=False, stop_after=4)["step"] == 4
    resumed = trainer.train(config, out, data=data, progress=False, tensorboard=False)
    # answers are read on the host from the batch: resuming repeats the run bit for bit
    for a, b in zip(jax.tree.leaves(whole["state"].params), jax.tree.leaves(resumed["state"].params)):
        np.testing.assert_array_equal(a, b)
    assert sorted(whole["state"].params) == ["encoder", "head", "token_embedder"]
    assert set(whole["train"]) == {"loss", "mse", "grad_norm"} and whole["eval"] == resumed["eval"]
    preds = json.load(open(os.path.join(out, "predictions.json")))["test_interpolate"]
    model = rh.RegressionHead(network.make_config("micro", vocabulary.vocab_size))
    eval_set = data.eval_sets["test_interpolate"]
    values = rh.predict_values(model, resumed["state"].params, eval_set.inputs)
    assert [p["prediction"] for p in preds] == [rh.format_prediction(v) for v in values]
    assert resumed["eval"]["test_interpolate/num_examples"] == 8
    with pytest.raises(ValueError, match="expected architecture 'encoder-decoder', got 'decoder-only'"):
        trainer.TrainConfig(loss=rh.LOSS, architecture="decoder-only",
                            data=data_lib.DataConfig(architecture="decoder-only")).validate()
    with pytest.raises(ValueError, match=r"loss: expected a loss name .*; or one of regression-head, rt, "
                                         r"rt\+ntl-mse, xval\), got 'regression'"):
        trainer.TrainConfig(loss="regression").validate()


def test_compare_pairs_the_head_with_ce_on_diabetes(tmp_path, capsys):
    pytest.importorskip("sklearn")
    pytest.importorskip("sentencepiece")
    pytest.importorskip("orbax.checkpoint")
    import json
    import os

    from ntl_jax import cli
    from ntl_jax.cli import compare as cli_compare
    from ntl_jax.cli import train as cli_train

    argv = ["--task", "diabetes", "--losses", "ce", "ntl-was", rh.LOSS, "--ntl-weight", "0.1", "0.3",
            "--dropout-rate", "0.1",
            "--seeds", "1", "--steps", "2", "--preset", "micro", "--train-examples", "16",
            "--eval-examples", "500", "--batch-size", "8", "--log-every", "1", "--checkpoint-every", "2",
            "--no-progress", "--no-tensorboard", "--out", str(tmp_path / "cmp")]
    args = cli.build_parser(["compare"] + argv).parse_args(["compare"] + argv)
    train_args = cli.build_parser(["train"]).parse_args(["train", "--loss", rh.LOSS, "--out", "x"])
    assert train_args.loss == rh.LOSS
    assert rh.LOSS in cli_train.CHOICES and rh.LOSS not in cli_train.LOSSES  # LOSSES: the step's losses
    _, runs = cli_compare.plan(args, str(tmp_path))
    assert cli_compare._config(args, runs[-1]).dropout_rate == 0.1
    # one head run per seed whatever the NTL weights, paired with that seed's CE run
    assert [(r.label, r.ntl_weight, r.baseline) for r in runs] == [
        ("ce", 0.0, None), ("ntl-was λ=0.1", 0.1, "ce"), ("ntl-was λ=0.3", 0.3, "ce"), (rh.LOSS, 0.0, "ce")]
    assert cli.main(["compare"] + argv) == 0
    result = json.load(open(str(tmp_path / "cmp" / "compare.json")))
    assert result["settings"]["module"] == "diabetes"
    assert result["table_metrics"] == list(cli_compare.TABLE_METRICS["diabetes"])
    assert result["table_metrics"][:2] == ["test_interpolate/rmse", "test_interpolate/pearson_r"]
    by_loss = {r["loss"]: r for r in result["runs"]}
    head = by_loss[rh.LOSS]["metrics"]
    assert head["test_interpolate/num_examples"] == 88 and head["test_interpolate/parsed"] == 1.0
    assert head["test_interpolate/rmse"] > 0
    paired = result["paired"][rh.LOSS]["test_interpolate/rmse"]
    assert paired["baseline"] == "ce" and paired["n"] == 1 and paired["higher_is_better"] is False
    assert paired["mean_diff"] == pytest.approx(head["test_interpolate/rmse"]
                                                - by_loss["ce"]["metrics"]["test_interpolate/rmse"])
    assert os.path.exists(str(tmp_path / "cmp" / "compare.png"))
    assert rh.LOSS in capsys.readouterr().out
