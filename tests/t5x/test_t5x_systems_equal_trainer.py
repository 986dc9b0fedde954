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
        optimizer_def=adafactor.Adafactor(), z_loss=config.z_loss, ntl_weight=weight, ntl_kind="mse",
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
        optimizer_def=adafactor.Adafactor(), z_loss=config.z_loss, ntl_weight=weight, ntl_kind="mse",
        loss_normalizing_factor="NUM_REAL_TARGET_TOKENS", fused_loss=False)
    assert abs(float(plain.loss_fn(to_t5x(params), t5x_batch, None)[0]) - loss) > 1e-3
