"""The 16-bit logits gradient of the standalone losses: exact, and (on the CPU) without
the float32 `[batch, length, vocab]` buffer XLA makes of a 16-bit scatter-add.

XLA's CPU backend widens a bfloat16/float16 scatter-add to a float32 buffer the size of
the logits, so the transpose of taking the number-token columns costs more than the
caller's whole cross-entropy backward adds. `losses._columns_gradient_cpu` writes the
same values as a chain of selects (a few ids) or as a bitwise 16-bit scatter (many ids);
other platforms keep `take`'s own transpose.
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


def take_transpose(g, ids, shape):
    return jax.linear_transpose(lambda x: jnp.take(x, ids, axis=-1), jax.ShapeDtypeStruct(shape, g.dtype))(g)[0]


def random_ids(rng, n, vocab):
    """`n` distinct sorted ids, the first and last column of the vocabulary included."""
    inner = rng.choice(np.arange(1, vocab - 1), size=n - 2, replace=False)
    return jnp.asarray(np.sort(np.concatenate([[0, vocab - 1], inner])), jnp.int32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [2, 10, 16, 17, 300])  # 16: the last select chain; 17: the first scatter
def test_cpu_columns_gradient_is_takes_transpose_exactly(dtype, n):
    """Same values as take's transpose (a scatter-add into zeros, which turns -0 into 0
    and, flushing to zero, subnormals into 0 as well: those keep their bits here)."""
    rng = np.random.default_rng(n)
    shape = (2, 3, 512)
    ids = random_ids(rng, n, shape[-1])
    g = rng.standard_normal(shape[:-1] + (n,)).astype(np.float32) * 1e3
    g[0, 0, :2] = [0.0, 1.0]
    g[1, 2, :2] = [np.inf, -np.inf]
    g = jnp.asarray(g, dtype)
    got = jax.jit(lambda g, ids: losses._columns_gradient_cpu(g, ids, shape=shape))(g, ids)
    want = take_transpose(g, ids, shape)
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


@pytest.mark.parametrize("count", [10, 120])
@pytest.mark.parametrize("dtype", DTYPES)
def test_16_bit_gradient_is_the_rounded_float32_gradient(count, dtype):
    """End to end, through both the select chain (10 number tokens) and the scatter
    (120): the gradient is the float32 one of the widened logits, rounded once."""
    nt = scattered_table(600, count)
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.standard_normal((2, 5, 600)) * 2, jnp.float32)
    number_ids = np.asarray(nt.ids)
    targets = jnp.asarray(rng.choice(number_ids, size=(2, 5)), jnp.int32).at[0, 0].set(7)
    weights = jnp.ones((2, 5)).at[1, 1].set(0.0)

    def f(x):
        return ntl_jax.ntl_was(x, targets, nt, weights=weights, reduction="mean")

    grad = jax.jit(jax.grad(f))(logits.astype(dtype))
    want = jax.grad(f)(logits.astype(dtype).astype(jnp.float32))
    assert grad.dtype == dtype
    np.testing.assert_allclose(np.asarray(grad, np.float32), want, rtol=float(jnp.finfo(dtype).eps),
                               atol=float(jnp.finfo(dtype).smallest_subnormal))
    off_numbers = np.setdiff1d(np.arange(600), number_ids)
    assert np.all(np.asarray(grad, np.float32)[..., off_numbers] == 0)


def compiled_temp_bytes(fn, *args):
    return jax.jit(jax.value_and_grad(fn)).lower(*args).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA's CPU backend widens 16-bit scatters")
@pytest.mark.parametrize("count, extra_16_bit_buffers", [(10, 0), (120, 1)])
@pytest.mark.parametrize("reweigh", [False, True])
def test_cpu_backward_next_to_optax_adds_no_float32_logits_buffer(count, extra_16_bit_buffers, reweigh):
    """optax CE + ntl_was with bfloat16 logits compiles to optax CE's temporaries plus at
    most `extra_16_bit_buffers` bfloat16 `[B, L, V]` buffers (the scatter's, with many
    number tokens) and `[B, L, N]`-sized ones; take's own transpose added two float32
    ones (4 bfloat16-sized), and float32 exponentials for reweigh one more (2)."""
    batch, length, vocab = 4, 16, 4096
    nt = scattered_table(vocab, count)
    logits = jnp.zeros((batch, length, vocab), jnp.bfloat16)
    targets = jnp.zeros((batch, length), jnp.int32)
    weights = jnp.ones((batch, length))

    def ce(lg, t, w):
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(lg, t))

    def ce_and_ntl(lg, t, w):
        return ce(lg, t, w) + 0.3 * ntl_jax.ntl_was(lg, t, nt, weights=w, reweigh=reweigh, reduction="mean")

    args = (logits, targets, weights)
    extra = compiled_temp_bytes(ce_and_ntl, *args) - compiled_temp_bytes(ce, *args)
    buffer = batch * length * vocab * 2
    assert extra <= extra_16_bit_buffers * buffer + 64 * batch * length * count, (extra, buffer)


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_other_platforms_keep_takes_scatter(platform):
    """Lowered for an accelerator (no device needed), the gradient is take's own
    scatter-add in bfloat16; lowered for the CPU, with ten number tokens, there is none."""
    nt = scattered_table(512, 10)
    args = (jax.ShapeDtypeStruct((2, 4, 512), jnp.bfloat16), jax.ShapeDtypeStruct((2, 4), jnp.int32))
    grad = jax.jit(jax.grad(lambda lg, t: ntl_jax.ntl_was(lg, t, nt, reduction="sum")))

    def scatters(platforms):
        text = jax.export.export(grad, platforms=platforms)(*args).mlir_module()
        return re.findall(r"stablehlo\.scatter.*\n(?:.*\n)*?.*-> tensor<2x4x512xbf16>", text)

    assert len(scatters([platform])) == 1
    assert scatters(["cpu"]) == []
