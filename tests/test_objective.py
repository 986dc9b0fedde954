"""The objective against T5X's definitions, written out in numpy with explicit one-hot soft targets."""

import enum

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ntl_jax import NumberTokens, losses
from tests.formulation import ntl_jax_under_test as ntl_jax

PIECES = ["<pad>", "</s>", "x", "."] + list("0123456789")
NT = NumberTokens.from_pieces(PIECES)
V = len(PIECES)
TARGETS = jnp.array([[5, 6, 3, 9, 1, 0, 0], [2, 13, 4, 4, 1, 0, 0]])
LOGITS = jax.random.normal(jax.random.PRNGKey(0), (2, 7, V)) * 3


def t5x_cross_entropy_numpy(logits, targets, weights, label_smoothing, z_loss, factor):
    """compute_weighted_cross_entropy as T5X writes it: one-hot soft targets, log-softmax."""
    logits = np.asarray(logits, np.float64)
    vocab = logits.shape[-1]
    confidence = 1.0 - label_smoothing
    low = (1.0 - confidence) / (vocab - 1)
    constant = -(confidence * np.log(confidence) + (vocab - 1) * low * np.log(low + 1e-20))
    soft = np.where(np.arange(vocab) == np.asarray(targets)[..., None], confidence, low)
    lse = np.log(np.exp(logits).sum(-1))
    z = z_loss * lse**2
    loss = -(soft * (logits - lse[..., None])).sum(-1) + z - constant
    weight_sum = loss.size
    if weights is not None:
        loss, z, weight_sum = loss * weights, z * weights, np.sum(weights)
    if factor is not None:
        loss, z = loss / factor, z / factor
    return loss.sum(), z.sum(), weight_sum


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("z_loss", [0.0, 1e-4, 0.1])
@pytest.mark.parametrize("factor", [None, 7.5])
@pytest.mark.parametrize("weighted", [False, True])
def test_weighted_cross_entropy_matches_t5x(label_smoothing, z_loss, factor, weighted):
    weights = np.asarray(TARGETS > 0, np.float32) * 1.5 if weighted else None
    got = ntl_jax.weighted_cross_entropy(LOGITS, TARGETS, weights=weights, label_smoothing=label_smoothing,
                                         z_loss=z_loss, loss_normalizing_factor=factor)
    want = t5x_cross_entropy_numpy(LOGITS, TARGETS, weights, label_smoothing, z_loss, factor)
    np.testing.assert_allclose([float(x) for x in got], want, rtol=2e-5)


def test_cross_entropy_gradient_is_t5x_custom_vjp():
    # T5X's backward pass: (1 + 2 z lse) softmax - soft_targets, times the weight.
    z_loss, ls = 0.01, 0.1
    weights = jnp.asarray(TARGETS > 0, jnp.float32)
    grad = jax.grad(lambda l: ntl_jax.weighted_cross_entropy(
        l, TARGETS, weights=weights, label_smoothing=ls, z_loss=z_loss)[0])(LOGITS)
    lse = jax.nn.logsumexp(LOGITS, -1, keepdims=True)
    soft = jnp.where(jnp.arange(V) == TARGETS[..., None], 1 - ls, ls / (V - 1))
    want = ((1 + 2 * z_loss * lse) * jax.nn.softmax(LOGITS) - soft) * weights[..., None]
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-6)


class ForeignFactor(enum.Enum):  # stands in for T5X's SpecialLossNormalizingFactor
    NUM_REAL_TARGET_TOKENS = 1
    NUM_TOTAL_TARGET_TOKENS = 2
    AVERAGE_PER_SEQUENCE = 3


def test_normalizing_factor_semantics():
    weights = jnp.asarray([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0]], jnp.float32)
    assert ntl_jax.loss_normalizing_factor_and_weights(None, TARGETS, None) == (None, None)
    factor, w = ntl_jax.loss_normalizing_factor_and_weights(233472, TARGETS, weights)
    assert factor == 233472 and w is weights
    for name in ("num_real_target_tokens", ForeignFactor.NUM_REAL_TARGET_TOKENS):
        factor, w = ntl_jax.loss_normalizing_factor_and_weights(name, TARGETS, weights)
        assert float(factor) == 8.0 and np.array_equal(w, weights)
    factor, w = ntl_jax.loss_normalizing_factor_and_weights("NUM_REAL_TARGET_TOKENS", TARGETS, None)
    assert float(factor) == 10.0 and np.array_equal(w, TARGETS > 0)  # weights default to targets > 0
    factor, _ = ntl_jax.loss_normalizing_factor_and_weights(ForeignFactor.NUM_TOTAL_TARGET_TOKENS, TARGETS, weights)
    assert factor == 14
    factor, w = ntl_jax.loss_normalizing_factor_and_weights("AVERAGE_PER_SEQUENCE", TARGETS, weights)
    assert float(factor) == 2.0
    np.testing.assert_allclose(w, weights / jnp.array([[5.0], [3.0]]))


def test_without_weights_pad_targets_count_unless_the_factor_is_special():
    # T5X's rule, which the docstring states for a plain optax user: weights=None counts
    # the pad id 0 (4 of the 14 targets here); only a special factor defaults to targets > 0.
    for factor in (None, 7.5):
        _, parts = ntl_jax.cross_entropy_and_ntl(LOGITS, TARGETS, NT, loss_normalizing_factor=factor)
        assert float(parts["weight_sum"]) == 14.0
    _, parts = ntl_jax.cross_entropy_and_ntl(LOGITS, TARGETS, NT, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    assert float(parts["weight_sum"]) == 10.0
    _, parts = ntl_jax.cross_entropy_and_ntl(LOGITS, TARGETS, NT, weights=TARGETS > 0)
    assert float(parts["weight_sum"]) == 10.0
    doc = " ".join(ntl_jax.cross_entropy_and_ntl.__doc__.split())
    assert "None: every target counts, pads too, unless `loss_normalizing_factor` is a special one" in doc
    assert "e.g. `targets > 0`" in doc


def test_average_per_sequence_packed():
    # Row 0 packs 3 + 2 tokens then padding; row 1 one sequence whose weights are all 0.
    positions = jnp.array([[0, 1, 2, 0, 1, 0, 0], [0, 1, 2, 3, 0, 0, 0]])
    segments = jnp.array([[1, 1, 1, 2, 2, 0, 0], [1, 1, 1, 1, 0, 0, 0]])
    weights = jnp.array([[1, 1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0]], jnp.float32)
    factor, w = ntl_jax.loss_normalizing_factor_and_weights(
        "AVERAGE_PER_SEQUENCE", TARGETS, weights, decoder_segment_ids=segments, decoder_positions=positions)
    np.testing.assert_allclose(w, [[1 / 3] * 3 + [1 / 2] * 2 + [0, 0], [0] * 7], rtol=1e-6)
    assert float(factor) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="decoder_positions"):
        ntl_jax.loss_normalizing_factor_and_weights("AVERAGE_PER_SEQUENCE", TARGETS, weights,
                                                    decoder_segment_ids=segments)


def test_bad_normalizing_factor():
    with pytest.raises(ValueError, match="NUM_REAL_TARGET_TOKENS.*'per_token'"):
        ntl_jax.loss_normalizing_factor_and_weights("per_token", TARGETS)
    with pytest.raises(TypeError, match="got list"):
        ntl_jax.loss_normalizing_factor_and_weights([1.0], TARGETS)


FACTORS = [None, 100.0, "NUM_REAL_TARGET_TOKENS", "NUM_TOTAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE"]


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("kind", ["was", "mse", "number_level"])
def test_objective_is_ce_plus_weighted_ntl_with_one_factor(factor, kind):
    weights = jnp.asarray(TARGETS > 0, jnp.float32)
    loss, parts = ntl_jax.cross_entropy_and_ntl(
        LOGITS, TARGETS, NT, weights=weights, number_loss=kind, ntl_weight=0.3, z_loss=1e-4, label_smoothing=0.1,
        loss_normalizing_factor=factor)
    resolved, w = ntl_jax.loss_normalizing_factor_and_weights(factor, TARGETS, weights)
    ce, z, _ = t5x_cross_entropy_numpy(LOGITS, TARGETS, np.asarray(w), 0.1, 1e-4, resolved)
    ntl_sum = float(ntl_jax.number_token_loss(LOGITS, TARGETS, NT, number_loss=kind, weights=w, reduction="sum"))
    ntl_mean = float(ntl_jax.number_token_loss(LOGITS, TARGETS, NT, number_loss=kind, weights=w, reduction="mean"))
    divide = 1.0 if resolved is None else float(resolved)
    # The paper's and ntloss's: λ x NTL's mean over the number targets beside CE's mean
    # over the tokens; T5X's CE is sum / factor = CE's mean x W / factor, and so the term.
    ntl_term = 0.3 * ntl_mean * float(np.sum(w)) / divide
    np.testing.assert_allclose(float(parts["cross_entropy"]), ce - z, rtol=2e-5)
    np.testing.assert_allclose(float(parts["z_loss"]), z, rtol=2e-5)
    # "ntl" is the weighted mean over the positions the loss counts, whatever the factor;
    # "ntl_term" what it adds to the loss, in the paper's ratio to the cross-entropy.
    np.testing.assert_allclose(float(parts["ntl"]), ntl_mean, rtol=1e-5)
    np.testing.assert_allclose(float(parts["ntl"]), ntl_sum / float(parts["ntl_weight_sum"]), rtol=1e-5)
    np.testing.assert_allclose(float(parts["ntl_term"]), ntl_term, rtol=1e-5)
    np.testing.assert_allclose(float(loss), ce + ntl_term, rtol=2e-5)
    np.testing.assert_allclose(float(loss), float(parts["cross_entropy"] + parts["z_loss"] + parts["ntl_term"]),
                               rtol=1e-6)
    assert ntl_sum > 0
    # ntl_jax 0.4's normalisation, kept reachable: NTL's sum divided by CE's factor.
    old = ntl_jax.losses.with_mean_over(ntl_jax.losses.parse(kind), "targets")
    old_loss, old_parts = ntl_jax.cross_entropy_and_ntl(
        LOGITS, TARGETS, NT, weights=weights, number_loss=old, ntl_weight=0.3, z_loss=1e-4, label_smoothing=0.1,
        loss_normalizing_factor=factor)
    np.testing.assert_allclose(float(old_parts["ntl_term"]), 0.3 * ntl_sum / divide, rtol=1e-5)
    assert float(old_parts["ntl"]) == float(parts["ntl"])
    # Without a number loss the objective is exactly the cross-entropy.
    for none in (None, "none"):
        ce_only, ce_parts = ntl_jax.cross_entropy_and_ntl(
            LOGITS, TARGETS, NT, weights=weights, number_loss=none, z_loss=1e-4, label_smoothing=0.1,
            loss_normalizing_factor=factor)
        np.testing.assert_allclose(float(ce_only), ce, rtol=2e-5)
        assert float(ce_parts["ntl"]) == float(ce_parts["ntl_term"]) == float(ce_parts["ntl_weight_sum"]) == 0.0


def test_objective_parts_and_errors():
    _, parts = ntl_jax.cross_entropy_and_ntl(LOGITS, TARGETS, NT, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    assert float(parts["weight_sum"]) == 10.0 and float(parts["loss_normalizing_factor"]) == 10.0
    assert float(parts["ntl_weight_sum"]) == 6.0  # "1", "2", "5" and "9", "0", "0"
    with pytest.raises(ValueError, match="number loss in.*got 'wass'"):
        ntl_jax.cross_entropy_and_ntl(LOGITS, TARGETS, NT, number_loss="wass")
    reweighed = losses.was(reweigh=True)
    grads = jax.grad(lambda l: ntl_jax.cross_entropy_and_ntl(l, TARGETS, NT, number_loss=reweighed)[0])(LOGITS)
    assert np.isfinite(np.asarray(grads)).all()
    # A spec string and the value it names are the same loss.
    spec = ntl_jax.cross_entropy_and_ntl(LOGITS, TARGETS, NT, number_loss="was(reweigh=true)")[0]
    value = ntl_jax.cross_entropy_and_ntl(LOGITS, TARGETS, NT, number_loss=losses.was(reweigh=True))[0]
    assert float(spec) == float(value)


@pytest.mark.parametrize("old, new", [
    (dict(ntl_kind="mse"), "number_loss="), (dict(reweigh=True), r"ntl_jax\.losses\.was\(reweigh=True\)"),
    (dict(squash_factor=2.0), r"was\(squash_factor=\.\.\.\)"), (dict(max_number_length=3), "number_level"),
    (dict(smmd_sigma=1.0), r"smmd\(sigma=\.\.\.\)"), (dict(formulation="columns"), "each backend"),
])
def test_removed_keywords_name_their_new_form(old, new):
    (key,) = old
    for f, args in ((ntl_jax.cross_entropy_and_ntl, (LOGITS,)),
                    (ntl_jax.fused_cross_entropy_and_ntl, (jnp.ones((2, 7, 3)), jnp.ones((3, V))))):
        with pytest.raises(TypeError, match=f"no longer takes {key}=.*{new}"):
            f(*args, TARGETS, NT, **old)


def test_label_smoothing_on_a_one_token_vocabulary_is_t5x_s():
    # T5X smooths onto no other token: the label is `confidence` on the only one, whose
    # probability is 1, so each position costs `confidence * log(confidence)`.
    loss, _, weight_sum = ntl_jax.weighted_cross_entropy(jnp.zeros((1, 2, 1)), jnp.zeros((1, 2), jnp.int32),
                                                         label_smoothing=0.1)
    np.testing.assert_allclose(float(loss), 2 * 0.9 * np.log(0.9), rtol=1e-6)
    assert float(weight_sum) == 2.0
