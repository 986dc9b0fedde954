"""NTL model subclasses against the stock T5X models (skipped without t5x)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("t5x.models", reason="t5x is not installed (it is not on PyPI; see the README)")

import seqio  # noqa: E402
from t5x import adafactor  # noqa: E402
from t5x import losses as t5x_losses  # noqa: E402
from t5x import models as t5x_models  # noqa: E402
from t5x.examples.decoder_only import network as decoder_only_network  # noqa: E402
from t5x.examples.t5 import network as t5_network  # noqa: E402

import ntl_jax  # noqa: E402
from ntl_jax import losses  # noqa: E402
from ntl_jax.t5x import models as ntl_models  # noqa: E402
from tests.objective_options import SQUARED_DISTANCE, registered_loss

VOCAB = seqio.ByteVocabulary()  # 259 ids, digits '0'..'9' are 51..60
MODEL_VOCAB_SIZE = 384  # the network rounds up, as T5X configs do
DIGIT_IDS = np.arange(51, 61)
FACTORS = [None, 233472.0, "NUM_REAL_TARGET_TOKENS", "NUM_TOTAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE"]


def _encdec_module():
    config = t5_network.T5Config(
        vocab_size=MODEL_VOCAB_SIZE, dtype="float32", emb_dim=16, num_heads=2, num_encoder_layers=1,
        num_decoder_layers=1, head_dim=8, mlp_dim=32, mlp_activations=("gelu", "linear"),
        dropout_rate=0.0, logits_via_embedding=False,
    )
    return t5_network.Transformer(config)


def _decoder_module():
    config = decoder_only_network.TransformerConfig(
        vocab_size=MODEL_VOCAB_SIZE, dtype="float32", emb_dim=16, num_heads=2, num_layers=1, head_dim=8,
        mlp_dim=32, mlp_activations=("gelu", "linear"), dropout_rate=0.0, logits_via_embedding=True,
    )
    return decoder_only_network.DecoderWrapper(config)


def _encdec(cls, **kwargs):
    return cls(
        module=_encdec_module(), input_vocabulary=VOCAB, output_vocabulary=VOCAB,
        optimizer_def=adafactor.Adafactor(decay_rate=0.8), **kwargs,
    )


def _decoder_only(cls, **kwargs):
    return cls(module=_decoder_module(), vocabulary=VOCAB, optimizer_def=adafactor.Adafactor(decay_rate=0.8), **kwargs)


def _targets_row(rng, lengths, total):
    """One row of packed sequences: mostly digits, some letters, EOS (1) at each end."""
    tokens, segments, positions = [], [], []
    for seg, n in enumerate(lengths, start=1):
        body = np.where(rng.random(n - 1) < 0.7, rng.choice(DIGIT_IDS, n - 1), rng.integers(100, 120, n - 1))
        tokens += list(body) + [1]
        segments += [seg] * n
        positions += list(range(n))
    pad = total - len(tokens)
    return (np.array(tokens + [0] * pad), np.array(segments + [0] * pad), np.array(positions + [0] * pad))


def _batch(packed, seed=0, with_weights=True):
    """A [3, 10] encoder-decoder batch; packed rows hold two or three sequences."""
    rng = np.random.default_rng(seed)
    layouts = [[4, 3], [5, 2, 3], [10]] if packed else [[6], [9], [3]]
    rows = [_targets_row(rng, lengths, 10) for lengths in layouts]
    targets = np.stack([r[0] for r in rows]).astype(np.int32)
    segment_ids = np.stack([r[1] for r in rows]).astype(np.int32)
    positions = np.stack([r[2] for r in rows]).astype(np.int32)
    # decoder inputs: targets shifted right within each segment, 0 (BOS) at each start.
    inputs = np.where(positions == 0, 0, np.roll(targets, 1, axis=1)) * (segment_ids > 0)
    batch = {
        "encoder_input_tokens": rng.integers(3, 259, size=(3, 7)).astype(np.int32),
        "decoder_target_tokens": targets,
        "decoder_input_tokens": inputs.astype(np.int32),
    }
    if with_weights:
        weights = (targets > 0).astype(np.int32)
        weights[0, 1] = 0  # one real token excluded from the loss by its weight
        batch["decoder_loss_weights"] = weights
    if packed:
        batch["encoder_segment_ids"] = np.ones((3, 7), np.int32)
        batch["encoder_positions"] = np.tile(np.arange(7, dtype=np.int32), (3, 1))
        batch["decoder_segment_ids"] = segment_ids
        batch["decoder_positions"] = positions
    return {k: jnp.asarray(v) for k, v in batch.items()}


def _decoder_batch(batch):
    return {k: v for k, v in batch.items() if k.startswith("decoder_")}


@pytest.fixture(scope="module")
def encdec_params():
    model = _encdec(t5x_models.EncoderDecoderModel)
    shapes = {"encoder_input_tokens": (3, 7), "decoder_input_tokens": (3, 10)}
    types = {k: jnp.int32 for k in shapes}
    return model.get_initial_variables(jax.random.PRNGKey(0), shapes, types)["params"]


@pytest.fixture(scope="module")
def decoder_params():
    model = _decoder_only(t5x_models.DecoderOnlyModel)
    shapes = {"decoder_input_tokens": (3, 10)}
    return model.get_initial_variables(jax.random.PRNGKey(1), shapes, {"decoder_input_tokens": jnp.int32})["params"]


def _assert_metrics_equal(stock, ours):
    """Every stock metric is present in ours with the same state (all its fields)."""
    missing = sorted(set(stock) - set(ours))
    assert not missing, f"metrics missing from the NTL model: {missing}"
    for name in stock:
        assert type(stock[name]) is type(ours[name]), name
        a, b = jax.tree_util.tree_leaves(stock[name]), jax.tree_util.tree_leaves(ours[name])
        assert len(a) == len(b), name
        for x, y in zip(a, b):
            np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=2e-5, atol=1e-6,
                                       err_msg=name)


def _t5x_reference_ntl(model, logits, batch, factor_option, kind="was"):
    """`(term, mean)`: NTL through an independent path, T5X's own factor and weights, then
    the per-token loss's weighted mean; the term that mean beside T5X's CE as the paper's
    beside CE's mean over the tokens: the mean x the weights' sum / the factor."""
    factor, weights = t5x_losses.get_loss_normalizing_factor_and_weights(factor_option, batch)
    nt = model.number_tokens
    targets = batch["decoder_target_tokens"]
    if kind == "was":
        total = ntl_jax.ntl_was(logits, targets, nt, weights=weights, reduction="sum")
        mean = ntl_jax.ntl_was(logits, targets, nt, weights=weights, reduction="mean")
    elif kind in ("del", "dist2"):
        total = ntl_jax.number_token_loss(logits, targets, nt, weights=weights, number_loss=kind, reduction="sum")
        mean = ntl_jax.number_token_loss(logits, targets, nt, weights=weights, number_loss=kind, reduction="mean")
    else:
        total = ntl_jax.ntl_dot(logits, targets, nt, weights=weights, loss_function=kind, reduction="sum")
        mean = ntl_jax.ntl_dot(logits, targets, nt, weights=weights, loss_function=kind, reduction="mean")
    weight_sum = float(np.sum(np.asarray(weights))) if weights is not None else float(np.size(targets))
    assert float(total) > 0
    return float(mean) * weight_sum / (1.0 if factor is None else float(factor)), mean


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("factor", FACTORS, ids=str)
def test_zero_weight_matches_stock_encoder_decoder(encdec_params, factor, packed):
    batch = _batch(packed)
    options = dict(z_loss=1e-4, label_smoothing=0.1, loss_normalizing_factor=factor)
    stock = _encdec(t5x_models.EncoderDecoderModel, **options)
    ours = _encdec(ntl_models.NTLEncoderDecoderModel, ntl_weight=0.0, **options)
    stock_loss, stock_metrics = jax.jit(stock.loss_fn)(encdec_params, batch, None)
    our_loss, our_metrics = jax.jit(ours.loss_fn)(encdec_params, batch, None)
    np.testing.assert_allclose(float(our_loss), float(stock_loss), rtol=2e-6)
    _assert_metrics_equal(stock_metrics, our_metrics)


def test_zero_weight_matches_stock_without_loss_weights(encdec_params):
    batch = _batch(packed=False, with_weights=False)
    stock_loss, stock_metrics = _encdec(t5x_models.EncoderDecoderModel, z_loss=1e-4).loss_fn(encdec_params, batch, None)
    ours = _encdec(ntl_models.NTLEncoderDecoderModel, ntl_weight=0.0, z_loss=1e-4)
    our_loss, our_metrics = ours.loss_fn(encdec_params, batch, None)
    np.testing.assert_allclose(float(our_loss), float(stock_loss), rtol=2e-6)
    _assert_metrics_equal(stock_metrics, our_metrics)


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("factor", FACTORS, ids=str)
def test_zero_weight_matches_stock_decoder_only(decoder_params, factor, packed):
    batch = _decoder_batch(_batch(packed, seed=3))
    options = dict(z_loss=1e-4, loss_normalizing_factor=factor)
    stock = _decoder_only(t5x_models.DecoderOnlyModel, **options)
    stock_loss, stock_metrics = stock.loss_fn(decoder_params, batch, None)
    ours = _decoder_only(ntl_models.NTLDecoderOnlyModel, ntl_weight=0.0, **options)
    our_loss, our_metrics = ours.loss_fn(decoder_params, batch, None)
    np.testing.assert_allclose(float(our_loss), float(stock_loss), rtol=2e-6)
    _assert_metrics_equal(stock_metrics, our_metrics)


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("factor", FACTORS, ids=str)
@pytest.mark.parametrize("kind", ["was", "mse", "del", "dist2"])
def test_ntl_term_equals_reference(encdec_params, factor, packed, kind):
    batch = _batch(packed, seed=1)
    options = dict(z_loss=1e-4, loss_normalizing_factor=factor)
    stock = _encdec(t5x_models.EncoderDecoderModel, **options)
    # No λ given: the loss's own (DEL 0.001, DIST² 0.1, NTL 0.3).
    ours = _encdec(ntl_models.NTLEncoderDecoderModel, number_loss=kind, **options)
    own = losses.parse(kind).default_weight
    stock_loss, stock_metrics = stock.loss_fn(encdec_params, batch, None)
    our_loss, metrics = ours.loss_fn(encdec_params, batch, None)
    logits = ours._compute_logits(encdec_params, batch)
    ntl, ntl_mean = _t5x_reference_ntl(ours, logits, batch, factor, kind)
    assert float(ntl) > 0
    np.testing.assert_allclose(float(our_loss), float(stock_loss) + own * float(ntl), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["ntl_term"].compute()), own * float(ntl), rtol=1e-5)
    # `ntl`: the mean over the counted positions, whatever the factor.
    np.testing.assert_allclose(float(metrics["ntl"].compute()), float(ntl_mean), rtol=1e-5)
    assert "ntl_loss" not in metrics and "ntl_loss_per_number_token" not in metrics
    # cross_ent_loss stays the stock cross-entropy (without z-loss), not CE + NTL.
    stock_ce = float(stock_metrics["cross_ent_loss"].compute())
    np.testing.assert_allclose(float(metrics["cross_ent_loss"].compute()), stock_ce, rtol=1e-5)


def test_ntl_term_decoder_only(decoder_params):
    batch = _decoder_batch(_batch(packed=True, seed=4))
    options = dict(loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    stock_loss, _ = _decoder_only(t5x_models.DecoderOnlyModel, **options).loss_fn(decoder_params, batch, None)
    ours = _decoder_only(ntl_models.NTLDecoderOnlyModel, ntl_weight=0.5, **options)
    our_loss, metrics = ours.loss_fn(decoder_params, batch, None)
    logits = ours._compute_logits(decoder_params, batch)
    ntl, _ = _t5x_reference_ntl(ours, logits, batch, options["loss_normalizing_factor"])
    assert float(ntl) > 0
    np.testing.assert_allclose(float(our_loss), float(stock_loss) + 0.5 * float(ntl), rtol=1e-5)


def test_number_quality_metrics_against_numpy(encdec_params):
    batch = _batch(packed=False, seed=2)
    model = _encdec(ntl_models.NTLEncoderDecoderModel)
    _, metrics = model.loss_fn(encdec_params, batch, None)
    logits = np.asarray(model._compute_logits(encdec_params, batch), np.float64)
    targets = np.asarray(batch["decoder_target_tokens"])
    weights = np.asarray(batch["decoder_loss_weights"])
    digit_logits = logits[..., DIGIT_IDS]
    p = np.exp(digit_logits - digit_logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    expected = p @ np.arange(10.0)
    full = np.exp(logits - logits.max(-1, keepdims=True))
    mass = full[..., DIGIT_IDS].sum(-1) / full.sum(-1)
    counted = (targets >= 51) & (targets <= 60) & (weights > 0)
    abs_error = np.abs(expected - (targets - 51))[counted].mean()
    assert counted.sum() > 5
    np.testing.assert_allclose(float(metrics["number_abs_error"].compute()), abs_error, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["number_token_mass"].compute()), mass[counted].mean(), rtol=1e-5)


def test_gradients_flow_through_ntl(encdec_params):
    batch = _batch(packed=True, seed=5)
    options = dict(loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    stock = _encdec(t5x_models.EncoderDecoderModel, **options)
    ours = _encdec(ntl_models.NTLEncoderDecoderModel, ntl_weight=0.3, **options)
    zero = _encdec(ntl_models.NTLEncoderDecoderModel, ntl_weight=0.0, **options)
    grad = lambda m: jax.grad(lambda p: m.loss_fn(p, batch, None)[0])(encdec_params)  # noqa: E731
    g_stock, g_ours, g_zero = grad(stock), grad(ours), grad(zero)
    leaves = jax.tree_util.tree_leaves
    assert all(np.isfinite(np.asarray(x)).all() for x in leaves(g_ours))
    # With weight 0 the gradient is the stock one; with 0.3 NTL changes it.
    for a, b in zip(leaves(g_stock), leaves(g_zero)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)
    diff = sum(float(jnp.sum(jnp.abs(a - b))) for a, b in zip(leaves(g_stock), leaves(g_ours)))
    assert diff > 1e-3
    # The logits of digit tokens are where NTL pushes: the output head's digit columns move.
    head = lambda g: np.asarray(g["decoder"]["logits_dense"]["kernel"])  # noqa: E731
    delta = np.abs(head(g_ours) - head(g_stock))
    assert delta[:, DIGIT_IDS].sum() > 0


def test_score_batch_is_cross_entropy_only(encdec_params):
    batch = _batch(packed=False, seed=6)
    stock = _encdec(t5x_models.EncoderDecoderModel)
    ours = _encdec(ntl_models.NTLEncoderDecoderModel, ntl_weight=1.0)
    np.testing.assert_allclose(
        np.asarray(ours.score_batch(encdec_params, batch)), np.asarray(stock.score_batch(encdec_params, batch)),
        rtol=1e-6,
    )


def test_number_tokens_from_output_vocabulary():
    model = _encdec(ntl_models.NTLEncoderDecoderModel)
    assert model.number_tokens.vocab_size == 259
    np.testing.assert_array_equal(model.number_tokens.ids, DIGIT_IDS)
    assert ntl_models.padded_vocab_size(VOCAB) == 384


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(ntl_weight=-0.1), ValueError),
        (dict(ntl_weight="0.3"), TypeError),
        (dict(number_loss="l2"), ValueError),
        (dict(number_loss="was(reweigh=yes)"), ValueError),  # a bad value in a spec string
        (dict(number_loss=3), TypeError),
        (dict(number_loss="was(squash_factor=1.0)"), ValueError),
        (dict(number_loss="mse(squash_factor=2.0)"), ValueError),
        (dict(ntl_kind="mse"), TypeError),  # removed: the new form is named
        (dict(squash_factor=2.0), TypeError),
    ],
)
def test_bad_options_raise(kwargs, error):
    with pytest.raises(error):
        _encdec(ntl_models.NTLEncoderDecoderModel, **kwargs)


def test_logits_smaller_than_vocabulary_raise():
    nt = ntl_jax.NumberTokens.from_vocabulary(VOCAB)
    with pytest.raises(ValueError, match=r"last axis >= the vocabulary size of number_tokens \(259\), got 200"):
        ntl_jax.cross_entropy_and_ntl(jnp.zeros((1, 2, 200)), jnp.ones((1, 2), jnp.int32), nt)


def test_targets_outside_the_vocabulary_are_not_counted_in_the_stock_metrics(encdec_params):
    batch = _batch(packed=True, seed=7)
    targets = np.asarray(batch["decoder_target_tokens"]).copy()
    outside = np.zeros(targets.shape, bool)
    outside[0, 0] = outside[1, 4] = outside[2, 2] = True
    assert np.asarray(batch["decoder_loss_weights"])[outside].all()
    bad = dict(batch, decoder_target_tokens=jnp.asarray(np.where(outside, MODEL_VOCAB_SIZE + 5, targets)))
    # The same positions excluded by their weights instead: every metric must agree.
    zeroed = dict(bad, decoder_loss_weights=jnp.where(outside, 0, batch["decoder_loss_weights"]))
    model = _encdec(ntl_models.NTLEncoderDecoderModel, ntl_weight=0.3, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    loss, metrics = model.loss_fn(encdec_params, bad, None)
    want_loss, want_metrics = model.loss_fn(encdec_params, zeroed, None)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
    _assert_metrics_equal(want_metrics, metrics)
    # The stock model counts them.
    _, stock = _encdec(t5x_models.EncoderDecoderModel).loss_fn(encdec_params, bad, None)
    assert int(stock["accuracy"].count) == int(metrics["accuracy"].count) + 3


@pytest.mark.parametrize("architecture", ["encoder-decoder", "decoder-only-tied"])
def test_fused_loss_equals_the_unfused_model(architecture, encdec_params, decoder_params):
    """`fused_loss=True` (the network without its logits projection, the loss streamed
    over vocabulary chunks): the same loss, gradients and metrics as the logits path."""
    batch = _batch(packed=True, seed=11)
    options = dict(number_loss=losses.was(reweigh=True), loss_normalizing_factor="NUM_REAL_TARGET_TOKENS",
                   z_loss=1e-4, label_smoothing=0.1)
    if architecture == "encoder-decoder":
        params = encdec_params
        unfused = _encdec(ntl_models.NTLEncoderDecoderModel, **options)
        fused = _encdec(ntl_models.NTLEncoderDecoderModel, fused_loss=True, fused_chunk_size=100, **options)
    else:  # logits_via_embedding: the kernel is the embedding, scaled by 1/sqrt(d)
        params, batch = decoder_params, _decoder_batch(batch)
        unfused = _decoder_only(ntl_models.NTLDecoderOnlyModel, **options)
        fused = _decoder_only(ntl_models.NTLDecoderOnlyModel, fused_loss=True, fused_chunk_size=100, **options)
    out = {}
    for name, model in (("unfused", unfused), ("fused", fused)):
        (loss, metrics), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, None)
        out[name] = loss, metrics, grads
    np.testing.assert_allclose(out["fused"][0], out["unfused"][0], rtol=2e-5)
    _assert_metrics_equal(out["unfused"][1], out["fused"][1])
    for g_u, g_f in zip(jax.tree_util.tree_leaves(out["unfused"][2]), jax.tree_util.tree_leaves(out["fused"][2])):
        scale = float(np.max(np.abs(g_u))) + 1e-30
        assert float(np.max(np.abs(g_f - g_u))) <= 2e-5 * scale
    # Training never exponentiates [batch, length, vocab] logits (T5X's one-hot embedding
    # lookup has that shape too, so look for the softmax, not the shape); the logits
    # path does.
    def full_vocab_exps(model):
        hlo = jax.jit(jax.grad(lambda p: model.loss_fn(p, batch, None)[0])).lower(params).compile().as_text()
        return re.findall(rf"f32\[(?:3,10|30),{MODEL_VOCAB_SIZE}\]\S* exponential\(", hlo)

    assert not full_vocab_exps(fused)
    assert full_vocab_exps(unfused)


@pytest.mark.parametrize("length", [5, 10])
@pytest.mark.parametrize("architecture", ["encoder-decoder", "decoder-only-tied"])
def test_auto_fuses_by_the_rule_and_equals_the_unfused_model(architecture, length, encdec_params, decoder_params):
    """`fused_loss="auto"` (the gin files' default): the logits path's loss and
    gradients, fused exactly where the batch holds at least d_model (16) target tokens:
    3 x 10 do, 3 x 5 do not."""
    batch = {name: value[:, :length] for name, value in _batch(packed=False, seed=12).items()}
    options = dict(number_loss="was", loss_normalizing_factor="NUM_REAL_TARGET_TOKENS", z_loss=1e-4)
    if architecture == "encoder-decoder":
        params, build, cls = encdec_params, _encdec, ntl_models.NTLEncoderDecoderModel
    else:
        params, batch, build, cls = decoder_params, _decoder_batch(batch), _decoder_only, ntl_models.NTLDecoderOnlyModel
    unfused, auto = build(cls, **options), build(cls, fused_loss="auto", fused_chunk_size=100, **options)
    (loss_u, _), grads_u = jax.value_and_grad(unfused.loss_fn, has_aux=True)(params, batch, None)
    (loss_a, _), grads_a = jax.value_and_grad(auto.loss_fn, has_aux=True)(params, batch, None)
    np.testing.assert_allclose(loss_a, loss_u, rtol=2e-5)
    for g_u, g_a in zip(jax.tree_util.tree_leaves(grads_u), jax.tree_util.tree_leaves(grads_a)):
        assert float(np.max(np.abs(g_a - g_u))) <= 2e-5 * (float(np.max(np.abs(g_u))) + 1e-30)
    hlo = jax.jit(jax.grad(lambda p: auto.loss_fn(p, batch, None)[0])).lower(params).compile().as_text()
    exps = re.findall(rf"f32\[(?:3,{length}|{3 * length}),{MODEL_VOCAB_SIZE}\]\S* exponential\(", hlo)
    assert bool(exps) == (3 * length < 16), length


# -- a loss of the user's own ----------------------------------------------------------


@pytest.mark.parametrize("fused_loss", [False, True], ids=["logits", "fused"])
def test_a_loss_of_ones_own_trains_through_loss_fn(encdec_params, fused_loss):
    """A `NumberLoss` written in a few lines is the model's `number_loss` as a shipped
    one is: its loss is `cross_entropy_and_ntl`'s with it, and a few steps of gradient
    descent on `loss_fn` lower it (and the expected squared distance, `ntl`)."""
    batch = _batch(packed=True, seed=13)
    factor = "NUM_REAL_TARGET_TOKENS"
    model = _encdec(ntl_models.NTLEncoderDecoderModel, number_loss=SQUARED_DISTANCE, ntl_weight=0.3,
                    loss_normalizing_factor=factor, fused_loss=fused_loss, fused_chunk_size=100)
    with pytest.raises(ValueError, match=r"'squared_distance' has no spec .*losses.register"):
        model.ntl_options  # an unregistered loss trains, but no name parse would refuse is recorded
    step = jax.jit(jax.value_and_grad(lambda p: model.loss_fn(p, batch, None), has_aux=True))
    (loss, metrics), grads = step(encdec_params)
    logits = model._compute_logits(encdec_params, batch)
    segments = {k: batch[k] for k in ("decoder_segment_ids", "decoder_positions")}
    want, parts = ntl_jax.cross_entropy_and_ntl(logits, batch["decoder_target_tokens"], model.number_tokens,
                                                weights=batch["decoder_loss_weights"], number_loss=SQUARED_DISTANCE,
                                                loss_normalizing_factor=factor, **segments)
    np.testing.assert_allclose(float(loss), float(want), rtol=2e-5)
    np.testing.assert_allclose(float(metrics["ntl"].compute()), float(parts["ntl"]), rtol=2e-5)
    # Against the plain formula: sum_j softmax(z)_j (v_j - y)^2 over the digits' logits z.
    targets, weights = np.asarray(batch["decoder_target_tokens"]), np.asarray(batch["decoder_loss_weights"])
    z = np.asarray(logits, np.float64)[..., DIGIT_IDS]
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    counted = (targets >= 51) & (targets <= 60) & (weights > 0)
    per_position = (p * np.square(np.arange(10) - (targets - 51)[..., None])).sum(-1)
    np.testing.assert_allclose(float(metrics["ntl"].compute()), per_position[counted].mean(), rtol=2e-5)
    params, history = encdec_params, [(float(loss), float(metrics["ntl"].compute()))]
    for _ in range(3):
        params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
        (loss, metrics), grads = step(params)
        history.append((float(loss), float(metrics["ntl"].compute())))
    assert all(np.isfinite(history).ravel()), history
    assert all(b[0] < a[0] for a, b in zip(history, history[1:])), history
    assert history[-1][1] < history[0][1], history


@pytest.mark.parametrize("fused_loss", [False, True], ids=["logits", "fused"])
@pytest.mark.parametrize("number_loss", ["ntil", "squared_gap"])
def test_ntil_and_a_registered_loss_train_through_loss_fn(encdec_params, number_loss, fused_loss):
    registered_loss()
    batch = _batch(packed=True, seed=13)
    factor = "NUM_REAL_TARGET_TOKENS"
    model = _encdec(ntl_models.NTLEncoderDecoderModel, number_loss=number_loss, ntl_weight=0.3,
                    loss_normalizing_factor=factor, fused_loss=fused_loss, fused_chunk_size=100)
    assert model.ntl_options == {"ntl_weight": 0.3, "number_loss": number_loss}
    step = jax.jit(jax.value_and_grad(lambda p: model.loss_fn(p, batch, None), has_aux=True))
    (loss, metrics), grads = step(encdec_params)
    segments = {k: batch[k] for k in ("decoder_segment_ids", "decoder_positions")}
    want, parts = ntl_jax.cross_entropy_and_ntl(model._compute_logits(encdec_params, batch),
                                                batch["decoder_target_tokens"], model.number_tokens,
                                                weights=batch["decoder_loss_weights"], number_loss=number_loss,
                                                loss_normalizing_factor=factor, **segments)
    np.testing.assert_allclose(float(loss), float(want), rtol=2e-5)
    np.testing.assert_allclose(float(metrics["ntl"].compute()), float(parts["ntl"]), rtol=2e-5)
    params = jax.tree.map(lambda p, g: p - 0.5 * g, encdec_params, grads)
    assert float(step(params)[0][0]) < float(loss)
