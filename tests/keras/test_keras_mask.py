"""The mask Keras attaches to the logits (`Embedding(mask_zero=True)`) is honoured as
Keras's own losses and metrics honour it, merged with `sample_weight`: at
`ntl_weight=0` the loss is Keras's `SparseCategoricalCrossentropy(from_logits=True)`
under each reduction, and at 0.3 a plain NumPy CE + 0.3 x NTL-WAS over the kept
positions, called directly, in `evaluate` and in `train_on_batch`."""

import pytest

keras = pytest.importorskip("keras")

import jax
import numpy as np
from keras.src.backend import get_keras_mask

import ntl_jax
import ntl_jax.keras as ntl_keras

PIECES = ["<pad>", "a", "b", "+", "=", *"0123456789"]
VALUES = np.array([np.nan] * 5 + list(range(10)), np.float64)  # each id's value, NaN: not a number
REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight", "sum")
BATCH, LENGTH = 4, 7


def _model():
    keras.utils.set_random_seed(0)
    ids = keras.Input((LENGTH,), dtype="int32")
    wide = keras.initializers.RandomNormal(stddev=1.0)  # so that the logits, and each position's loss, differ
    hidden = keras.layers.Embedding(len(PIECES), 8, mask_zero=True, embeddings_initializer=wide)(ids)
    logits = keras.layers.Dense(len(PIECES), kernel_initializer=wide)(hidden)
    return keras.Model(ids, logits)


@pytest.fixture(scope="module")
def data():
    """`(model, initial weights, table, x, y, sample_weight, mask)`: inputs padded with id 0
    (masked by the embedding), labels number tokens and others, on the padding too."""
    rng = np.random.default_rng(0)
    x = rng.integers(1, len(PIECES), (BATCH, LENGTH)).astype("int32")
    for row, length in enumerate((4, 2, LENGTH, 6)):
        x[row, length:] = 0
    y = rng.integers(0, len(PIECES), (BATCH, LENGTH)).astype("int32")
    y[:, ::2] = rng.integers(5, len(PIECES), (BATCH, (LENGTH + 1) // 2))  # number targets on every other position
    sample_weight = rng.uniform(0.25, 2.0, (BATCH, LENGTH)).astype("float32")
    model = _model()
    table = ntl_jax.NumberTokens.from_pieces(PIECES)
    return model, model.get_weights(), table, x, y, sample_weight, x != 0


def reference(logits, y, sample_weight, mask, reduction, ntl_weight):
    """CE + ntl_weight x NTL-WAS in float64 with Keras's mask: `w = sample_weight x mask`,
    CE's weighted sum and NTL-WAS's mean over the kept number targets times `sum(w)`, over
    the reduction's divisor (the count kept, the sum of `w`, or 1)."""
    logits = np.asarray(logits, np.float64)
    w = (np.ones(y.shape) if sample_weight is None else np.asarray(sample_weight, np.float64)) * mask
    shifted = logits - logits.max(-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    ce = -np.take_along_axis(log_p, y[..., None], -1)[..., 0]
    numbers = ~np.isnan(VALUES)
    number_logits = logits[..., numbers] - logits[..., numbers].max(-1, keepdims=True)
    p = np.exp(number_logits) / np.exp(number_logits).sum(-1, keepdims=True)
    target = VALUES[y]
    is_number = ~np.isnan(target)
    was = np.sum(p * np.abs(VALUES[numbers] - np.where(is_number, target, 0.0)[..., None]), -1)
    counted = w * is_number
    ntl = np.sum(was * counted) / np.sum(counted)
    divisor = {"sum_over_batch_size": mask.sum(), "mean": mask.sum(), "mean_with_sample_weight": w.sum(),
               "sum": 1.0}[reduction]
    return (np.sum(ce * w) + ntl_weight * ntl * w.sum()) / divisor


def _compiled(data, loss, **kwargs):
    model, initial, *_ = data
    model.set_weights(initial)
    model.compile(loss=loss, optimizer=keras.optimizers.SGD(0.5), **kwargs)
    return model


def test_the_mask_arrives_on_the_logits(data):
    model, _, _, x, _, _, mask = data
    np.testing.assert_array_equal(get_keras_mask(model(x)), mask)
    assert 0 < mask.sum() < mask.size


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_called_directly_it_is_keras_sparse_cross_entropy_at_weight_zero(data, reduction):
    model, initial, table, x, y, sample_weight, mask = data
    model.set_weights(initial)
    ours = ntl_keras.NumberTokenLoss(table, ntl_weight=0.0, reduction=reduction)
    keras_own = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
    logits = model(x)
    unmasked = np.asarray(logits)  # the same logits without the mask
    for weight in (sample_weight, None):
        expected = float(keras_own(y, logits, weight))
        np.testing.assert_allclose(float(ours(y, logits, weight)), expected, rtol=2e-6)
        np.testing.assert_allclose(expected, reference(unmasked, y, weight, mask, reduction, 0.0), rtol=1e-5)
        # Read where Keras reads it: inside a jitted step, from the traced logits.
        jitted = jax.jit(lambda x, weight: ours(y, model(x), weight))(x, weight)
        np.testing.assert_allclose(float(jitted), expected, rtol=2e-6)
        # The mask matters on this batch: without it, a different number.
        assert abs(float(ours(y, unmasked, weight)) - expected) > 1e-2 * expected


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_called_directly_it_is_the_numpy_reference_at_weight_0_3(data, reduction):
    model, initial, table, x, y, sample_weight, mask = data
    model.set_weights(initial)
    loss = ntl_keras.NumberTokenLoss(table, number_loss="was", ntl_weight=0.3, reduction=reduction)
    logits = model(x)
    for weight in (sample_weight, None):
        expected = reference(np.asarray(logits), y, weight, mask, reduction, 0.3)
        np.testing.assert_allclose(float(loss(y, logits, weight)), expected, rtol=1e-5)
        unmasked = reference(np.asarray(logits), y, weight, np.ones_like(mask), reduction, 0.3)
        assert abs(unmasked - expected) > 1e-2 * expected


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_evaluate_and_train_on_batch_mask_as_keras(data, reduction):
    """`compile(loss=...)`: `evaluate`'s loss, `train_on_batch`'s loss and the weights after
    one step equal Keras's sparse cross-entropy's at weight 0; at 0.3, the reference."""
    model, initial, table, x, y, sample_weight, mask = data
    model.set_weights(initial)
    logits = np.asarray(model(x))
    keras_own = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
    expected = _compiled(data, keras_own).evaluate(x, y, sample_weight=sample_weight, batch_size=BATCH, verbose=0)
    keras_step = _compiled(data, keras_own).train_on_batch(x, y, sample_weight=sample_weight)
    keras_weights = model.get_weights()

    ours = ntl_keras.NumberTokenLoss(table, ntl_weight=0.0, reduction=reduction)
    np.testing.assert_allclose(
        _compiled(data, ours).evaluate(x, y, sample_weight=sample_weight, batch_size=BATCH, verbose=0), expected,
        rtol=2e-6)
    np.testing.assert_allclose(_compiled(data, ours).train_on_batch(x, y, sample_weight=sample_weight), keras_step,
                               rtol=2e-6)
    for got, want in zip(model.get_weights(), keras_weights):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(expected, reference(logits, y, sample_weight, mask, reduction, 0.0), rtol=1e-5)

    with_ntl = ntl_keras.NumberTokenLoss(table, number_loss="was", ntl_weight=0.3, reduction=reduction)
    want = reference(logits, y, sample_weight, mask, reduction, 0.3)
    np.testing.assert_allclose(
        _compiled(data, with_ntl).evaluate(x, y, sample_weight=sample_weight, batch_size=BATCH, verbose=0), want,
        rtol=1e-5)
    np.testing.assert_allclose(_compiled(data, with_ntl).train_on_batch(x, y, sample_weight=sample_weight), want,
                               rtol=1e-5)


def test_the_number_metrics_leave_out_what_the_mask_leaves_out(data):
    model, initial, table, x, y, sample_weight, mask = data
    model.set_weights(initial)
    logits = np.asarray(model(x), np.float64)
    compiled = _compiled(data, ntl_keras.NumberTokenLoss(table),
                         weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(),
                                           *ntl_keras.number_metrics(table)])
    got = compiled.evaluate(x, y, sample_weight=sample_weight, batch_size=BATCH, verbose=0, return_dict=True)
    w = sample_weight * mask * ~np.isnan(VALUES[y])
    ntl_alone = reference(logits, y, sample_weight, mask, "sum", 1.0) - reference(logits, y, sample_weight, mask,
                                                                                 "sum", 0.0)
    np.testing.assert_allclose(got["ntl"], ntl_alone / np.sum(sample_weight * mask), rtol=1e-5)
    right = logits.argmax(-1) == y
    np.testing.assert_allclose(got["number_accuracy"], np.sum(w * right) / np.sum(w), rtol=1e-6)
    numbers = ~np.isnan(VALUES)
    p = np.exp(logits[..., numbers] - logits[..., numbers].max(-1, keepdims=True))
    expected_value = (p / p.sum(-1, keepdims=True)) @ VALUES[numbers]
    error = np.abs(expected_value - np.nan_to_num(VALUES[y]))
    np.testing.assert_allclose(got["number_abs_error"], np.sum(w * error) / np.sum(w), rtol=1e-5)
    # Keras's own metric reads the mask the same way: the kept positions' weights.
    kept = sample_weight * mask
    np.testing.assert_allclose(got["sparse_categorical_accuracy"], np.sum(kept * right) / np.sum(kept), rtol=1e-6)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_ignore_class_masks_as_keras_sparse_cross_entropy(data, reduction):
    """Keras's sparse cross-entropy masks an ignored label (its output's mask), which the
    reduction then counts out as the logits' mask; with the mask too, both at once."""
    model, initial, table, x, y, sample_weight, mask = data
    model.set_weights(initial)
    marked = np.where(np.arange(y.size).reshape(y.shape) % 3 == 1, -100, y)
    ours = ntl_keras.NumberTokenLoss(table, ntl_weight=0.0, ignore_class=-100, reduction=reduction)
    keras_own = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-100,
                                                           reduction=reduction)
    masked = model(x)
    for logits in (masked, np.asarray(masked)):
        for weight in (sample_weight, None):
            np.testing.assert_allclose(float(ours(marked, logits, weight)), float(keras_own(marked, logits, weight)),
                                       rtol=2e-6)
