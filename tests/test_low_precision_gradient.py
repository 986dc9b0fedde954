"""The 16-bit logits gradient of the losses and the objective, in each formulation of
the number statistics (`ntl_jax.number_stats`): the float32 gradient of the widened
logits rounded once, in every mode of differentiation; and, lowered for each platform,
the formulation it takes: on accelerators no gather or scatter over the vocabulary.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ntl_jax
from ntl_jax import NumberTokens

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

    def f(x):
        return ntl_jax.ntl_was(x, targets, nt, weights=weights, reduction="mean")

    grad = jax.jit(jax.grad(f))(logits.astype(dtype))
    want = jax.grad(f)(logits.astype(dtype).astype(jnp.float32))
    assert grad.dtype == dtype
    np.testing.assert_allclose(np.asarray(grad, np.float32), want, **rounded_once(dtype))
    off_numbers = np.setdiff1d(np.arange(logits.shape[-1]), np.asarray(nt.ids))
    assert np.all(np.asarray(grad, np.float32)[..., off_numbers] == 0)


OBJECTIVE_OPTIONS = [dict(ntl_kind="none", label_smoothing=0.1), dict(ntl_kind="was", reweigh=True),
                     dict(ntl_kind="mse", label_smoothing=0.1), dict(ntl_kind="number_level", reweigh=True)]


@pytest.mark.parametrize("count", [10, 120])
@pytest.mark.parametrize("options", OBJECTIVE_OPTIONS, ids=lambda o: "-".join(map(str, o.values())))
@pytest.mark.parametrize("dtype", DTYPES)
def test_16_bit_objective_gradient_is_the_rounded_float32_gradient(count, options, dtype, formulation):
    """`cross_entropy_and_ntl`: every term's gradient (normaliser, target, label
    smoothing, number columns, reweigh's mass) adds up in float32 and is rounded to the
    logits' dtype once, and the loss is the float32 one of the widened logits."""
    nt, logits, targets, weights = problem(count)

    def f(x):
        return ntl_jax.cross_entropy_and_ntl(x, targets, nt, weights=weights, z_loss=1e-4, **options)[0]

    value, grad = jax.jit(jax.value_and_grad(f))(logits.astype(dtype))
    want_value, want = jax.value_and_grad(f)(logits.astype(dtype).astype(jnp.float32))
    assert grad.dtype == dtype
    np.testing.assert_allclose(float(value), float(want_value), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad, np.float32), want, **rounded_once(dtype))


@pytest.mark.parametrize("reweigh", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_16_bit_objective_forward_mode_and_hessian(dtype, reweigh, formulation):
    """The objective's custom derivatives (the normaliser's sum, the target's select,
    the number statistics') are JVP rules: forward mode gives the reverse-mode Jacobian, and the
    Hessian is the float32 one of the widened logits, with reweigh too."""
    nt, logits, targets, weights = problem(10, vocab=40)
    low = logits[:1, :3].astype(dtype)

    def f(x):
        return ntl_jax.cross_entropy_and_ntl(x, targets[:1, :3], nt, weights=weights[:1, :3], ntl_kind="mse",
                                             label_smoothing=0.1, reweigh=reweigh)[0]

    assert_forward_mode_and_hessian(f, low)


@pytest.mark.parametrize("dtype", DTYPES)
def test_16_bit_forward_mode_and_hessian(dtype, formulation):
    """Forward mode gives the reverse-mode Jacobian, and the Hessian is the float32
    one of the widened logits (the custom derivative is a JVP rule, so every mode of
    differentiation composes)."""
    nt, logits, targets, weights = problem(10, vocab=40)
    low = logits[:1, :3].astype(dtype)

    def f(x):
        return ntl_jax.ntl_was(x, targets[:1, :3], nt, weights=weights[:1, :3], reduction="sum")

    assert_forward_mode_and_hessian(f, low)


def assert_forward_mode_and_hessian(f, low):
    """`f`'s forward-mode Jacobian at the 16-bit `low` equals its reverse-mode one, and
    its Hessian the float32 Hessian at the widened values."""
    dtype = low.dtype
    # Forward mode carries the float32 tangent of the loss; reverse mode rounds the
    # gradient to the logits' dtype once.
    forward, reverse = jax.jacfwd(f)(low), jax.jacrev(f)(low)
    assert forward.dtype == jnp.float32 and reverse.dtype == dtype
    np.testing.assert_allclose(np.asarray(reverse, np.float32), forward, **rounded_once(dtype))
    hessian = jax.jit(jax.hessian(f))(low)
    want = jax.hessian(f)(low.astype(jnp.float32))
    # Entries that are sums of terms which nearly cancel carry float32 noise of the
    # size of the largest terms, whichever path computes them.
    scale = float(jnp.max(jnp.abs(want)))
    tolerance = rounded_once(dtype)
    np.testing.assert_allclose(np.asarray(hessian, np.float32), want, rtol=tolerance["rtol"],
                               atol=tolerance["atol"] + 1e-6 * scale)


@pytest.mark.parametrize("reweigh", [False, True])
def test_each_platform_lowers_its_own_formulation(reweigh):
    """Lowered for an accelerator (no device needed), the loss has no gather and its
    gradient no scatter (masked reductions and an elementwise gradient); lowered for the
    CPU, it is take's gather and scatter of the number columns."""
    nt = scattered_table(512, 10)
    args = (jax.ShapeDtypeStruct((2, 4, 512), jnp.bfloat16), jax.ShapeDtypeStruct((2, 4), jnp.int32))
    grad = jax.jit(jax.grad(lambda lg, t: ntl_jax.ntl_was(lg, t, nt, reweigh=reweigh, reduction="sum")))

    def ops(platform, name):
        """The result types of the ops `name` in the program lowered for `platform`."""
        text = jax.export.export(grad, platforms=[platform])(*args).mlir_module()
        return re.findall(rf'"stablehlo.{name}".*?-> (tensor<[^>]*>)', text, flags=re.S)

    for platform in ("cuda", "tpu"):
        assert ops(platform, "scatter") == [] and ops(platform, "gather") == []
    assert ops("cpu", "scatter") == ["tensor<2x4x512xf32>"]
    assert ops("cpu", "gather") == ["tensor<2x4x10xf32>"]
