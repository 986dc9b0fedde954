"""Every number loss against its plain reference (`NumberLoss.reference`: an
explicit softmax over the number columns) in every formulation of the number
statistics, values and gradients; NTL's successors DEL, DIST² and SMMD against numpy
references written from their papers and the DEL and SMMD authors' code
(tests/number_loss_references.py); their place weights, multi-digit tokens, decimal
points, 16-bit logits, extreme logits, no number token, and the objective."""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import ntl_jax
from ntl_jax import NumberTokens, losses
from ntl_jax._core import digit_runs
from ntl_jax._core.number_losses import smmd
from ntl_jax._core.number_stats import FORMULATIONS, with_formulation
from ntl_jax._core.targets import number_target
from tests import number_loss_references as ref

# Digits at scattered ids, a point, a few other pieces; logits a few columns wider.
PIECES = ["<pad>", "</s>", "7", "x", "3", "0", ".", "9", "1", "y", "5", "2", "8", "4", "6", "-", ","]
DIGITS = NumberTokens.from_pieces(PIECES)
# Multi-digit pieces and number tokens with a sign or a point (digit count 0).
WIDE = NumberTokens.from_pieces(
    ["<pad>", "</s>", "x", ".", "7", "07", "12", "3", "-1", "3.5", "00", "5", "99", "0", "120", "9", "45", "1", "2"],
    digit_level=False,
)
EXTRA = 3
B, L = 3, 12
KINDS = list(losses.NAMES)
# Every shipped loss at its defaults, and those whose parameters take another path
# (squashed distances; a Gaussian label, which reads every number token's probability).
LOSS_CASES = [losses.parse(kind) for kind in KINDS] + [losses.was(squash_factor=3.0), losses.was_cdf(sigma=1.0)]


def inputs(nt, seed, scale=3.0):
    """Logits, targets (mostly number tokens, some others, some out of range) and
    weights (some 0), with NaN in the logits at one ignored position."""
    rng = np.random.default_rng(seed)
    vocab = nt.vocab_size + EXTRA
    logits = rng.standard_normal((B, L, vocab)) * scale
    ids = np.asarray(nt.ids)
    targets = rng.choice(ids, size=(B, L))
    targets[rng.random((B, L)) < 0.2] = 1  # "</s>"
    if nt.dot_id is not None:
        targets[0, 3] = nt.dot_id
    targets[2, 5] = vocab + 4  # out of range: ignored
    weights = rng.uniform(0.5, 2.0, (B, L))
    weights[1, 2] = 0.0
    logits[1, 2] = np.nan  # an ignored position: whatever its logits hold
    return jnp.asarray(logits, jnp.float32), jnp.asarray(targets, jnp.int32), jnp.asarray(weights, jnp.float32)


def reference_per_position(number_loss, logits, targets, weights, nt):
    """`(loss, counted)` of the reference, each `[batch, length]`, taking the number
    columns of the logits (ignored positions zeroed, as the losses read them)."""
    target = number_target(targets, weights, logits.shape[-1], nt)
    z = jnp.where(target.keep[..., None], jnp.take(logits, jnp.asarray(nt.ids), axis=-1), 0.0)
    return number_loss.reference(z, target, nt)


def reference_sum(number_loss, logits, targets, weights, nt):
    """`sum(weight * reference)` over the counted positions."""
    loss, counted = reference_per_position(number_loss, logits, targets, weights, nt)
    return jnp.sum(jnp.where(counted, loss * weights, 0.0))


@pytest.mark.parametrize("formulation", FORMULATIONS)
@pytest.mark.parametrize("number_loss", LOSS_CASES, ids=lambda loss: loss.spec)
@pytest.mark.parametrize("nt", [DIGITS, WIDE], ids=["digits", "wide"])
def test_every_variant_equals_its_reference_in_every_formulation(nt, number_loss, formulation):
    logits, targets, weights = inputs(nt, seed=LOSS_CASES.index(number_loss))
    if number_loss.check_table is not None and _refuses(number_loss, nt):  # NTIL on multi-digit pieces
        with pytest.raises(ValueError, match=_refuses(number_loss, nt)):
            ntl_jax.number_token_loss(logits, targets, nt, number_loss=number_loss, weights=weights)
        return

    def loss(x):
        return ntl_jax.number_token_loss(x, targets, with_formulation(nt, formulation), number_loss=number_loss,
                                         weights=weights, reduction="sum")

    value, grad = jax.value_and_grad(loss)(logits)
    clean = jnp.nan_to_num(logits)
    want, want_grad = jax.value_and_grad(lambda x: reference_sum(number_loss, x, targets, weights, nt))(clean)
    assert float(want) > 0
    np.testing.assert_allclose(float(value), float(want), rtol=2e-6)
    # float32: the reductions take each entry p_j·(f_j − E f) from sums over the number
    # columns, so an entry's rounding is tens of eps of the largest entry (23 at most
    # over 60 seeds of these inputs); 64 eps leaves room for other kernels' orders.
    eps = float(jnp.finfo(jnp.float32).eps)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-5,
                               atol=64 * eps * float(jnp.max(jnp.abs(want_grad))))
    assert np.all(np.asarray(grad)[1, 2] == 0)  # the ignored position, NaN logits and all


def _refuses(number_loss, nt):
    """The start of the error `number_loss` raises for the table `nt`, or None."""
    try:
        number_loss.check_table(nt)
    except ValueError as error:
        return re.escape(str(error)[:60])
    return None


OWN_ONE_LINERS = [losses.expectation("squared", lambda v, y: (v - y) ** 2),
                  losses.of_expected_value("log_error", lambda yhat, y: jnp.log1p(jnp.abs(yhat - y)))]


@pytest.mark.parametrize("number_loss", LOSS_CASES + OWN_ONE_LINERS, ids=lambda loss: loss.name + str(loss.params))
def test_a_loss_reads_other_positions_exactly_when_it_says_so(number_loss):
    # MaxText's tiles split sequences only for a loss that says it reads its own position
    # alone (`across_positions=False`): ending a number early at one position must leave
    # every other position's loss as it was, bit for bit, for those, and move some other
    # position's loss for the rest.
    logits, targets, weights = inputs(DIGITS, seed=1)
    digits = [PIECES.index(str(d)) for d in (4, 7, 1, 9, 2, 6)]
    targets = targets.at[0, 5:11].set(jnp.asarray(digits, jnp.int32))  # a six-digit number
    ended = targets.at[0, 8].set(PIECES.index("</s>"))  # ... ended after its third digit

    def per_position(t):
        loss, counted = reference_per_position(number_loss, logits, t, weights, DIGITS)
        return np.asarray(jnp.where(counted, loss, 0.0))

    before, after = per_position(targets), per_position(ended)
    elsewhere = np.ones(before.shape, bool)
    elsewhere[0, 8] = False
    assert (not np.array_equal(before[elsewhere], after[elsewhere])) == number_loss.across_positions


def test_a_loss_written_in_full_may_read_across_positions_unless_it_says_not():
    own = losses.NumberLoss("own", losses.NumberReads(means=(lambda c, t, nt: c.value,)),
                            lambda stats, target, nt: (stats.means[0], target.is_number))
    assert own.across_positions
    assert not dataclasses.replace(own, across_positions=False).across_positions


# -- DEL ---------------------------------------------------------------------------------


def digit_logits(logits, nt):
    """The logits of "0".."9" in digit order `[..., 10]` (numpy)."""
    order = [PIECES.index(str(d)) for d in range(10)]
    return np.asarray(logits, np.float64)[..., order]


def test_del_per_position_matches_the_numpy_reference():
    logits, targets, weights = inputs(DIGITS, seed=3)
    got = ntl_jax.number_token_loss(logits, targets, DIGITS, number_loss="del", weights=weights)
    target = number_target(targets, weights, logits.shape[-1], DIGITS)
    strings = [[PIECES[t] if 0 <= t < len(PIECES) and w > 0 else None for t, w in zip(row, wrow)]
               for row, wrow in zip(np.asarray(targets), np.asarray(weights))]
    place = np.stack(ref.del_place_weights(strings))
    digit = np.where(np.asarray(target.is_number), np.asarray(target.value), 0).astype(int)
    want = ref.del_per_position(digit_logits(jnp.nan_to_num(logits), DIGITS), digit, place)
    want = np.where(np.asarray(target.is_number), want * np.asarray(weights), 0.0)
    assert np.count_nonzero(want) > 10
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-6, atol=1e-7)


def test_del_hand_computed_values():
    # Uniform logits, one digit target: sum_k 0.1 log 2 = log 2, weight 2 (the ones).
    # z_4 = ln 9, target 4 as the tens digit of "45": (1/2) ln(20/9), weight 4.
    logits = np.zeros((1, 3, len(PIECES)), np.float32)
    logits[0, 1, PIECES.index("4")] = np.log(9.0)
    targets = jnp.asarray([[PIECES.index("x"), PIECES.index("4"), PIECES.index("5")]])
    got = ntl_jax.number_token_loss(jnp.asarray(logits), targets, DIGITS, number_loss="del")
    np.testing.assert_allclose(np.asarray(got)[0], [0.0, 4 * 0.5 * np.log(20 / 9), 2 * np.log(2)], rtol=1e-6)


@pytest.mark.parametrize("text", ["12.345", "7", "-3.5", "1,234", ".5", "1.2.3", "x=10.", "0.07", "100x.5",
                                  "3.14.15", "..2"])
def test_place_weights_are_the_authors(text):
    ids = [PIECES.index(c) if c in PIECES else PIECES.index("x") for c in text]
    target = number_target(jnp.asarray([ids]), None, len(PIECES), DIGITS)
    got = np.asarray(digit_runs.place_weights(target, DIGITS))[0]
    want = ref.del_place_weights([list(text)])[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_place_weights_never_join_sequences_nor_cross_ignored_positions():
    ids = [[PIECES.index(c) for c in "x12"], [PIECES.index(c) for c in "3x4"]]
    weights = jnp.asarray([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    target = number_target(jnp.asarray(ids), weights, len(PIECES), DIGITS)
    np.testing.assert_allclose(np.asarray(digit_runs.place_weights(target, DIGITS)), [[0, 4, 2], [2, 0, 2]])
    # A weight of 0 ignores a position: it ends the number as any other token does.
    ids = [[PIECES.index(c) for c in "123"]]
    target = number_target(jnp.asarray(ids), jnp.asarray([[1.0, 0.0, 1.0]]), len(PIECES), DIGITS)
    np.testing.assert_allclose(np.asarray(digit_runs.place_weights(target, DIGITS)), [[2, 0, 2]])


def test_place_weights_of_multi_digit_tokens():
    # "12" "07" is 1207: "12" in the hundreds (weight 6), "07" the ones (2); "-1" and
    # "3.5" are numbers of their own (2); "120" "." "45": 2, 0, 1.02^-2 (the first
    # decimal digit of "45" is the first after the point).
    pieces = ["<pad>", "</s>", "x", ".", "7", "07", "12", "3", "-1", "3.5", "00", "5", "99", "0", "120", "9", "45"]
    ids = [[pieces.index(p) for p in ("12", "07", "x", "-1", "3.5", "120", ".", "45")]]
    target = number_target(jnp.asarray(ids), None, WIDE.vocab_size, WIDE)
    np.testing.assert_allclose(np.asarray(digit_runs.place_weights(target, WIDE))[0],
                               [6, 2, 0, 2, 2, 2, 0, 1.02 ** -2], rtol=1e-6)


# -- DIST² -------------------------------------------------------------------------------


@pytest.mark.parametrize("nt", [DIGITS, WIDE], ids=["digits", "wide"])
def test_dist2_matches_the_numpy_reference(nt):
    logits, targets, weights = inputs(nt, seed=5)
    got = ntl_jax.number_token_loss(logits, targets, nt, number_loss="dist2", weights=weights)
    target = number_target(targets, weights, logits.shape[-1], nt)
    z = np.asarray(jnp.nan_to_num(logits), np.float64)[..., np.asarray(nt.ids)]
    want = ref.dist2_per_position(z, np.asarray(nt.number_values), np.asarray(target.value))
    want = np.where(np.asarray(target.is_number), want * np.asarray(weights), 0.0)
    assert np.count_nonzero(want) > 10
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_dist2_hand_computed_values():
    # Uniform logits over the digits, target 4: log 10 - H(q) = 1.231137 (tau = 1);
    # logits log q: 0.
    logits = np.zeros((1, 2, len(PIECES)), np.float32)
    q = ref.dist2_target_distribution(np.arange(10), 4)
    for d in range(10):
        logits[0, 1, PIECES.index(str(d))] = np.log(q[d])
    targets = jnp.asarray([[PIECES.index("4"), PIECES.index("4")]])
    got = ntl_jax.number_token_loss(jnp.asarray(logits), targets, DIGITS, number_loss="dist2")
    np.testing.assert_allclose(np.asarray(got)[0], [1.231137, 0.0], atol=2e-6)


# -- SMMD --------------------------------------------------------------------------------
# A LLaMA-3-like table: "0".."999" one token each, and number tokens that are not in
# SMMD's support (a leading zero, "1000", a sign, a point).
LLAMA_PIECES = ["<pad>", "</s>", "x", "."] + [str(v) for v in range(1000)] + ["07", "00", "1000", "-1", "3.5", "y"]
LLAMA = NumberTokens.from_pieces(LLAMA_PIECES, digit_level=False)
SMMD_TABLES = {"digits": (DIGITS, PIECES), "wide": (WIDE, None), "llama": (LLAMA, LLAMA_PIECES)}


def smmd_inputs(name, seed):
    nt, pieces = SMMD_TABLES[name]
    logits, targets, weights = inputs(nt, seed)
    if name == "llama":  # a few targets off SMMD's support: not counted
        targets = targets.at[0, :5].set(jnp.asarray([LLAMA_PIECES.index(p) for p in ("07", "00", "1000", "-1", "3.5")]))
    return nt, pieces, logits, targets, weights


def smmd_reference(logits, targets, weights, pieces, **options):
    """The authors' per-position SMMD (numpy, float64) x weight, 0 at ignored positions."""
    keep = (np.asarray(weights) > 0) & (np.asarray(targets) >= 0) & (np.asarray(targets) < logits.shape[-1])
    z = np.where(keep[..., None], np.nan_to_num(np.asarray(logits, np.float64)), 0.0)
    loss, counted = ref.smmd_per_position(z, np.where(keep, targets, 0), pieces, **options)
    return np.where(keep & counted, loss * np.asarray(weights), 0.0)


# `ntl_jax.losses.smmd`'s parameters, which the reference takes by the same names.
SMMD_OPTIONS = [dict(), dict(mode="mmd"), dict(mode="smooth"), dict(sigma=0.7, squash_factor=3.0, alpha=0.4)]


@pytest.mark.parametrize("options", SMMD_OPTIONS, ids=["default", "mmd", "smooth", "sigma-squash-alpha"])
@pytest.mark.parametrize("name", ["digits", "llama"])
def test_smmd_matches_the_authors_reference(name, options):
    nt, pieces, logits, targets, weights = smmd_inputs(name, seed=19)
    number_loss = losses.smmd(**options)
    got = ntl_jax.number_token_loss(logits, targets, nt, number_loss=number_loss, weights=weights)
    want = smmd_reference(logits, targets, weights, pieces, **options)
    assert np.count_nonzero(want) > 10
    if name == "llama":  # off the support: not counted
        assert not np.any(np.asarray(got)[0, :5])
    # float32: p'Kp - 2 (Kp)_t + K_tt cancels to the loss; its rounding is a few eps of K_tt = 1.
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=2e-6)
    # Under `jit` the kernel is built on the host for the table as a closure constant, and
    # in the program for a traced one (the table an argument).
    jitted = jax.jit(lambda x: ntl_jax.number_token_loss(x, targets, nt, number_loss=number_loss,
                                                         weights=weights))(logits)
    traced = jax.jit(lambda x, table: ntl_jax.number_token_loss(x, targets, table, number_loss=number_loss,
                                                                weights=weights))(logits, nt)
    # The same loss written as a spec.
    spec = ntl_jax.number_token_loss(logits, targets, nt, number_loss=number_loss.spec, weights=weights)
    for other in (jitted, traced, spec):
        np.testing.assert_allclose(np.asarray(other), want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("name", ["digits", "llama"])
def test_smmd_gradient_matches_the_authors_reference(name):
    """The gradient against central differences of the float64 reference: positions are
    independent, so one difference per column of the logits gives that column at every
    position (on the LLaMA-like table a sample of columns, those off the support too)."""
    nt, pieces, logits, targets, weights = smmd_inputs(name, seed=23)
    logits = jnp.nan_to_num(logits)
    grad = jax.grad(lambda x: ntl_jax.number_token_loss(x, targets, nt, number_loss="smmd", weights=weights,
                                                        reduction="sum"))(logits)
    vocab = logits.shape[-1]
    columns = np.arange(vocab)
    if name == "llama":
        rng = np.random.default_rng(0)
        off = [LLAMA_PIECES.index(p) for p in ("07", "00", "1000", "-1", "3.5", "x")]
        columns = np.concatenate([rng.choice(vocab, 40, replace=False), off])
    x, h = np.asarray(logits, np.float64), 1e-5
    for c in columns:
        up, down = x.copy(), x.copy()
        up[..., c] += h
        down[..., c] -= h
        want = (smmd_reference(up, targets, weights, pieces) - smmd_reference(down, targets, weights, pieces)) / (2 * h)
        np.testing.assert_allclose(np.asarray(grad)[..., c], want, rtol=1e-4, atol=1e-6, err_msg=f"column {c}")


def test_smmd_reference_is_the_quadratic_forms_written_out():
    """The reference's expansion (the authors') equals r'Kr + alpha r'(D - K)r with r,
    K and D formed explicitly, on small random tables and logits."""
    rng = np.random.default_rng(29)
    for trial in range(20):
        values = sorted(rng.choice(1000, size=rng.integers(2, 12), replace=False))
        pieces = ["<pad>"] + [str(v) for v in rng.permutation(values)] + ["x"]
        logits = rng.standard_normal((4, len(pieces))) * 3
        targets = rng.choice([pieces.index(str(v)) for v in values], 4)
        sigma, squash = rng.uniform(0.5, 4.0), rng.uniform(1.5, 12.0)
        ids = [pieces.index(str(v)) for v in values]
        v = np.asarray(values, np.float64)
        d = np.abs(v[:, None] - v[None, :])
        nonzero = d[d > 0]
        if nonzero.max() > nonzero.min():
            d = np.where(d > 0, 1 + (d - nonzero.min()) * (squash - 1) / (d.max() - nonzero.min()), 0.0)
        K = np.exp(-d ** 2 / (2 * sigma ** 2))
        D = np.diag(K.sum(axis=1))
        alpha = 1 / (2 * K.sum(axis=1).mean())
        for mode in ("smmd", "mmd", "smooth"):
            got, counted = ref.smmd_per_position(logits, targets, pieces, mode=mode, sigma=sigma, squash_factor=squash)
            assert counted.all()
            for i in range(4):
                p = np.exp(logits[i, ids] - logits[i, ids].max())
                p /= p.sum()
                r = p - np.eye(len(values))[ids.index(targets[i])]
                mmd, smooth = r @ K @ r, r @ (D - K) @ r
                want = {"smmd": mmd + alpha * smooth, "mmd": mmd, "smooth": alpha * smooth}[mode]
                np.testing.assert_allclose(got[i], max(want, 0.0), rtol=1e-9, atol=1e-12)


def test_smmd_support_and_kernel_of_a_multi_digit_table():
    support, kernel, alpha = smmd.smmd_kernel(LLAMA)
    values = np.asarray(LLAMA.number_values)
    assert sorted(values[np.asarray(support)].tolist()) == list(range(1000))  # "07", "00", "1000", "-1", "3.5" not
    assert not np.any(np.asarray(kernel)[~np.asarray(support)])
    want = ref.smmd_kernel(np.arange(1000))
    order = np.argsort(np.where(np.asarray(support), values, np.inf))[:1000]
    np.testing.assert_allclose(np.asarray(kernel)[np.ix_(order, order)], want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(float(alpha), 0.5 / want.sum(axis=1).mean(), rtol=1e-6)
    # On digits squashing to [1, 9] changes nothing: K_ij = exp(-(i - j)^2 / 8).
    support, kernel, alpha = smmd.smmd_kernel(DIGITS)
    digits = np.asarray(DIGITS.number_values)
    np.testing.assert_allclose(np.asarray(kernel), np.exp(-(digits[:, None] - digits[None, :]) ** 2 / 8), rtol=1e-6)


def test_smmd_hand_computed_at_point_masses():
    # Sure of digit k, target 0: r = e_k - e_0, so r'Kr = 2 - 2 K_0k (growing with k) and
    # r'(D - K)r = deg_0 + deg_k - 2 + 2 K_0k, K_ij = exp(-(i - j)^2 / 8). The smoothness
    # term is largest for middle digits (most neighbours), so SMMD is not monotone in k.
    logits = np.full((1, 10, len(PIECES)), -30.0, np.float32)
    for k in range(10):
        logits[0, k, PIECES.index(str(k))] = 30.0
    targets = jnp.full((1, 10), PIECES.index("0"))
    k = np.arange(10)
    kernel = np.exp(-(k[:, None] - k[None, :]) ** 2 / 8)
    degree = kernel.sum(axis=1)
    alpha = 0.5 / degree.mean()
    mmd = 2 - 2 * kernel[0]
    smooth = np.where(k > 0, degree[0] + degree - 2 + 2 * kernel[0], 0.0)
    for mode, want in (("mmd", mmd), ("smooth", alpha * smooth), ("smmd", mmd + alpha * smooth)):
        got = ntl_jax.number_token_loss(jnp.asarray(logits), targets, DIGITS, number_loss=losses.smmd(mode=mode))
        np.testing.assert_allclose(np.asarray(got)[0], want, rtol=1e-5, atol=1e-6)
    assert np.all(np.diff(mmd) > 0)


# -- every successor ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["del", "dist2", "smmd"])
def test_gradients_match_finite_differences(kind):
    logits, targets, weights = inputs(DIGITS, seed=7, scale=1.0)
    f = functools.partial(ntl_jax.number_token_loss, targets=targets, number_tokens=DIGITS, number_loss=kind,
                          weights=weights, reduction="mean")
    check_grads(f, (jnp.nan_to_num(logits),), order=1, modes=["rev", "fwd"], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("formulation", FORMULATIONS)
@pytest.mark.parametrize("kind", ["del", "dist2", "smmd"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_16_bit_logits_compute_in_float32(kind, dtype, formulation):
    logits, targets, weights = inputs(DIGITS, seed=9)
    low = jnp.nan_to_num(logits).astype(dtype)

    def f(x):
        return ntl_jax.number_token_loss(x, targets, with_formulation(DIGITS, formulation), number_loss=kind,
                                         weights=weights, reduction="sum")

    value, grad = jax.value_and_grad(f)(low)
    want, want_grad = jax.value_and_grad(f)(low.astype(jnp.float32))
    assert grad.dtype == dtype
    np.testing.assert_allclose(float(value), float(want), rtol=1e-6)
    eps = float(jnp.finfo(dtype).eps)
    np.testing.assert_allclose(np.asarray(grad, np.float32), want_grad, rtol=eps / 2 + 1e-6,
                               atol=float(jnp.finfo(dtype).smallest_subnormal) / 2)


@pytest.mark.parametrize("kind", ["del", "dist2", "smmd"])
@pytest.mark.parametrize("scale", [1e4, -1e4])
def test_finite_at_extreme_logits(kind, scale):
    logits, targets, weights = inputs(DIGITS, seed=11)
    extreme = jnp.sign(jnp.nan_to_num(logits)) * scale
    for formulation in FORMULATIONS:
        value, grad = jax.value_and_grad(lambda x: ntl_jax.number_token_loss(
            x, targets, with_formulation(DIGITS, formulation), number_loss=kind, weights=weights,
            reduction="mean"))(extreme)
        assert np.isfinite(float(value)) and np.isfinite(np.asarray(grad)).all()


@pytest.mark.parametrize("kind", ["del", "dist2", "smmd"])
def test_no_number_token_gives_exact_zero_and_reweigh_is_refused(kind):
    logits, _, _ = inputs(DIGITS, seed=13)
    targets = jnp.full((B, L), PIECES.index("x"))
    value, grad = jax.value_and_grad(lambda x: ntl_jax.number_token_loss(
        x, targets, DIGITS, number_loss=kind, reduction="mean"))(jnp.nan_to_num(logits))
    assert float(value) == 0.0 and not np.any(np.asarray(grad))
    # No largest value to charge: the constructor has no reweigh, a spec may not name it,
    # and a NumberLoss made with it is refused.
    constructor = losses.LOSSES[kind]
    with pytest.raises(TypeError, match=rf"{constructor.__name__}\(\) got an unexpected keyword argument 'reweigh'"):
        constructor(reweigh=True)
    with pytest.raises(ValueError, match=rf"number loss '{kind}' has no parameter 'reweigh'"):
        ntl_jax.number_token_loss(logits, targets, DIGITS, number_loss=f"{kind}(reweigh=true)")
    with pytest.raises(ValueError, match=rf"number loss '{kind}': expected reweigh=False \(the loss has no largest "
                                         r"value.*got reweigh=True"):
        dataclasses.replace(constructor(), reweigh=True)
    with pytest.raises(TypeError, match=r"no longer takes reweigh= .*number_loss=ntl_jax.losses.was\(reweigh=True\)"):
        ntl_jax.cross_entropy_and_ntl(logits, targets, DIGITS, number_loss=kind, reweigh=True)


@pytest.mark.parametrize("kind", ["del", "dist2", "smmd"])
def test_objective_and_fused_head(kind):
    """`cross_entropy_and_ntl`'s NTL part is the per-token loss under the same weights
    and factor; the fused head gives the same loss and gradients."""
    rng = np.random.default_rng(17)
    hidden = jnp.asarray(rng.standard_normal((B, L, 8)), jnp.float32)
    kernel = jnp.asarray(rng.standard_normal((8, len(PIECES) + EXTRA)), jnp.float32)
    _, targets, weights = inputs(DIGITS, seed=17)
    options = dict(number_loss=kind, weights=weights, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS", z_loss=1e-4)
    loss, parts = ntl_jax.cross_entropy_and_ntl(hidden @ kernel, targets, DIGITS, **options)
    per_token = ntl_jax.number_token_loss(hidden @ kernel, targets, DIGITS, number_loss=kind, weights=weights,
                                          reduction="sum")
    mean = ntl_jax.number_token_loss(hidden @ kernel, targets, DIGITS, number_loss=kind, weights=weights,
                                     reduction="mean")
    # Its term: the loss's own lambda x the weighted mean, beside CE's mean (the factor is
    # the weights' sum); its `ntl` part: that mean.
    own = ntl_jax.losses.parse(kind).default_weight
    assert own == {"del": 0.001, "dist2": 0.1, "smmd": 1.0}[kind]
    np.testing.assert_allclose(float(parts["loss_normalizing_factor"]), float(parts["weight_sum"]), rtol=1e-7)
    np.testing.assert_allclose(float(parts["ntl_term"]), own * float(mean), rtol=1e-6)
    np.testing.assert_allclose(float(parts["ntl"]), float(mean), rtol=1e-6)
    np.testing.assert_allclose(float(parts["ntl"]) * float(parts["ntl_weight_sum"]), float(per_token), rtol=1e-6)
    assert float(parts["ntl"]) > 0
    np.testing.assert_allclose(float(loss), float(parts["cross_entropy"] + parts["z_loss"] + parts["ntl_term"]),
                               rtol=1e-6)
    grads = jax.grad(lambda h, k: ntl_jax.cross_entropy_and_ntl(h @ k, targets, DIGITS, **options)[0],
                     argnums=(0, 1))(hidden, kernel)
    fused_loss, fused_grads = jax.value_and_grad(
        lambda h, k: ntl_jax.fused_cross_entropy_and_ntl(h, k, targets, DIGITS, chunk_size=8, **options)[0],
        argnums=(0, 1))(hidden, kernel)
    np.testing.assert_allclose(float(fused_loss), float(loss), rtol=2e-6)
    for got, want in zip(fused_grads, grads):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(jnp.max(jnp.abs(want))))
