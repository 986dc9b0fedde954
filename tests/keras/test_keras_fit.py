"""`fit` with LoRA, the number metrics in `History`, and a saved model that comes back
with its loss."""

import pytest

keras_hub = pytest.importorskip("keras_hub")

import keras
import numpy as np

import ntl_jax
import ntl_jax.keras as ntl_keras
from tests.keras import builders
from tests.objective_options import registered_loss


def test_fit_with_lora_logs_the_number_metrics_and_saves_the_loss(tmp_path):
    causal_lm, tokenizer = builders.causal_lm("gemma")  # Llama 3 fits in test_keras_fused.py
    causal_lm.backbone.enable_lora(rank=2)
    loss = ntl_keras.NumberTokenLoss(tokenizer, number_loss="smmd(sigma=3)", ntl_weight=0.5)
    causal_lm.compile(loss=loss, optimizer=keras.optimizers.Adam(1e-2),
                      weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(),
                                        *ntl_keras.number_metrics(tokenizer)])
    history = causal_lm.fit(x=builders.LINES[:32], validation_data=(builders.LINES[32:40],), batch_size=8,
                            epochs=2, verbose=0)
    for name in ("loss", "ntl", "number_accuracy", "number_abs_error", "val_ntl", "val_number_abs_error"):
        assert len(history.history[name]) == 2 and all(np.isfinite(history.history[name])), name
    assert 0.0 <= history.history["number_accuracy"][-1] <= 1.0
    assert history.history["loss"][-1] < history.history["loss"][0]
    # Only the adapters train.
    assert all("lora" in variable.path for variable in causal_lm.trainable_weights)

    path = tmp_path / "model.keras"
    causal_lm.save(path)
    loaded = ntl_keras.load_model(path)
    assert type(loaded.loss) is ntl_keras.NumberTokenLoss
    assert loaded.loss.number_loss.spec == "smmd(sigma=3.0)" and loaded.loss.ntl_weight == 0.5
    np.testing.assert_array_equal(loaded.loss.number_tokens.values, loss.number_tokens.values)
    np.testing.assert_array_equal(loaded.loss.number_tokens.digit_counts, loss.number_tokens.digit_counts)
    data = builders.LINES[32:40]
    before = causal_lm.evaluate(x=data, batch_size=8, verbose=0, return_dict=True)
    after = loaded.evaluate(x=data, batch_size=8, verbose=0, return_dict=True)
    assert after.keys() == before.keys()
    for name in before:
        np.testing.assert_allclose(after[name], before[name], rtol=1e-5, err_msg=name)


def test_the_metrics_are_means_over_the_number_targets():
    tokenizer = builders.qwen_tokenizer()
    table = ntl_keras.number_tokens(tokenizer)
    three, four, word = (tokenizer.token_to_id(piece) for piece in ("3", "4", "Ġis"))
    y = np.array([[three, word, four]])
    logits = np.full((1, 3, table.vocab_size), -30.0, np.float32)
    logits[0, 0, three] = logits[0, 1, word] = 0.0  # right at "3", and at the word
    logits[0, 2, tokenizer.token_to_id("6")] = 0.0  # "6" where "4" is the target
    weights = np.array([[1.0, 1.0, 1.0]])
    accuracy, error, ntl = (ntl_keras.NumberAccuracy(table), ntl_keras.NumberAbsoluteError(table),
                            ntl_keras.NumberTokenLossMetric(table))
    for metric in (accuracy, error, ntl):
        metric.update_state(y, logits, sample_weight=weights)
    np.testing.assert_allclose(accuracy.result(), 0.5)  # one of the two number targets
    np.testing.assert_allclose(error.result(), 1.0, atol=1e-5)  # |3 - 3| and |6 - 4|, averaged
    np.testing.assert_allclose(ntl.result(), 1.0, atol=1e-5)  # NTL-WAS at one-hot predictions: the same
    ntl.update_state(y, logits, sample_weight=np.array([[0.0, 1.0, 0.0]]))  # no number target counts
    np.testing.assert_allclose(ntl.result(), 1.0, atol=1e-5)
    ntl.reset_state()
    assert float(ntl.result()) == 0.0


@pytest.mark.parametrize("number_loss", ["ntil", "squared_gap"])
def test_ntil_and_a_registered_loss_fit_and_come_back_from_a_saved_model(tmp_path, number_loss):
    value = registered_loss() if number_loss == "squared_gap" else ntl_jax.losses.ntil()
    causal_lm, tokenizer = builders.causal_lm("gemma")  # digits one token each, as NTIL reads them
    causal_lm.compile(loss=ntl_keras.NumberTokenLoss(tokenizer, number_loss=number_loss),
                      optimizer=keras.optimizers.Adam(1e-2), weighted_metrics=ntl_keras.number_metrics(tokenizer))
    history = causal_lm.fit(x=builders.LINES[:16], batch_size=8, epochs=2, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    path = tmp_path / "model.keras"
    causal_lm.save(path)
    loaded = ntl_keras.load_model(path)
    assert loaded.loss.number_loss is value
    data = builders.LINES[32:40]
    before = causal_lm.evaluate(x=data, batch_size=8, verbose=0, return_dict=True)
    after = loaded.evaluate(x=data, batch_size=8, verbose=0, return_dict=True)
    for name in before:
        np.testing.assert_allclose(after[name], before[name], rtol=1e-5, err_msg=name)
