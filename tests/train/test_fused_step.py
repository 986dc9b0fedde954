"""The trainer's `--fused-loss` step against the unfused one."""

import jax
import numpy as np
import optax
import pytest
from conftest import addition_source, fake_data

from ntl_jax import cli
from ntl_jax.cli import train as cli_train
from ntl_jax.flax import linen_hidden_states_and_kernel
from ntl_jax.train import data as data_lib
from ntl_jax.train import network, trainer
from ntl_jax.train import step as step_lib

# SGD with learning rate 1: a step's parameter change is minus the gradient.
SGD = optax.sgd(1.0)


def _step(vocabulary, model, loss, fused):
    number_tokens = trainer.number_tokens_of(vocabulary)
    return step_lib.make_train_step(model, SGD, number_tokens, loss=loss, fused_loss=fused)


@pytest.mark.parametrize("architecture, tied, loss", [
    ("encoder-decoder", False, "ntl-was"),
    ("encoder-decoder", True, "ntl-number-level"),
    ("decoder-only", False, "ce"),
    ("decoder-only", False, "ntl-was"),
    ("decoder-only", True, "del"),
])
def test_fused_step_equals_the_unfused_step(vocabulary, architecture, tied, loss):
    cfg = network.make_config("micro", vocabulary.vocab_size, logits_via_embedding=tied)
    model = network.make_model(architecture, cfg)
    data_config = data_lib.DataConfig(module="fake", train_examples=8, eval_examples=8, batch_size=8,
                                      architecture=architecture)
    batch = data_lib.ProblemData(data_config, vocabulary=vocabulary, example_source=addition_source).batch(0)
    state = step_lib.create_train_state(model, SGD, batch, seed=0)
    unfused, fused = _step(vocabulary, model, loss, fused=False), _step(vocabulary, model, loss, fused=True)
    (state_u, metrics_u), (state_f, metrics_f) = unfused(state, batch), fused(state, batch)
    for name in ("loss", "cross_entropy", "ntl", "grad_norm"):
        np.testing.assert_allclose(metrics_f[name], metrics_u[name], rtol=2e-5, atol=1e-7, err_msg=name)
    grads = [jax.tree.leaves(jax.tree.map(lambda new, old: old - new, s.params, state.params))
             for s in (state_u, state_f)]
    for name, g_u, g_f in zip(jax.tree_util.tree_flatten_with_path(state.params)[0], *grads):
        scale = float(np.max(np.abs(g_u))) + 1e-12
        assert float(np.max(np.abs(g_f - g_u))) <= 1e-4 * scale, name[0]


def test_the_head_is_found_and_skipped(vocabulary):
    cfg = network.make_config("micro", vocabulary.vocab_size)
    model = network.Transformer(cfg)
    batch = fake_data(vocabulary, n=8, batch=8).batch(0)
    args, kwargs = step_lib.model_inputs(batch)
    params = model.init(jax.random.key(0), *args, **kwargs, enable_dropout=False)["params"]
    hidden, kernel = linen_hidden_states_and_kernel(model, {"params": params}, *args, **kwargs,
                                                        enable_dropout=False)
    np.testing.assert_array_equal(kernel, params["decoder"]["logits_dense"]["kernel"])
    assert hidden.shape == batch["decoder_target_tokens"].shape + (cfg.emb_dim,)
    logits = model.apply({"params": params}, *args, **kwargs, enable_dropout=False)
    np.testing.assert_allclose(hidden @ kernel, logits, rtol=1e-5, atol=1e-5)


def test_a_network_without_a_known_head_is_refused():
    import flax.linen as nn

    class Plain(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(5, name="out")(x)

    model = Plain()
    variables = model.init(jax.random.key(0), np.ones((1, 3)))
    with pytest.raises(ValueError, match="one 'logits_dense' module or one Embed.attend call, found 0"):
        linen_hidden_states_and_kernel(model, variables, np.ones((1, 3)))


def test_the_flag_reaches_the_run_configuration():
    for flags, expected in (([], True), (["--fused-loss"], True), (["--no-fused-loss"], False)):
        argv = ["train", "--out", "x"] + flags
        args = cli.build_parser(argv).parse_args(argv)
        assert cli_train.make_config(args, "ntl-was", 0).fused_loss is expected
    # Runs saved before the option existed resume with --no-fused-loss.
    assert "fused_loss" in trainer.TrainConfig().identity()
    assert "fused_loss" not in trainer.TrainConfig(fused_loss=False).identity()
