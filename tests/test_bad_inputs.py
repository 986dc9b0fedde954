"""Bad and degenerate inputs: each ends as a clear error or as the correct value.

Table-driven: every case is an input and either the exception it raises (type and a
fragment of the message) or the finite value it must give, checked against a
reference computed without the garbage.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ntl_jax import NumberTokens, losses
from ntl_jax._core import head_stats, number_stats
from ntl_jax._core.targets import number_target
from ntl_jax.data.reader import read_pairs
from tests.formulation import FORMULATION
from tests.formulation import ntl_jax_under_test as ntl_jax
from tests.grid import pairwise

PIECES = ["<pad>", "</s>", "x", "."] + list("0123456789")  # digit d has id d + 4
NT = NumberTokens.from_pieces(PIECES)
V = len(PIECES)
TARGETS = jnp.array([[5, 6, 3, 9, 1, 0, 0], [2, 13, 4, 4, 1, 0, 0]])
WEIGHTS = jnp.asarray(TARGETS > 0, jnp.float32)
LOGITS = jax.random.normal(jax.random.PRNGKey(0), (2, 7, V)) * 3
FACTORS = [None, 7.5, "NUM_REAL_TARGET_TOKENS", "NUM_TOTAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE"]
KINDS = ["was", "mse", "number_level", "number_level_float"]


def objective(logits=LOGITS, targets=TARGETS, nt=NT, **kwargs):
    return ntl_jax.cross_entropy_and_ntl(logits, targets, nt, **kwargs)


def finite_grad(fn, logits):
    grads = jax.grad(fn)(logits)
    return bool(np.isfinite(np.asarray(grads)).all())


# -- clear errors ----------------------------------------------------------------------

ERRORS = [
    # name, call, exception, message fragment
    ("ntl_weight negative", lambda: objective(ntl_weight=-1.0), ValueError, "ntl_weight >= 0"),
    ("ntl_weight nan", lambda: objective(ntl_weight=math.nan), ValueError, "ntl_weight finite"),
    ("ntl_weight inf", lambda: objective(ntl_weight=math.inf), ValueError, "ntl_weight finite"),
    ("ntl_weight str", lambda: objective(ntl_weight="0.3"), TypeError, "ntl_weight to be a real number, got str"),
    ("ntl_weight bool", lambda: objective(ntl_weight=True), TypeError, "ntl_weight to be a real number"),
    ("ntl_weight array", lambda: objective(ntl_weight=jnp.ones(2)), ValueError, "ntl_weight to be a scalar"),
    ("factor zero", lambda: objective(loss_normalizing_factor=0.0), ValueError, "loss_normalizing_factor > 0"),
    ("factor negative", lambda: objective(loss_normalizing_factor=-2), ValueError, "loss_normalizing_factor > 0"),
    ("factor nan", lambda: objective(loss_normalizing_factor=math.nan), ValueError, "finite"),
    ("factor inf array", lambda: objective(loss_normalizing_factor=jnp.float32(math.inf)), ValueError, "finite"),
    ("factor wce", lambda: ntl_jax.weighted_cross_entropy(LOGITS, TARGETS, loss_normalizing_factor=0),
     ValueError, "loss_normalizing_factor > 0"),
    ("label_smoothing 1", lambda: objective(label_smoothing=1.0), ValueError, "label_smoothing >= 0.0 and < 1.0"),
    ("label_smoothing negative", lambda: objective(label_smoothing=-0.1), ValueError, "label_smoothing"),
    ("label_smoothing wce", lambda: ntl_jax.weighted_cross_entropy(LOGITS, TARGETS, label_smoothing=1.5),
     ValueError, "label_smoothing"),
    ("z_loss negative", lambda: objective(z_loss=-1e-4), ValueError, "z_loss >= 0"),
    ("squash inf", lambda: objective(number_loss=losses.was(squash_factor=math.inf)), ValueError,
     "number loss 'was': expected squash_factor finite and > 1, got inf"),
    ("squash inf spec", lambda: objective(number_loss="was(squash_factor=inf)"), ValueError,
     "number loss 'was': expected squash_factor finite and > 1, got inf"),
    ("squash nan", lambda: ntl_jax.ntl_was(LOGITS, TARGETS, NT, squash_factor=math.nan), ValueError,
     "number loss 'was': expected squash_factor finite and > 1, got nan"),
    ("squash 1", lambda: objective(number_loss=losses.was(squash_factor=1.0)), ValueError,
     "expected squash_factor finite and > 1, got 1.0"),
    ("squash str", lambda: objective(number_loss=losses.was(squash_factor="3")), TypeError,
     "number loss 'was': expected squash_factor to be a Python number, got str '3'"),
    ("reweigh str", lambda: objective(number_loss=losses.was(reweigh="yes")), TypeError,
     "number loss 'was': expected reweigh True or False, got str 'yes'"),
    ("reweigh int", lambda: ntl_jax.ntl_was(LOGITS, TARGETS, NT, reweigh=1), TypeError,
     "expected reweigh True or False, got int 1"),
    ("reweigh none", lambda: ntl_jax.number_level_loss(LOGITS, TARGETS, NT, reweigh=None), TypeError,
     "number loss 'number_level': expected reweigh True or False, got NoneType None"),
    ("pieces str", lambda: NumberTokens.from_pieces("0123456789ab"), TypeError, "a single str"),
    ("wce weights [B, 1]", lambda: ntl_jax.weighted_cross_entropy(LOGITS, TARGETS, weights=jnp.ones((2, 1))),
     ValueError, "expected weights of shape (2, 7)"),
    ("wce weights [L]", lambda: ntl_jax.weighted_cross_entropy(LOGITS, TARGETS, weights=jnp.ones(7)),
     ValueError, "expected weights of shape (2, 7)"),
    ("wce targets shape", lambda: ntl_jax.weighted_cross_entropy(LOGITS, TARGETS[:, :3]), ValueError,
     "expected targets of shape (2, 7)"),
    ("wce float targets", lambda: ntl_jax.weighted_cross_entropy(LOGITS, TARGETS * 1.0), TypeError,
     "integer targets"),
    ("segment ids shape", lambda: objective(
        loss_normalizing_factor="AVERAGE_PER_SEQUENCE", decoder_segment_ids=jnp.ones((2, 6), jnp.int32),
        decoder_positions=jnp.zeros((2, 7), jnp.int32)), ValueError, "decoder_segment_ids of shape (2, 7)"),
    ("positions shape", lambda: objective(
        loss_normalizing_factor="AVERAGE_PER_SEQUENCE", decoder_segment_ids=jnp.ones((2, 7), jnp.int32),
        decoder_positions=jnp.zeros((7,), jnp.int32)), ValueError, "decoder_positions of shape (2, 7)"),
    ("segment ids shape, numeric factor", lambda: ntl_jax.loss_normalizing_factor_and_weights(
        None, TARGETS, decoder_segment_ids=jnp.ones((1, 7), jnp.int32)), ValueError,
     "decoder_segment_ids of shape (2, 7)"),
    ("nested list logits", lambda: objective(logits=np.asarray(LOGITS).tolist()), TypeError,
     "expected logits as an array of shape [batch, length, vocab]"),
    ("nested list targets", lambda: objective(targets=np.asarray(TARGETS).tolist()), TypeError,
     "expected targets as an array of shape [batch, length]"),
    ("nested list weights", lambda: objective(weights=[[1.0] * 7] * 2), TypeError,
     "expected weights as an array"),
    ("nested list wce", lambda: ntl_jax.weighted_cross_entropy(np.asarray(LOGITS).tolist(), TARGETS),
     TypeError, "expected logits as an array"),
    ("nested list ntl_was", lambda: ntl_jax.ntl_was(LOGITS, np.asarray(TARGETS).tolist(), NT), TypeError,
     "expected targets as an array"),
    ("negative weights", lambda: objective(weights=WEIGHTS.at[1, 2].set(-1.0)), ValueError,
     "non-negative weights, got -1.0 at index (1, 2)"),
    ("nan weights", lambda: objective(weights=WEIGHTS.at[0, 3].set(jnp.nan)), ValueError,
     "finite weights, got nan at index (0, 3)"),
    ("inf weights numpy", lambda: ntl_jax.ntl_was(LOGITS, TARGETS, NT, weights=np.full((2, 7), np.inf)),
     ValueError, "finite weights"),
    ("negative weights wce", lambda: ntl_jax.weighted_cross_entropy(LOGITS, TARGETS, weights=-WEIGHTS),
     ValueError, "non-negative weights"),
    ("negative weights number level", lambda: ntl_jax.number_level_loss(LOGITS, TARGETS, NT, weights=-WEIGHTS),
     ValueError, "non-negative weights"),
    ("squash duplicated digit", lambda: ntl_jax.ntl_was(
        jnp.zeros((1, 1, 4)), jnp.array([[1]]), NumberTokens.from_pieces(["a", "0", "1", "1"]), squash_factor=3.0),
     ValueError, "[1.0] appear on more than one token"),
    ("squash two values", lambda: ntl_jax.ntl_was(
        jnp.zeros((1, 1, 3)), jnp.array([[1]]), NumberTokens.from_pieces(["a", "0", "1"]), squash_factor=2.0),
     ValueError, "number loss 'was': expected number tokens with at least 3 distinct values for squash_factor"),
    ("squash two values objective", lambda: objective(
        logits=jnp.zeros((1, 1, 3)), targets=jnp.array([[1]]), nt=NumberTokens.from_pieces(["a", "0", "1"]),
        number_loss=losses.was(squash_factor=2.0)), ValueError, "at least 3 distinct values for squash_factor"),
    ("squash was_cdf", lambda: objective(number_loss="was_cdf(squash_factor=3.0)"), ValueError,
     "number loss 'was_cdf' has no parameter 'squash_factor' (it takes ('sigma', 'reweigh'), and every loss "
     "mean_over)"),
    ("squash was_cdf constructor", lambda: losses.was_cdf(squash_factor=3.0), TypeError,
     "was_cdf() got an unexpected keyword argument 'squash_factor'"),
    ("smmd mode", lambda: objective(number_loss=losses.smmd(mode="both")), ValueError,
     "number loss 'smmd': expected mode in ('smmd', 'mmd', 'smooth'), got 'both'"),
    ("smmd mode spec", lambda: objective(number_loss="smmd(mode=both)"), ValueError,
     "number loss 'smmd': expected mode in ('smmd', 'mmd', 'smooth'), got 'both'"),
    ("smmd sigma zero", lambda: objective(number_loss=losses.smmd(sigma=0.0)), ValueError,
     "number loss 'smmd': expected sigma finite and > 0, got 0.0"),
    ("smmd alpha negative", lambda: objective(number_loss=losses.smmd(alpha=-1.0)), ValueError,
     "number loss 'smmd': expected alpha finite and >= 0, got -1.0"),
    ("smmd sigma traced", lambda: objective(number_loss=losses.smmd(sigma=jnp.float32(2.0))), TypeError,
     "number loss 'smmd': expected sigma to be a Python number, got ArrayImpl"),
    ("smmd option on was", lambda: objective(number_loss="was(sigma=1.0)"), ValueError,
     "number loss 'was' has no parameter 'sigma' (it takes ('squash_factor', 'reweigh'), and every loss "
     "mean_over)"),
    ("smmd option keyword", lambda: objective(smmd_sigma=1.0), TypeError,
     "cross_entropy_and_ntl() no longer takes smmd_sigma= (ntl_jax 0.3.0); pass "
     "number_loss=ntl_jax.losses.smmd(sigma=...)"),
    ("smmd without its numbers", lambda: ntl_jax.number_token_loss(
        jnp.zeros((1, 1, 4)), jnp.array([[1]]), NumberTokens.from_pieces(["a", "07", "-1", "3.5"], digit_level=False),
        number_loss="smmd"), ValueError, "number loss 'smmd': expected number tokens writing an integer 0..999 alone"),
    ("gce_sigma negative", lambda: objective(gce_sigma=-1.0), ValueError, "expected gce_sigma >= 0.0, got -1.0"),
    ("gce_sigma nan", lambda: objective(gce_sigma=math.nan), ValueError, "gce_sigma finite"),
    ("gce_sigma inf", lambda: objective(gce_sigma=math.inf), ValueError, "gce_sigma finite"),
    ("gce_sigma str", lambda: objective(gce_sigma="1"), TypeError, "gce_sigma to be a real number, got str"),
    ("gce_sigma None", lambda: objective(gce_sigma=None), TypeError, "gce_sigma to be a real number, got NoneType"),
    ("gce_sigma bool", lambda: objective(gce_sigma=True), TypeError, "gce_sigma to be a real number"),
    ("gce_sigma array", lambda: objective(gce_sigma=jnp.ones(2)), ValueError, "gce_sigma to be a scalar"),
    ("gce_sigma traced", lambda: jax.jit(lambda s: objective(gce_sigma=s)[0])(1.0), TypeError,
     "gce_sigma to be a concrete number"),
    ("gce_sigma with label_smoothing", lambda: objective(gce_sigma=1.0, label_smoothing=0.1), ValueError,
     "expected at most one of gce_sigma and label_smoothing"),
    ("gce_sigma fused", lambda: ntl_jax.fused_cross_entropy_and_ntl(
        jnp.ones((2, 7, 3)), jnp.ones((3, V)), TARGETS, NT, gce_sigma=-0.5), ValueError, "gce_sigma >= 0.0"),
    ("gce_sigma fused with label_smoothing", lambda: ntl_jax.fused_cross_entropy_and_ntl(
        jnp.ones((2, 7, 3)), jnp.ones((3, V)), TARGETS, NT, gce_sigma=1.0, label_smoothing=0.1), ValueError,
     "at most one of gce_sigma and label_smoothing"),
]


@pytest.mark.parametrize("name,call,error,fragment", ERRORS, ids=[e[0] for e in ERRORS])
def test_clear_error(name, call, error, fragment):
    with pytest.raises(error) as info:
        call()
    assert fragment in str(info.value), str(info.value)
    assert len(str(info.value)) < 400  # no printed arrays or lists


def test_read_pairs_non_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "arithmetic__add_or_sub.txt"
    path.write_bytes(b"What is 1 + 1?\n2\nWhat is \xff + 2?\n3\n")
    with pytest.raises(ValueError, match=r"arithmetic__add_or_sub.txt:3: not valid UTF-8 \(byte 0xff"):
        list(read_pairs(str(path)))
    # A valid file still reads, universal newlines included.
    path.write_bytes("Was ist 1 \u00fc 1?\r\n2\r\n".encode())
    assert list(read_pairs(str(path))) == [("Was ist 1 \u00fc 1?", "2")]


def test_traced_values_are_not_checked_under_jit():
    # Under jit the weights and factor are traced: assumed valid, documented, no error.
    fn = jax.jit(lambda w, f: objective(weights=w, loss_normalizing_factor=f)[0])
    assert np.isfinite(float(fn(WEIGHTS, jnp.float32(3.0))))


# -- degenerate batches: 0, never NaN ----------------------------------------------------

DEGENERATE = [
    (f"{kind}-{factor}-{case}", kind, factor, case)
    for kind in ["was", "number_level", "none"]
    for factor in FACTORS
    for case in ["zero weights", "empty batch", "empty length"]
]


@pytest.mark.parametrize("name,kind,factor,case", DEGENERATE, ids=[d[0] for d in DEGENERATE])
def test_nothing_counted_gives_zero_and_finite_gradients(name, kind, factor, case):
    logits, targets, weights = LOGITS, TARGETS, jnp.zeros((2, 7))
    if case == "empty batch":
        logits, targets, weights = jnp.zeros((0, 7, V)), jnp.zeros((0, 7), jnp.int32), None
    elif case == "empty length":
        logits, targets, weights = jnp.zeros((2, 0, V)), jnp.zeros((2, 0), jnp.int32), None

    number_loss = None if kind == "none" else losses.LOSSES[kind](reweigh=True)

    def fn(l):
        return objective(logits=l, targets=targets, weights=weights, number_loss=number_loss, z_loss=1e-4,
                         label_smoothing=0.1, loss_normalizing_factor=factor)[0]

    assert float(fn(logits)) == 0.0
    assert finite_grad(fn, logits)


@pytest.mark.parametrize("case", ["zero weights", "empty batch"])
def test_nothing_counted_gives_zero_under_gaussian_smoothing(case):
    logits, targets, weights = LOGITS, TARGETS, jnp.zeros((2, 7))
    if case == "empty batch":
        logits, targets, weights = jnp.zeros((0, 7, V)), jnp.zeros((0, 7), jnp.int32), None

    def fn(l):
        return objective(logits=l, targets=targets, weights=weights, gce_sigma=1.0,
                         number_loss=losses.was_cdf(sigma=1.0, reweigh=True),
                         loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")[0]

    assert float(fn(logits)) == 0.0
    assert finite_grad(fn, logits)


def test_empty_packed_batch_gives_zero():
    empty = jnp.zeros((0, 7), jnp.int32)
    loss, _ = objective(logits=jnp.zeros((0, 7, V)), targets=empty, loss_normalizing_factor="AVERAGE_PER_SEQUENCE",
                        decoder_segment_ids=empty, decoder_positions=empty)
    assert float(loss) == 0.0


# -- garbage at ignored positions: the loss without them ---------------------------------

# Row 0 keeps positions 0-3, row 1 keeps 0-2; the rest hold garbage logits and targets.
KEEP = jnp.array([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0]], bool)
CLEAN_TARGETS = jnp.array([[5, 6, 3, 9, 1, 1, 1], [2, 13, 4, 1, 1, 1, 1]])


def ntl_sum(parts):
    """The weighted sum of the number loss: its mean (`parts["ntl"]`) times the weight it counts."""
    return float(parts["ntl"]) * float(parts["ntl_weight_sum"])


def clean_reference(factor, number_loss, logits=LOGITS, **kwargs):
    """The objective on the kept positions only (the rows cut to their kept prefixes): the
    number loss's mean over the positions it counts, beside CE as beside CE's mean."""
    total = 0.0
    sums = {"ce": 0.0, "ntl": 0.0, "z": 0.0, "w": 0.0, "counted": 0.0}
    per_row = []
    for row, n in ((0, 4), (1, 3)):
        _, parts = objective(logits=logits[row:row + 1, :n], targets=CLEAN_TARGETS[row:row + 1, :n],
                             number_loss=number_loss, loss_normalizing_factor=None, **kwargs)
        per_row.append((n, parts))
        sums["ce"] += float(parts["cross_entropy"])
        sums["ntl"] += ntl_sum(parts)
        sums["z"] += float(parts["z_loss"])
        sums["w"] += float(parts["weight_sum"])
        sums["counted"] += float(parts["ntl_weight_sum"])
    mean = sums["ntl"] / sums["counted"]
    if factor is None:
        divisor = 1.0
    elif factor == "NUM_REAL_TARGET_TOKENS":
        divisor = sums["w"]
    elif factor == "NUM_TOTAL_TARGET_TOKENS":
        divisor = 14.0
    elif factor == "AVERAGE_PER_SEQUENCE":
        # Each row's weights divided by its own count; then the factor is 2 rows.
        total_ce = sum((float(p["cross_entropy"]) + float(p["z_loss"])) / n for n, p in per_row)
        per_sequence_mean = (sum(ntl_sum(p) / n for n, p in per_row)
                             / sum(float(p["ntl_weight_sum"]) / n for n, p in per_row))
        return total_ce / 2.0 + 0.3 * per_sequence_mean  # the weights' sum (2 rows) over the factor (2)
    else:
        divisor = factor
    total = (sums["ce"] + sums["z"] + 0.3 * mean * sums["w"]) / divisor
    return total


GARBAGE = [
    ("nan logits", lambda l: l.at[0, 5].set(jnp.nan).at[1, 4:].set(jnp.nan), lambda t: t),
    ("inf logits", lambda l: l.at[0, 4].set(jnp.inf).at[1, 6].set(-jnp.inf), lambda t: t),
    ("-inf pad column", lambda l: l.at[:, :, 0].set(jnp.where(KEEP, l[:, :, 0], -jnp.inf)), lambda t: t),
    ("huge logits", lambda l: l.at[0, 4:].set(3e38), lambda t: t),
    ("ids outside vocab", lambda l: l.at[1, 3:].set(jnp.nan), lambda t: t.at[1, 3].set(V).at[1, 4].set(-100)),
]


def assert_gradient_ignores_garbage(fn, logits, clean):
    """`fn`'s gradient is exactly 0 at the ignored positions, finite, and at the kept
    positions what it is when the ignored positions hold the `clean` logits instead."""
    grads, clean_grads = jax.grad(fn)(logits), jax.grad(fn)(clean)
    assert grads.dtype == clean.dtype and np.isfinite(np.asarray(grads, np.float32)).all()
    assert float(jnp.abs(jnp.where(KEEP[..., None], 0.0, grads)).max()) == 0.0
    np.testing.assert_allclose(np.asarray(grads[KEEP], np.float32), np.asarray(clean_grads[KEEP], np.float32),
                               rtol=1e-6, atol=0)


@pytest.mark.parametrize(("garbage", "kind", "factor"),
                         pairwise(garbage={g[0]: g for g in GARBAGE}, kind=KINDS, factor=FACTORS))
def test_ignored_positions_contribute_exactly_zero(garbage, kind, factor):
    _, spoil_logits, spoil_targets = garbage
    logits = spoil_logits(LOGITS)
    # Ignored by weight 0 (the pad id 0 as targets), or by an id outside the vocabulary.
    targets = spoil_targets(jnp.where(KEEP, CLEAN_TARGETS, 0))
    weights = None if factor in FACTORS[2:] else jnp.asarray(KEEP, jnp.float32)
    if garbage[0] == "ids outside vocab":
        weights = jnp.asarray(KEEP.at[1, 3:].set(True), jnp.float32) if weights is not None else None
        targets = targets.at[1, 5:].set(V + 7)  # counted by weight, ignored by id

    def fn(l):
        return objective(logits=l, targets=targets, weights=weights, number_loss=kind, z_loss=1e-4,
                         label_smoothing=0.0, loss_normalizing_factor=factor)[0]

    want = clean_reference(factor, kind, z_loss=1e-4)
    np.testing.assert_allclose(float(fn(logits)), want, rtol=2e-5)
    assert finite_grad(fn, logits)
    assert_gradient_ignores_garbage(fn, logits, LOGITS)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("garbage", GARBAGE, ids=[g[0] for g in GARBAGE])
def test_ignored_positions_contribute_exactly_zero_with_smoothing_and_reweigh(garbage, dtype):
    """The statistics that read every logit (the normaliser, reweigh's mass, label
    smoothing's sum) are masked per position, not by sanitising the logits: garbage at
    ignored positions still reaches neither the loss nor the gradient, in 16 bits too."""
    _, spoil_logits, spoil_targets = garbage
    logits = spoil_logits(LOGITS.astype(dtype))
    targets = spoil_targets(jnp.where(KEEP, CLEAN_TARGETS, 0))
    weights = jnp.asarray(KEEP, jnp.float32)
    if garbage[0] == "ids outside vocab":
        weights = jnp.asarray(KEEP.at[1, 3:].set(True), jnp.float32)
        targets = targets.at[1, 5:].set(V + 7)
    options = dict(z_loss=1e-4, label_smoothing=0.1, number_loss=losses.was(reweigh=True))

    def fn(l):
        return objective(logits=l, targets=targets, weights=weights, **options)[0]

    clean = LOGITS.astype(dtype)
    want = clean_reference(None, logits=clean, **options)
    np.testing.assert_allclose(float(fn(logits)), want, rtol=2e-5)
    assert_gradient_ignores_garbage(fn, logits, clean)

    def ce(l):
        return ntl_jax.weighted_cross_entropy(l, targets, weights=weights, label_smoothing=0.1, z_loss=1e-4)[0]

    want = sum(float(ntl_jax.weighted_cross_entropy(clean[row:row + 1, :n], CLEAN_TARGETS[row:row + 1, :n],
                                                    label_smoothing=0.1, z_loss=1e-4)[0])
               for row, n in ((0, 4), (1, 3)))
    np.testing.assert_allclose(float(ce(logits)), want, rtol=2e-5)
    assert_gradient_ignores_garbage(ce, logits, clean)


@pytest.mark.parametrize("factor", [None, "NUM_REAL_TARGET_TOKENS"])
@pytest.mark.parametrize("garbage", GARBAGE, ids=[g[0] for g in GARBAGE])
def test_ignored_positions_contribute_exactly_zero_under_gaussian_smoothing(garbage, factor):
    _, spoil_logits, spoil_targets = garbage
    logits = spoil_logits(LOGITS)
    targets = spoil_targets(jnp.where(KEEP, CLEAN_TARGETS, 0))
    weights = None if factor is not None else jnp.asarray(KEEP, jnp.float32)
    if garbage[0] == "ids outside vocab":
        weights = jnp.asarray(KEEP.at[1, 3:].set(True), jnp.float32) if weights is not None else None
        targets = targets.at[1, 5:].set(V + 7)

    def fn(l):
        return objective(logits=l, targets=targets, weights=weights, number_loss=losses.was_cdf(sigma=1.0),
                         z_loss=1e-4, gce_sigma=1.0, loss_normalizing_factor=factor)[0]

    want = clean_reference(factor, losses.was_cdf(sigma=1.0), z_loss=1e-4, gce_sigma=1.0)
    np.testing.assert_allclose(float(fn(logits)), want, rtol=2e-5)
    assert_gradient_ignores_garbage(fn, logits, LOGITS)


def test_ids_outside_vocab_are_ignored_by_every_count():
    targets = TARGETS.at[0, 0].set(V).at[1, 1].set(V + 100)  # both were counted, "1" and "9"
    _, parts = objective(targets=targets, z_loss=1e-2, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    _, ref = objective(targets=targets, weights=WEIGHTS.at[0, 0].set(0).at[1, 1].set(0), z_loss=1e-2,
                       loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    assert float(parts["weight_sum"]) == 8.0 and float(parts["loss_normalizing_factor"]) == 8.0
    for key in ("loss", "cross_entropy", "z_loss", "ntl", "ntl_term", "ntl_weight_sum"):
        np.testing.assert_allclose(float(parts[key]), float(ref[key]), rtol=1e-6, err_msg=key)
    ce, z, n = ntl_jax.weighted_cross_entropy(LOGITS, targets, z_loss=1e-2)
    ce_ref, z_ref, n_ref = ntl_jax.weighted_cross_entropy(
        LOGITS, TARGETS, weights=jnp.ones((2, 7)).at[0, 0].set(0).at[1, 1].set(0), z_loss=1e-2)
    assert int(n) == int(n_ref) == 12
    np.testing.assert_allclose([float(ce), float(z)], [float(ce_ref), float(z_ref)], rtol=1e-6)


# -- check_targets: the opt-in error for ids the losses would ignore -------------------

# Ids shifted by an offset: 15, 16, 19 in row 0 and 23, 14, 14 in row 1 leave [0, V = 14).
OFFSET_TARGETS = jnp.where(TARGETS > 0, TARGETS + 10, 0)


def test_offset_targets_are_ignored_quietly_unless_checked():
    # The losses keep T5X's rule (no error, fewer positions counted) ...
    _, parts = objective(targets=OFFSET_TARGETS, weights=WEIGHTS)
    assert float(parts["weight_sum"]) == 4.0 and float(WEIGHTS.sum()) == 10.0
    # ... and check_targets names what it expected and what came.
    with pytest.raises(ValueError) as info:
        ntl_jax.check_targets(OFFSET_TARGETS, V)
    assert str(info.value) == (
        "expected target ids in [0, 14) (the vocabulary size is 14) or the ignore value -100, got 6 out of "
        "range: 15 at (0, 0), 16 at (0, 1), 19 at (0, 3), 23 at (1, 1), 14 at (1, 2), ...; the losses would "
        "ignore them silently")


def test_check_targets_passes_ids_in_the_vocabulary_and_the_ignore_value():
    ntl_jax.check_targets(TARGETS, V)
    ntl_jax.check_targets(np.asarray(TARGETS.at[0, 5:].set(-100)), V)  # numpy, ntloss's ignore_index
    ntl_jax.check_targets(TARGETS.at[0, 6].set(-1), V, ignore_index=-1)
    ntl_jax.check_targets(TARGETS.astype(jnp.uint8), V)  # -100 does not fit uint8: nothing to allow
    with pytest.raises(ValueError, match=r"in \[0, 14\) \(the vocabulary size is 14\), got 1 out of range: -100 at "
                                         r"\(0, 5\);"):
        ntl_jax.check_targets(TARGETS.at[0, 5].set(-100), V, ignore_index=None)
    with pytest.raises(ValueError, match="got 1 out of range: -100 at"):
        ntl_jax.check_targets(TARGETS.at[0, 5].set(-100), V, ignore_index=-1)


@pytest.mark.parametrize("call,error,fragment", [
    (lambda: ntl_jax.check_targets(TARGETS * 1.0, V), TypeError, "integer targets"),
    (lambda: ntl_jax.check_targets(np.asarray(TARGETS).tolist(), V), TypeError, "convert it with jnp.asarray"),
    (lambda: ntl_jax.check_targets(TARGETS, 0), ValueError, "vocab_size to be an integer >= 1, got 0"),
    (lambda: ntl_jax.check_targets(TARGETS, 14.0), ValueError, "vocab_size to be an integer"),
    (lambda: ntl_jax.check_targets(TARGETS, V, ignore_index="pad"), ValueError, "ignore_index to be an integer"),
])
def test_check_targets_bad_arguments(call, error, fragment):
    with pytest.raises(error, match=fragment):
        call()


def test_check_targets_under_jit_with_checkify():
    from jax.experimental import checkify

    def loss_fn(logits, targets):
        ntl_jax.check_targets(targets, logits.shape[-1])
        return objective(logits=logits, targets=targets, weights=WEIGHTS)[0]

    checked = checkify.checkify(jax.jit(loss_fn))
    err, loss = checked(LOGITS, TARGETS)
    assert err.get() is None
    # The check changes nothing (jit's fusion may round a sum differently: a few float32 ulps).
    np.testing.assert_allclose(loss, objective(weights=WEIGHTS)[0], rtol=1e-6)
    err, _ = checked(LOGITS, OFFSET_TARGETS)
    with pytest.raises(ValueError, match=r"expected target ids in \[0, 14\) \(the vocabulary size is 14\) or the "
                                         r"ignore value -100, got 15 at flat index 0 \(out of range in all: 6\)"):
        err.throw()
    # checkify inside jit, and under grad, give the same error.
    err, _ = jax.jit(checkify.checkify(jax.grad(loss_fn)))(LOGITS, OFFSET_TARGETS.at[0, 0].set(-100))
    assert "got 16 at flat index 1 (out of range in all: 5)" in err.get()
    # Without checkify, jit says how to fix it.
    with pytest.raises(ValueError, match="checkify"):
        jax.jit(loss_fn)(LOGITS, TARGETS)


@pytest.mark.parametrize("kind", ["was", "mse", "huber", "number_level", "number_level_float"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_losses_ignore_nan_logits_at_zero_weight(kind, reduction):
    logits = LOGITS.at[1, 2].set(jnp.nan).at[0, 5].set(-jnp.inf)
    weights = jnp.ones((2, 7)).at[1, 2].set(0.0).at[0, 5].set(0.0)
    clean = LOGITS.at[1, 2].set(0.0).at[0, 5].set(0.0)

    def fn(l):
        return ntl_jax.number_token_loss(l, TARGETS, NT, number_loss=kind, weights=weights, reduction=reduction)

    got, want = fn(logits), fn(clean)
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert finite_grad(lambda l: jnp.sum(fn(l)), logits)


# -- number level: a weight-0 digit breaks the number -----------------------------------


def digit(d):
    return d + 4


def test_zero_weight_digit_breaks_the_number():
    # "123 4": weight 0 on "2" leaves the numbers "1" and "3", as ntloss's ignore_index.
    targets = jnp.array([[digit(1), digit(2), digit(3), 2, digit(4)]])
    weights = jnp.array([[1.0, 0.0, 1.0, 1.0, 1.0]])
    logits = jax.random.normal(jax.random.PRNGKey(3), (1, 5, V)) * 2
    got = ntl_jax.number_level_loss(logits, targets, NT, weights=weights)
    ignored = ntl_jax.number_level_loss(logits, targets.at[0, 1].set(-100), NT)
    np.testing.assert_allclose(got, ignored, rtol=1e-6)
    assert np.count_nonzero(np.asarray(got)) == 3  # "1", "3", "4"
    # Weight 0 on the first digit no longer zeroes the whole number "123".
    first = ntl_jax.number_level_loss(logits, targets, NT, weights=weights.at[0, 1].set(1.0).at[0, 0].set(0.0))
    assert float(first[0, 1]) > 0 and float(first[0, 0]) == 0.0


@pytest.mark.parametrize("float_level", [False, True])
@pytest.mark.parametrize("reweigh", [False, True])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_zero_weight_digits_match_ntloss_ignore_index(float_level, reweigh, reduction):
    torch = pytest.importorskip("torch")
    ntloss = pytest.importorskip("ntloss")
    from tests import ntloss_cases as cases

    nt = NumberTokens.from_pieces(cases.PIECES)
    inputs = cases.make_inputs(5)
    weights = inputs["weights"].copy()
    weights[2, [1, 4, 6]] = 0.0  # inside "987654321"
    weights[0, [0, 8]] = 0.0  # first digit of "12", last of "19"
    ignored = np.where(weights == 0, cases.IGNORE, inputs["targets"])
    loss = ntloss.NumberLevelLoss(cases.hf_tokenizer(), float_level=float_level, reweigh=reweigh)
    want = loss(torch.from_numpy(inputs["logits"]), torch.from_numpy(ignored),
                loss_weights=torch.from_numpy(weights), reduction=reduction).numpy()
    got = ntl_jax.number_level_loss(jnp.asarray(inputs["logits"]), jnp.asarray(inputs["targets"], jnp.int32), nt,
                                    weights=jnp.asarray(weights), reweigh=reweigh, reduction=reduction,
                                    float_level=float_level)
    np.testing.assert_allclose(got, want, rtol=3e-5, atol=1e-5)


def test_a_zero_weight_inside_a_number_ends_it_where_ntloss_joins_across():
    """Targets "a 1 2 3 b", a confident "a 1 9 3 b", weights [1, 1, 0, 1, 1]: a weight of 0
    marks a position whose logits are never read, inside a number too, so the numbers are
    "1" and "3" (both right: 0), and NaN logits there change nothing. ntloss joins 123
    across it, reading the masked digit's prediction (193), and weighs the number by its
    first digit's weight: [0, 0.2215, 0, 0, 0]. docs/guides/losses.md says how the two differ."""
    torch = pytest.importorskip("torch")
    ntloss = pytest.importorskip("ntloss")
    from tests import ntloss_cases as cases

    nt = NumberTokens.from_pieces(cases.PIECES)
    targets = np.asarray([cases.pieces_ids("a", "1", "2", "3", "b")])
    predicted = np.asarray(cases.pieces_ids("a", "1", "9", "3", "b"))
    logits = np.full((1, 5, cases.VOCAB_SIZE), -30.0, np.float32)
    logits[0, np.arange(5), predicted] = 30.0
    weights = np.asarray([[1.0, 1.0, 0.0, 1.0, 1.0]], np.float32)
    got = ntl_jax.number_level_loss(jnp.asarray(logits), jnp.asarray(targets, jnp.int32), nt,
                                    weights=jnp.asarray(weights), reduction="none")
    np.testing.assert_array_equal(np.asarray(got), np.zeros((1, 5)))
    garbage = logits.copy()
    garbage[0, 2] = np.nan
    np.testing.assert_array_equal(np.asarray(ntl_jax.number_level_loss(
        jnp.asarray(garbage), jnp.asarray(targets, jnp.int32), nt, weights=jnp.asarray(weights),
        reduction="none")), np.zeros((1, 5)))
    theirs = ntloss.NumberLevelLoss(cases.hf_tokenizer(), reweigh=False)(
        torch.from_numpy(logits), torch.from_numpy(targets), loss_weights=torch.from_numpy(weights),
        reduction="none").numpy()
    np.testing.assert_allclose(theirs, [[0.0, 70 / 316, 0.0, 0.0, 0.0]], rtol=1e-6)  # |193-123| / (193+123)


# -- reweigh at large logits ----------------------------------------------------------


def reweighed_was_float64(logits, targets):
    """NTL-WAS with reweigh, evaluated in float64 numpy."""
    logits = np.asarray(logits, np.float64)
    values = np.asarray(NT.values, np.float64)
    ids = np.asarray(NT.ids)
    v = values[ids]
    top = logits.max(-1, keepdims=True)
    e = np.exp(logits - top)
    mass = e[..., ids].sum(-1) / e.sum(-1)
    rest = np.delete(e, ids, axis=-1).sum(-1) / e.sum(-1)
    p = e[..., ids] / e[..., ids].sum(-1, keepdims=True)
    y = values[np.asarray(targets)]
    loss = (p * np.abs(y[..., None] - v)).sum(-1)
    return loss * mass + 1.01 * (v.max() - v.min()) * rest


# The float32 sums behind reweigh's mass and rest: at most V - 1 roundings each, of a
# relative u = eps / 2 (every term is at most 1, the total at least 1).
_SUM_ERROR = (V - 1) * float(np.finfo(np.float32).eps) / 2


@pytest.mark.parametrize("targets_at", ["random digits", "the top digit"])
@pytest.mark.parametrize("scale", [1.0, 30.0, 100.0])
@pytest.mark.parametrize("number_bias", [-20.0, 0.0, 20.0])
def test_reweigh_is_accurate_at_large_logits(scale, number_bias, targets_at):
    # Digits as targets everywhere; number_bias moves the number mass towards 0 or 1,
    # where the mass or 1 - mass cancels in a naive evaluation. With the top digit as
    # the target, the WAS term nearly vanishes at large scales and the loss is tiny.
    logits = jax.random.normal(jax.random.PRNGKey(7), (4, 16, V)) * scale
    logits = logits.at[..., 4:].add(number_bias)
    if targets_at == "the top digit":
        targets = jnp.argmax(logits[..., 4:], axis=-1) + 4
    else:
        targets = jax.random.randint(jax.random.PRNGKey(8), (4, 16), 4, V)
    # The mass, relative to itself; the rest, a few ulps of 1 (`number_mass`'s contract).
    everywhere = number_target(jnp.zeros(logits.shape[:-1], jnp.int32), None, V, NT)  # every position kept
    numbers = number_stats.number_stats(logits, everywhere, number_stats.with_formulation(NT, FORMULATION),
                                        number_stats.NumberReads())
    _, (mass, rest) = head_stats._number_mass(logits, numbers, everywhere.keep, logits)
    e = np.exp(np.asarray(logits, np.float64) - np.asarray(logits, np.float64).max(-1, keepdims=True))
    want_mass = e[..., 4:].sum(-1) / e.sum(-1)
    np.testing.assert_allclose(mass, want_mass, rtol=4 * _SUM_ERROR, atol=float(np.finfo(np.float32).tiny))
    np.testing.assert_allclose(rest, e[..., :4].sum(-1) / e.sum(-1), rtol=0, atol=4 * _SUM_ERROR)
    got = np.asarray(ntl_jax.ntl_was(logits, targets, NT, reweigh=True), np.float64)
    want = reweighed_was_float64(logits, targets)
    # The loss is WAS x mass + 1.01 x 9 x rest: the first term to float32's relative
    # accuracy (2e-6 for the WAS sum and the mass), the second to the rest's absolute one.
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1.01 * 9 * 4 * _SUM_ERROR)
    grads = jax.grad(lambda l: jnp.sum(ntl_jax.ntl_was(l, targets, NT, reweigh=True)))(logits)
    assert np.isfinite(np.asarray(grads)).all()
