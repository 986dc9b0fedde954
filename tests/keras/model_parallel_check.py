"""Run as a script on 8 host devices: `NumberTokenLoss` in `fit` and `evaluate` of a
Gemma-like `CausalLM` under `keras.distribution.ModelParallel`, with KerasHub's own
layout map (the embedding, so the vocabulary and the logits' last axis, over "model"),
equal to one device's: the loss, the metrics, and the weights after a step."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests import xla_flags  # noqa: E402

os.environ["XLA_FLAGS"] = xla_flags.host_devices(8)
os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402

import ntl_jax.keras as ntl_keras  # noqa: E402
from tests.keras import builders  # noqa: E402

# The model's vocabulary, rounded up past the tokenizer's to divide over "model" (4); the
# ids past the tokenizer's are no numbers.
VOCAB = 40


def build():
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GemmaBackbone(vocabulary_size=VOCAB, num_layers=1, num_query_heads=4,
                                              num_key_value_heads=4, hidden_dim=16, intermediate_dim=32, head_dim=4)
    return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)


def step(causal_lm, tokenizer, x, y, sample_weight):
    """`(evaluate's logs, the weights after one SGD step)`."""
    causal_lm.compile(loss=ntl_keras.NumberTokenLoss(tokenizer, ntl_weight=0.3), optimizer=keras.optimizers.SGD(0.5),
                      weighted_metrics=ntl_keras.number_metrics(tokenizer))
    logs = causal_lm.evaluate(x, y, sample_weight=sample_weight, batch_size=8, verbose=0, return_dict=True)
    causal_lm.fit(x, y, sample_weight=sample_weight, batch_size=8, epochs=1, verbose=0)
    return logs, [np.asarray(w) for w in causal_lm.get_weights()]


def main():
    assert jax.device_count() == 8, jax.devices()
    tokenizer = builders.gemma_tokenizer()
    preprocessor = keras_hub.models.GemmaCausalLMPreprocessor(tokenizer, sequence_length=16)
    x, y, sample_weight = preprocessor(builders.LINES[:8])
    single = build()
    weights = single.get_weights()
    single_logs, single_after = step(single, tokenizer, x, y, sample_weight)

    mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices=keras.distribution.list_devices())
    layout_map = keras_hub.models.GemmaBackbone.get_layout_map(mesh, model_parallel_dim_name="model",
                                                               data_parallel_dim_name="batch")
    distribution = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    with distribution.scope():
        sharded = build()
        sharded.set_weights(weights)
        embedding = sharded.backbone.token_embedding.embeddings.value
        assert embedding.sharding.spec[0] == "model", embedding.sharding  # the vocabulary over "model"
        sharded_logs, sharded_after = step(sharded, tokenizer, x, y, sample_weight)

    assert sharded_logs.keys() == single_logs.keys()
    for name, value in single_logs.items():
        np.testing.assert_allclose(sharded_logs[name], value, rtol=1e-5, err_msg=name)
    for a, b in zip(sharded_after, single_after):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    print("model parallel equals one device:", {name: round(value, 6) for name, value in sharded_logs.items()})


if __name__ == "__main__":
    main()
