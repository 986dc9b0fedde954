"""The 16-bit logits gradient of the standalone losses: exact, every mode of
differentiation, and (on the CPU) without the float32 `[batch, length, vocab]` buffer
XLA makes of a 16-bit scatter-add.

XLA's CPU backend widens a bfloat16/float16 scatter-add to a float32 buffer the size of
the logits, so the transpose of taking the number-token columns cost more than the
caller's whole cross-entropy backward adds. For up to `losses._SELECT_CHAIN_MAX` number
tokens, `losses._columns_tangent_cpu` takes the columns as masked sums, whose transpose
is a sum of selects fused into the caller's gradient; other platforms, float32 and more
number tokens keep `take`'s own derivative.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ntl_jax
from ntl_jax import NumberTokens, losses

DTYPES = [jnp.bfloat16, jnp.float16]
FEW = losses._SELECT_CHAIN_MAX


def take(t, ids):
    return jnp.take(t, ids, axis=-1)


def random_ids(rng, n, vocab):
    """`n` distinct sorted ids, the first and last column of the vocabulary included."""
    inner = rng.choice(np.arange(1, vocab - 1), size=n - 2, replace=False)
    return jnp.asarray(np.sort(np.concatenate([[0, vocab - 1], inner])), jnp.int32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [2, 10, FEW])
def test_cpu_columns_tangent_and_its_transpose_are_takes(dtype, n):
    """The masked sums equal `take` and their transpose equals `take`'s transpose (a
    scatter-add into zeros), value for value, infinities included."""
    rng = np.random.default_rng(n)
    shape = (2, 3, 512)
    ids = random_ids(rng, n, shape[-1])
    x = rng.standard_normal(shape).astype(np.float32) * 1e3
    x[0, 0, :] = np.inf  # selected away where not taken
    x[1, 2, int(ids[1])] = -np.inf
    x = jnp.asarray(x, dtype)
    np.testing.assert_array_equal(np.asarray(jax.jit(losses._columns_tangent_cpu)(x, ids), np.float32),
                                  np.asarray(take(x, ids), np.float32))

    g = rng.standard_normal(shape[:-1] + (n,)).astype(np.float32) * 1e3
    g[1, 2, :2] = [np.inf, -np.inf]
    g = jnp.asarray(g, dtype)
    spec = jax.ShapeDtypeStruct(shape, dtype)
    got = jax.jit(lambda g: jax.linear_transpose(lambda t: losses._columns_tangent_cpu(t, ids), spec)(g)[0])(g)
    want = jax.linear_transpose(lambda t: take(t, ids), spec)(g)[0]
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


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


@pytest.mark.parametrize("count", [10, 120])  # the sum of selects; take's scatter
@pytest.mark.parametrize("dtype", DTYPES)
def test_16_bit_gradient_is_the_rounded_float32_gradient(count, dtype):
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


@pytest.mark.parametrize("count", [10, 120])  # the sum of selects; take's scatter
@pytest.mark.parametrize("options", OBJECTIVE_OPTIONS, ids=lambda o: "-".join(map(str, o.values())))
@pytest.mark.parametrize("dtype", DTYPES)
def test_16_bit_objective_gradient_is_the_rounded_float32_gradient(count, options, dtype):
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
def test_16_bit_objective_forward_mode_and_hessian(dtype, reweigh):
    """The objective's custom derivatives (the normaliser's sum, the target's select,
    the columns') are JVP rules: forward mode gives the reverse-mode Jacobian, and the
    Hessian is the float32 one of the widened logits, with reweigh too."""
    nt, logits, targets, weights = problem(10, vocab=40)
    low = logits[:1, :3].astype(dtype)

    def f(x):
        return ntl_jax.cross_entropy_and_ntl(x, targets[:1, :3], nt, weights=weights[:1, :3], ntl_kind="mse",
                                             label_smoothing=0.1, reweigh=reweigh)[0]

    assert_forward_mode_and_hessian(f, low)


@pytest.mark.parametrize("dtype", DTYPES)
def test_16_bit_forward_mode_and_hessian(dtype):
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


def compiled_temp_bytes(fn, *args):
    return jax.jit(jax.value_and_grad(fn)).lower(*args).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA's CPU backend widens 16-bit scatters")
@pytest.mark.parametrize("reweigh", [False, True])
def test_cpu_backward_next_to_optax_adds_no_float32_logits_buffer(reweigh):
    """optax CE + ntl_was with bfloat16 logits and ten number tokens compiles to optax
    CE's temporaries plus `[B, L, N]`-sized ones; take's own transpose added two float32
    `[B, L, V]` buffers, and float32 exponentials for reweigh one more."""
    batch, length, vocab, count = 4, 16, 4096, 10
    nt = scattered_table(vocab, count)
    args = (jnp.zeros((batch, length, vocab), jnp.bfloat16), jnp.zeros((batch, length), jnp.int32),
            jnp.ones((batch, length)))

    def ce(lg, t, w):
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(lg, t))

    def ce_and_ntl(lg, t, w):
        return ce(lg, t, w) + 0.3 * ntl_jax.ntl_was(lg, t, nt, weights=w, reweigh=reweigh, reduction="mean")

    # [B, L, N]-sized temporaries only: 64 bytes per position and number token is a
    # sixth of one bfloat16 [B, L, V] buffer here.
    extra = compiled_temp_bytes(ce_and_ntl, *args) - compiled_temp_bytes(ce, *args)
    assert extra <= 64 * batch * length * count, extra


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA's CPU backend widens 16-bit scatters")
@pytest.mark.parametrize("kind, reweigh, label_smoothing",
                         [("none", False, 0.0), ("none", False, 0.1), ("was", False, 0.0), ("was", True, 0.1),
                          ("mse", True, 0.0)])
def test_cpu_objective_makes_no_float32_copy_of_16_bit_logits(kind, reweigh, label_smoothing):
    """`cross_entropy_and_ntl` with bfloat16 logits and ten number tokens compiles to
    one float32 `[B, L, V]` temporary (the exponentials its sum reads) plus `[B, L,
    N]`-sized ones. A sanitised float32 copy of the logits made it two, and optax CE's
    widened target scatter makes it two as well."""
    batch, length, vocab, count = 4, 16, 4096, 10
    nt = scattered_table(vocab, count)
    args = (jnp.zeros((batch, length, vocab), jnp.bfloat16), jnp.zeros((batch, length), jnp.int32))

    def objective(lg, t):
        return ntl_jax.cross_entropy_and_ntl(lg, t, nt, ntl_kind=kind, reweigh=reweigh,
                                             label_smoothing=label_smoothing, z_loss=1e-4)[0]

    float32_buffer = batch * length * vocab * 4
    assert compiled_temp_bytes(objective, *args) <= float32_buffer + 64 * batch * length * count


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_other_platforms_keep_takes_scatter(platform):
    """Lowered for an accelerator (no device needed), the gradient is take's own
    scatter-add in bfloat16; lowered for the CPU, with ten number tokens, there is none."""
    nt = scattered_table(512, 10)
    args = (jax.ShapeDtypeStruct((2, 4, 512), jnp.bfloat16), jax.ShapeDtypeStruct((2, 4), jnp.int32))
    grad = jax.jit(jax.grad(lambda lg, t: ntl_jax.ntl_was(lg, t, nt, reduction="sum")))

    def scatters(platforms):
        """(operand types, result type) of each scatter: its region's closing line."""
        text = jax.export.export(grad, platforms=platforms)(*args).mlir_module()
        return [re.search(r"\}\) : \((.*)\) -> (tensor<[^>]*>)", op).groups()
                for op in text.split('"stablehlo.scatter"')[1:]]

    assert scatters([platform]) == [
        ("tensor<2x4x512xbf16>, tensor<10x1xi32>, tensor<2x4x10xbf16>", "tensor<2x4x512xbf16>")]
    assert scatters(["cpu"]) == []
