"""Each misuse is a clear error: a backend other than JAX, a tokenizer without number
tokens, a label outside the vocabulary (never a smaller loss), a reduction the loss has
no form for."""

import os
import subprocess
import sys
import textwrap

import pytest

keras_hub = pytest.importorskip("keras_hub")

import jax
import jax.numpy as jnp
import keras
import numpy as np

import ntl_jax
import ntl_jax.keras as ntl_keras
from tests.keras import builders

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code, backend):
    env = dict(os.environ, KERAS_BACKEND=backend, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_ntl_jax_never_imports_keras_and_another_backend_is_refused():
    result = _run("""
        import sys
        import ntl_jax
        assert "keras" not in sys.modules, "import ntl_jax imported keras"
        import ntl_jax.keras as ntl_keras
        table = ntl_jax.NumberTokens.from_pieces(["<pad>", "a", *"0123456789"])
        for make in (lambda: ntl_keras.NumberTokenLoss(table), lambda: ntl_keras.NumberAccuracy(table)):
            try:
                make()
            except RuntimeError as error:
                print("refused:", error)
    """, backend="numpy")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("expected the Keras backend 'jax', got 'numpy'; set KERAS_BACKEND=jax") == 2, (
        result.stdout)


@pytest.mark.parametrize("build", [builders.gemma_tokenizer, builders.llama3_tokenizer, builders.qwen_tokenizer])
def test_a_tokenizer_without_digits_is_refused(build):
    tokenizer = build(digits=False)
    with pytest.raises(ValueError, match=f"{type(tokenizer).__name__} has no number tokens to weigh: expected at "
                                         "least one number token"):
        ntl_keras.NumberTokenLoss(tokenizer)
    with pytest.raises(TypeError, match="expected a KerasHub tokenizer"):
        ntl_keras.number_tokens(object())


def _labels_out_of_range():
    causal_lm, tokenizer = builders.causal_lm("qwen")
    x, y, sample_weight = causal_lm.preprocessor(builders.LINES[:2])
    logits = jnp.asarray(causal_lm(x))
    bad = np.array(y).copy()
    bad[1, 3] = logits.shape[-1] + 5  # an id off by an offset, in a counted position
    return causal_lm, tokenizer, logits, bad, sample_weight


def test_a_label_out_of_range_raises_eagerly_under_jit_and_in_fit():
    causal_lm, tokenizer, logits, bad, sample_weight = _labels_out_of_range()
    loss = ntl_keras.NumberTokenLoss(tokenizer)
    vocab = logits.shape[-1]
    with pytest.raises(ValueError, match=rf"expected target ids in \[0, {vocab}\).* got 1 out of range: {vocab + 5}"):
        loss(bad, logits, sample_weight)
    with pytest.raises(Exception, match=rf"expected label token ids in \[0, {vocab}\) .*the first {vocab + 5}"):
        jax.block_until_ready(jax.jit(loss)(bad, logits, sample_weight))
    causal_lm.preprocessor = None  # the batches as they are, labels included
    causal_lm.compile(loss=loss, optimizer="sgd")
    x = {"token_ids": np.array(bad), "padding_mask": np.ones_like(bad, bool)}
    with pytest.raises(Exception, match=r"expected label token ids in \[0, "):
        causal_lm.fit(x=x, y=bad, sample_weight=np.asarray(sample_weight), batch_size=2, epochs=1, verbose=0)


def test_where_the_host_cannot_raise_the_traced_loss_is_nan(monkeypatch):
    from ntl_jax.keras import labels

    monkeypatch.setattr(labels, "_raise_if_out_of_range", lambda *args: None)
    check = jax.jit(lambda targets: labels.checked(jnp.float32(1.0), targets, 5))
    assert float(check(jnp.array([[1, 2, 4]]))) == 1.0
    assert np.isnan(float(check(jnp.array([[1, 2, 9]]))))
    assert np.isnan(float(check(jnp.array([[-1, 2, 3]]))))


def test_bad_arguments_are_refused_at_construction():
    table = ntl_jax.NumberTokens.from_pieces(["<pad>", "a", *"0123456789"])
    with pytest.raises(ValueError, match="expected reduction in .* the loss has no per-token form"):
        ntl_keras.NumberTokenLoss(table, reduction="none")
    with pytest.raises(ValueError, match="no parameter 'sigm'"):
        ntl_keras.NumberTokenLoss(table, number_loss="smmd(sigm=2)")
    with pytest.raises(ValueError, match="expected ntl_weight >= 0.0"):
        ntl_keras.NumberTokenLoss(table, ntl_weight=-1.0)
    with pytest.raises(ValueError, match=r"expected y_true of token ids, shape \[batch, length\]"):
        ntl_keras.NumberTokenLoss(table)(jnp.zeros((2,), jnp.int32), jnp.zeros((2, 3, 12)))
    assert keras.backend.backend() == "jax"
