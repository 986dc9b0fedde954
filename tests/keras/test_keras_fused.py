"""`FusedNumberTokenLossModel` trains a `CausalLM` as `NumberTokenLoss` on its logits
does, never forming them."""

import pytest

keras_hub = pytest.importorskip("keras_hub")

import keras
import numpy as np

import ntl_jax.keras as ntl_keras
from tests.keras import builders


@pytest.mark.parametrize("family", ["gemma", "llama3"])  # a tied and an untied output embedding
def test_a_fused_step_is_a_step_on_the_logits(family):
    trained = []
    for fused in (False, True):
        causal_lm, tokenizer = builders.causal_lm(family, seed=1)
        causal_lm.backbone.enable_lora(rank=2)
        x, y, sample_weight = causal_lm.preprocessor(builders.LINES[:8])
        loss = ntl_keras.NumberTokenLoss(tokenizer, ntl_weight=0.5)
        model = ntl_keras.FusedNumberTokenLossModel(causal_lm, loss, chunk_size=8) if fused else causal_lm
        model.compile(loss=None if fused else loss, optimizer=keras.optimizers.SGD(0.5))
        if not fused:
            causal_lm.preprocessor = None  # the same preprocessed batch for both
        before = model.evaluate(x, y, sample_weight=sample_weight, batch_size=8, verbose=0, return_dict=True)
        history = model.fit(x, y, sample_weight=sample_weight, batch_size=8, epochs=1, verbose=0)
        trained.append((before["loss"], history.history, [np.asarray(v) for v in causal_lm.trainable_weights]))
    (logits_loss, _, logits_weights), (fused_loss, fused_history, fused_weights) = trained
    np.testing.assert_allclose(fused_loss, logits_loss, rtol=1e-5)
    assert len(fused_weights) == len(logits_weights) > 0
    for a, b in zip(fused_weights, logits_weights):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert np.isfinite(fused_history["ntl"][0]) and fused_history["ntl"][0] > 0


def test_a_soft_capped_head_is_refused():
    tokenizer = builders.gemma_tokenizer()
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=tokenizer.vocabulary_size(), num_layers=1, num_query_heads=2, num_key_value_heads=1,
        hidden_dim=16, intermediate_dim=32, head_dim=8, final_logit_soft_cap=30.0)
    causal_lm = keras_hub.models.GemmaCausalLM(backbone=backbone)
    with pytest.raises(ValueError, match="without a soft cap, got GemmaBackbone with logit_soft_cap=30.0"):
        ntl_keras.FusedNumberTokenLossModel(causal_lm, ntl_keras.NumberTokenLoss(tokenizer))
    with pytest.raises(TypeError, match="expected loss to be a NumberTokenLoss"):
        ntl_keras.FusedNumberTokenLossModel(causal_lm, keras.losses.SparseCategoricalCrossentropy())
