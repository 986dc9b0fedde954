"""The paper's baselines as T5X models equal the trainer's, on one batch and one set of
parameters: loss and every gradient, to float32 rounding (skipped without t5x).

The trainer's network (`ntl_jax.train.network`) and T5X's `t5x.examples.t5.network`
share their parameter names; T5X keeps each attention projection as one matrix where
ours keeps heads apart, a reshape.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

pytest.importorskip("t5x.models", reason="t5x is not installed (it is not on PyPI; see the README)")

from t5x import adafactor  # noqa: E402
from t5x.examples.t5 import network as t5_network  # noqa: E402

from ntl_jax.seqio import vocabularies  # noqa: E402
from ntl_jax.t5x import models as ntl_models  # noqa: E402
from ntl_jax.t5x import networks as ntl_networks  # noqa: E402
from ntl_jax.train import data as data_lib  # noqa: E402
from ntl_jax.train import network, systems  # noqa: E402
from ntl_jax.train import step as step_lib  # noqa: E402
from ntl_jax.train.trainer import StepSpec, TrainConfig, build_step, number_tokens_of  # noqa: E402


def to_t5x(tree):
    """Our parameters (or gradients) in T5X's layout: attention kernels with heads joined."""
    def convert(path, x):
        if x.ndim != 3:
            return x
        return x.reshape(-1, x.shape[-1]) if path[-2].key == "out" else x.reshape(x.shape[0], -1)

    return jax.tree_util.tree_map_with_path(convert, tree)


def t5x_config(cfg: network.T5Config) -> t5_network.T5Config:
    return t5_network.T5Config(
        vocab_size=cfg.vocab_size, dtype="float32", emb_dim=cfg.emb_dim, num_heads=cfg.num_heads,
        num_encoder_layers=cfg.num_encoder_layers, num_decoder_layers=cfg.num_decoder_layers,
        head_dim=cfg.head_dim, mlp_dim=cfg.mlp_dim, mlp_activations=tuple(cfg.mlp_activations),
        dropout_rate=0.0, logits_via_embedding=False)


def _gradient_keeper():
    """An optimizer whose state is the last gradient and whose update is 0."""
    return optax.GradientTransformation(
        lambda params: jax.tree.map(jnp.zeros_like, params),
        lambda grads, state, params=None: (jax.tree.map(jnp.zeros_like, grads), grads))


def _trainer_loss_and_grads(config: TrainConfig, vocabulary, batch):
    model_config = network.make_config(config.preset, int(vocabulary.vocab_size))
    spec = StepSpec.of(config, model_config, number_tokens_of(vocabulary))
    model, _, _ = build_step(spec)
    train_step = step_lib.make_train_step(
        model, _gradient_keeper(), spec.number_tokens, loss=spec.loss, ntl_weight=spec.ntl_weight,
        z_loss=spec.z_loss, fused_loss=spec.fused_loss)
    state = step_lib.create_train_state(model, _gradient_keeper(), batch, config.seed)
    new_state, metrics = train_step(state, batch)
    return model_config, state.params, float(metrics["loss"]), new_state.opt_state


@pytest.fixture(scope="module")
def rt_batch():
    vocabulary = systems.vocabulary("rt")
    data = data_lib.ProblemData(data_lib.DataConfig(module="arithmetic__add_or_sub", train_examples=64,
                                                    eval_examples=8, batch_size=8, seed=3), vocabulary=vocabulary)
    return vocabulary, data.batch(0)


@pytest.mark.parametrize("system, weight", [("rt", 0.0), ("rt+ntl-mse", 0.3)])
def test_the_t5x_rt_model_is_the_trainers_rt(rt_batch, system, weight):
    vocabulary, batch = rt_batch
    config = TrainConfig(loss=system, preset="micro", ntl_weight=0.3, seed=5)
    model_config, params, loss, grads = _trainer_loss_and_grads(config, vocabulary, batch)
    model = ntl_models.NTLEncoderDecoderModel(
        module=ntl_networks.RtTransformer(t5x_config(model_config)),
        input_vocabulary=vocabularies.rt_vocabulary(), output_vocabulary=vocabularies.rt_vocabulary(),
        optimizer_def=adafactor.Adafactor(), z_loss=config.z_loss, ntl_weight=weight, number_loss="mse",
        loss_normalizing_factor="NUM_REAL_TARGET_TOKENS", fused_loss=False)
    t5x_batch = {k: jnp.asarray(v) for k, v in batch.items()}
    (t5x_loss, _), t5x_grads = jax.value_and_grad(model.loss_fn, has_aux=True)(to_t5x(params), t5x_batch, None)
    assert float(t5x_loss) == pytest.approx(loss, rel=2e-6)
    flat = jax.tree_util.tree_flatten_with_path(to_t5x(grads))[0]
    theirs = dict(jax.tree_util.tree_flatten_with_path(t5x_grads)[0])
    assert len(flat) == len(theirs)
    for path, ours in flat:
        scale = float(np.abs(ours).max())
        np.testing.assert_allclose(theirs[path], ours, rtol=1e-4, atol=1e-5 * scale + 1e-9,
                                   err_msg=jax.tree_util.keystr(path))
    # The encodings are in both: without them the T5X loss differs.
    plain = ntl_models.NTLEncoderDecoderModel(
        module=t5_network.Transformer(t5x_config(model_config)),
        input_vocabulary=vocabularies.rt_vocabulary(), output_vocabulary=vocabularies.rt_vocabulary(),
        optimizer_def=adafactor.Adafactor(), z_loss=config.z_loss, ntl_weight=weight, number_loss="mse",
        loss_normalizing_factor="NUM_REAL_TARGET_TOKENS", fused_loss=False)
    assert abs(float(plain.loss_fn(to_t5x(params), t5x_batch, None)[0]) - loss) > 1e-3


# -- xVal ---------------------------------------------------------------------------------

QUESTIONS = ["What is -4 + 2.5?", "Calculate 120 - 7.", "Solve 3*x = 12 for x.", "Add 0.25 and 99.", "Sum 1, 2."]
ANSWERS = ["-1.5", "113", "4", "99.25", "3"]


@pytest.fixture(scope="module")
def xval_setup():
    from ntl_jax.train import xval

    vocabulary = systems.vocabulary("xval")
    codec = xval.XvalVocabulary(vocabulary)
    batch = {"encoder_input_tokens": data_lib.encode_texts(vocabulary, QUESTIONS, 24)[0],
             "decoder_target_tokens": data_lib.encode_texts(vocabulary, ANSWERS, 8)[0]}
    features = xval.features(codec, batch)
    cfg = xval.model_config_with_num_token(network.make_config("micro", vocabulary.vocab_size), codec.vocab_size)
    model = xval.XvalTransformer(cfg)
    params = model.init(jax.random.key(2), features["encoder_input_tokens"], features["decoder_input_tokens"],
                        features["decoder_target_tokens"], enable_dropout=False)["params"]
    return vocabulary, codec, features, cfg, model, params


def _t5x_xval_model(cfg):
    from ntl_jax.seqio import xval as seqio_xval
    from ntl_jax.t5x import xval as ntl_xval

    vocabulary = seqio_xval.xval_vocabulary()
    return ntl_xval.XvalEncoderDecoderModel(
        module=ntl_networks.XvalTransformer(t5x_config(cfg)), input_vocabulary=vocabulary,
        output_vocabulary=vocabulary, optimizer_def=adafactor.Adafactor())


def test_the_seqio_pipeline_gives_the_trainers_features(xval_setup):
    import seqio
    import tensorflow as tf

    from ntl_jax.seqio import xval as seqio_xval

    _, _, features, *_ = xval_setup
    vocabulary = seqio_xval.xval_vocabulary()
    output_features = {k: seqio.Feature(vocabulary) for k in ("inputs", "targets")}
    ds = tf.data.Dataset.from_tensor_slices({"inputs": QUESTIONS, "targets": ANSWERS})
    ds = seqio.preprocessors.tokenize(ds, output_features)
    lengths = {"inputs": 24, "targets": 8}
    ds = seqio.preprocessors.append_eos_after_trim(ds, output_features=output_features, sequence_length=lengths)
    ds = seqio_xval.number_scales(ds, output_features)
    converted = seqio_xval.XvalFeatureConverter(pack=False)(ds, lengths)
    got = {k: np.stack([np.asarray(ex[k]) for ex in converted.as_numpy_iterator()]) for k in converted.element_spec}
    for key in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens"):
        np.testing.assert_array_equal(got[key], features[key], err_msg=key)
    num = vocabulary.num_id
    assert (got["decoder_target_tokens"] == num).sum() == 5 and (got["encoder_input_tokens"] == num).sum() == 10
    for key, ids in (("encoder_scale", "encoder_input_tokens"), ("decoder_scale", "decoder_input_tokens"),
                     ("target_values", "decoder_target_tokens")):
        at = got[ids] == num
        np.testing.assert_allclose(got[key][at], features[key][at], rtol=1e-6, err_msg=key)
    with pytest.raises(ValueError, match="expected unpacked batches"):
        seqio_xval.XvalFeatureConverter(pack=True)


def test_the_t5x_xval_model_is_the_trainers_xval(xval_setup):
    from ntl_jax.train import xval

    _, codec, features, cfg, model, params = xval_setup
    f = {k: jnp.asarray(v) for k, v in features.items()}

    def trainer_loss(p):
        logits, numbers = model.apply({"params": p}, f["encoder_input_tokens"], f["decoder_input_tokens"],
                                      f["decoder_target_tokens"], encoder_scale=f["encoder_scale"],
                                      decoder_scale=f["decoder_scale"], enable_dropout=False)
        return xval.xval_loss(logits, numbers, f["decoder_target_tokens"], f["target_values"], codec.num_id)[0]

    loss, grads = jax.value_and_grad(trainer_loss)(params)
    t5x_model = _t5x_xval_model(cfg)
    batch = {**f, "decoder_loss_weights": (f["decoder_target_tokens"] > 0).astype(jnp.int32)}
    (t5x_loss, metrics), t5x_grads = jax.value_and_grad(t5x_model.loss_fn, has_aux=True)(to_t5x(params), batch, None)
    assert float(t5x_loss) == pytest.approx(float(loss), rel=2e-6)
    ce, mse = (float(metrics[k].compute()) for k in ("cross_ent_loss", "number_mse"))
    assert float(t5x_loss) == pytest.approx((ce + mse) / 2, rel=1e-6) and mse > 0
    theirs = dict(jax.tree_util.tree_flatten_with_path(t5x_grads)[0])
    flat = jax.tree_util.tree_flatten_with_path(to_t5x(grads))[0]
    assert len(flat) == len(theirs) and any("number_head" in jax.tree_util.keystr(p) for p, _ in flat)
    for path, ours in flat:
        scale = float(np.abs(ours).max())
        np.testing.assert_allclose(theirs[path], ours, rtol=1e-4, atol=1e-5 * scale + 1e-9,
                                   err_msg=jax.tree_util.keystr(path))


def test_the_t5x_xval_model_predicts_the_trainers_text(xval_setup):
    from flax import linen as nn

    from ntl_jax.data.number_scaling import unscale_values
    from ntl_jax.flax import xval as flax_xval
    from ntl_jax.train import xval

    vocabulary, codec, features, cfg, model, params = xval_setup
    eval_set = data_lib.EvalSet(data_lib.encode_texts(vocabulary, QUESTIONS, 24)[0], QUESTIONS, ANSWERS)
    assert xval.predict(model, params, eval_set, vocabulary, 8, batch_size=5) == _t5x_texts(cfg, params, features)
    # The token head made to write "[NUM] - [NUM]": the texts hold the head's values.
    sp, minus = vocabulary.encode(" ")[0], vocabulary.encode("-")[0]
    forced = np.array([codec.num_id, sp, minus, sp, codec.num_id, 1, 1, 1])

    def force(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if context.module.name == "logits_dense" and context.method_name == "__call__":
            return jnp.broadcast_to(100.0 * jax.nn.one_hot(forced[: out.shape[1]], out.shape[-1]), out.shape)
        return out

    with nn.intercept_methods(force):
        ids, nums = flax_xval.greedy_decode(model, params, jnp.asarray(features["encoder_input_tokens"]),
                                            jnp.asarray(features["encoder_scale"]), 8, codec.num_id)
        got = _t5x_texts(cfg, params, features)
    values = unscale_values(np.asarray(nums))
    assert got == [codec.decode(row, v) for row, v in zip(np.asarray(ids), values)]
    for text, v in zip(got, values):  # the head's values, written where [NUM] was emitted
        assert text.split() == [xval.format_value(v[0]), "-", xval.format_value(v[4])]


def _t5x_texts(cfg, params, features):
    t5x_model = _t5x_xval_model(cfg)
    batch = {k: jnp.asarray(features[k]) for k in ("encoder_input_tokens", "encoder_scale", "decoder_input_tokens")}
    decodes, _ = t5x_model.predict_batch_with_aux(to_t5x(params), batch)
    assert decodes.shape == (5, 16)  # (token, value bits) per position
    with pytest.raises(ValueError, match="greedily, one decode per example"):
        t5x_model.predict_batch_with_aux(to_t5x(params), batch, num_decodes=4)
    return [t5x_model.output_vocabulary.decode(row) for row in np.asarray(decodes)]
