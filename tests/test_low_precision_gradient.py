"""The 16-bit logits gradient of the losses and the objective, in each formulation of
the number statistics (`ntl_jax._core.number_stats`): the float32 gradient of the widened
logits rounded once, in every mode of differentiation; and, lowered for each platform,
the formulation it takes: on accelerators no gather or scatter over the vocabulary.
"""

import re

import jax
import jax.export  # an attribute of jax only after its import before JAX 0.8
import jax.numpy as jnp
import numpy as np
import pytest

import ntl_jax
from ntl_jax import NumberTokens, losses
from ntl_jax._core.number_stats import with_formulation
from tests.conftest import FORMULATIONS
from tests.grid import pairwise

DTYPES = [jnp.bfloat16, jnp.float16]


def scattered_table(vocab, count, seed=0):
    """A vocabulary with the numbers 0..count-1 at scattered ids (multi-digit pieces, so
    `digit_level=False`: `count` number tokens)."""
    rng = np.random.default_rng(seed)
    pieces = [f"w{i}" for i in range(vocab)]
    for value, token_id in enumerate(rng.choice(vocab, size=count, replace=False)):
        pieces[token_id] = str(value)
    table = NumberTokens.from_pieces(pieces, digit_level=False)
    assert len(table.ids) == count
    return table


def problem(count, vocab=600, seed=1):
    nt = scattered_table(vocab, count)
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(rng.standard_normal((2, 5, vocab)) * 2, jnp.float32)
    targets = jnp.asarray(rng.choice(np.asarray(nt.ids), size=(2, 5)), jnp.int32).at[0, 0].set(7)
    weights = jnp.ones((2, 5)).at[1, 1].set(0.0)
    return nt, logits, targets, weights


def rounded_once(dtype):
    """`assert_allclose` tolerances of a float32 value rounded to `dtype` once: half a
    unit in the last place (eps / 2 relative, half the smallest subnormal absolute),
    plus 1e-6 relative for the float32 value itself, computed along another path."""
    info = jnp.finfo(dtype)
    return dict(rtol=float(info.eps) / 2 + 1e-6, atol=float(info.smallest_subnormal) / 2)


@pytest.mark.parametrize("count", [10, 120])
@pytest.mark.parametrize("dtype", DTYPES)
def test_16_bit_gradient_is_the_rounded_float32_gradient(count, dtype, formulation):
    """End to end: the gradient is the float32 one of the widened logits, rounded once
    (half a unit in the last place, also among the subnormals), and 0 off the numbers."""
    nt, logits, targets, weights = problem(count)
    nt = with_formulation(nt, formulation)

    def f(x):
        return ntl_jax.ntl_was(x, targets, nt, weights=weights, reduction="mean")

    grad = jax.jit(jax.grad(f))(logits.astype(dtype))
    want = jax.jit(jax.grad(f))(logits.astype(dtype).astype(jnp.float32))
    assert grad.dtype == dtype
    np.testing.assert_allclose(np.asarray(grad, np.float32), want, **rounded_once(dtype))
    off_numbers = np.setdiff1d(np.arange(logits.shape[-1]), np.asarray(nt.ids))
    assert np.all(np.asarray(grad, np.float32)[..., off_numbers] == 0)


OBJECTIVE_OPTIONS = [dict(number_loss=None, label_smoothing=0.1), dict(number_loss=losses.was(reweigh=True)),
                     dict(number_loss="mse", label_smoothing=0.1),
                     dict(number_loss=losses.number_level(reweigh=True)),
                     # Every number token's column: gathered (on accelerators beyond 32 of them).
                     dict(number_loss=losses.was_cdf(sigma=1.0), gce_sigma=1.0)]


@pytest.mark.parametrize(("dtype", "options", "count", "formulation"),
                         pairwise(dtype=DTYPES, options=OBJECTIVE_OPTIONS, count=[10, 120],
                                  formulation=FORMULATIONS), indirect=["formulation"])
def test_16_bit_objective_gradient_is_the_rounded_float32_gradient(count, options, dtype, formulation):
    """`cross_entropy_and_ntl`: every term's gradient (normaliser, target, label
    smoothing, number columns, reweigh's mass) adds up in float32 and is rounded to the
    logits' dtype once, and the loss is the float32 one of the widened logits."""
    nt, logits, targets, weights = problem(count)
    nt = with_formulation(nt, formulation)

    def f(x):
        return ntl_jax.cross_entropy_and_ntl(x, targets, nt, weights=weights, z_loss=1e-4, **options)[0]

    value, grad = jax.jit(jax.value_and_grad(f))(logits.astype(dtype))
    want_value, want = jax.jit(jax.value_and_grad(f))(logits.astype(dtype).astype(jnp.float32))
    assert grad.dtype == dtype
    np.testing.assert_allclose(float(value), float(want_value), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad, np.float32), want, **rounded_once(dtype))


@pytest.mark.parametrize(("dtype", "reweigh", "formulation"),
                         pairwise(dtype=DTYPES, reweigh=[False, True], formulation=FORMULATIONS),
                         indirect=["formulation"])
def test_16_bit_objective_forward_mode_and_hessian(dtype, reweigh, formulation):
    """The objective's custom derivatives (the normaliser's sum, the target's select,
    the number statistics') are JVP rules: forward mode gives the reverse-mode Jacobian, and the
    Hessian is the float32 one of the widened logits, with reweigh too."""
    nt, logits, targets, weights = problem(10, vocab=40)
    low = logits[:1, :3].astype(dtype)
    nt = with_formulation(nt, formulation)

    def f(x):
        return ntl_jax.cross_entropy_and_ntl(x, targets[:1, :3], nt, weights=weights[:1, :3],
                                             number_loss=losses.mse(reweigh=reweigh), label_smoothing=0.1)[0]

    assert_forward_mode_and_hessian(f, low)


@pytest.mark.parametrize("dtype", DTYPES)
def test_16_bit_forward_mode_and_hessian(dtype, formulation):
    """Forward mode gives the reverse-mode Jacobian, and the Hessian is the float32
    one of the widened logits (the custom derivative is a JVP rule, so every mode of
    differentiation composes)."""
    nt, logits, targets, weights = problem(10, vocab=40)
    low = logits[:1, :3].astype(dtype)
    nt = with_formulation(nt, formulation)

    def f(x):
        return ntl_jax.ntl_was(x, targets[:1, :3], nt, weights=weights[:1, :3], reduction="sum")

    assert_forward_mode_and_hessian(f, low)


def assert_forward_mode_and_hessian(f, low):
    """`f`'s forward-mode Jacobian at the 16-bit `low` equals its reverse-mode one, and
    its Hessian the float32 Hessian at the widened values."""
    dtype = low.dtype
    # Forward mode carries the float32 tangent of the loss; reverse mode rounds the
    # gradient to the logits' dtype once.
    forward, reverse = jax.jit(jax.jacfwd(f))(low), jax.jit(jax.jacrev(f))(low)
    assert forward.dtype == jnp.float32 and reverse.dtype == dtype
    np.testing.assert_allclose(np.asarray(reverse, np.float32), forward, **rounded_once(dtype))
    hessian = jax.jit(jax.hessian(f))(low)
    want = jax.jit(jax.hessian(f))(low.astype(jnp.float32))
    # Entries that are sums of terms which nearly cancel carry float32 noise of the
    # size of the largest terms, whichever path computes them.
    scale = float(jnp.max(jnp.abs(want)))
    tolerance = rounded_once(dtype)
    np.testing.assert_allclose(np.asarray(hessian, np.float32), want, rtol=tolerance["rtol"],
                               atol=tolerance["atol"] + 1e-6 * scale)


@pytest.mark.parametrize("reweigh", [False, True])
def test_each_platform_lowers_its_own_formulation(reweigh):
    """Lowered for each platform (no device needed): for the TPU the loss has no gather
    and its gradient no scatter (masked reductions and an elementwise gradient); for the
    GPUs it gathers the number columns from the 16-bit logits and its gradient gathers
    theirs back through the `[vocab]` slot map, with no scatter; for the CPU it is
    take's gather and scatter of the number columns."""
    nt = scattered_table(512, 10)
    args = (jax.ShapeDtypeStruct((2, 4, 512), jnp.bfloat16), jax.ShapeDtypeStruct((2, 4), jnp.int32))
    grad = jax.jit(jax.grad(lambda lg, t: ntl_jax.ntl_was(lg, t, nt, reweigh=reweigh, reduction="sum")))

    def ops(platform, name):
        """The result types of the ops `name` in the program lowered for `platform`."""
        text = jax.export.export(grad, platforms=[platform])(*args).mlir_module()
        return re.findall(rf'"stablehlo.{name}".*?-> (tensor<[^>]*>)', text, flags=re.S)

    assert ops("tpu", "scatter") == [] and ops("tpu", "gather") == []
    for platform in ("cuda", "rocm"):
        assert ops(platform, "scatter") == []
        assert sorted(ops(platform, "gather")) == ["tensor<2x4x10xbf16>", "tensor<2x4x512xf32>"]
    assert ops("cpu", "scatter") == ["tensor<2x4x512xf32>"]
    assert ops("cpu", "gather") == ["tensor<2x4x10xf32>"]


def test_number_columns_are_gathered_from_the_16_bit_logits():
    """NTL-WAS-CDF against a smoothed label reads every number token's column; beyond 32
    of them the TPU's formulation gathers them too, from the logits in their own dtype
    (gathered from the widened logits, XLA writes all of them out in float32 first), and
    scatters their gradient into the float32 one; the GPUs' gathers the gradient back.
    (The CPU's gathers from the widened logits, see `number_stats._by_formulation`.)"""
    nt = scattered_table(512, 40)
    args = (jax.ShapeDtypeStruct((2, 4, 512), jnp.bfloat16), jax.ShapeDtypeStruct((2, 4), jnp.int32))
    grad = jax.jit(jax.grad(lambda lg, t: ntl_jax.cross_entropy_and_ntl(
        lg, t, nt, number_loss=losses.was_cdf(sigma=1.0), gce_sigma=1.0)[0]))
    for platform, gradient_scatters in (("cuda", []), ("tpu", ["tensor<2x4x512xf32>"])):
        text = jax.export.export(grad, platforms=[platform])(*args).mlir_module()
        gathers = re.findall(r'"stablehlo.gather".*?-> (tensor<[^>]*>)', text, flags=re.S)
        assert "tensor<2x4x40xbf16>" in gathers and "tensor<2x4x40xf32>" not in gathers, (platform, gathers)
        assert ("tensor<2x4x512xf32>" in gathers) == (platform == "cuda"), (platform, gathers)
        scatters = re.findall(r'"stablehlo.scatter".*?-> (tensor<[^>]*>)', text, flags=re.S)
        assert scatters == gradient_scatters, (platform, scatters)


@pytest.mark.parametrize("shift", [3.0, 17.5])
def test_reweigh_gradient_off_the_numbers_at_a_small_number_mass(shift, formulation):
    """One position, target "3", a 32,100-piece vocabulary with the digits at scattered
    ids, logits `3 * randn` with the number tokens' lowered by `shift` (a number mass
    about 1.6e-6 and 1e-12): `ntl_was(reweigh=True)`'s float32 gradient against float64.
    Off the numbers it is `(ntl - 1.01 * ceiling) * d mass`, `d mass = -p_v * mass`: a
    rest formed as `1 - mass` and then differentiated would lose float32's eps over the
    mass there (4.9e-3 relative at 1.6e-6)."""
    vocab = 32_100
    nt = scattered_table(vocab, 10, seed=3)
    ids = np.asarray(nt.ids)
    rng = np.random.default_rng(1)
    logits = 3.0 * rng.standard_normal((1, 1, vocab))
    logits[..., ids] -= shift
    target = jnp.asarray([[ids[np.flatnonzero(np.asarray(nt.number_values) == 3)[0]]]], jnp.int32)
    ceiling = float(losses.was().ceiling(nt))

    # The gradient in closed form, float64, every factor formed without cancellation
    # (autodiff of a float64 softmax would form d rest = p_v (1 - rest), float64's eps
    # over the mass: 1.4e-4 relative at 1e-12): the loss is W m + c rest, so off the
    # numbers (c - W) m p_v, on them m p~_j (|v_j - y| - W) + (W - c) p_j rest.
    z = logits[0, 0]
    p = np.exp(z - z.max())
    p /= p.sum()
    is_number = np.zeros(vocab, bool)
    is_number[ids] = True
    mass, rest = p[is_number].sum(), p[~is_number].sum()
    distance = np.abs(np.asarray(nt.number_values, np.float64) - 3.0)
    inner = p[ids] / mass
    w = np.sum(inner * distance)
    c = 1.01 * ceiling
    want = (c - w) * mass * p
    want[ids] = mass * inner * (distance - w) + (w - c) * p[ids] * rest
    assert (1e-6 < mass < 3e-6) if shift == 3.0 else (3e-13 < mass < 3e-12), mass
    nt = with_formulation(nt, formulation)
    got = np.asarray(jax.grad(lambda z: ntl_jax.ntl_was(z, target, nt, reweigh=True, reduction="sum"))(
        jnp.asarray(logits, jnp.float32)))[0, 0].astype(np.float64)
    relative = np.abs(got[~is_number] - want[~is_number]) / np.abs(want[~is_number])
    assert np.median(relative) <= 1e-5, np.median(relative)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) <= 1e-5
