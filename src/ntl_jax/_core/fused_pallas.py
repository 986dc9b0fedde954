"""The fused head's backward pass as two Pallas TPU kernels (opt-in: `backward="pallas"`).

XLA's backward writes each chunk's `[tokens, chunk]` gradient of the logits to HBM and
reads it back for the two products (unless the compiler keeps it on chip, as it does on
a v5e); these kernels keep every tile in VMEM:

- `hidden_grad`: a grid of (token blocks, vocabulary blocks), the vocabulary innermost;
  each token block's float32 gradient stays in VMEM while the kernel streams past it.
- `kernel_grad`: a grid of (vocabulary blocks, token blocks), the tokens innermost; each
  block of columns' float32 gradient stays in VMEM while the tokens stream past it, and
  the number tokens' columns take their gradient from `number_columns_grad` instead.

Both recompute the tile's logits from `h` and the kernel, and their gradient as XLA's
chunk loop does (`tile_grad.logits_grad`), rounded to the operands' dtype before the
products.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ntl_jax._core.tile_grad import logits_grad

# Per-token statistics travel as the columns of one float32 `[tokens, 4]` operand.
_SHIFT, _G_REST, _G_TARGET, _G_SUM = range(4)
_TOKEN_BLOCKS = (1024, 512, 256, 128, 64, 32, 16, 8)
# What each kernel's blocks may take of VMEM (a v5e and a v5p compile them within it).
_VMEM_BUDGET = 40 << 20


def _logits_grad(h, kernel_block, stats, targets, number_index, first_column, width, dtype):
    """`(d logits, kernel block)` of one `[tokens, columns]` tile: `d logits` in `dtype`,
    and the kernel block with the columns past `width` (a partial last block's) zeroed."""
    columns = first_column + jax.lax.broadcasted_iota(jnp.int32, (1, kernel_block.shape[1]), 1)
    valid = columns < width
    kernel_block = jnp.where(valid, kernel_block, jnp.zeros((), kernel_block.dtype))
    logits = jax.lax.dot_general(h, kernel_block, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    d = logits_grad(logits, stats[:, _SHIFT:_SHIFT + 1], stats[:, _G_REST:_G_REST + 1],
                    stats[:, _G_TARGET:_G_TARGET + 1], stats[:, _G_SUM:_G_SUM + 1], columns == targets,
                    ~valid | (number_index >= 0), dtype)
    return d, kernel_block


def _hidden_grad_kernel(h_ref, kernel_ref, stats_ref, targets_ref, index_ref, out_ref, *, block, width):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _():
        out_ref[...] = jnp.zeros_like(out_ref)

    d, kernel_block = _logits_grad(h_ref[...], kernel_ref[...], stats_ref[...], targets_ref[...], index_ref[...],
                                   j * block, width, h_ref.dtype)
    out_ref[...] += jax.lax.dot_general(d, kernel_block, (((1,), (1,)), ((), ())),
                                        preferred_element_type=jnp.float32)


def _kernel_grad_kernel(h_ref, kernel_ref, stats_ref, targets_ref, index_ref, numbers_ref, out_ref, acc_ref, *,
                        block, width):
    j, i = pl.program_id(0), pl.program_id(1)

    @pl.when(i == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    h = h_ref[...]
    d, _ = _logits_grad(h, kernel_ref[...], stats_ref[...], targets_ref[...], index_ref[...], j * block, width,
                        h.dtype)
    acc_ref[...] += jax.lax.dot_general(h, d, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)

    @pl.when(i == pl.num_programs(1) - 1)
    def _():
        index = index_ref[...]
        numbers = numbers_ref[...]
        one_hot = (jax.lax.broadcasted_iota(jnp.int32, (numbers.shape[1], index.shape[1]), 0) == index)
        # A one-hot product picks each number column's gradient exactly (float32 operands
        # at full precision; Mosaic takes that precision for float32 only).
        precision = jax.lax.Precision.HIGHEST if numbers.dtype == jnp.float32 else None
        picked = jax.lax.dot_general(numbers, one_hot.astype(numbers.dtype), (((1,), (0,)), ((), ())),
                                     precision=precision, preferred_element_type=jnp.float32)
        out_ref[...] = jnp.where(index >= 0, picked, acc_ref[...]).astype(out_ref.dtype)


def _hidden_grad_blocks(num_tokens: int, d_model: int, itemsize: int) -> tuple[int, int, int]:
    """`(tokens, columns, VMEM bytes)` of `hidden_grad`: 512 columns, and the most tokens
    that fit (the kernel is read once per token block)."""
    columns = 512
    for tokens in _blocks_of(num_tokens):
        vmem = _tile_vmem(tokens, columns, d_model, itemsize) + 2 * tokens * d_model * 4
        if vmem <= _VMEM_BUDGET:
            return tokens, columns, vmem
    raise ValueError(f"expected a d_model whose blocks fit {_VMEM_BUDGET >> 20} MiB of VMEM, got {d_model}")


def _kernel_grad_blocks(num_tokens: int, d_model: int, numbers: int, itemsize: int) -> tuple[int, int, int]:
    """`(tokens, columns, VMEM bytes)` of `kernel_grad`: 256 tokens, and the most columns
    that fit (the hidden states are read once per column block)."""
    blocks = _blocks_of(num_tokens)
    tokens = next((t for t in blocks if t <= 256), blocks[-1])
    for columns in (2048, 1024, 512, 256, 128):
        vmem = (_tile_vmem(tokens, columns, d_model, itemsize) + 2 * d_model * columns * itemsize
                + d_model * columns * 4 + 2 * d_model * numbers * itemsize)
        if vmem <= _VMEM_BUDGET:
            return tokens, columns, vmem
    raise ValueError(f"expected a d_model and number tokens whose blocks fit {_VMEM_BUDGET >> 20} MiB of VMEM, "
                     f"got d_model {d_model} and {numbers} number columns")


def _tile_vmem(tokens: int, columns: int, d_model: int, itemsize: int) -> int:
    """VMEM both kernels take per grid step besides their outputs: the double-buffered
    blocks of `h`, the kernel and the per-token statistics and targets (each a 128-lane
    row), and the tile's float32 logits, their gradient and its rounded copy."""
    return (2 * (tokens * d_model * itemsize + d_model * columns * itemsize + tokens * 2 * 128 * 4)
            + tokens * columns * (8 + itemsize))


def _blocks_of(num_tokens: int):
    """Token blocks that divide `num_tokens`, largest first (all of them if none does)."""
    blocks = [b for b in _TOKEN_BLOCKS if num_tokens % b == 0]
    return blocks or [num_tokens]


def _params(vmem: int):
    """Token or column blocks in parallel, the accumulating axis last; a scoped VMEM
    limit with room over the blocks' estimate for the compiler's own temporaries."""
    return pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                vmem_limit_bytes=int(vmem * 1.25) + (8 << 20))


def backward(h, kernel, stats, targets, number_index, number_columns_grad, *, columns: int | None = None,
             kernel_columns: int | None = None, out_dtype=None, interpret=False):
    """`(d h float32 [N, D], d kernel [D, V])` of the non-number columns' logits.

    h `[N, D]`, kernel `[D, V]` (one shard's columns), stats float32 `[N, 4]` (shift,
    g_rest, g_target, g_sum per token), targets int32 `[N]` as this shard's columns
    (any value off `[0, V)` for a target it does not own), number_index int32 `[V]`
    (each column's index among the number tokens, -1 elsewhere), number_columns_grad
    `[D, n]` the number tokens' columns' gradient (placed at their columns).
    `columns` is the vocabulary block of the hidden states' gradient, `kernel_columns`
    that of the kernel's (None: what fits `_VMEM_BUDGET`); `out_dtype` the kernel
    gradient's (default the kernel's)."""
    num, d_model = h.shape
    width = kernel.shape[1]
    dtype = jnp.result_type(h, kernel)
    h, kernel = h.astype(dtype), kernel.astype(dtype)
    itemsize = jnp.dtype(dtype).itemsize
    out_dtype = kernel.dtype if out_dtype is None else out_dtype
    targets = targets.astype(jnp.int32).reshape(num, 1)
    index = number_index.astype(jnp.int32).reshape(1, width)
    numbers = jnp.pad(number_columns_grad.astype(dtype), ((0, 0), (0, -number_columns_grad.shape[1] % 128)))
    interpret = pltpu.InterpretParams() if interpret else False

    tokens, chosen, vmem = _hidden_grad_blocks(num, d_model, itemsize)
    columns = min(columns or chosen, -(-width // 128) * 128)
    d_h = pl.pallas_call(
        functools.partial(_hidden_grad_kernel, block=columns, width=width),
        grid=(num // tokens, pl.cdiv(width, columns)),
        in_specs=[pl.BlockSpec((tokens, d_model), lambda i, j: (i, 0)),
                  pl.BlockSpec((d_model, columns), lambda i, j: (0, j)),
                  pl.BlockSpec((tokens, 4), lambda i, j: (i, 0)),
                  pl.BlockSpec((tokens, 1), lambda i, j: (i, 0)),
                  pl.BlockSpec((1, columns), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((tokens, d_model), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((num, d_model), jnp.float32),
        compiler_params=_params(vmem),
        interpret=interpret, name="ntl_hidden_grad",
    )(h, kernel, stats, targets, index)

    tokens, chosen, vmem = _kernel_grad_blocks(num, d_model, numbers.shape[1], itemsize)
    kernel_columns = min(kernel_columns or chosen, -(-width // 128) * 128)
    d_kernel = pl.pallas_call(
        functools.partial(_kernel_grad_kernel, block=kernel_columns, width=width),
        grid=(pl.cdiv(width, kernel_columns), num // tokens),
        in_specs=[pl.BlockSpec((tokens, d_model), lambda j, i: (i, 0)),
                  pl.BlockSpec((d_model, kernel_columns), lambda j, i: (0, j)),
                  pl.BlockSpec((tokens, 4), lambda j, i: (i, 0)),
                  pl.BlockSpec((tokens, 1), lambda j, i: (i, 0)),
                  pl.BlockSpec((1, kernel_columns), lambda j, i: (0, j)),
                  pl.BlockSpec(numbers.shape, lambda j, i: (0, 0))],
        out_specs=pl.BlockSpec((d_model, kernel_columns), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((d_model, width), out_dtype),
        scratch_shapes=[pltpu.VMEM((d_model, kernel_columns), jnp.float32)],
        compiler_params=_params(vmem),
        interpret=interpret, name="ntl_kernel_grad",
    )(h, kernel, stats, targets, index, numbers)
    return d_h, d_kernel
