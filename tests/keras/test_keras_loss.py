"""`ntl_jax.keras.NumberTokenLoss` is `ntl_jax.cross_entropy_and_ntl` on a KerasHub
`CausalLM`'s logits, under each of Keras's reductions, and Keras's own sparse
categorical cross-entropy at `ntl_weight=0`."""

import pytest

keras_hub = pytest.importorskip("keras_hub")

import jax
import jax.numpy as jnp
import keras
import numpy as np

import ntl_jax
import ntl_jax.keras as ntl_keras
from tests.keras import builders

FAMILIES = ("gemma", "llama3", "qwen")
# Keras's reduction -> the objective's loss-normalising factor (a function of the batch).
FACTORS = {
    "sum_over_batch_size": lambda targets, weights: float(targets.size),
    "mean_with_sample_weight": lambda targets, weights: "NUM_REAL_TARGET_TOKENS",
    "sum": lambda targets, weights: None,
}


@pytest.fixture(scope="module", params=FAMILIES)
def batch(request):
    """`(family, tokenizer, logits, y, sample_weight)` of a tiny `CausalLM` of each family."""
    causal_lm, tokenizer = builders.causal_lm(request.param)
    x, y, sample_weight = causal_lm.preprocessor(builders.LINES[:4])
    logits = causal_lm(x)
    return request.param, tokenizer, jnp.asarray(logits), jnp.asarray(y), jnp.asarray(sample_weight)


@pytest.mark.parametrize(("reduction", "number_loss"), [
    *((reduction, "was") for reduction in FACTORS), ("sum_over_batch_size", ntl_jax.losses.smmd(mode="mmd")),
    ("sum", "del")])
def test_the_loss_is_the_objective(batch, reduction, number_loss):
    """With no λ given on either side: the loss's own, its term normalised as its
    authors', beside Keras's cross-entropy under each reduction."""
    _, tokenizer, logits, y, sample_weight = batch
    table = ntl_keras.number_tokens(tokenizer)
    loss = ntl_keras.NumberTokenLoss(tokenizer, number_loss=number_loss, reduction=reduction)
    assert loss.ntl_weight == ntl_jax.losses.resolve(number_loss).default_weight
    weights = sample_weight.astype(jnp.float32)

    def objective(logits):
        return ntl_jax.cross_entropy_and_ntl(logits, y, table, weights=weights, number_loss=number_loss,
                                             loss_normalizing_factor=FACTORS[reduction](y, weights))[0]

    def keras_loss(logits):
        return loss(y, logits, sample_weight)

    expected, expected_grad = jax.value_and_grad(objective)(logits)
    # Keras's trainer jits the loss: once, at Keras's default reduction.
    for fn in (keras_loss, jax.jit(keras_loss)) if reduction == "sum_over_batch_size" else (keras_loss,):
        value, grad = jax.value_and_grad(fn)(logits)
        np.testing.assert_allclose(value, expected, rtol=1e-6)
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-9)
    assert value.dtype == jnp.float32
    _, parts = loss.loss_and_parts(y, logits, sample_weight)
    assert float(parts["ntl_weight_sum"]) > 0  # the batch has number targets


def test_weight_zero_is_keras_sparse_categorical_cross_entropy(batch):
    _, tokenizer, logits, y, sample_weight = batch
    for reduction in FACTORS:
        ours = ntl_keras.NumberTokenLoss(tokenizer, ntl_weight=0.0, reduction=reduction)
        keras_own = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
        for weight in (sample_weight, None):
            np.testing.assert_allclose(ours(y, logits, weight), keras_own(y, logits, weight), rtol=2e-6,
                                       err_msg=reduction)
        # Mixed precision: bf16 logits, the loss in float32.
        bf16 = logits.astype(jnp.bfloat16)
        np.testing.assert_allclose(ours(y, bf16, sample_weight), keras_own(y, bf16, sample_weight), rtol=1e-5,
                                   err_msg=reduction)


def test_number_tokens_of_each_tokenizer():
    gemma = ntl_keras.number_tokens(builders.gemma_tokenizer())
    qwen = ntl_keras.number_tokens(builders.qwen_tokenizer())
    llama3 = ntl_keras.number_tokens(builders.llama3_tokenizer())
    assert sorted(gemma.number_values.tolist()) == sorted(qwen.number_values.tolist()) == list(range(10))
    # Llama 3 writes up to three digits per token: every such piece is a number token.
    assert sorted(llama3.number_values.tolist()) == sorted([*range(10), 12, 10, 100, 99, 999, 36, 7])
    assert llama3.digit_counts[builders.llama3_tokenizer().token_to_id("07")] == 2
    only_digits = ntl_keras.number_tokens(builders.llama3_tokenizer(), digit_level=True)
    assert sorted(only_digits.number_values.tolist()) == list(range(10))
    assert ntl_keras.number_tokens(gemma) is gemma


def test_the_config_keeps_the_loss():
    tokenizer = builders.llama3_tokenizer()
    loss = ntl_keras.NumberTokenLoss(tokenizer, number_loss="smmd(mode=mmd)", ntl_weight=0.5, z_loss=1e-4,
                                     reduction="mean_with_sample_weight", ignore_class=0)
    config = loss.get_config()
    assert config["number_loss"] == "smmd(mode=mmd)" and config["ntl_weight"] == 0.5
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss))
    assert type(again) is ntl_keras.NumberTokenLoss
    assert again.get_config() == config
    for name in ("values", "ids", "number_values", "digit_counts", "opens_number"):
        np.testing.assert_array_equal(getattr(again.number_tokens, name), getattr(loss.number_tokens, name))
    assert again.number_tokens.dot_id == loss.number_tokens.dot_id
    none = ntl_keras.NumberTokenLoss(tokenizer, number_loss=None)
    assert ntl_keras.NumberTokenLoss.from_config(none.get_config()).number_loss is None


def test_a_number_loss_of_your_own_is_not_saved_by_a_spec_it_cannot_read_back():
    shipped = ntl_jax.losses.was()
    own = ntl_jax.NumberLoss(name="mine", reads=shipped.reads, loss=shipped.loss)
    loss = ntl_keras.NumberTokenLoss(builders.qwen_tokenizer(), number_loss=own)
    with pytest.raises(ValueError, match=r"'mine' has no spec that parse reads back .*losses.register"):
        loss.get_config()


def test_ignore_class_counts_for_nothing(batch):
    _, tokenizer, logits, y, sample_weight = batch
    marked = jnp.where(sample_weight, y, -100)
    ours = ntl_keras.NumberTokenLoss(tokenizer, ignore_class=-100)(marked, logits)
    # As Keras's sparse cross-entropy, an ignored label is masked: the default reduction
    # divides by the labels kept, here the sum of the 0/1 padding mask.
    weighted = ntl_keras.NumberTokenLoss(tokenizer, reduction="mean_with_sample_weight")
    np.testing.assert_allclose(ours, weighted(y, logits, sample_weight), rtol=1e-6)
