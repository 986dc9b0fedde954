"""The number-level loss on multi-digit tokenizers (pieces such as "0".."999", "07").

Held against a plain-Python reference written from the definition (numbers read from
the target pieces, the predicted expected values placed by the target tokens' digit
counts), and, on single-digit vocabularies, against the numbers the library gave before
multi-digit tokens were supported (tests/fixtures/number_level_single_digit.npz, written
by tests/fixtures/make_number_level_fixture.py from commit 9e35221).
"""

import functools
import itertools
import math
import pathlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import ntl_jax
from ntl_jax import NumberTokens, cross_entropy_and_ntl, fused_cross_entropy_and_ntl
from ntl_jax import losses as number_losses
from ntl_jax._core import losses
from ntl_jax._core.digit_runs import join_digit_runs
from ntl_jax._core.targets import number_target
from tests.fixtures import make_number_level_fixture as single_digit

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "number_level_single_digit.npz"
IGNORE = -100  # as ntloss's ignore_index and tests/ntloss_cases.py

# A LLaMA-3-like vocabulary: every number "0".."999", leading-zero pieces "00".."099",
# "000", "007", "0007"; number tokens that are no plain digit run ("-1", "3.5", "1e3",
# "+7"); a dot, letters and specials. The logits have 3 columns beyond the table.
RUN_PIECES = [str(i) for i in range(1000)] + [f"0{i}" for i in range(100)] + ["000", "007", "0007"]
LONE_PIECES = ["-1", "3.5", "1e3", "+7", "-20"]
PIECES = ["<pad>", "</s>", "a", "b", "x", "."] + LONE_PIECES + RUN_PIECES
NT = NumberTokens.from_pieces(PIECES, digit_level=False)
DOT = PIECES.index(".")
EXTRA = 3
VOCAB = len(PIECES) + EXTRA
EPS = float(np.finfo(np.float32).eps)


def ids(*pieces):
    return [PIECES.index(p) for p in pieces]


# -- the reference, from the definition ---------------------------------------------------


def is_number(piece):
    try:
        return math.isfinite(float(piece))
    except (TypeError, ValueError):
        return False


def is_run(piece):
    """A number token made of plain digits joins its neighbours into one number."""
    return piece is not None and piece != "" and all(c in "0123456789" for c in piece)


def softmax64(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def reference(logits, targets, weights, *, float_level, reweigh, reduction, pieces=PIECES):
    """Walks each row's target pieces: a run of plain-digit pieces (across one "." between
    two of them when `float_level`) is the number their concatenation writes; any other
    number piece is a number of its own. The prediction's expected value at each token
    of the number is placed by the digits the target pieces after it write (at most
    10^19, as ntloss). Ignored positions (weight 0, id outside the logits) and ids
    beyond the table break numbers."""
    logits = np.asarray(logits, np.float64)
    targets = np.asarray(targets)
    batch, length, vocab = logits.shape
    number_ids = [i for i, p in enumerate(pieces) if is_number(p)]
    number_values = np.array([float(pieces[i]) for i in number_ids])
    per_token = np.zeros((batch, length))
    weight_sum = 0.0

    def piece(b, t):
        tid = int(targets[b, t])
        if not 0 <= tid < vocab or (weights is not None and weights[b, t] == 0) or tid >= len(pieces):
            return None
        return pieces[tid]

    def expected(b, t):
        return float(softmax64(logits[b, t, number_ids]) @ number_values)

    for b in range(batch):
        t = 0
        while t < length:
            p = piece(b, t)
            if is_run(p):
                run = [t]
                t += 1
                while t < length:
                    q = piece(b, t)
                    if is_run(q):
                        run.append(t)
                        t += 1
                    elif float_level and q == "." and t + 1 < length and is_run(piece(b, t + 1)):
                        t += 1
                    else:
                        break
                strings = [piece(b, s) for s in run]
                after = [sum(len(s) for s in strings[i + 1:]) for i in range(len(run))]
                y = sum(int(s) * 10 ** min(k, 19) for s, k in zip(strings, after))
                if len("".join(strings)) <= 20:
                    assert y == int("".join(strings))
                yhat = sum(expected(b, s) * 10.0 ** min(k, 19) for s, k in zip(run, after))
                start = run[0]
            elif p is not None and is_number(p):
                y, yhat, start = float(p), expected(b, t), t
                t += 1
            else:
                t += 1
                continue
            loss = abs(yhat - y) / (abs(yhat) + abs(y) + EPS)
            if reweigh:
                mass = softmax64(logits[b, start])[number_ids].sum()
                loss = loss * mass + 1.01 * (1.0 - mass)
            w = 1.0 if weights is None else float(weights[b, start])
            per_token[b, start] = loss * w
            weight_sum += w
    if reduction == "none":
        return per_token
    if reduction == "sum":
        return per_token.sum()
    return per_token.sum() / max(weight_sum, EPS)


def random_inputs(seed, batch=4, length=40, scale=3.0):
    """Targets: plain-digit runs of 1-3 digit pieces (some long enough to pass 20
    digits), dots, lone numbers, text, padding, ignored ids (-100) and ids beyond the
    table; weights with zeros; random logits."""
    rng = np.random.default_rng(seed)
    short = [p for p in RUN_PIECES if len(p) <= 2]
    groups = [
        (0.30, [PIECES.index(p) for p in RUN_PIECES]),
        (0.15, [PIECES.index(p) for p in short]),
        (0.15, [DOT]),
        (0.08, [PIECES.index(p) for p in LONE_PIECES]),
        (0.12, ids("a", "b", "x")),
        (0.06, ids("<pad>", "</s>")),
        (0.07, [IGNORE]),
        (0.07, list(range(len(PIECES), VOCAB))),
    ]
    p = np.array([g[0] for g in groups])
    which = rng.choice(len(groups), size=(batch, length), p=p / p.sum())
    targets = np.array([[rng.choice(groups[g][1]) for g in row] for row in which], np.int32)
    # One row with a long run (7 three-digit pieces: 21 digits, beyond the clip).
    targets[0, 3:10] = rng.integers(PIECES.index("100"), PIECES.index("999") + 1, size=7)
    logits = (rng.normal(size=(batch, length, VOCAB)) * scale).astype(np.float32)
    weights = rng.uniform(0.0, 2.0, size=(batch, length)).astype(np.float32)
    weights[rng.uniform(size=weights.shape) < 0.15] = 0.0
    return logits, targets, weights


# -- hand-computed ---------------------------------------------------------------------


def one_hot_logits(predicted):
    return jnp.log(jax.nn.one_hot(jnp.asarray([predicted]), VOCAB) + 1e-30)


def smape(yhat, y):
    return abs(yhat - y) / (abs(yhat) + abs(y) + EPS)


def test_digit_counts_place_each_piece():
    # "123","4" -> 1234 predicted as "123","5" -> 1235; "12","007" -> 12007 as "12","070" -> 12070.
    targets = jnp.asarray([ids("123", "4", "a", "12", "007", "</s>")])
    logits = one_hot_logits(ids("123", "5", "a", "12", "070", "</s>"))
    got = ntl_jax.number_level_loss(logits, targets, NT)
    np.testing.assert_allclose(got, [[smape(1235, 1234), 0, 0, smape(12070, 12007), 0, 0]], rtol=1e-5)
    starts, numbers = join_digit_runs(targets > 5, jnp.asarray([[123.0, 4, 0, 12, 7, 0]]),
                                      digit_counts=number_target(targets, None, NT.vocab_size, NT).digits)
    assert starts.tolist() == [[True, False, False, True, False, False]]
    assert numbers.tolist() == [[1234.0, 0, 0, 12007.0, 0, 0]]


def test_number_tokens_without_digit_count_stand_alone():
    # "12","-1","3": three numbers (a sign has no place in a run); "3.5" too, and with
    # float_level a dot next to it joins nothing: "1",".","3.5" is "1" and "3.5".
    targets = jnp.asarray([ids("12", "-1", "3", "a", "1", ".", "3.5", "1", ".", "25")])
    logits = one_hot_logits(ids("12", "-20", "4", "a", "2", ".", "1e3", "1", ".", "26"))
    want_int = [smape(12, 12), smape(-20, -1), smape(4, 3), 0, smape(2, 1), 0, smape(1000, 3.5),
                smape(1, 1), 0, smape(26, 25)]
    np.testing.assert_allclose(ntl_jax.number_level_loss(logits, targets, NT), [want_int], rtol=1e-5, atol=1e-7)
    want_float = want_int[:7] + [smape(126, 125), 0, 0]
    np.testing.assert_allclose(ntl_jax.number_level_loss(logits, targets, NT, float_level=True),
                               [want_float], rtol=1e-5, atol=1e-7)
    assert want_int[1] > 0.9 and want_float[7] > 0  # the lone and joined terms are not trivially 0


def test_space_marked_pieces_begin_a_new_number():
    """With `prefixed_numbers=True`, "Ġ12" is 12 and begins a number of its own: "3","Ġ12"
    are the numbers 3 and 12 (not 312), while "Ġ12","34" is 1234; with float_level a dot
    does not join across the space either ("1",".","Ġ5" is 1 and 5)."""
    pieces = ["<pad>", "a", ".", "Ġ"] + [str(i) for i in range(100)] + [f"Ġ{i}" for i in range(100)]
    nt = NumberTokens.from_pieces(pieces, digit_level=False, prefixed_numbers=True)
    tid = pieces.index
    opens = np.asarray(nt.opens_number)
    assert opens[[tid("Ġ12"), tid("12"), tid("Ġ"), tid("a")]].tolist() == [True, False, False, False]
    targets = jnp.asarray([[tid("3"), tid("Ġ12"), tid("34"), tid("a"), tid("1"), tid("."), tid("Ġ5")]])
    guess = [tid("4"), tid("Ġ12"), tid("35"), tid("a"), tid("2"), tid("."), tid("Ġ5")]
    logits = jnp.log(jax.nn.one_hot(jnp.asarray([guess]), len(pieces)) + 1e-30)
    want = [smape(4, 3), smape(1235, 1234), 0, 0, smape(2, 1), 0, 0]
    for float_level in (False, True):
        got = ntl_jax.number_level_loss(logits, targets, nt, float_level=float_level)
        np.testing.assert_allclose(got, [want], rtol=1e-5, atol=1e-7, err_msg=f"float_level={float_level}")
    unmarked = NumberTokens.from_pieces(pieces, digit_level=False)  # "Ġ12" is no number there
    assert not np.asarray(unmarked.opens_number).any()


# -- single-digit vocabularies: today's numbers -------------------------------------------


def test_single_digit_vocabulary_gives_the_stored_numbers():
    """Within 2 float32 ulps of 1 per element of the library before multi-digit support
    (the loss is a ratio in [0, 1] of a difference of whole numbers, whose digits are
    now summed in another order: its rounding is a few ulps of 1, not of itself); the
    gradients within 16 ulps of their largest element (each is a difference of terms of
    about that size, rounded in that other order too, and, on the reductions path of
    `number_stats`, from probabilities computed along another path)."""
    stored = np.load(FIXTURE)
    inputs = {k.split("/", 1)[1]: stored[k] for k in stored if k.startswith("input/")}
    # The fixture's `outputs` reads `number_level_loss` and `join_digit_runs` off a module,
    # as `ntl_jax/_core/losses.py` held both then; today the join is `digit_runs`', and
    # the loss takes ntloss's `float_level` where it took the variant's name.
    def number_level_loss(*args, ntl_kind, **kwargs):
        return losses.number_level_loss(*args, float_level=ntl_kind == "number_level_float", **kwargs)

    today = types.SimpleNamespace(number_level_loss=number_level_loss, join_digit_runs=join_digit_runs)
    got = single_digit.outputs(today, inputs)
    assert set(got) == {k for k in stored if not k.startswith("input/")}
    for name, value in got.items():
        want = stored[name]
        if name.endswith("/grad"):
            scale = np.spacing(np.float32(np.max(np.abs(want))))
            assert np.max(np.abs(value - want)) <= 16 * scale, name
        elif name.endswith("/starts"):
            np.testing.assert_array_equal(value, want, err_msg=name)
        else:
            scale = np.spacing(np.float32(max(1.0, np.max(np.abs(want)))))
            assert np.max(np.abs(value - want)) <= 2 * scale, name
    assert np.count_nonzero(stored["f1_r0/none/weighted"]) >= 20  # many numbers, not a trivial fixture


def test_join_digit_runs_with_counts_of_one_is_the_single_digit_join():
    stored = np.load(FIXTURE)
    is_digit = jnp.asarray(stored["input/is_digit"])
    values = jnp.asarray(stored["input/values"])
    dots = jnp.asarray(np.where(stored["input/is_digit"], 5, np.where(np.arange(is_digit.shape[1]) % 3 == 0, 3, 2)))
    for float_level in (False, True):
        starts, numbers = join_digit_runs(is_digit, values, dots, 3 if float_level else None,
                                          jnp.ones(is_digit.shape, jnp.int32))
        np.testing.assert_array_equal(starts, stored[f"join_f{int(float_level)}/starts"])
        # The digits' terms (all >= 0) are now summed in another order: k digits carry
        # at most (k - 1) half-ulps of relative rounding either way.
        want = stored[f"join_f{int(float_level)}/numbers"]
        k = int(np.max(np.sum(stored["input/is_digit"], axis=1)))
        np.testing.assert_allclose(numbers, want, rtol=k * float(np.finfo(np.float32).eps), atol=0)


def test_digit_level_tables_are_unchanged_by_wider_tables_on_single_digits():
    """A `digit_level=False` table scores targets made of single digits as the digit-level
    table does: every digit writes one digit in both."""
    pieces = single_digit.PIECES
    stored = np.load(FIXTURE)
    logits, targets = jnp.asarray(stored["input/logits"]), jnp.asarray(stored["input/targets"])
    wide = NumberTokens.from_pieces(pieces, digit_level=False)  # "12" is a number too
    targets = jnp.where(targets == pieces.index("12"), pieces.index("y"), targets)
    logits = logits.at[..., pieces.index("12")].set(-1e30)  # no mass on it: same prediction
    for float_level in (False, True):
        narrow = ntl_jax.number_level_loss(logits, targets, NumberTokens.from_pieces(pieces), float_level=float_level)
        np.testing.assert_allclose(ntl_jax.number_level_loss(logits, targets, wide, float_level=float_level), narrow,
                                   rtol=1e-6, atol=1e-7)


# -- multi-digit vocabularies: against the reference ----------------------------------------


# float32 against float64: numbers up to 10^21 and expectations over 1108 number tokens
# each carry a relative error of a few float32 ulps, so |yhat - y| / (|yhat| + |y|), in
# [0, 1], is off by a few ulps of 1 (at most 3.2e-7 over 6 seeds x 4 option sets), and
# a weighted sum of ~50 such terms (about 25) by a few ulps of itself.
ATOL, RTOL = 1e-6, 1e-6


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("float_level,reweigh", list(itertools.product([False, True], [False, True])))
def test_matches_the_reference(seed, float_level, reweigh):
    logits, targets, weights = random_inputs(seed)
    for weighted, reduction in itertools.product([False, True], ["none", "sum", "mean"]):
        w = weights if weighted else None
        got = ntl_jax.number_level_loss(jnp.asarray(logits), jnp.asarray(targets), NT,
                                        weights=None if w is None else jnp.asarray(w),
                                        float_level=float_level, reweigh=reweigh, reduction=reduction)
        want = reference(logits, targets, w, float_level=float_level, reweigh=reweigh, reduction=reduction)
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=RTOL, atol=ATOL,
                                   err_msg=f"weighted={weighted} reduction={reduction}")
    # Not a trivial case: many numbers, of several tokens, some lone, some past 20 digits.
    counted = reference(logits, targets, None, float_level=float_level, reweigh=False, reduction="none") != 0
    assert counted.sum() >= 15


def test_under_jit_and_with_a_traced_table():
    logits, targets, weights = random_inputs(3)
    f = jax.jit(functools.partial(ntl_jax.number_level_loss, float_level=True, reweigh=True, reduction="mean"))
    got = f(jnp.asarray(logits), jnp.asarray(targets), NT, weights=jnp.asarray(weights))
    want = reference(logits, targets, weights, float_level=True, reweigh=True, reduction="mean")
    np.testing.assert_allclose(float(got), want, rtol=RTOL, atol=ATOL)


# -- gradients -----------------------------------------------------------------------------


@pytest.mark.parametrize("float_level,reweigh", [(False, False), (True, True)])
def test_gradients_are_finite_at_extreme_and_nan_logits(float_level, reweigh):
    logits, targets, weights = random_inputs(4, scale=300.0)
    weights[1, 5] = weights[2, 7] = 0.0
    logits[1, 5] = np.nan
    logits[2, 7, :10] = np.inf

    def f(lg):
        return ntl_jax.number_level_loss(lg, jnp.asarray(targets), NT, weights=jnp.asarray(weights),
                                         float_level=float_level, reweigh=reweigh, reduction="mean")

    value, grad = jax.value_and_grad(f)(jnp.asarray(logits))
    assert np.isfinite(float(value)) and np.isfinite(np.asarray(grad)).all()
    assert np.count_nonzero(np.asarray(grad)) > 0
    assert not np.asarray(grad)[1, 5].any() and not np.asarray(grad)[2, 7].any()


@pytest.mark.parametrize("float_level", [False, True])
def test_gradients_match_finite_differences(float_level):
    # Short numbers (pieces of at most 2 digits, 8 positions) so float32 differences resolve.
    targets = jnp.asarray([ids("12", "07", ".", "5", "a", "-1", "99", "3"),
                           ids("x", "4", "0", "3.5", "00", ".", ".", "1")])
    logits = jax.random.normal(jax.random.PRNGKey(0), (2, 8, VOCAB))
    f = functools.partial(ntl_jax.number_level_loss, targets=targets, number_tokens=NT,
                          float_level=float_level, reweigh=True, reduction="mean")
    check_grads(jax.jit(f), (logits,), order=1, modes=["rev"], atol=2e-2, rtol=2e-2)


# -- the fused head ------------------------------------------------------------------------


def _ce_weight_sum(targets, weights):
    """The cross-entropy's weight sum (no loss-normalising factor): the given weights at the
    targets inside the logits (ignored ids, -100, count for nothing)."""
    targets, weights = np.asarray(targets), np.asarray(weights, np.float64)
    return np.where((weights > 0) & (targets >= 0) & (targets < VOCAB), weights, 0.0).sum()


def _assert_close(a, b, rtol=2e-5, what=""):
    # As tests/test_fused.py: different summation orders, a few hundred ulps of the largest value.
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(np.max(np.abs(a)), 1e-30)
    assert np.max(np.abs(a - b)) <= rtol * scale, f"{what}: max |diff| {np.max(np.abs(a - b))} vs scale {scale}"


@pytest.mark.parametrize("float_level,reweigh", [(False, False), (True, True)])
def test_fused_head_equals_the_unfused_objective(float_level, reweigh):
    _, targets, weights = random_inputs(5, batch=3, length=24)
    rng = np.random.default_rng(5)
    hidden = jnp.asarray(rng.normal(size=(3, 24, 8)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(8, VOCAB)), jnp.float32)
    targets, weights = jnp.asarray(targets), jnp.asarray(weights)
    options = dict(weights=weights, number_loss=number_losses.number_level(float_level=float_level, reweigh=reweigh))

    def unfused(h, k):
        return cross_entropy_and_ntl(jnp.einsum("bld,dv->blv", h, k), targets, NT, **options)

    def fused(h, k):
        return fused_cross_entropy_and_ntl(h, k, targets, NT, chunk_size=128, **options)

    (loss_u, parts_u), grads_u = jax.jit(jax.value_and_grad(unfused, argnums=(0, 1), has_aux=True))(hidden, kernel)
    (loss_f, parts_f), grads_f = jax.jit(jax.value_and_grad(fused, argnums=(0, 1), has_aux=True))(hidden, kernel)
    _assert_close(loss_u, loss_f, what="loss")
    for name in parts_u:
        _assert_close(parts_u[name], parts_f[name], what=name)
    _assert_close(grads_u[0], grads_f[0], what="d hidden")
    _assert_close(grads_u[1], grads_f[1], what="d kernel")
    # Both: lambda x the reference's weighted mean x the cross-entropy's weight sum (ntl_jax
    # 0.5; no loss-normalising factor), and its weighted mean.
    logits = np.asarray(jnp.einsum("bld,dv->blv", hidden, kernel))
    want = reference(logits, np.asarray(targets), np.asarray(weights), float_level=float_level,
                     reweigh=reweigh, reduction="sum")
    mean = reference(logits, np.asarray(targets), np.asarray(weights), float_level=float_level,
                     reweigh=reweigh, reduction="mean")
    weight_sum = _ce_weight_sum(targets, weights)
    np.testing.assert_allclose(float(parts_f["weight_sum"]), weight_sum, rtol=1e-6)
    assert want / mean < 0.8 * weight_sum  # the numbers are a share of the targets: new and old differ
    np.testing.assert_allclose(float(parts_f["ntl_term"]), 0.3 * mean * weight_sum, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(parts_f["ntl"]), mean, rtol=RTOL, atol=ATOL)
    assert want > 1.0


@pytest.mark.parametrize("float_level", [False, True])
def test_max_number_length_reaches_the_objective_and_the_fused_head(float_level):
    """`max_number_length` means in the objective and the fused head what it means in
    `number_level_loss` (held against ntloss in test_parity.py): the same NTL sum."""
    from ntl_jax import number_level_loss

    _, targets, weights = random_inputs(5, batch=3, length=24)
    rng = np.random.default_rng(5)
    hidden = jnp.asarray(rng.normal(size=(3, 24, 8)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(8, VOCAB)), jnp.float32)
    targets, weights = jnp.asarray(targets), jnp.asarray(weights)
    logits = jnp.einsum("bld,dv->blv", hidden, kernel)
    name = "number_level_float" if float_level else "number_level"
    options = dict(weights=weights, number_loss=number_losses.number_level(float_level=float_level,
                                                                           max_number_length=2))
    want = float(number_level_loss(logits, targets, NT, float_level=float_level, weights=weights, reduction="sum",
                                   max_number_length=2))
    mean = float(number_level_loss(logits, targets, NT, float_level=float_level, weights=weights, reduction="mean",
                                   max_number_length=2))
    default = float(number_level_loss(logits, targets, NT, float_level=float_level, weights=weights, reduction="sum"))
    # Numbers of 3+ places: the cap changes the loss, by 100x the tolerance below or more.
    assert abs(want - default) > 1e-3 * abs(default)
    _, parts = cross_entropy_and_ntl(logits, targets, NT, **options)
    _, fused_parts = fused_cross_entropy_and_ntl(hidden, kernel, targets, NT, chunk_size=128, **options)
    # The same loss as a spec.
    _, spec_parts = cross_entropy_and_ntl(logits, targets, NT, weights=weights,
                                          number_loss=f"{name}(max_number_length=2)")
    weight_sum = _ce_weight_sum(targets, weights)
    for got in (parts, fused_parts, spec_parts):
        np.testing.assert_allclose(float(got["ntl_term"]), 0.3 * mean * weight_sum, rtol=1e-5)
        np.testing.assert_allclose(float(got["ntl"]), mean, rtol=1e-5)
    with pytest.raises(ValueError, match=r"number loss 'was' has no parameter 'max_number_length' \(it takes "
                                         r"\('squash_factor', 'reweigh'\), and every loss mean_over\)"):
        cross_entropy_and_ntl(logits, targets, NT, number_loss="was(max_number_length=2)")
    with pytest.raises(TypeError, match=r"cross_entropy_and_ntl\(\) no longer takes max_number_length= "
                                        r".*number_loss=ntl_jax.losses.number_level\(max_number_length=...\)"):
        cross_entropy_and_ntl(logits, targets, NT, number_loss="was", max_number_length=2)
    with pytest.raises(ValueError, match=rf"number loss '{name}': expected max_number_length to be an integer >= 1, "
                                         r"got 0"):
        fused_cross_entropy_and_ntl(hidden, kernel, targets, NT, number_loss=f"{name}(max_number_length=0)")
