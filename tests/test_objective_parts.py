"""The objective's parts, each against numbers computed here in numpy: `ntl` is the
weighted mean of the number loss over the positions it counts, `ntl_term` what it adds
to the loss (`ntl_weight * mean * weight_sum / factor`, ntl_jax 0.5); no number loss computes none; a loss a user
writes trains through the objective and the fused head; `gce_sigma` changes the
cross-entropy only."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ntl_jax
from ntl_jax import NumberTokens, losses
from ntl_jax._core.number_stats import FORMULATIONS, with_formulation
from tests.objective_options import SQUARED_DISTANCE

PIECES = ["<pad>", "</s>", "x"] + list("0123456789")  # digit d is id 3 + d
NT = NumberTokens.from_pieces(PIECES)
V = len(PIECES)
DIGITS = np.arange(3, 13)
# 3 real targets, 2 of them number tokens: "5" "x" in row 0, "7" in row 1, padding after.
TARGETS = jnp.array([[3 + 5, 2, 0, 0], [3 + 7, 0, 0, 0]])
Y = np.array([[5.0, 0, 0, 0], [7.0, 0, 0, 0]])
IS_NUMBER = np.array([[1.0, 0, 0, 0], [1.0, 0, 0, 0]])
LOGITS = jax.random.normal(jax.random.PRNGKey(3), (2, 4, V)) * 2
NTL_WEIGHT = 0.7


def _softmax(z):
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _number_probs(logits):
    """p over the number tokens' logits, `[batch, length, 10]` float64."""
    return _softmax(np.asarray(logits, np.float64)[..., DIGITS])


def _was(logits):
    """NTL-WAS per position: sum_j p_j |v_j - y|."""
    return (_number_probs(logits) * np.abs(np.arange(10) - Y[..., None])).sum(-1)


def _squared_distance(logits):
    """The user's loss per position: sum_j p_j (v_j - y)^2."""
    return (_number_probs(logits) * np.square(np.arange(10) - Y[..., None])).sum(-1)


def _cross_entropy(logits, targets):
    """-log softmax(z)_t per position, float64."""
    z = np.asarray(logits, np.float64)
    lse = np.log(np.exp(z).sum(-1))
    return lse - np.take_along_axis(z, np.asarray(targets)[..., None], -1)[..., 0]


# (factor, weights given, the effective weights and the factor T5X resolves them to).
REAL = np.array([[1.0, 1, 0, 0], [1, 0, 0, 0]])
GIVEN = np.array([[2.0, 1, 3, 0], [0.5, 0, 0, 0]])
CASES = {
    "NUM_REAL_TARGET_TOKENS": ("NUM_REAL_TARGET_TOKENS", None, REAL, 3.0),
    "AVERAGE_PER_SEQUENCE": ("AVERAGE_PER_SEQUENCE", None, np.array([[0.5, 0.5, 0, 0], [1, 0, 0, 0]]), 2.0),
    "None": (None, None, np.ones((2, 4)), None),  # pads count, none is a number
    "None-weighted": (None, GIVEN, GIVEN, None),
}


@pytest.mark.parametrize("case", CASES)
def test_ntl_is_the_weighted_mean_and_ntl_term_what_it_adds(case):
    factor, weights, w, resolved = CASES[case]
    loss, parts = ntl_jax.cross_entropy_and_ntl(LOGITS, TARGETS, NT, weights=weights, number_loss="was",
                                                ntl_weight=NTL_WEIGHT, z_loss=1e-3, loss_normalizing_factor=factor)
    was = _was(LOGITS)
    counted = w * IS_NUMBER
    mean = (was * counted).sum() / counted.sum()
    # The paper's: λ x the mean beside CE's mean over the tokens, CE here sum(w CE) / factor.
    term = NTL_WEIGHT * mean * w.sum() / (1.0 if resolved is None else resolved)
    # The number positions are (0, 0) and (1, 0): the mean of two numbers, as weighted.
    np.testing.assert_allclose(mean, (w[0, 0] * was[0, 0] + w[1, 0] * was[1, 0]) / (w[0, 0] + w[1, 0]), rtol=1e-12)
    np.testing.assert_allclose(float(parts["ntl"]), mean, rtol=1e-5)
    np.testing.assert_allclose(float(parts["ntl_term"]), term, rtol=1e-5)
    np.testing.assert_allclose(float(parts["ntl_weight_sum"]), counted.sum(), rtol=1e-6)
    np.testing.assert_allclose(float(parts["ntl_sum"]), (was * counted).sum(), rtol=1e-5)
    assert float(parts["ntl"]) == float(ntl_jax.ntl_mean(parts["ntl_sum"], parts["ntl_weight_sum"]))
    # The same mean as the standalone loss's, under the same weights.
    _, w_resolved = ntl_jax.loss_normalizing_factor_and_weights(factor, TARGETS, weights)
    w_resolved = np.ones((2, 4)) if w_resolved is None else w_resolved
    np.testing.assert_allclose(w_resolved, w, rtol=1e-6)
    standalone = ntl_jax.number_token_loss(LOGITS, TARGETS, NT, number_loss="was", weights=w_resolved,
                                           reduction="mean")
    np.testing.assert_allclose(float(parts["ntl"]), float(standalone), rtol=1e-6)
    # loss = cross_entropy + z_loss + ntl_term, and the cross-entropy is the plain one.
    lse = np.log(np.exp(np.asarray(LOGITS, np.float64)).sum(-1))
    divide = 1.0 if resolved is None else resolved
    np.testing.assert_allclose(float(parts["cross_entropy"]), (_cross_entropy(LOGITS, TARGETS) * w).sum() / divide,
                               rtol=1e-5)
    np.testing.assert_allclose(float(parts["z_loss"]), (1e-3 * lse**2 * w).sum() / divide, rtol=1e-5)
    np.testing.assert_allclose(float(loss), float(parts["cross_entropy"]) + float(parts["z_loss"]) + term, rtol=1e-6)
    np.testing.assert_allclose(float(loss), float(parts["cross_entropy"] + parts["z_loss"] + parts["ntl_term"]),
                               rtol=1e-6)


def test_the_mean_over_no_number_target_is_zero():
    targets = jnp.array([[2, 2, 0, 0], [2, 0, 0, 0]])  # "x" only
    loss, parts = ntl_jax.cross_entropy_and_ntl(LOGITS, targets, NT, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    assert float(parts["ntl"]) == float(parts["ntl_term"]) == float(parts["ntl_weight_sum"]) == 0.0
    assert np.isfinite(float(loss))
    grads = jax.grad(lambda l: ntl_jax.cross_entropy_and_ntl(l, targets, NT)[1]["ntl"])(LOGITS)
    assert np.isfinite(np.asarray(grads)).all()


@pytest.mark.parametrize("none", [None, "none"])
@pytest.mark.parametrize("factor", ["NUM_REAL_TARGET_TOKENS", None])
def test_no_number_loss_computes_none(none, factor):
    weights = jnp.asarray(REAL, jnp.float32)
    loss, parts = ntl_jax.cross_entropy_and_ntl(LOGITS, TARGETS, NT, weights=weights, number_loss=none,
                                                z_loss=1e-3, loss_normalizing_factor=factor)
    for name in ("ntl", "ntl_term", "ntl_weight_sum"):
        assert float(parts[name]) == 0.0, (name, parts[name])
    resolved, w = ntl_jax.loss_normalizing_factor_and_weights(factor, TARGETS, weights)
    ce, z, weight_sum = ntl_jax.weighted_cross_entropy(LOGITS, TARGETS, weights=w, z_loss=1e-3,
                                                       loss_normalizing_factor=resolved)
    np.testing.assert_allclose(float(loss), float(ce), rtol=1e-6)
    np.testing.assert_allclose(float(parts["z_loss"]), float(z), rtol=1e-6)
    assert float(parts["weight_sum"]) == float(weight_sum) == 3.0
    # The same through the fused head.
    hidden = jax.random.normal(jax.random.PRNGKey(4), (2, 4, 5))
    kernel = jax.random.normal(jax.random.PRNGKey(5), (5, V))
    fused_loss, fused_parts = ntl_jax.fused_cross_entropy_and_ntl(
        hidden, kernel, TARGETS, NT, weights=weights, number_loss=none, z_loss=1e-3, loss_normalizing_factor=factor,
        chunk_size=4)
    assert float(fused_parts["ntl"]) == float(fused_parts["ntl_term"]) == 0.0
    ce, _, _ = ntl_jax.weighted_cross_entropy(hidden @ kernel, TARGETS, weights=w, z_loss=1e-3,
                                              loss_normalizing_factor=resolved)
    np.testing.assert_allclose(float(fused_loss), float(ce), rtol=1e-5)
    # Nothing of a number loss is traced: a weight of 0 on NTL-WAS still computes it.
    def size(number_loss, ntl_weight=0.0):
        return len(jax.make_jaxpr(lambda l: ntl_jax.cross_entropy_and_ntl(
            l, TARGETS, NT, weights=weights, number_loss=number_loss, ntl_weight=ntl_weight,
            loss_normalizing_factor=factor)[0])(LOGITS).eqns)

    _, was_parts = ntl_jax.cross_entropy_and_ntl(LOGITS, TARGETS, NT, weights=weights, ntl_weight=0.0,
                                                 loss_normalizing_factor=factor)
    assert float(was_parts["ntl"]) > 0 and float(was_parts["ntl_term"]) == 0.0
    assert size(none) < size("was"), (size(none), size("was"))


# -- A loss a user writes -----------------------------------------------------------------

B, L, D = 2, 4, 6


def _hidden_and_kernel(seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.normal(size=(B, L, D)), jnp.float32),
            jnp.asarray(rng.normal(size=(D, V)) * 0.7, jnp.float32))


def _user_objective_numpy(hidden, kernel, weights, factor):
    """`(loss, d hidden, d kernel)` of (sum(w CE) + lambda * mean_counted(E_p[(v - y)^2]) *
    sum(w)) / factor in float64 (ntl_jax 0.5's normalisation): the
    gradient of each term with respect to the logits written out (CE's `softmax - onehot`,
    the expectation's `p_j (f_j - E_p f)` at the number columns), then through `hidden @ kernel`."""
    h, k = np.asarray(hidden, np.float64), np.asarray(kernel, np.float64)
    logits = h @ k
    w = np.asarray(weights, np.float64)
    f = np.square(np.arange(10) - Y[..., None])
    p = _number_probs(logits)
    mean_f = (p * f).sum(-1)
    scale = w.sum() / (w * IS_NUMBER).sum()  # weight_sum / ntl_weight_sum: constants of the logits
    loss = ((_cross_entropy(logits, TARGETS) * w).sum() + NTL_WEIGHT * scale * (mean_f * w * IS_NUMBER).sum()) / factor
    d_logits = _softmax(logits) - np.eye(V)[np.asarray(TARGETS)]
    d_logits = d_logits * w[..., None]
    d_logits[..., DIGITS] += NTL_WEIGHT * scale * (w * IS_NUMBER)[..., None] * p * (f - mean_f[..., None])
    d_logits /= factor
    return loss, d_logits @ k.T, np.einsum("bld,blv->dv", h, d_logits)


def _user_objectives(hidden, kernel, weights, nt=NT, **options):
    """`{name: ((loss, parts), (d hidden, d kernel))}` from the logits and from the fused head."""
    common = dict(weights=weights, number_loss=SQUARED_DISTANCE, ntl_weight=NTL_WEIGHT,
                  loss_normalizing_factor="NUM_REAL_TARGET_TOKENS", **options)

    def unfused(h, k):
        return ntl_jax.cross_entropy_and_ntl(h @ k, TARGETS, nt, **common)

    def fused(h, k):
        return ntl_jax.fused_cross_entropy_and_ntl(h, k, TARGETS, nt, chunk_size=5, **common)

    return {name: jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(hidden, kernel)
            for name, f in (("objective", unfused), ("fused", fused))}


@pytest.mark.parametrize("formulation", ("auto",) + FORMULATIONS)
def test_a_users_loss_equals_its_numpy_reference_through_the_objective_and_the_fused_head(formulation):
    hidden, kernel = _hidden_and_kernel()
    weights = jnp.asarray(REAL, jnp.float32)
    want_loss, want_dh, want_dk = _user_objective_numpy(hidden, kernel, REAL, 3.0)
    results = _user_objectives(hidden, kernel, weights, with_formulation(NT, formulation))
    logits = np.asarray(hidden @ kernel, np.float64)
    user = _squared_distance(logits)
    for name, ((loss, parts), (dh, dk)) in results.items():
        np.testing.assert_allclose(float(loss), want_loss, rtol=2e-5, err_msg=name)
        np.testing.assert_allclose(float(parts["ntl"]), (user[0, 0] + user[1, 0]) / 2, rtol=2e-5, err_msg=name)
        # NUM_REAL_TARGET_TOKENS: factor = weight_sum = 3, so the term is lambda x the mean over the 2 numbers.
        np.testing.assert_allclose(float(parts["ntl_term"]), NTL_WEIGHT * (user[0, 0] + user[1, 0]) / 2, rtol=2e-5,
                                   err_msg=name)
        np.testing.assert_allclose(dh, want_dh, rtol=1e-4, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(dk, want_dk, rtol=1e-4, atol=1e-6, err_msg=name)
    # The objective and the fused head agree with each other closer than with float64.
    (a, _), (da_h, da_k) = results["objective"]
    (b, _), (db_h, db_k) = results["fused"]
    np.testing.assert_allclose(float(a), float(b), rtol=2e-6)
    np.testing.assert_allclose(da_h, db_h, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(da_k, db_k, rtol=2e-5, atol=1e-6)


def test_a_users_loss_alone_equals_its_reference():
    want = _squared_distance(LOGITS)
    per_position = ntl_jax.number_token_loss(LOGITS, TARGETS, NT, number_loss=SQUARED_DISTANCE)
    np.testing.assert_allclose(per_position, want * IS_NUMBER, rtol=1e-5, atol=1e-6)
    mean = ntl_jax.ntl_from_number_logits(LOGITS[..., DIGITS], TARGETS, NT, number_loss=SQUARED_DISTANCE,
                                          reduction="mean")
    np.testing.assert_allclose(float(mean), (want[0, 0] + want[1, 0]) / 2, rtol=1e-5)
    with pytest.raises(ValueError, match=r"no spec that parse reads back .*losses.register"):
        SQUARED_DISTANCE.spec  # never recorded as a spec parse would refuse
    with pytest.raises(ValueError, match="expected reweigh=False"):
        losses.NumberLoss("squared_distance", SQUARED_DISTANCE.reads, SQUARED_DISTANCE.loss, reweigh=True)


@pytest.mark.parametrize("head", ["objective", "fused"])
def test_a_users_loss_trains_a_toy_parameter_with_plain_sgd(head):
    """Five steps of `kernel -= lr * grad` lower the loss, and the user's number loss with it."""
    hidden, kernel = _hidden_and_kernel(seed=1)
    weights = jnp.asarray(REAL, jnp.float32)
    common = dict(weights=weights, number_loss=SQUARED_DISTANCE, ntl_weight=NTL_WEIGHT,
                  loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    if head == "objective":
        def objective(k):
            return ntl_jax.cross_entropy_and_ntl(hidden @ k, TARGETS, NT, **common)
    else:
        def objective(k):
            return ntl_jax.fused_cross_entropy_and_ntl(hidden, k, TARGETS, NT, chunk_size=5, **common)

    step = jax.jit(jax.value_and_grad(objective, has_aux=True))
    history = []
    for _ in range(6):
        (loss, parts), grad = step(kernel)
        history.append((float(loss), float(parts["ntl"])))
        kernel = kernel - 0.1 * grad
    losses_seen, ntl_seen = zip(*history)
    assert all(b < a for a, b in zip(losses_seen, losses_seen[1:])), history
    assert ntl_seen[-1] < 0.8 * ntl_seen[0], history
    # The first step's loss is the numpy reference's.
    np.testing.assert_allclose(losses_seen[0], _user_objective_numpy(*_hidden_and_kernel(seed=1), REAL, 3.0)[0],
                               rtol=2e-5)


# -- gce_sigma smooths the cross-entropy's label only -------------------------------------


def _was_cdf_one_hot(logits):
    """sum_j p_j |r_j - r_t|: on digits the rank is the value."""
    return (_number_probs(logits) * np.abs(np.arange(10) - Y[..., None])).sum(-1)


def _was_cdf_gaussian(logits, sigma):
    """sum_k |CDF_p(k) - CDF_q(k)|, q the Gaussian label of width sigma over the digits."""
    q = np.exp(-np.square(np.arange(10) - Y[..., None]) / (2 * sigma**2))
    q /= q.sum(-1, keepdims=True)
    gap = np.cumsum(_number_probs(logits) - q, axis=-1)[..., :-1]
    return np.abs(gap).sum(-1)


def test_gce_sigma_no_longer_changes_what_was_cdf_computes():
    weights = jnp.asarray(REAL, jnp.float32)
    out = {}
    for gce_sigma in (0.0, 1.0):
        for sigma in (0.0, 1.0):
            out[gce_sigma, sigma] = ntl_jax.cross_entropy_and_ntl(
                LOGITS, TARGETS, NT, weights=weights, number_loss=losses.was_cdf(sigma=sigma), gce_sigma=gce_sigma,
                loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")[1]
    one_hot, gaussian = _was_cdf_one_hot(LOGITS), _was_cdf_gaussian(LOGITS, 1.0)
    for gce_sigma in (0.0, 1.0):
        np.testing.assert_allclose(float(out[gce_sigma, 0.0]["ntl"]), (one_hot[0, 0] + one_hot[1, 0]) / 2, rtol=1e-5)
        np.testing.assert_allclose(float(out[gce_sigma, 1.0]["ntl"]), (gaussian[0, 0] + gaussian[1, 0]) / 2,
                                   rtol=1e-5)
    np.testing.assert_allclose(float(out[0.0, 0.0]["ntl"]), float(out[1.0, 0.0]["ntl"]), rtol=1e-6)
    assert abs(float(out[0.0, 1.0]["ntl"]) - float(out[0.0, 0.0]["ntl"])) > 0.05, out
    # ... while gce_sigma does change the cross-entropy, whatever the number loss.
    for sigma in (0.0, 1.0):
        assert abs(float(out[1.0, sigma]["cross_entropy"]) - float(out[0.0, sigma]["cross_entropy"])) > 0.05
    np.testing.assert_allclose(float(out[1.0, 0.0]["cross_entropy"]), float(out[1.0, 1.0]["cross_entropy"]),
                               rtol=1e-6)
