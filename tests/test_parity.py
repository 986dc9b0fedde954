"""Parity with the authors' ntloss 0.3.2 for every variant, option and reduction.

Checked against stored ntloss outputs (always) and against ntloss itself when it is
installed (the `test` extra installs it with the CPU build of torch).
"""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ntl_jax import losses
from tests import ntloss_cases as cases
from tests.formulation import ntl_jax_under_test as ntl_jax

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "ntloss_0.3.2.npz"
STORED = np.load(FIXTURE)
INPUTS = {k: STORED[f"input/{k}"] for k in ("logits", "targets", "weights")}
CASES = [
    (name, kind, options, reduction, weighting)
    for name, kind, options in cases.variants()
    for reduction in cases.REDUCTIONS
    for weighting in cases.WEIGHTINGS
]
IDS = [f"{c[0]}-{c[3]}-{c[4]}" for c in CASES]


def ours(kind, options, reduction, weighting, logits=None):
    opts = dict(options)
    nt = ntl_jax.NumberTokens.from_pieces(cases.PIECES, digit_level=opts.pop("digit_level", True))
    logits = jnp.asarray(INPUTS["logits"] if logits is None else logits)
    targets = jnp.asarray(INPUTS["targets"], jnp.int32)
    weights = jnp.asarray(INPUTS["weights"]) if weighting == "weighted" else None
    if kind == "was":
        return ntl_jax.ntl_was(logits, targets, nt, weights=weights, reduction=reduction, **opts)
    if kind == "number_level":
        return ntl_jax.number_level_loss(logits, targets, nt, weights=weights, reduction=reduction, **opts)
    return ntl_jax.ntl_dot(logits, targets, nt, weights=weights, loss_function=kind, reduction=reduction, **opts)


@pytest.mark.parametrize("name,kind,options,reduction,weighting", CASES, ids=IDS)
def test_matches_stored_ntloss(name, kind, options, reduction, weighting):
    expected = STORED[f"{name}/{reduction}/{weighting}"]
    got = np.asarray(ours(kind, options, reduction, weighting), np.float64)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_cases_are_not_degenerate():
    # The cases must exercise non-zero losses, zero-weight positions and every kind.
    values = [np.abs(STORED[f"{c[0]}/sum/weighted"]) for c in CASES]
    assert min(values) > 1e-3
    none_was = STORED["was_d1_sNone_r0/none/weighted"]
    assert (none_was != 0).sum() >= 10 and (none_was == 0).sum() >= 10
    # float_level joins 12.5 into one number, so it has fewer counted positions.
    plain = STORED["number_level_f0_r0/none/unweighted"]
    joined = STORED["number_level_f1_r0/none/unweighted"]
    assert (joined != 0).sum() < (plain != 0).sum()


@pytest.mark.parametrize("name,kind,options,reduction,weighting", CASES, ids=IDS)
def test_stored_outputs_are_ntloss_today(name, kind, options, reduction, weighting):
    pytest.importorskip("torch")
    ntloss = pytest.importorskip("ntloss")
    assert ntloss.__version__ == "0.3.2"
    live = cases.ntloss_output(kind, options, INPUTS, reduction, weighting)
    # Both sides are float32 torch results, but torch picks its SIMD kernels (AVX-512,
    # AVX2, or none with ATEN_CPU_CAPABILITY=default) by CPU, and those round softmax and
    # sums in another order. A per-position MSE/MAE/Huber loss is a difference of
    # float32 expectations of values up to 12 (squares up to 169), so a few ulps of those
    # (~1e-6 absolute) are up to ~7e-6 relative on a small loss. The live checks' bound:
    np.testing.assert_allclose(live, STORED[f"{name}/{reduction}/{weighting}"], rtol=3e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("name,kind,options", list(cases.variants()), ids=[v[0] for v in cases.variants()])
def test_live_parity_on_other_logits(seed, name, kind, options):
    pytest.importorskip("torch")
    pytest.importorskip("ntloss")
    inputs = dict(INPUTS, logits=cases.make_inputs(seed)["logits"])
    for reduction in ("none", "mean"):
        expected = cases.ntloss_output(kind, options, inputs, reduction, "weighted")
        got = np.asarray(ours(kind, options, reduction, "weighted", logits=inputs["logits"]))
        # reweigh adds 1.01 * max_dist * (1 - mass): with max_dist = 169 (MSE over values
        # -1..12) one float32 ulp of the mass moves the loss by ~2e-5 in either package.
        np.testing.assert_allclose(got, expected, rtol=3e-5, atol=1e-5)


# -- ntloss options beyond the stored cases ----------------------------------------


def _log_cosh_torch(prediction, target, reduction="none"):
    import torch

    return torch.log(torch.cosh(prediction - target))


def _log_cosh(prediction, target):
    return jnp.log(jnp.cosh(prediction - target))


@pytest.mark.parametrize("reweigh", [False, True])
@pytest.mark.parametrize("reduction", cases.REDUCTIONS)
def test_ntl_dot_takes_a_loss_function_as_ntloss(reweigh, reduction):
    """`ntl_dot(loss_function=f)` against `NTLossDotProduct(loss_function=f)` for log-cosh,
    jitted, weighted; with reweigh, the ceiling `max(|f(lo, hi)|, |f(hi, lo)|)` as ntloss's.
    The same function as the objective's `number_loss=expected_value_loss(f)`."""
    torch = pytest.importorskip("torch")
    ntloss = pytest.importorskip("ntloss")
    nt = ntl_jax.NumberTokens.from_pieces(cases.PIECES)
    weights = INPUTS["weights"]
    targets = np.where(weights == 0, cases.IGNORE, INPUTS["targets"])
    theirs = ntloss.NTLossDotProduct(cases.hf_tokenizer(), reweigh=reweigh, loss_function=_log_cosh_torch)
    want = theirs(torch.from_numpy(INPUTS["logits"]), torch.from_numpy(targets),
                  loss_weights=torch.from_numpy(weights), reduction=reduction).numpy()
    run = jax.jit(lambda lg, t, w: ntl_jax.ntl_dot(lg, t, nt, weights=w, loss_function=_log_cosh, reweigh=reweigh,
                                                   reduction=reduction))
    got = run(jnp.asarray(INPUTS["logits"]), jnp.asarray(INPUTS["targets"], jnp.int32), jnp.asarray(weights))
    assert float(np.max(np.abs(want))) > 0.1
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5)
    # The same function as the objective's number loss: its `ntl` part the weighted mean
    # (ntloss's "mean"), its term (since 0.5.0) lambda times that mean times the CE's weight
    # sum over the factor (None: 1), no longer lambda times the weighted sum.
    if reduction in ("sum", "mean"):
        _, parts = ntl_jax.cross_entropy_and_ntl(
            jnp.asarray(INPUTS["logits"]), jnp.asarray(INPUTS["targets"], jnp.int32), nt,
            weights=jnp.asarray(weights), number_loss=losses.expected_value_loss(_log_cosh, reweigh=reweigh))
        mean = theirs(torch.from_numpy(INPUTS["logits"]), torch.from_numpy(targets),
                      loss_weights=torch.from_numpy(weights), reduction="mean").numpy()
        np.testing.assert_allclose(float(parts["ntl"]), float(mean), rtol=1e-5)
        if reduction == "sum":
            assert float(want) != pytest.approx(float(mean) * float(np.sum(weights)), rel=1e-3)
            np.testing.assert_allclose(float(parts["ntl_term"]), 0.3 * float(mean) * float(np.sum(weights)),
                                       rtol=1e-5)


@pytest.mark.parametrize("max_number_length", [1, 2, 3])
@pytest.mark.parametrize("float_level", [False, True])
def test_number_level_max_number_length_as_ntloss(max_number_length, float_level):
    """A small `max_number_length`: in longer runs ("12", "987654321") the leading digits
    all take the highest place, in ntloss as here."""
    torch = pytest.importorskip("torch")
    ntloss = pytest.importorskip("ntloss")
    nt = ntl_jax.NumberTokens.from_pieces(cases.PIECES)
    theirs = ntloss.NumberLevelLoss(cases.hf_tokenizer(), float_level=float_level, reweigh=False,
                                    max_number_length=max_number_length)
    want = theirs(torch.from_numpy(INPUTS["logits"]), torch.from_numpy(INPUTS["targets"]), reduction="none").numpy()
    got = ntl_jax.number_level_loss(jnp.asarray(INPUTS["logits"]), jnp.asarray(INPUTS["targets"], jnp.int32), nt,
                                    float_level=float_level, max_number_length=max_number_length,
                                    reduction="none")
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-6)
    default = ntl_jax.number_level_loss(jnp.asarray(INPUTS["logits"]), jnp.asarray(INPUTS["targets"], jnp.int32),
                                        nt, float_level=float_level, reduction="none")
    assert not np.allclose(np.asarray(got), np.asarray(default))  # the long run reads differently


def test_bad_loss_function_and_max_number_length_are_refused():
    nt = ntl_jax.NumberTokens.from_pieces(cases.PIECES)
    logits, targets = jnp.asarray(INPUTS["logits"]), jnp.asarray(INPUTS["targets"], jnp.int32)
    with pytest.raises(ValueError, match="a function.*got 'rmse'"):
        ntl_jax.ntl_dot(logits, targets, nt, loss_function="rmse")
    with pytest.raises(ValueError, match="a function.*got 3"):
        ntl_jax.ntl_dot(logits, targets, nt, loss_function=3)
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match=rf"number loss 'number_level': expected max_number_length to be an "
                                             rf"integer >= 1, got {bad!r}"):
            ntl_jax.number_level_loss(logits, targets, nt, max_number_length=bad)
