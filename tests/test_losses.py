"""Hand-computed values, gradients, numerics, properties and input checks of the losses."""

import functools

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

from ntl_jax import NumberTokens, losses
from tests.formulation import ntl_jax_under_test as ntl_jax

PIECES = ["<pad>", "</s>", "x", "."] + list("0123456789")  # digit d has id d + 4
NT = NumberTokens.from_pieces(PIECES)
V = len(PIECES)
ALL_KINDS = list(losses.NAMES)
# The losses with no largest value for reweigh to charge (NTL's successors).
UNBOUNDED = tuple(kind for kind in ALL_KINDS if losses.parse(kind).ceiling is None)


def number_loss(kind, reweigh=False):
    """The shipped loss named `kind` at its defaults, reweighed when asked."""
    return losses.LOSSES[kind](reweigh=True) if reweigh else losses.LOSSES[kind]()


# Each loss plain, and reweighed where it can be.
KIND_REWEIGH = [number_loss(kind, reweigh) for kind in ALL_KINDS for reweigh in (False, True)
                if not (reweigh and kind in UNBOUNDED)]


def digit(d):
    return d + 4


def logits_from_probs(probs):
    """Logits whose softmax is `probs` (rows over the whole vocabulary)."""
    return jnp.log(jnp.asarray(probs, jnp.float32) + 1e-30)


def random_logits(seed, shape=(2, 6, V), scale=2.0):
    return jax.random.normal(jax.random.PRNGKey(seed), shape) * scale


TARGETS = jnp.array([[digit(1), digit(2), 3, digit(5), 1, 0], [2, digit(9), digit(0), digit(0), 1, 0]])


# -- hand-computed values ------------------------------------------------------------


def test_was_hand_computed():
    # Number mass split 0.25 on "1", 0.75 on "7"; target "4": 0.25*3 + 0.75*3 = 3.
    probs = np.zeros(V)
    probs[digit(1)], probs[digit(7)], probs[2] = 0.2, 0.6, 0.2  # 0.2 off the number tokens
    logits = logits_from_probs(probs)[None, None]
    target = jnp.array([[digit(4)]])
    np.testing.assert_allclose(ntl_jax.ntl_was(logits, target, NT), [[3.0]], rtol=1e-6)
    # reweigh: mass 0.8 -> 3 * 0.8 + 1.01 * 9 * 0.2
    np.testing.assert_allclose(ntl_jax.ntl_was(logits, target, NT, reweigh=True), [[2.4 + 1.818]], rtol=1e-6)
    # squash 3 on digits: distance d -> 1 + (d - 1) * 2 / 8, so |4-1| = |4-7| = 3 -> 1.5.
    np.testing.assert_allclose(ntl_jax.ntl_was(logits, target, NT, squash_factor=3.0), [[1.5]], rtol=1e-6)


@pytest.mark.parametrize("loss,expected", [("mse", 6.25), ("mae", 2.5), ("huber", 2.0)])
def test_dot_hand_computed(loss, expected):
    # Expected value 0.5*2 + 0.5*5 = 3.5, target 1: error 2.5.
    probs = np.zeros(V)
    probs[digit(2)] = probs[digit(5)] = 0.5
    logits = logits_from_probs(probs)[None, None]
    got = ntl_jax.ntl_dot(logits, jnp.array([[digit(1)]]), NT, loss_function=loss)
    np.testing.assert_allclose(ntl_jax.number_token_loss(logits, jnp.array([[digit(1)]]), NT, number_loss=loss),
                               [[expected]], rtol=1e-6)
    np.testing.assert_allclose(got, [[expected]], rtol=1e-6)


def test_huber_below_delta_is_quadratic():
    probs = np.zeros(V)
    probs[digit(1)] = probs[digit(2)] = 0.5  # expected 1.5, target 1: 0.5 * 0.25
    got = ntl_jax.ntl_dot(logits_from_probs(probs)[None, None], jnp.array([[digit(1)]]), NT, loss_function="huber")
    np.testing.assert_allclose(got, [[0.125]], rtol=1e-6)


def test_number_level_hand_computed():
    # Target "12.5" predicted with certainty as "13.5".
    target = jnp.array([[digit(1), digit(2), 3, digit(5), 1]])
    predicted = jnp.array([[digit(1), digit(3), 3, digit(5), 1]])
    logits = logits_from_probs(jax.nn.one_hot(predicted, V))
    # Integer level: "12" vs "13" and "5" vs "5".
    np.testing.assert_allclose(
        ntl_jax.number_level_loss(logits, target, NT), [[1 / 25, 0, 0, 0, 0]], rtol=1e-5, atol=1e-7)
    # Float level: 125 vs 135, one number at the first digit.
    np.testing.assert_allclose(
        ntl_jax.number_level_loss(logits, target, NT, float_level=True), [[10 / 260, 0, 0, 0, 0]], rtol=1e-5)
    np.testing.assert_allclose(
        ntl_jax.number_token_loss(logits, target, NT, number_loss="number_level_float"), [[10 / 260, 0, 0, 0, 0]],
        rtol=1e-5)


def test_join_digit_runs_places_numbers_at_their_first_digit():
    is_digit = jnp.array([[True, True, False, True, True, True, False, True]])
    values = jnp.array([[4.0, 2.0, 0.0, 1.0, 0.0, 7.0, 0.0, 3.0]])
    starts, numbers = ntl_jax._core.digit_runs.join_digit_runs(is_digit, values)
    assert starts.tolist() == [[True, False, False, True, False, False, False, True]]
    assert numbers.tolist() == [[42.0, 0, 0, 107.0, 0, 0, 0, 3.0]]


def test_reductions_and_weights():
    logits = random_logits(0)
    weights = jnp.array([[1.0, 0.5, 3.0, 0.0, 1.0, 1.0], [1.0, 2.0, 0.0, 1.0, 1.0, 1.0]])
    per_token = ntl_jax.ntl_was(logits, TARGETS, NT)
    counted = np.array([[1, 1, 0, 1, 0, 0], [0, 1, 1, 1, 0, 0]], bool)
    assert (np.asarray(per_token)[~counted] == 0).all() and (np.asarray(per_token)[counted] > 0).all()
    weighted = ntl_jax.ntl_was(logits, TARGETS, NT, weights=weights)
    np.testing.assert_allclose(weighted, per_token * weights, rtol=1e-6)
    total = float(jnp.sum(per_token * weights))
    np.testing.assert_allclose(ntl_jax.ntl_was(logits, TARGETS, NT, weights=weights, reduction="sum"), total, rtol=1e-6)
    counted_weight = float(np.sum(np.asarray(weights)[counted]))  # 1 + 0.5 + 0 + 2 + 0 + 1
    np.testing.assert_allclose(
        ntl_jax.ntl_was(logits, TARGETS, NT, weights=weights, reduction="mean"), total / counted_weight, rtol=1e-6)


STANDALONE_LOSSES = [ntl_jax.ntl_was, ntl_jax.ntl_dot, ntl_jax.number_level_loss, ntl_jax.number_token_loss]


@pytest.mark.parametrize("loss", STANDALONE_LOSSES, ids=lambda f: f.__name__)
def test_default_reduction_is_per_position_and_the_docstring_says_it_is_no_scalar(loss):
    # The default stays "none" (ntloss's); forgetting it is JAX's scalar-output error,
    # which the docstrings quote.
    logits = random_logits(2)
    assert loss(logits, TARGETS, NT).shape == TARGETS.shape
    with pytest.raises(TypeError, match="Gradient only defined for scalar-output functions"):
        jax.grad(lambda x: loss(x, TARGETS, NT))(logits)
    assert jax.grad(lambda x: loss(x, TARGETS, NT, reduction="mean"))(logits).shape == logits.shape
    doc = " ".join(loss.__doc__.split())
    assert "not a scalar" in doc and '"mean"' in doc
    for doc in (ntl_jax._core.losses.__doc__, ntl_jax.ntl_was.__doc__):
        assert "Gradient only defined for scalar-output functions" in " ".join(doc.split())


def test_dispatcher_matches_named_functions():
    logits = random_logits(1)
    for kind in (kind for kind in ALL_KINDS if kind not in UNBOUNDED):  # those have their own tests
        got = ntl_jax.number_token_loss(logits, TARGETS, NT, number_loss=number_loss(kind, reweigh=True),
                                        reduction="sum")
        if kind in ("was", "was_cdf"):  # the same on evenly spaced digits with a one-hot label
            want = ntl_jax.ntl_was(logits, TARGETS, NT, reweigh=True, reduction="sum")
        elif kind.startswith("number_level"):
            want = ntl_jax.number_level_loss(
                logits, TARGETS, NT, float_level=kind == "number_level_float", reweigh=True, reduction="sum")
        else:
            want = ntl_jax.ntl_dot(logits, TARGETS, NT, loss_function=kind, reweigh=True, reduction="sum")
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_predict_numbers_values():
    logits = random_logits(2)
    value, mass = ntl_jax.predict_numbers(logits, NT)
    probs = np.asarray(jax.nn.softmax(logits, -1))
    nt_probs = probs[..., 4:]
    np.testing.assert_allclose(mass, nt_probs.sum(-1), rtol=1e-5)
    np.testing.assert_allclose(value, (nt_probs / nt_probs.sum(-1, keepdims=True)) @ np.arange(10), rtol=1e-5)


# -- gradients and numerics -------------------------------------------------------------


# NTIL's value reads the argmax digits, its gradient passes straight through a softmax:
# no finite difference follows it (tests/test_ntil.py holds it to its authors').
@pytest.mark.parametrize("loss", [loss for loss in KIND_REWEIGH if loss.name != "ntil"], ids=lambda loss: loss.spec)
def test_gradients_match_finite_differences(loss):
    f = functools.partial(ntl_jax.number_token_loss, targets=TARGETS, number_tokens=NT, number_loss=loss,
                          reduction="mean")
    check_grads(lambda logits: f(logits), (random_logits(3, scale=1.0),), order=1, modes=["rev"],
                atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("loss", KIND_REWEIGH, ids=lambda loss: loss.spec)
@pytest.mark.parametrize("scale", [1e4, -1e4])
def test_finite_at_extreme_logits(loss, scale):
    logits = jnp.sign(random_logits(4)) * scale
    def f(logits):
        return ntl_jax.number_token_loss(logits, TARGETS, NT, number_loss=loss, reduction="mean")
    value, grad = jax.value_and_grad(f)(logits)
    assert np.isfinite(value) and np.isfinite(np.asarray(grad)).all()


@pytest.mark.parametrize("loss", KIND_REWEIGH, ids=lambda loss: loss.spec)
def test_bf16_and_f16_logits_compute_in_f32(loss):
    """16-bit logits are widened exactly and every statistic (the masses too) is taken
    in float32: the value is the float32 one of the widened logits, and the gradient
    is its float32 gradient rounded once to the logits' dtype (half a unit in the last
    place, also among the subnormals)."""
    logits = random_logits(5)
    for dtype in (jnp.bfloat16, jnp.float16):
        low = logits.astype(dtype)

        def f(x):
            return ntl_jax.number_token_loss(x, TARGETS, NT, number_loss=loss, reduction="sum")

        got, grad = jax.value_and_grad(f)(low)
        want, want_grad = jax.value_and_grad(f)(low.astype(jnp.float32))
        assert got.dtype == jnp.float32 and grad.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(grad, np.float32), want_grad, rtol=float(jnp.finfo(dtype).eps),
                                   atol=float(jnp.finfo(dtype).smallest_subnormal))


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_no_number_token_gives_exact_zero(kind):
    targets = jnp.array([[2, 3, 1, 0], [0, 0, 0, 0]])
    logits = random_logits(6, shape=(2, 4, V))
    for reduction in ("none", "sum", "mean"):
        value = ntl_jax.number_token_loss(logits, targets, NT, number_loss=number_loss(kind, kind not in UNBOUNDED),
                                          reduction=reduction)
        assert np.all(np.asarray(value) == 0.0)
    grad = jax.grad(lambda x: ntl_jax.number_token_loss(x, targets, NT, number_loss=kind, reduction="mean"))(logits)
    assert np.all(np.asarray(grad) == 0.0)


def test_all_weights_zero_gives_zero_mean_not_nan():
    value = ntl_jax.ntl_was(random_logits(7), TARGETS, NT, weights=jnp.zeros(TARGETS.shape), reduction="mean")
    assert float(value) == 0.0


def test_out_of_vocabulary_targets_are_ignored():
    ignored = TARGETS.at[0, 0].set(-100)
    per_token = ntl_jax.ntl_was(random_logits(8), ignored, NT)
    assert float(per_token[0, 0]) == 0.0 and float(per_token[0, 1]) > 0


# -- properties ---------------------------------------------------------------------


number_logits = hnp.arrays(np.float32, (1, 3, V), elements=st.floats(-20, 20, width=32))
target_rows = st.lists(st.integers(0, V - 1), min_size=3, max_size=3).map(lambda r: jnp.array([r]))


@settings(max_examples=40, deadline=None)
@given(number_logits, target_rows, st.sampled_from([None, 2.0, 9.0]))
def test_was_is_non_negative(logits, targets, squash):
    assert np.all(np.asarray(ntl_jax.ntl_was(jnp.asarray(logits), targets, NT, squash_factor=squash)) >= 0)


@settings(max_examples=40, deadline=None)
@given(number_logits, st.integers(0, 9))
def test_was_is_zero_when_number_mass_sits_on_the_target(logits, d):
    logits = jnp.asarray(logits).at[..., 4:].set(-1e4).at[..., digit(d)].set(0.0)
    targets = jnp.full((1, 3), digit(d))
    np.testing.assert_allclose(ntl_jax.ntl_was(logits, targets, NT), 0.0, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 9), st.sampled_from([None, 3.0]))
def test_was_grows_with_the_distance_of_a_point_mass(target, squash):
    predictions = jnp.arange(10)
    logits = logits_from_probs(jax.nn.one_hot(digit(predictions), V))[None]
    losses = np.asarray(ntl_jax.ntl_was(logits, jnp.full((1, 10), digit(target)), NT, squash_factor=squash))[0]
    distance = np.abs(np.arange(10) - target)
    order = np.argsort(distance, kind="stable")
    assert np.all(np.diff(losses[order]) >= -1e-6)
    assert np.all((losses > 1e-6) == (distance > 0))  # strictly grows away from the target


@settings(max_examples=30, deadline=None)
@given(number_logits, number_logits, st.sampled_from(ALL_KINDS))
def test_non_number_logits_do_not_matter_without_reweigh(a, b, kind):
    mixed = jnp.asarray(b).at[..., 4:].set(jnp.asarray(a)[..., 4:])
    targets = jnp.array([[digit(3), digit(1), digit(4)]])
    np.testing.assert_allclose(
        ntl_jax.number_token_loss(jnp.asarray(a), targets, NT, number_loss=kind),
        ntl_jax.number_token_loss(mixed, targets, NT, number_loss=kind), rtol=1e-5, atol=1e-6)


# -- transformations --------------------------------------------------------------------


def test_jit_does_not_recompile_on_new_values():
    traces = []

    @jax.jit
    def step(logits, targets, weights):
        traces.append(1)
        return ntl_jax.cross_entropy_and_ntl(logits, targets, NT, weights=weights)[0]

    first = step(random_logits(9), TARGETS, jnp.ones(TARGETS.shape))
    second = step(random_logits(10), TARGETS[::-1], jnp.full(TARGETS.shape, 0.5, jnp.float32))
    assert len(traces) == 1 and float(first) != float(second)


def test_number_tokens_as_a_jit_argument_equals_closure_constant():
    logits = random_logits(11)
    as_argument = jax.jit(lambda l, t, nt: ntl_jax.ntl_was(l, t, nt, reweigh=True, squash_factor=4.0))
    np.testing.assert_allclose(
        as_argument(logits, TARGETS, NT), ntl_jax.ntl_was(logits, TARGETS, NT, reweigh=True, squash_factor=4.0),
        rtol=1e-6)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_vmap_equals_a_loop(kind):
    logits = random_logits(12, shape=(3, 2, 6, V))
    targets = jnp.stack([TARGETS, TARGETS[::-1], TARGETS[:, ::-1]])
    f = functools.partial(ntl_jax.number_token_loss, number_tokens=NT, number_loss=kind, reduction="mean")
    mapped = jax.vmap(lambda l, t: f(l, t))(logits, targets)
    np.testing.assert_allclose(mapped, [f(logits[i], targets[i]) for i in range(3)], rtol=1e-6)


# -- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "logits,targets,kwargs,error,message",
    [
        (jnp.zeros((2, V)), jnp.zeros((2,), int), {}, ValueError, r"logits of rank 3.*got shape \(2, 14\)"),
        (jnp.zeros((2, 3, V)), jnp.zeros((2,), int), {}, ValueError, r"targets of rank 2.*got shape \(2,\)"),
        (jnp.zeros((2, 3, V)), jnp.zeros((2, 4), int), {}, ValueError, r"targets of shape \(2, 3\).*got \(2, 4\)"),
        (jnp.zeros((2, 3, V)), jnp.zeros((2, 3)), {}, TypeError, "integer targets.*float32"),
        (jnp.zeros((2, 3, V), int), jnp.zeros((2, 3), int), {}, TypeError, "floating-point logits.*int32"),
        (jnp.zeros((2, 3, V - 1)), jnp.zeros((2, 3), int), {}, ValueError,
         r"last axis >= the vocabulary size.*\(14\), got 13"),
        (jnp.zeros((2, 3, V)), jnp.zeros((2, 3), int), {"weights": jnp.ones((3, 2))}, ValueError,
         r"weights of shape \(2, 3\).*got \(3, 2\)"),
        (jnp.zeros((2, 3, V)), jnp.zeros((2, 3), int), {"reduction": "avg"}, ValueError, "reduction in.*'avg'"),
        (jnp.zeros((2, 3, V)), jnp.zeros((2, 3), int), {"number_loss": "l3"}, ValueError,
         r"expected a number loss in \('was', .*or 'none'\), got 'l3'"),
        (jnp.zeros((2, 3, V)), jnp.zeros((2, 3), int), {"number_loss": "mse(squash_factor=2.0)"}, ValueError,
         r"number loss 'mse' has no parameter 'squash_factor' \(it takes \('reweigh',\), and every loss mean_over\)"),
        (jnp.zeros((2, 3, V)), jnp.zeros((2, 3), int), {"number_loss": None}, ValueError,
         "expected number_loss a NumberLoss or a spec of one, got None"),
        (jnp.zeros((2, 3, V)), jnp.zeros((2, 3), int), {"ntl_kind": "l3"}, TypeError,
         r"number_token_loss\(\) no longer takes ntl_kind= .*pass number_loss="),
        (jnp.zeros((2, 3, V)), jnp.zeros((2, 3), int), {"number_loss": "mse", "squash_factor": 2.0}, TypeError,
         r"no longer takes squash_factor= .*number_loss=ntl_jax.losses.was\(squash_factor=...\)"),
    ],
)
def test_bad_input_names_expected_and_actual(logits, targets, kwargs, error, message):
    with pytest.raises(error, match=message):
        ntl_jax.number_token_loss(logits, targets, NT, **kwargs)


def test_bad_dot_loss_and_number_tokens():
    with pytest.raises(ValueError, match=r"expected loss_function in \('mse', 'mae', 'huber'\) or a function.*'l2'"):
        ntl_jax.ntl_dot(jnp.zeros((1, 1, V)), jnp.zeros((1, 1), int), NT, loss_function="l2")
    with pytest.raises(TypeError, match=r"ntl_dot\(\) no longer takes ntl_kind= .*pass loss_function="):
        ntl_jax.ntl_dot(jnp.zeros((1, 1, V)), jnp.zeros((1, 1), int), NT, ntl_kind="l2")
    with pytest.raises(TypeError, match="NumberTokens, got list"):
        ntl_jax.ntl_was(jnp.zeros((1, 1, V)), jnp.zeros((1, 1), int), PIECES)
