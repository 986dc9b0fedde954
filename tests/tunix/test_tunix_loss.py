"""`ntl_jax.tunix`'s loss on Tunix's Qwen, Llama and Gemma models: equal to the library's
objective on the model's logits, to Tunix's own cross-entropy at `ntl_weight=0`, and,
fused from the final hidden states, equal to the logits path in loss and gradients; a
loss of one's own is its plain formula and trains in the `PeftTrainer`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.tunix.families import (
    LINEAR_HEADS,
    NUMBERS,
    SQUARED_DISTANCE,
    batch,
    gemma2_model,
    perturbed,
    qwen2_model,
    squared_distance_mean,
)

qwix = pytest.importorskip("qwix")

import optax  # noqa: E402
from flax import nnx  # noqa: E402
from tunix.sft import peft_trainer  # noqa: E402

import ntl_jax  # noqa: E402
from ntl_jax import losses  # noqa: E402
from ntl_jax import tunix as ntl_tunix  # noqa: E402
from tests.objective_options import registered_loss  # noqa: E402

FAMILIES = sorted(LINEAR_HEADS)


def _loss_and_grads(model, inputs, **options):
    loss_fn = ntl_tunix.number_token_loss_fn(NUMBERS, **options)
    (loss, parts), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, **inputs)
    return loss, parts, grads


def _logits(model, inputs):
    logits, _ = model(inputs["input_tokens"], inputs["positions"], None, inputs["attention_mask"])
    return logits


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("number_loss", ["was", "del", "smmd", SQUARED_DISTANCE],
                         ids=lambda v: v.name if isinstance(v, losses.NumberLoss) else None)
def test_the_loss_is_the_objective_on_the_next_token_logits(family, number_loss):
    model, inputs = LINEAR_HEADS[family](), batch()
    # No λ on either side: the loss's own (DEL 0.001, SMMD 1, the others 0.3).
    loss, parts = ntl_tunix.number_token_loss_fn(NUMBERS, number_loss=number_loss)(model, **inputs)
    logits = _logits(model, inputs)
    expected, expected_parts = ntl_jax.cross_entropy_and_ntl(
        logits[:, :-1], inputs["input_tokens"][:, 1:], NUMBERS, weights=inputs["input_mask"][:, 1:],
        number_loss=number_loss, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    assert float(parts["ntl"]) > 0.01
    for name in ("ntl", "ntl_term", "ntl_weight_sum"):
        np.testing.assert_allclose(parts[name], expected_parts[name], rtol=1e-6, err_msg=name)
    # `ntl` is the mean over the counted number targets, `ntl_term` λ x it, beside CE's mean.
    own = losses.resolve(number_loss).default_weight
    np.testing.assert_allclose(parts["ntl_term"], own * parts["ntl"], rtol=1e-5)
    np.testing.assert_allclose(loss, parts["cross_entropy"] + parts["ntl_term"], rtol=1e-6)
    # The mask's targets only: the answer of each row, without the padding.
    assert float(parts["weight_sum"]) == float(jnp.sum(inputs["input_mask"][:, 1:]))


@pytest.mark.parametrize("family", FAMILIES)
def test_at_ntl_weight_zero_it_is_tunix_cross_entropy(family):
    model, inputs = LINEAR_HEADS[family](), batch(seed=1)
    loss, parts = ntl_tunix.number_token_loss_fn(NUMBERS, ntl_weight=0.0)(model, **inputs)
    tunix_loss = peft_trainer._default_loss_fn(model, **inputs)
    np.testing.assert_allclose(loss, tunix_loss, rtol=2e-6)
    np.testing.assert_allclose(parts["cross_entropy"], tunix_loss, rtol=2e-6)


def _assert_fused_equals_logits(model, inputs, **options):
    loss_u, parts_u, grads_u = _loss_and_grads(model, inputs, **options)
    loss_f, parts_f, grads_f = _loss_and_grads(model, inputs, fused=True, **options)
    assert float(parts_u["ntl"]) > 0.01 and float(parts_u["cross_entropy"]) > 1.0
    np.testing.assert_allclose(loss_f, loss_u, rtol=2e-5, atol=1e-7)
    for name in ("cross_entropy", "ntl"):
        np.testing.assert_allclose(parts_f[name], parts_u[name], rtol=2e-5, atol=1e-7, err_msg=name)
    flat_u, flat_f = (dict(jax.tree_util.tree_flatten_with_path(g)[0]) for g in (grads_u, grads_f))
    assert flat_u.keys() == flat_f.keys()
    for path, g_u in flat_u.items():
        scale = float(np.max(np.abs(g_u)))
        assert scale > 0, jax.tree_util.keystr(path)  # every parameter gets a gradient
        assert float(np.max(np.abs(flat_f[path] - g_u))) <= 1e-4 * scale, jax.tree_util.keystr(path)
    return flat_u


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_loss_and_gradients_equal_the_logits_path(family):
    grads = _assert_fused_equals_logits(LINEAR_HEADS[family](), batch(seed=2), ntl_weight=0.3)
    names = " ".join(jax.tree_util.keystr(p) for p in grads)
    assert ("lm_head" in names) == (family in ("qwen2", "llama3"))  # the untied heads


def test_fused_with_lora_adapters_trains_them_as_the_logits_path():
    model = qwen2_model(tied=False)
    provider = qwix.LoraProvider(module_path=".*_proj", rank=4, alpha=8.0)  # every projection but the head
    inputs = batch(seed=3)
    lora = perturbed(qwix.apply_lora_to_model(model, provider, **model.get_model_input()), seed=1)
    options = dict(ntl_weight=0.3, number_loss="dist2")
    lora_grad = nnx.DiffState(0, nnx.LoRAParam)
    results = []
    for fused in (False, True):
        loss_fn = ntl_tunix.number_token_loss_fn(NUMBERS, fused=fused, **options)
        (loss, _), grads = nnx.value_and_grad(loss_fn, argnums=lora_grad, has_aux=True)(lora, **inputs)
        results.append((loss, grads))
    (loss_u, grads_u), (loss_f, grads_f) = results
    np.testing.assert_allclose(loss_f, loss_u, rtol=2e-5)
    leaves_u, leaves_f = jax.tree_util.tree_leaves(grads_u), jax.tree_util.tree_leaves(grads_f)
    assert len(leaves_u) == 2 * 7 * 2  # A and B of seven projections in two layers, and no other parameter
    for g_u, g_f in zip(leaves_u, leaves_f):
        scale = float(np.max(np.abs(g_u)))
        assert scale > 0
        assert float(np.max(np.abs(g_f - g_u))) <= 1e-4 * scale


def test_a_lora_adapter_on_the_head_is_refused_by_the_fused_loss():
    model = qwen2_model(tied=False)
    lora = qwix.apply_lora_to_model(model, qwix.LoraProvider(module_path=".*lm_head", rank=2, alpha=2.0),
                                    **model.get_model_input())
    with pytest.raises(ValueError, match=r"expected no LoRA adapter on the logits projection.*lm_head"):
        ntl_tunix.number_token_loss_fn(NUMBERS, fused=True)(lora, **batch())
    loss, _ = ntl_tunix.number_token_loss_fn(NUMBERS)(lora, **batch())  # from the logits it counts
    assert np.isfinite(float(loss))


def test_soft_capped_logits_are_refused_by_the_fused_loss_and_work_from_the_logits():
    model = gemma2_model(softcap=30.0)
    with pytest.raises(ValueError, match=r"final_logits_softcap=30.0.*fused=False"):
        ntl_tunix.number_token_loss_fn(NUMBERS, fused=True)(model, **batch())
    loss, parts = ntl_tunix.number_token_loss_fn(NUMBERS, ntl_weight=0.0)(model, **batch())
    np.testing.assert_allclose(loss, peft_trainer._default_loss_fn(model, **batch()), rtol=2e-6)


def test_the_model_is_left_as_it_was():
    model, inputs = qwen2_model(tied=True), batch()
    before, _ = model(inputs["input_tokens"], inputs["positions"], None, inputs["attention_mask"])
    hidden, kernel = ntl_tunix.hidden_states_and_kernel(model, inputs["input_tokens"], inputs["positions"], None,
                                                         inputs["attention_mask"])
    np.testing.assert_allclose(hidden @ kernel, before, rtol=1e-5, atol=1e-5)
    after, _ = model(inputs["input_tokens"], inputs["positions"], None, inputs["attention_mask"])
    np.testing.assert_array_equal(after, before)


def test_bad_number_tokens_are_named():
    with pytest.raises(TypeError, match=r"expected NumberTokens.*got list"):
        ntl_tunix.number_token_loss_fn(["0", "1"])


def test_a_model_without_tunix_heads_is_named():
    class Plain(nnx.Module):
        def __init__(self):
            self.lm_head = nnx.Linear(4, 5, rngs=nnx.Rngs(0))

    with pytest.raises(TypeError, match=r"expected the model's lm_head to be Tunix's Einsum .*got Linear"):
        ntl_tunix.hidden_states_and_kernel(Plain())
    with pytest.raises(TypeError, match=r"expected a Tunix decoder with an lm_head .*got Module"):
        ntl_tunix.hidden_states_and_kernel(nnx.Module())


def test_a_loss_of_ones_own_is_its_plain_formula():
    model, inputs = qwen2_model(tied=False), batch(seed=5)
    for fused in (False, True):
        _, parts = ntl_tunix.number_token_loss_fn(NUMBERS, number_loss=SQUARED_DISTANCE, fused=fused)(model, **inputs)
        expected = squared_distance_mean(_logits(model, inputs)[:, :-1], inputs["input_tokens"][:, 1:],
                                         inputs["input_mask"][:, 1:])
        assert expected > 1.0
        np.testing.assert_allclose(parts["ntl"], expected, rtol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
def test_a_loss_of_ones_own_trains_in_the_peft_trainer(fused):
    model, inputs = qwen2_model(tied=True), batch(seed=6)
    loss_fn = ntl_tunix.number_token_loss_fn(NUMBERS, number_loss=SQUARED_DISTANCE, ntl_weight=0.3, fused=fused)
    before, parts_before = loss_fn(model, **inputs)
    steps = 4
    trainer = peft_trainer.PeftTrainer(model, optax.adam(3e-3), peft_trainer.TrainingConfig(
        eval_every_n_steps=100, max_steps=steps, pbar_description=None)).with_loss_fn(loss_fn, has_aux=True)
    trainer.train([inputs] * steps)  # the same batch each step: its loss before each update is logged
    logged = np.asarray(trainer.metrics_logger.get_metric_history("", "loss", "train"))
    after, parts_after = loss_fn(model, **inputs)  # the model was trained in place
    assert len(logged) >= steps - 1 and np.all(np.isfinite(logged)), logged
    np.testing.assert_allclose(logged[0], before, rtol=1e-5)
    assert np.all(np.diff(logged) < 0) and float(after) < logged[-1], (logged, float(after))
    assert float(parts_after["ntl"]) < float(parts_before["ntl"])


@pytest.mark.parametrize("number_loss", ["ntil", "squared_gap"])
def test_ntil_and_a_registered_loss_train_in_the_peft_trainer(number_loss):
    registered_loss()
    model, inputs = qwen2_model(tied=True), batch(seed=6)
    loss_fn = ntl_tunix.number_token_loss_fn(NUMBERS, number_loss=number_loss, ntl_weight=0.3, fused=True)
    before, parts = loss_fn(model, **inputs)
    assert float(parts["ntl"]) > 0
    steps = 4
    trainer = peft_trainer.PeftTrainer(model, optax.adam(3e-3), peft_trainer.TrainingConfig(
        eval_every_n_steps=100, max_steps=steps, pbar_description=None)).with_loss_fn(loss_fn, has_aux=True)
    trainer.train([inputs] * steps)
    logged = np.asarray(trainer.metrics_logger.get_metric_history("", "loss", "train"))
    np.testing.assert_allclose(logged[0], before, rtol=1e-5)
    assert np.all(np.isfinite(logged)) and float(loss_fn(model, **inputs)[0]) < logged[0], logged


def test_old_keywords_are_refused_with_the_new_form_named():
    with pytest.raises(TypeError, match=r"number_token_loss_fn\(\) no longer takes ntl_kind=.*number_loss="):
        ntl_tunix.number_token_loss_fn(NUMBERS, ntl_kind="was")
    with pytest.raises(TypeError, match=r"no longer takes squash_factor=.*ntl_jax.losses.was\(squash_factor="):
        ntl_tunix.number_token_loss_fn(NUMBERS, squash_factor=2.0)
    with pytest.raises(TypeError, match=r"no longer takes reweigh=.*was\(reweigh=True\)"):
        ntl_tunix.number_token_loss_fn(NUMBERS, number_loss="was", reweigh=True)
    with pytest.raises(TypeError, match=r"no longer takes smmd_sigma=.*smmd\(sigma="):
        ntl_tunix.number_token_loss_fn(NUMBERS, number_loss="smmd", smmd_sigma=1.0)


def test_a_bad_number_loss_is_refused_when_the_loss_is_made():
    with pytest.raises(ValueError, match="nope"):
        ntl_tunix.number_token_loss_fn(NUMBERS, number_loss="nope")
    with pytest.raises(TypeError, match="expected_value_loss"):
        ntl_tunix.number_token_loss_fn(NUMBERS, number_loss=lambda p, y: (p - y) ** 2)


def test_no_number_loss_is_cross_entropy_alone():
    model, inputs = LINEAR_HEADS["llama3"](), batch(seed=1)
    loss, parts = ntl_tunix.number_token_loss_fn(NUMBERS, number_loss=None)(model, **inputs)
    np.testing.assert_allclose(loss, peft_trainer._default_loss_fn(model, **inputs), rtol=2e-6)
    assert float(parts["ntl"]) == float(parts["ntl_term"]) == 0.0
