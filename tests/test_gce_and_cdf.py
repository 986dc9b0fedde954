"""Gaussian-smoothed cross-entropy (`gce_sigma`) and NTL-WAS-CDF (`ntl_jax.losses.was_cdf`,
its Gaussian label of its own width `sigma`) against numpy references written from their
definitions in float64, on random logits, targets, weights and ignored positions;
gradients; the identity with NTL-WAS on digits; the fused head. ntloss has neither, so
there is no parity test with it."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import ntl_jax as package
from ntl_jax import NumberTokens, fused_cross_entropy_and_ntl, losses
from ntl_jax._core.targets import gaussian_label, number_target
from tests.formulation import bound
from tests.formulation import ntl_jax_under_test as ntl_jax

cross_entropy_and_ntl = ntl_jax.cross_entropy_and_ntl


def target_distribution(targets, number_tokens, gce_sigma):
    """`(smoothed, q)`: GCE's label over the number tokens `[batch, length, N]` (the
    one-hot where it does not smooth), as the objective and NTL-WAS-CDF build it."""
    target = number_target(targets, None, number_tokens.vocab_size, number_tokens)
    one_hot = (targets[..., None] == jnp.asarray(number_tokens.ids)).astype(jnp.float32)
    if gce_sigma == 0:
        return jnp.zeros(targets.shape, bool), one_hot
    label = gaussian_label(target, number_tokens, gce_sigma)
    q = label.at(jnp.asarray(number_tokens.number_values, jnp.float32),
                 number_tokens.at_numbers(number_tokens.digit_counts, jnp.int32))
    return label.smoothed, jnp.where(label.smoothed[..., None], q, one_hot)


# Digits at scattered ids (their value order is not their id order).
DIGITS = NumberTokens.from_pieces(["<pad>", "</s>", "7", "x", "3", "0", ".", "9", "1", "y", "5", "2", "8", "4", "6"])
# Multi-digit pieces: 1-, 2- and 3-digit groups, "7" and "07" sharing a value, and
# number tokens with a sign or a point (digit count 0).
WIDE = NumberTokens.from_pieces(
    ["<pad>", "</s>", "x", ".", "7", "07", "12", "3", "-1", "3.5", "00", "5", "99", "0", "120", "9", "45", "1", "2"],
    digit_level=False,
)
EXTRA = 3  # the logits have a few columns beyond the table (no numbers)
B, L = 3, 11


def _inputs(nt, seed=0, scale=2.0):
    rng = np.random.default_rng(seed)
    vocab = nt.vocab_size + EXTRA
    logits = rng.normal(size=(B, L, vocab)) * scale
    ids = np.asarray(nt.ids)
    # Mostly number targets, some others, ids beyond the table and outside the logits.
    pool = np.r_[ids, ids, [1, 2, 3, nt.vocab_size + 1, vocab + 4, -5]]
    targets = rng.choice(pool, size=(B, L))
    weights = rng.choice([0.0, 0.5, 1.0, 2.0], size=(B, L), p=[0.2, 0.2, 0.4, 0.2])
    # An ignored position full of NaN.
    weights[1, 3] = 0.0
    logits[1, 3] = np.nan
    return jnp.asarray(logits, jnp.float32), jnp.asarray(targets, jnp.int32), jnp.asarray(weights, jnp.float32)


def _label(nt, target, sigma, vocab):
    """The label over the whole vocabulary, written from the definition."""
    values = np.asarray(nt.values, np.float64)
    counts = np.asarray(nt.digit_counts)
    label = np.zeros(vocab)
    is_number = target < nt.vocab_size and not np.isnan(values[target])
    if sigma > 0 and is_number and counts[target] > 0:
        for j in np.asarray(nt.ids):
            if counts[j] == counts[target]:
                label[j] = np.exp(-((values[j] - values[target]) ** 2) / (2 * sigma**2))
        return label / label.sum()
    label[target] = 1.0
    return label


def _logsumexp(x):
    top = x.max()
    return top + np.log(np.exp(x - top).sum())


def reference(logits, targets, weights, nt, *, sigma, kind, ntl_weight=0.3, reweigh=False, factor=None,
              cdf_sigma=None):
    """`(loss, cross_entropy, ntl, d loss / d logits, ntl_mean)` in float64, position by
    position: `ntl_mean` the number loss's weighted mean over the positions it counts,
    `ntl` that mean beside the cross-entropy as the paper puts it beside CE's mean over
    the tokens (the mean x the weights' sum over the factor).

    GCE: `-sum_j label_j log softmax(logits)_j`, the entropy not subtracted, the label
    of width `sigma`.
    WAS-CDF: `sum_k |CDF_p(k) - CDF_q(k)|` over the number tokens sorted by value (ties
    by id), `p` the softmax over the number tokens, `q` the label on them, of width
    `cdf_sigma` (None: `sigma`, the authors' pairing).
    WAS: `sum_j p_j |y - v_j|`, the label's value only.
    """
    cdf_sigma = sigma if cdf_sigma is None else cdf_sigma
    logits = np.asarray(logits, np.float64)
    targets, weights = np.asarray(targets), np.asarray(weights, np.float64)
    vocab = logits.shape[-1]
    ids = np.asarray(nt.ids)
    v = np.asarray(nt.values, np.float64)[ids]
    order = np.argsort(v, kind="stable")
    ce = ntl = counted_weight = weight_sum = 0.0
    grad = np.zeros_like(logits)
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            y, w = targets[b, t], weights[b, t]
            if w == 0 or not 0 <= y < vocab:
                continue
            weight_sum += w
            row = logits[b, t]
            lse = _logsumexp(row)
            label = _label(nt, y, sigma, vocab)
            ce += -w * label @ (row - lse)
            grad[b, t] += w * (np.exp(row - lse) - label)
            if y >= nt.vocab_size or np.isnan(nt.values[y]) or kind == "none":
                continue
            p = np.exp(row[ids] - _logsumexp(row[ids]))
            if kind == "was_cdf":
                q = _label(nt, y, cdf_sigma, vocab)[ids]
                loss = np.abs(np.cumsum((p - q)[order])[:-1]).sum()
                ceiling = len(ids) - 1
            else:
                loss = p @ np.abs(float(nt.values[y]) - v)
                ceiling = v.max() - v.min()
            if reweigh:
                mass = np.exp(_logsumexp(row[ids]) - lse)
                loss = loss * mass + 1.01 * ceiling * (1 - mass)
            ntl += w * loss
            counted_weight += w
    divisor = 1.0 if factor is None else factor
    mean = ntl / counted_weight if counted_weight > 0 else 0.0
    return ((ce + ntl_weight * mean * weight_sum) / divisor, ce / divisor, mean * weight_sum / divisor,
            grad / divisor, mean)


def number_loss(kind, sigma=0.0, reweigh=False):
    """The loss the reference's `kind` computes: WAS-CDF against the label of width `sigma`."""
    if kind == "none":
        return None
    if kind == "was_cdf":
        return losses.was_cdf(sigma=sigma, reweigh=reweigh)
    return losses.LOSSES[kind](reweigh=reweigh)


# float32 sums of <= 33 positions of O(1) terms, each a float32 logsumexp or cumulative
# sum over <= 22 entries: a few ulps each, 2e-6 relative with room.
RTOL = 2e-6


@pytest.mark.parametrize("nt", [DIGITS, WIDE], ids=["digits", "wide"])
@pytest.mark.parametrize("sigma", [0.0, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("kind,reweigh", [("was_cdf", False), ("was_cdf", True), ("was", False), ("none", False)])
def test_objective_matches_the_numpy_reference(nt, sigma, kind, reweigh):
    logits, targets, weights = _inputs(nt, seed=int(sigma * 10) + len(kind))
    loss, parts = cross_entropy_and_ntl(logits, targets, nt, weights=weights, gce_sigma=sigma,
                                        number_loss=number_loss(kind, sigma, reweigh), loss_normalizing_factor=7.0)
    want = reference(logits, targets, weights, nt, sigma=sigma, kind=kind, reweigh=reweigh, factor=7.0)
    np.testing.assert_allclose(float(parts["cross_entropy"]), want[1], rtol=RTOL)
    np.testing.assert_allclose(float(parts["ntl_term"]), 0.3 * want[2], rtol=RTOL, atol=1e-7)
    np.testing.assert_allclose(float(parts["ntl"]), want[4], rtol=RTOL, atol=1e-7)
    np.testing.assert_allclose(float(loss), want[0], rtol=RTOL)


@pytest.mark.parametrize("nt", [DIGITS, WIDE], ids=["digits", "wide"])
@pytest.mark.parametrize("gce_sigma,cdf_sigma", [(0.0, 1.0), (1.0, 0.0), (1.0, 0.5), (0.5, 3.0)])
def test_was_cdf_label_has_its_own_width(nt, gce_sigma, cdf_sigma):
    """`gce_sigma` smooths the cross-entropy's label only; `was_cdf(sigma=...)` its own."""
    logits, targets, weights = _inputs(nt, seed=int(10 * gce_sigma + 100 * cdf_sigma))
    loss, parts = cross_entropy_and_ntl(logits, targets, nt, weights=weights, gce_sigma=gce_sigma,
                                        number_loss=losses.was_cdf(sigma=cdf_sigma))
    want = reference(logits, targets, weights, nt, sigma=gce_sigma, cdf_sigma=cdf_sigma, kind="was_cdf")
    np.testing.assert_allclose(float(parts["cross_entropy"]), want[1], rtol=RTOL)
    np.testing.assert_allclose(float(parts["ntl"]), want[4], rtol=RTOL)
    np.testing.assert_allclose(float(loss), want[0], rtol=RTOL)
    # Either width alone changes its own term and nothing else.
    _, same_ce = cross_entropy_and_ntl(logits, targets, nt, weights=weights, gce_sigma=gce_sigma,
                                       number_loss=losses.was_cdf(sigma=gce_sigma))
    _, same_ntl = cross_entropy_and_ntl(logits, targets, nt, weights=weights, gce_sigma=cdf_sigma,
                                        number_loss=losses.was_cdf(sigma=cdf_sigma))
    np.testing.assert_allclose(float(same_ce["cross_entropy"]), float(parts["cross_entropy"]), rtol=1e-6)
    np.testing.assert_allclose(float(same_ntl["ntl"]), float(parts["ntl"]), rtol=1e-6)
    assert abs(float(same_ce["ntl"]) - float(parts["ntl"])) > 1e-3 * float(parts["ntl"])


@pytest.mark.parametrize("nt", [DIGITS, WIDE], ids=["digits", "wide"])
def test_cross_entropy_gradient_is_softmax_minus_the_smoothed_label(nt):
    logits, targets, weights = _inputs(nt, seed=11)
    grad = jax.grad(lambda x: cross_entropy_and_ntl(x, targets, nt, weights=weights, gce_sigma=1.5,
                                                    ntl_weight=0.0)[0])(logits)
    want = reference(logits, targets, weights, nt, sigma=1.5, kind="none")[3]
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind,reweigh", [("was_cdf", False), ("was_cdf", True), ("none", False)])
def test_gradients_match_finite_differences(kind, reweigh):
    logits, targets, weights = _inputs(WIDE, seed=12, scale=1.0)
    logits = jnp.where(weights[..., None] > 0, logits, 0.0)  # finite differences through NaN are NaN
    f = functools.partial(cross_entropy_and_ntl, targets=targets, number_tokens=WIDE, weights=weights,
                          gce_sigma=1.0, number_loss=number_loss(kind, 1.0, reweigh), ntl_weight=1.0,
                          loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    check_grads(lambda x: f(x)[0], (logits,), order=1, modes=["rev"], atol=2e-2, rtol=2e-2)


def test_the_label_hand_computed():
    pieces = ["<pad>", "</s>", "x", ".", "7", "07", "12", "3", "-1", "3.5", "00", "5", "99", "0", "120", "9", "45", "1",
              "2"]
    index = {p: i for i, p in enumerate(np.asarray(WIDE.ids).tolist())}
    targets = jnp.asarray([[pieces.index(p) for p in ("07", "-1", "x", "120", "3")]])
    smoothed, q = target_distribution(targets, WIDE, 2.0)
    assert np.asarray(smoothed).tolist() == [[True, False, False, True, True]]
    q = np.asarray(q[0], np.float64)
    # "07" (7) over the 2-digit pieces 07, 12, 00, 99, 45.
    g = {p: np.exp(-((v - 7) ** 2) / 8) for p, v in (("07", 7), ("12", 12), ("00", 0), ("99", 99), ("45", 45))}
    want = np.zeros(WIDE.num_numbers)
    for p, x in g.items():
        want[index[pieces.index(p)]] = x / sum(g.values())
    np.testing.assert_allclose(q[0], want, rtol=1e-6, atol=1e-30)
    assert q[0, index[pieces.index("7")]] == 0.0  # same value, another digit count
    np.testing.assert_array_equal(q[1], np.eye(WIDE.num_numbers)[index[pieces.index("-1")]])  # sign: one-hot
    np.testing.assert_array_equal(q[2], 0.0)  # no number
    np.testing.assert_array_equal(q[3], np.eye(WIDE.num_numbers)[index[pieces.index("120")]])  # alone in its group
    # A very wide Gaussian is uniform over the group; a very narrow one is the one-hot.
    wide = np.asarray(target_distribution(targets, WIDE, 1e6)[1][0, 4])
    one_digit = [index[pieces.index(p)] for p in ("7", "3", "5", "0", "9", "1", "2")]
    np.testing.assert_allclose(wide[one_digit], 1 / 7, rtol=1e-6)
    narrow = np.asarray(target_distribution(targets, WIDE, 1e-30)[1])
    np.testing.assert_array_equal(narrow, np.asarray(target_distribution(targets, WIDE, 0.0)[1]))


def test_sigma_zero_is_cross_entropy_bitwise():
    logits, targets, weights = _inputs(DIGITS, seed=13)

    def run(**options):
        return jax.value_and_grad(
            lambda x: cross_entropy_and_ntl(x, targets, DIGITS, weights=weights, **options), has_aux=True,
        )(logits)

    (loss, parts), grad = run(z_loss=1e-3)
    for options in (dict(gce_sigma=0.0), dict(gce_sigma=1e-3)):  # a narrow Gaussian is the one-hot too
        (loss_s, parts_s), grad_s = run(z_loss=1e-3, **options)
        assert float(loss_s) == float(loss), options
        assert all(float(parts_s[k]) == float(parts[k]) for k in parts), options
        np.testing.assert_array_max_ulp(np.asarray(grad_s), np.asarray(grad), maxulp=0 if options["gce_sigma"] == 0
                                        else 4)


@pytest.mark.parametrize("reweigh", [False, True])
def test_was_cdf_is_ntl_was_on_digits_with_a_one_hot_label(reweigh):
    logits, targets, weights = _inputs(DIGITS, seed=14)
    cdf = ntl_jax.number_token_loss(logits, targets, DIGITS, number_loss=losses.was_cdf(reweigh=reweigh),
                                    weights=weights)
    was = ntl_jax.number_token_loss(logits, targets, DIGITS, number_loss=losses.was(reweigh=reweigh), weights=weights)
    assert np.count_nonzero(np.asarray(was)) >= 15
    # Sums of <= 10 float32 terms in different orders.
    np.testing.assert_allclose(np.asarray(cdf), np.asarray(was), rtol=2e-6, atol=1e-7)
    _, parts = cross_entropy_and_ntl(logits, targets, DIGITS, weights=weights,
                                     number_loss=losses.was_cdf(reweigh=reweigh))
    _, parts_was = cross_entropy_and_ntl(logits, targets, DIGITS, weights=weights,
                                         number_loss=losses.was(reweigh=reweigh))
    for part in ("ntl", "ntl_term"):
        np.testing.assert_allclose(float(parts[part]), float(parts_was[part]), rtol=2e-6)


def test_was_cdf_differs_from_was_under_the_gaussian_label():
    logits, targets, weights = _inputs(DIGITS, seed=15)
    _, cdf = cross_entropy_and_ntl(logits, targets, DIGITS, weights=weights, number_loss=losses.was_cdf(sigma=1.0),
                                   gce_sigma=1.0)
    _, was = cross_entropy_and_ntl(logits, targets, DIGITS, weights=weights, number_loss="was", gce_sigma=1.0)
    want = reference(logits, targets, weights, DIGITS, sigma=1.0, kind="was_cdf")
    np.testing.assert_allclose(float(cdf["ntl"]), want[4], rtol=RTOL)
    np.testing.assert_allclose(float(cdf["ntl_term"]), 0.3 * want[2], rtol=RTOL)
    assert abs(float(cdf["ntl"]) - float(was["ntl"])) > 0.05 * float(was["ntl"])
    # Ranks, not values: on the multi-digit table WAS-CDF is no longer NTL-WAS.
    logits, targets, weights = _inputs(WIDE, seed=16)
    cdf = ntl_jax.number_token_loss(logits, targets, WIDE, number_loss="was_cdf", weights=weights, reduction="sum")
    was = ntl_jax.number_token_loss(logits, targets, WIDE, number_loss="was", weights=weights, reduction="sum")
    assert abs(float(cdf) - float(was)) > 0.05 * float(was)


FUSED_OPTIONS = [
    dict(number_loss=losses.was_cdf(sigma=1.0), gce_sigma=1.0),
    dict(number_loss=losses.was_cdf(sigma=0.7, reweigh=True), gce_sigma=0.7, z_loss=1e-3),
    dict(number_loss=None, gce_sigma=2.0, loss_normalizing_factor="AVERAGE_PER_SEQUENCE"),
    dict(number_loss="number_level", gce_sigma=1.0, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS"),
    dict(number_loss=losses.was_cdf(sigma=2.0), gce_sigma=0.5),
]


def _options_id(options):
    return "-".join(f"{k}={getattr(v, 'spec', v)}" for k, v in options.items())


@pytest.mark.parametrize("options", FUSED_OPTIONS, ids=_options_id)
def test_fused_equals_unfused_on_multi_digit_pieces(options):
    _, targets, weights = _inputs(WIDE, seed=17)
    rng = np.random.default_rng(17)
    hidden = jnp.asarray(rng.normal(size=(B, L, 6)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(6, WIDE.vocab_size + EXTRA)), jnp.float32)

    def unfused(h, k):
        return cross_entropy_and_ntl(jnp.einsum("bld,dv->blv", h, k), targets, WIDE, weights=weights, **options)

    def fused(h, k):
        return fused_cross_entropy_and_ntl(h, k, targets, WIDE, weights=weights, chunk_size=5, **options)

    (_, parts_u), grads_u = jax.value_and_grad(unfused, argnums=(0, 1), has_aux=True)(hidden, kernel)
    (_, parts_f), grads_f = jax.value_and_grad(fused, argnums=(0, 1), has_aux=True)(hidden, kernel)
    # Different summation orders in float32 (as tests/test_fused.py).
    for name in parts_u:
        np.testing.assert_allclose(float(parts_f[name]), float(parts_u[name]), rtol=2e-5, atol=1e-6, err_msg=name)
    for a, b in zip(grads_u, grads_f):
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(a - b)) <= 2e-5 * np.max(np.abs(a))


# The fused-head harness of tests/test_fused.py (its vocabulary of 69 ids, chunks of 7).
# These option sets are not in tests/objective_options.py, whose count
# tests/test_vocab_parallel.py fixes.
HARNESS_OPTIONS = {
    "was_cdf-reweigh": dict(number_loss=losses.was_cdf(reweigh=True)),
    "was_cdf-gce": dict(number_loss=losses.was_cdf(sigma=1.0), gce_sigma=1.0, ntl_weight=1.0),
    "gce-z": dict(number_loss=None, gce_sigma=0.5, z_loss=1e-3),
}


@pytest.mark.parametrize("name", HARNESS_OPTIONS)
def test_fused_equals_unfused_in_the_fused_test_harness(name):
    from tests import test_fused

    hidden, kernel, targets, weights = test_fused._inputs(seed=21)
    test_fused._assert_same(*test_fused._both(hidden, kernel, targets, weights=weights, **HARNESS_OPTIONS[name]))


def _count_shaped(jaxpr, shape):
    """Equations (nested ones included) with an output of `shape`."""
    count = 0
    for eqn in jaxpr.eqns:
        count += sum(getattr(v.aval, "shape", None) == shape for v in eqn.outvars)
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    count += _count_shaped(sub, shape)
    return count


def test_no_array_of_the_logits_shape_is_added():
    # The smoothed label lives on the N number tokens: taking the number columns (the
    # CPU's formulation), the loss and its gradient use the same [batch, length, vocab]
    # operations with and without it. (With masked reductions over the vocabulary the
    # label's sum is one more of them, fused with the others: see benchmarks/tpu_cost.py.)
    logits, targets, weights = _inputs(WIDE, seed=18)
    logits = jnp.nan_to_num(logits)

    columns = bound("columns").cross_entropy_and_ntl

    def count(**options):
        f = jax.value_and_grad(lambda x: columns(x, targets, WIDE, weights=weights, **options)[0])
        return _count_shaped(jax.make_jaxpr(f)(logits).jaxpr, logits.shape)

    base = count(number_loss="was")
    assert base > 0
    assert count(number_loss="was", gce_sigma=1.0) == base
    assert count(number_loss=losses.was_cdf(sigma=1.0), gce_sigma=1.0) == base
    assert count(number_loss=losses.was_cdf(sigma=1.0)) == base


def test_jit_and_no_recompile_across_batches():
    traces = []  # the Python body runs once per trace

    def loss(x, t, w):
        traces.append(None)
        return cross_entropy_and_ntl(x, t, WIDE, weights=w, gce_sigma=1.0, number_loss=losses.was_cdf(sigma=1.0))[0]

    f = jax.jit(loss)
    for seed in (19, 20):
        logits, targets, weights = _inputs(WIDE, seed=seed)
        want = reference(logits, targets, weights, WIDE, sigma=1.0, kind="was_cdf")[0]
        np.testing.assert_allclose(float(f(logits, targets, weights)), want, rtol=RTOL)
    assert len(traces) == 1


@pytest.mark.parametrize("scale", [1e4, -1e4])
def test_finite_at_extreme_logits(scale):
    logits, targets, weights = _inputs(WIDE, seed=22)
    logits = jnp.where(weights[..., None] > 0, jnp.sign(logits) * scale, logits)  # NaN stays at the ignored one

    def f(x):
        return cross_entropy_and_ntl(x, targets, WIDE, weights=weights, gce_sigma=0.5,
                                     number_loss=losses.was_cdf(sigma=0.5, reweigh=True), z_loss=1e-4)[0]

    value, grad = jax.value_and_grad(f)(logits)
    assert np.isfinite(float(value))
    assert np.isfinite(np.asarray(grad)).all()
    assert not np.asarray(grad)[1, 3].any()  # the ignored position


def test_number_tokens_as_a_traced_argument():
    # A jitted function may take the table as an argument: the sort then happens on the device.
    logits, targets, weights = _inputs(WIDE, seed=23)
    f = jax.jit(lambda x, nt: cross_entropy_and_ntl(x, targets, nt, weights=weights, gce_sigma=1.0,
                                                    number_loss=losses.was_cdf(sigma=1.0))[1]["ntl"])
    want = reference(logits, targets, weights, WIDE, sigma=1.0, kind="was_cdf")[4]
    np.testing.assert_allclose(float(f(logits, WIDE)), want, rtol=RTOL)


def test_the_cross_entropy_is_one_value_and_its_fields_spell_it_as_keywords():
    """`cross_entropy=package.CrossEntropy(...)` is what every entry point takes; its fields
    as keywords make the same value (the same loss and gradient, bit for bit)."""
    logits = jax.random.normal(jax.random.key(3), (2, 5, DIGITS.vocab_size)) * 2
    targets = jnp.array([[2, 4, 12, 1, 0], [7, 11, 4, 13, 1]])
    ce = package.CrossEntropy(gce_sigma=1.0, z_loss=1e-3)
    for fn in (lambda l, **kw: package.cross_entropy_and_ntl(l, targets, DIGITS, **kw),
               lambda l, **kw: package.fused_cross_entropy_and_ntl(l, jnp.eye(DIGITS.vocab_size), targets, DIGITS,
                                                                    **kw)):
        value, grad = jax.value_and_grad(lambda l, kw: fn(l, **kw)[0])(logits, {"cross_entropy": ce})
        spelled, spelled_grad = jax.value_and_grad(lambda l: fn(l, gce_sigma=1.0, z_loss=1e-3)[0])(logits)
        np.testing.assert_array_equal(value, spelled)
        np.testing.assert_array_equal(grad, spelled_grad)
        plain = fn(logits, cross_entropy=package.CrossEntropy(z_loss=1e-3))[0]
        assert abs(float(plain) - float(value)) > 1e-3  # the Gaussian label changes the loss
    with pytest.raises(TypeError, match=r"^expected cross_entropy= or its fields as keywords, not both: got "
                                        r"CrossEntropy\(label_smoothing=0.0, z_loss=0.001, gce_sigma=1.0\) and "
                                        r"label_smoothing=0.1$"):
        package.cross_entropy_and_ntl(logits, targets, DIGITS, cross_entropy=ce, label_smoothing=0.1)
    with pytest.raises(TypeError, match=r"^expected cross_entropy an ntl_jax.CrossEntropy, got dict"):
        package.cross_entropy_and_ntl(logits, targets, DIGITS, cross_entropy={"gce_sigma": 1.0})
    with pytest.raises(ValueError, match=r"^expected at most one of gce_sigma and label_smoothing"):
        package.CrossEntropy(gce_sigma=1.0, label_smoothing=0.1)
