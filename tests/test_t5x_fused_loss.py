"""The NTL T5X models with `fused_loss=True`, without T5X: the network runs without its
logits projection and the loss streams `hidden @ kernel`. Against the same fake model
with `fused_loss=False`: loss, gradients and every metric."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ntl_jax import t5x_loss
from tests.test_t5x_model_loss import (
    FACTORS,
    NT,
    WIDTH,
    FakeNTLModel,
    FakeVocabulary,
    make_batch,
    value,
)

D_MODEL = 8


class TinyDecoder(nn.Module):
    """A stand-in network with T5.1.1's head: a `logits_dense` projection (or, tied, the
    embedding's `attend` with T5's 1/sqrt(d) scaling)."""

    tied: bool = False

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(WIDTH, D_MODEL, name="token_embedder")
        y = nn.tanh(nn.Dense(D_MODEL, name="body")(embed(tokens)))
        if self.tied:
            return embed.attend(y) / jnp.sqrt(D_MODEL)
        return nn.DenseGeneral(WIDTH, use_bias=False, name="logits_dense")(y)


class FlaxFakeModel(FakeNTLModel):
    """The fake T5X model whose `_compute_logits` runs a Flax network, as T5X's does."""

    def __init__(self, *, module, **kwargs):
        super().__init__(vocabulary=FakeVocabulary(), **kwargs)
        self.module = module

    def _compute_logits(self, params, batch, dropout_rng=None):
        return self.module.apply({"params": params}, batch["decoder_input_tokens"])


def _params(module, batch):
    params = module.init(jax.random.key(0), batch["decoder_input_tokens"])["params"]
    # Larger logits than the initialisation gives, so the loss is not near-uniform.
    return jax.tree.map(lambda p: p * 3.0, params)


def _loss_and_grads(model, params, batch):
    (loss, metrics), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, None)
    return loss, metrics, grads


@pytest.mark.parametrize("tied", [False, True], ids=["logits_dense", "tied"])
@pytest.mark.parametrize("factor", FACTORS, ids=str)
def test_fused_model_equals_the_unfused_model(tied, factor):
    batch = make_batch(packed=True, seed=3)
    module = TinyDecoder(tied=tied)
    params = _params(module, batch)
    options = dict(module=module, loss_normalizing_factor=factor, label_smoothing=0.1, z_loss=1e-3)
    unfused = FlaxFakeModel(**options, ntl_kind="number_level", reweigh=True)
    fused = FlaxFakeModel(**options, ntl_kind="number_level", reweigh=True, fused_loss=True, fused_chunk_size=5)
    loss_u, metrics_u, grads_u = _loss_and_grads(unfused, params, batch)
    loss_f, metrics_f, grads_f = _loss_and_grads(fused, params, batch)
    np.testing.assert_allclose(loss_f, loss_u, rtol=2e-5)
    assert metrics_f.keys() == metrics_u.keys()
    for name in metrics_u:
        np.testing.assert_allclose(value(metrics_f[name]), value(metrics_u[name]), rtol=2e-5, atol=1e-7,
                                   err_msg=name)
    for path, g_u in jax.tree_util.tree_flatten_with_path(grads_u)[0]:
        g_f = params_at(grads_f, path)
        scale = float(np.max(np.abs(g_u))) + 1e-30
        assert float(np.max(np.abs(g_f - g_u))) <= 2e-5 * scale, jax.tree_util.keystr(path)


def params_at(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree


def test_accuracy_stand_ins_score_the_vocabulary_argmax():
    batch = make_batch(packed=False, seed=4)
    module = TinyDecoder()
    params = _params(module, batch)
    model = FlaxFakeModel(module=module, fused_loss=True, fused_chunk_size=7)
    model.loss_fn(params, batch, None)
    call = model.metric_calls[-1]
    logits = module.apply({"params": params}, batch["decoder_input_tokens"])
    correct = np.asarray(jnp.argmax(logits, -1) == batch["decoder_target_tokens"])
    assert call["logits"].shape == batch["decoder_target_tokens"].shape + (2,)
    # Where the mask counts (ignored positions' hidden states are zeroed, as the loss
    # sees them, and the stock metric masks them out).
    counted = np.asarray(call["mask"]) > 0
    assert counted.sum() > 10 and correct[counted].any() and not correct[counted].all()
    got = np.asarray(jnp.argmax(call["logits"], -1) == call["targets"])
    np.testing.assert_array_equal(got[counted], correct[counted])


def test_the_fused_model_never_forms_the_logits():
    batch = make_batch(packed=True, seed=5)
    module = TinyDecoder()
    params = _params(module, batch)
    model = FlaxFakeModel(module=module, fused_loss=True, fused_chunk_size=5)
    hlo = jax.jit(jax.grad(lambda p: model.loss_fn(p, batch, None)[0])).lower(params).compile().as_text()
    assert f"[3,10,{WIDTH}]" not in hlo and f"[30,{WIDTH}]" not in hlo
    unfused = FlaxFakeModel(module=module)
    hlo = jax.jit(jax.grad(lambda p: unfused.loss_fn(p, batch, None)[0])).lower(params).compile().as_text()
    assert f"[3,10,{WIDTH}]" in hlo  # the check can fail


@pytest.mark.parametrize("kwargs, message", [
    (dict(fused_loss="yes"), "fused_loss to be True or False"),
    (dict(fused_chunk_size=0), "fused_chunk_size None or a positive int"),
])
def test_bad_fused_options(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        FlaxFakeModel(module=TinyDecoder(), **kwargs)


def test_model_loss_from_hidden_equals_model_loss():
    batch = make_batch(packed=True, seed=6)
    rng = np.random.default_rng(6)
    hidden = jnp.asarray(rng.normal(size=(3, 10, D_MODEL)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(D_MODEL, WIDTH)), jnp.float32)
    for factor in FACTORS:
        want = t5x_loss.model_loss(hidden @ kernel, batch, NT, loss_normalizing_factor=factor, reweigh=True)
        got = t5x_loss.model_loss_from_hidden(hidden, kernel, batch, NT, loss_normalizing_factor=factor,
                                              reweigh=True, chunk_size=7)
        np.testing.assert_allclose(got.loss, want.loss, rtol=2e-5)
        np.testing.assert_allclose(got.mask, want.mask)
        for name, (total, count) in want.averages.items():
            np.testing.assert_allclose(got.averages[name][0], total, rtol=2e-5, atol=1e-7, err_msg=name)
            np.testing.assert_allclose(got.averages[name][1], count, err_msg=name)
