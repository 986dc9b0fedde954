"""Cross-entropy + NTL straight from the decoder's hidden states, without ever holding
the `[batch, length, vocab]` logits.

Every term of the objective needs only a few numbers per position (`HeadStats`): the
log-normaliser, the target's logit, the sum of the logits (label smoothing), the number
tokens' logits, and, for the number mass, the log-normaliser over the non-number tokens. The
number tokens' logits are a small product with their columns, and the target's logit
one with its column (on a TPU it is picked from the chunks instead); the log-normaliser
over the rest of the vocabulary is streamed over vocabulary chunks of `[batch * length,
chunk]`, and its custom gradient recomputes each chunk's logits in
the backward pass, writing each chunk of the kernel's gradient once (chunking over the
vocabulary rather than the tokens needs no float32 accumulator the size of the kernel).
On a TPU each chunk is folded into the statistics by one reduction, which the
compiler fuses with the chunk's product (`_one_pass`); `backward="pallas"` replaces the
backward loop with `fused_pallas`'s two kernels. Which of these it does, and its chunk,
is decided once where the head is entered (`fused_plan.FusedPlan`, a static argument
here; without a named chip, one plan per platform, picked by the platform the program is
lowered for: `fused_plan.on_platform` around the forward and the backward pass). From the
statistics on
(`head_stats.HeadStats`), the arithmetic is `cross_entropy_and_ntl`'s own
(`objective.objective_from_head`).

With the kernel's columns sharded over a mesh axis (`vocab_axis`), each device streams
its own columns under `jax.shard_map` and the per-token statistics are combined across
the axis (a maximum and a sum for the log-normaliser, a sum for the target's logit and
the number tokens' columns); the backward pass writes each device's slice of the
kernel's gradient, so the kernel is never gathered.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ntl_jax._core import fused_plan, head_stats, number_stats, vocab_parallel
from ntl_jax._core.fused_plan import ByPlatform, FusedPlan
from ntl_jax._core.head_stats import HeadStats
from ntl_jax._core.number_stats import NumberReads
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.targets import NumberTarget
from ntl_jax._core.tile_grad import logits_grad

# Up to this many number tokens a column is compared with each (a search costs more).
_COMPARED_IDS = 128


def _dot(a, b, contract):
    """`a . b` over the axes `contract` = ((a axis,), (b axis,)), accumulated in float32."""
    return jax.lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32)


def _kernel_chunk(kernel, start, chunk):
    """Columns `[start, start + chunk)` of the kernel. The barrier keeps XLA from hoisting
    a dtype conversion of the whole kernel out of the loop (the CPU backend computes
    bf16 products in float32 and would otherwise convert all of it at once)."""
    kernel, start = jax.lax.optimization_barrier((kernel, start))
    return jax.lax.dynamic_slice_in_dim(kernel, start, chunk, axis=1)


def _chunk_start(i, width: int, chunk: int):
    """`(start, fresh)` of chunk `i` of `ceil(width / chunk)`: the last chunk is moved
    back to end at `width` (every chunk has `chunk` columns, one loop body, no
    remainder), and `fresh` `[chunk]` marks the columns no earlier chunk covered."""
    start = jnp.minimum(i * chunk, width - chunk)
    return start, start + jnp.arange(chunk) >= i * chunk


def _chunk_forward(h, kernel_chunk, targets, fresh, in_rest, start, acc, with_top, pick_targets):
    """Folds one chunk into `(rest_lse, target_logit, top_logit, top_id)`: the logsumexp
    over the columns `in_rest` (the non-number tokens not yet counted), with
    `pick_targets` the logit of each token's target column (`start` is the chunk's first
    id; `fresh` its columns no earlier chunk covered) and with `with_top` the largest
    logit and its first id."""
    rest_lse, target_logit, top_logit, top_id = acc
    logits = _dot(h, kernel_chunk, ((1,), (0,)))
    columns = start + jnp.arange(kernel_chunk.shape[1])
    if pick_targets:
        is_target = fresh[None, :] & (columns[None, :] == targets[:, None])
        chunk_lse, chunk_target, chunk_top, chunk_id = _one_pass(logits, in_rest, is_target, columns, with_top)
        target_logit += chunk_target
    else:
        chunk_lse = jax.nn.logsumexp(jnp.where(in_rest[None, :], logits, -jnp.inf), axis=-1)
        if with_top:
            chunk_top = jnp.max(logits, axis=-1)
            chunk_id = start + jnp.argmax(logits, axis=-1).astype(jnp.int32)
    rest_lse = jnp.logaddexp(rest_lse, chunk_lse)
    if with_top:  # a column seen twice changes neither the maximum nor its first id
        better = chunk_top > top_logit  # ties keep the earlier id, as argmax does
        top_id = jnp.where(better, chunk_id, top_id)
        top_logit = jnp.where(better, chunk_top, top_logit)
    return rest_lse, target_logit, top_logit, top_id


def _one_pass(logits, in_rest, is_target, columns, with_top):
    """`(lse, target, top, top_id)` per row of a chunk's `logits` in one reduction: the
    logsumexp over the columns `in_rest` (a running maximum and a sum rescaled to it),
    the sum of the logits where `is_target`, and with `with_top` the largest logit and
    its first column. One reduction is one fusion with the product on a TPU: the
    logits never leave the chip, where separate reductions each read them from HBM."""
    ones = jnp.ones_like(logits)
    operands = [jnp.where(in_rest[None, :], logits, -jnp.inf), ones, jnp.where(is_target, logits, 0.0)]
    inits = [jnp.float32(-jnp.inf), jnp.float32(0.0), jnp.float32(0.0)]
    if with_top:
        operands += [logits, jnp.broadcast_to(columns.astype(jnp.int32)[None, :], logits.shape)]
        inits += [jnp.float32(-jnp.inf), jnp.int32(jnp.iinfo(jnp.int32).max)]

    def combine(a, b):
        top = jnp.maximum(a[0], b[0])
        shift = jnp.where(jnp.isfinite(top), top, 0.0)
        out = [top, a[1] * jnp.exp(a[0] - shift) + b[1] * jnp.exp(b[0] - shift), a[2] + b[2]]
        if with_top:
            b_wins = (b[3] > a[3]) | ((b[3] == a[3]) & (b[4] < a[4]))
            out += [jnp.where(b_wins, b[3], a[3]), jnp.where(b_wins, b[4], a[4])]
        return tuple(out)

    out = jax.lax.reduce(tuple(operands), tuple(inits), combine, (1,))
    lse = out[0] + jnp.log(out[1])
    return (lse, out[2]) + ((out[3], out[4]) if with_top else (None, None))


def _columns(kernel, ids, plan: FusedPlan):
    """`kernel[:, ids]` as `[len(ids), D]`; on a TPU one column at a time."""
    return columns_one_by_one(kernel, ids) if plan.on_tpu else jnp.take(kernel, ids, axis=1).T


def columns_one_by_one(kernel, ids):
    """`kernel[:, ids]` as `[len(ids), D]`, a column per loop trip, each picked from the
    128 columns around it: on a TPU a gather of columns, or a slice one column wide,
    makes the compiler transpose the whole kernel first."""
    width = kernel.shape[1]
    lanes = min(128, width)

    def body(k, rows):
        start = jnp.clip(ids[k] // lanes * lanes, 0, width - lanes)
        block = jax.lax.dynamic_slice_in_dim(kernel, start, lanes, axis=1)
        column = jnp.sum(jnp.where(start + jnp.arange(lanes) == ids[k], block, jnp.zeros((), kernel.dtype)), axis=1)
        return jax.lax.dynamic_update_slice_in_dim(rows, column[None, :], k, axis=0)

    return jax.lax.fori_loop(0, ids.shape[0], body, jnp.zeros((ids.shape[0], kernel.shape[0]), kernel.dtype))


def _local_columns(ids, offset, width):
    """`(local, owned)`: `ids` as columns of the shard starting at `offset` (`width`
    columns; ids it does not own map to `width`, one past its end) and which it owns."""
    owned = (ids >= offset) & (ids < offset + width)
    return jnp.where(owned, ids - offset, width), owned


def _shard_numbers(ids, width, axis):
    """`(offset, local_ids, owned_ids)` of this shard (all of the vocabulary when `axis`
    is None): its first vocabulary id, and the number tokens as its columns (see
    `_local_columns`) and which it owns."""
    offset = 0 if axis is None else jax.lax.axis_index(axis) * width
    local_ids, owned_ids = _local_columns(ids, offset, width)
    return offset, local_ids, owned_ids


def _number_index(columns, local_ids):
    """`[len(columns)]`: each column's index among `local_ids`, -1 where it is no number
    token's. Compared with every id (a table of a few digits), else searched in the
    sorted ids: a scatter of the indices into a `[width]` table crashes libtpu's compiler
    (0.0.52) when a number token has id 0."""
    if local_ids.shape[0] <= _COMPARED_IDS:
        match = columns[:, None] == local_ids[None, :]
        return jnp.where(jnp.any(match, axis=1), jnp.argmax(match, axis=1), -1).astype(jnp.int32)
    order = jnp.argsort(local_ids)
    sorted_ids = local_ids[order]
    at = jnp.minimum(jnp.searchsorted(sorted_ids, columns), local_ids.shape[0] - 1)
    return jnp.where(sorted_ids[at] == columns, order[at], -1).astype(jnp.int32)


def _stream(h, kernel, targets, local_ids, offset, *, chunk, with_top, pick_targets):
    """`(rest_lse, target_logit, top_logit, top_id)` of one shard's columns, streamed over
    its chunks. The target's logit comes from the shard that owns its column (zero
    elsewhere): picked inside the loop with `pick_targets`, else from the target's column."""
    num, width = h.shape[0], kernel.shape[1]

    def body(i, acc):
        start, fresh = _chunk_start(i, width, chunk)
        kernel_chunk = _kernel_chunk(kernel, start, chunk)
        in_rest = fresh & (_number_index(start + jnp.arange(chunk), local_ids) < 0)
        return _chunk_forward(h, kernel_chunk, targets, fresh, in_rest, offset + start, acc, with_top, pick_targets)

    acc = (jnp.full((num,), -jnp.inf, jnp.float32), jnp.zeros((num,), jnp.float32),
           jnp.full((num,), -jnp.inf, jnp.float32), jnp.zeros((num,), jnp.int32))
    rest_lse, target_logit, top_logit, top_id = jax.lax.fori_loop(0, -(-width // chunk), body, acc)
    if not pick_targets:
        local_targets, owned_targets = _local_columns(targets, offset, width)
        target_columns = jnp.take(kernel, jnp.minimum(local_targets, width - 1), axis=1)  # [D, N]
        target_logit = jnp.einsum("nd,dn->n", h, target_columns, preferred_element_type=jnp.float32)
        target_logit = jnp.where(owned_targets, target_logit, 0.0)
    return rest_lse, target_logit, top_logit, top_id


def _local_stats_fwd(h, kernel, targets, ids, plan: FusedPlan, with_sum, with_top, axis):
    """The statistics of `h @ kernel` on one vocabulary shard (all of it when `axis` is
    None), combined over the shards of mesh axis `axis`: see `_vocab_stats_fwd`."""
    width = kernel.shape[1]
    offset, local_ids, owned_ids = _shard_numbers(ids, width, axis)
    # On a TPU the target's logit is picked inside the loop: a gather of the kernel's
    # columns makes its compiler transpose the whole kernel first. Elsewhere the gather
    # is cheaper than a pass over every chunk's logits.
    rest_lse, target_logit, top_logit, top_id = _stream(h, kernel, targets, local_ids, offset, chunk=plan.chunk,
                                                        with_top=with_top, pick_targets=plan.pick_targets)
    column_sum = jnp.sum(kernel, axis=1, dtype=jnp.float32) if with_sum else None
    # The number tokens' columns, n x D: small enough to assemble on every shard.
    number_columns = _columns(kernel, jnp.minimum(local_ids, width - 1), plan)
    number_columns = jnp.where(owned_ids[:, None], number_columns, jnp.zeros((), kernel.dtype))
    if axis is not None:
        rest_lse = _logsumexp_over(rest_lse, axis)
        target_logit = jax.lax.psum(target_logit, axis)
        number_columns = jax.lax.psum(number_columns, axis)
        if with_sum:
            column_sum = jax.lax.psum(column_sum, axis)
        if with_top:
            best = jax.lax.pmax(top_logit, axis)
            # Ties across shards keep the smallest id, as argmax does.
            top_id = jax.lax.pmin(jnp.where(top_logit == best, top_id, jnp.iinfo(jnp.int32).max), axis)
    if with_sum:
        logit_sum = _dot(h.astype(jnp.float32), column_sum, ((1,), (0,)))
    else:
        logit_sum = jnp.zeros((h.shape[0],), jnp.float32)
    number_logits = _dot(h, number_columns, ((1,), (1,)))
    return rest_lse, target_logit, logit_sum, number_logits, top_id


def _logsumexp_over(lse, axis):
    """The logsumexp of per-shard logsumexps over mesh axis `axis` (-inf stays -inf)."""
    top = jax.lax.pmax(lse, axis)
    shift = jnp.where(jnp.isfinite(top), top, 0.0)
    return shift + jnp.log(jax.lax.psum(jnp.exp(lse - shift), axis))


def _local_grads(h, kernel, targets, ids, rest_lse, cotangents, plan: FusedPlan, with_sum, axis, batch_axes=()):
    """`(d h, d kernel)` of one vocabulary shard's columns (all of them when `axis` is
    None): `d h` is this shard's share (summed over the shards by the caller); each
    chunk of `d kernel` is summed over the token shards (`batch_axes`) in float32
    before it is rounded to the kernel's dtype, as one device sums over all tokens.

    The number tokens' columns get their gradient as one `[tokens, n]` block before the
    loop (a per-chunk `[n, chunk]` one-hot would cost `tokens x n x vocab`
    multiply-adds, more than the head itself at n ~ 1,000 number tokens); each chunk
    selects its number columns' `d kernel` from it (a scatter after the loop would widen
    a bf16 kernel's whole gradient to float32 on XLA's CPU backend). With the plan's
    `backward` "pallas" the chunks are `fused_pallas`'s kernels'."""
    g_rest, g_target, g_sum, g_numbers = cotangents
    width, chunk = kernel.shape[1], plan.chunk
    grad_dtype = jnp.result_type(h, kernel)
    offset, local_ids, owned_ids = _shard_numbers(ids, width, axis)
    # A -inf rest_lse (no token outside the numbers) has zero probability everywhere.
    shift = jnp.where(jnp.isfinite(rest_lse), rest_lse, 0.0)[:, None]

    # The number tokens' columns this shard owns: every statistic's share at once.
    d_numbers = g_numbers + jnp.where(targets[:, None] == ids[None, :], g_target[:, None], 0.0)
    if with_sum:
        d_numbers += g_sum[:, None]
    d_numbers = jnp.where(owned_ids[None, :], d_numbers, 0.0).astype(grad_dtype)
    d_h_numbers = _dot(d_numbers, _columns(kernel, jnp.minimum(local_ids, width - 1), plan), ((1,), (0,)))
    d_number_columns = _dot(h, d_numbers, ((0,), (0,)))
    if plan.backward == "pallas":
        return _pallas_grads(h, kernel, targets - offset, local_ids, shift, cotangents, with_sum, d_h_numbers,
                             d_number_columns, batch_axes, plan.interpret)
    if batch_axes:
        d_number_columns = jax.lax.psum(d_number_columns, batch_axes)
    d_number_columns = d_number_columns.astype(kernel.dtype)

    def chunk_grads(start, fresh, kernel_chunk, index_chunk):
        """`(d hidden, d kernel_chunk)` of this chunk's logits' share of the statistics."""
        logits = _dot(h, kernel_chunk, ((1,), (0,)))
        columns = offset + start + jnp.arange(chunk)
        is_number_chunk = index_chunk >= 0
        d_logits = logits_grad(logits, shift, g_rest[:, None], g_target[:, None], g_sum[:, None] if with_sum else None,
                               columns[None, :] == targets[:, None], is_number_chunk[None, :], grad_dtype)
        # Columns an earlier chunk covered add to `d hidden` once; their `d kernel` is
        # the same again and is simply written over.
        d_h = _dot(jnp.where(fresh[None, :], d_logits, jnp.zeros((), d_logits.dtype)), kernel_chunk, ((1,), (1,)))
        d_kernel = _dot(h, d_logits, ((0,), (0,)))
        if batch_axes:
            d_kernel = jax.lax.psum(d_kernel, batch_axes)
        numbers = jnp.take(d_number_columns, jnp.maximum(index_chunk, 0), axis=1)
        return d_h, jnp.where(is_number_chunk[None, :], numbers, d_kernel.astype(kernel.dtype))

    def body(i, carry):
        d_h, d_kernel = carry
        start, fresh = _chunk_start(i, width, chunk)
        kernel_chunk = _kernel_chunk(kernel, start, chunk)
        index_chunk = _number_index(start + jnp.arange(chunk), local_ids)
        d_h_chunk, d_kernel_chunk = chunk_grads(start, fresh, kernel_chunk, index_chunk)
        return d_h + d_h_chunk, jax.lax.dynamic_update_slice_in_dim(d_kernel, d_kernel_chunk, start, axis=1)

    carry = (d_h_numbers, jnp.zeros_like(kernel))
    return jax.lax.fori_loop(0, -(-width // chunk), body, carry)


def _pallas_grads(h, kernel, local_targets, local_ids, shift, cotangents, with_sum, d_h_numbers,
                  d_number_columns, batch_axes, interpret):
    """`_local_grads` by `fused_pallas.backward` (in Pallas' interpret mode with
    `interpret`); with `batch_axes` its float32 kernel gradient (this device's tokens'
    share, number columns included) is summed over the token shards before it is
    rounded."""
    from ntl_jax._core import fused_pallas  # Pallas is imported only where it is used

    g_rest, g_target, g_sum, _ = cotangents
    width = kernel.shape[1]
    g_sum = g_sum if with_sum else jnp.zeros_like(g_rest)  # as the XLA loop adds it only with a sum
    stats = jnp.stack([shift[:, 0], g_rest, g_target, g_sum], axis=1).astype(jnp.float32)
    index = _number_index(jnp.arange(width), local_ids)
    d_h, d_kernel = fused_pallas.backward(
        h, kernel, stats, local_targets, index, d_number_columns.astype(kernel.dtype),
        out_dtype=jnp.float32 if batch_axes else kernel.dtype, interpret=interpret)
    if batch_axes:
        d_kernel = jax.lax.psum(d_kernel, batch_axes).astype(kernel.dtype)
    return d_h_numbers + d_h, d_kernel


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _vocab_stats(h, kernel, targets, ids, plan, with_sum, with_top, shards):
    return _vocab_stats_fwd(h, kernel, targets, ids, plan, with_sum, with_top, shards)[0]


def _vocab_stats_fwd(h, kernel, targets, ids, plan, with_sum, with_top, shards):
    """`(rest_lse, target_logit, logit_sum, number_logits, top_id)` of `h @ kernel`,
    each per token `[batch * length, ...]`.

    h `[batch, length, D]`, kernel `[D, V]`, targets `[batch, length]` in `[0, V)`, ids
    `[n]` the number tokens. `rest_lse` is the logsumexp over the tokens that are not
    numbers; `top_id` the argmax over the vocabulary (zeros without `with_top`), not
    differentiated. `plan` (a `FusedPlan`, or a `ByPlatform`) says how. With `shards` (a `VocabShards`),
    each device streams its own columns of the kernel and the statistics are combined
    over the vocabulary axis: the kernel is never gathered.
    """
    if shards is None:
        out = _stats_on_platform(_tokens(h), kernel, targets.reshape(-1), ids, plan, with_sum, with_top, None)
    else:
        tokens, rows, columns, replicated = vocab_parallel.partition_specs(shards)

        def local(h, kernel, targets, ids):
            h = vocab_parallel.gather_sequence(h, shards)
            return _stats_on_platform(_tokens(h), kernel, targets.reshape(-1), ids, plan, with_sum, with_top,
                                      shards.vocab_axis)

        out = jax.shard_map(
            local, mesh=shards.mesh, in_specs=(vocab_parallel.hidden_spec(shards), columns, tokens, replicated),
            out_specs=(tokens, tokens, tokens, rows, tokens), check_vma=False,
        )(h, kernel, targets, ids)
    return out, (h, kernel, targets, ids, out[0])


def _stats_on_platform(h, kernel, targets, ids, plan: FusedPlan | ByPlatform, with_sum, with_top, axis):
    """`_local_stats_fwd` under the plan for the platform the program is lowered for."""
    def stats(plan, h, kernel, targets, ids):
        return _local_stats_fwd(h, kernel, targets, ids, plan, with_sum, with_top, axis)

    return fused_plan.on_platform(plan, stats, h, kernel, targets, ids)


def _grads_on_platform(h, kernel, targets, ids, rest_lse, cotangents, plan: FusedPlan | ByPlatform, with_sum, axis,
                       batch_axes=()):
    """`_local_grads` under the plan for the platform the program is lowered for."""
    def grads(plan, h, kernel, targets, ids, rest_lse, cotangents):
        return _local_grads(h, kernel, targets, ids, rest_lse, cotangents, plan, with_sum, axis, batch_axes)

    return fused_plan.on_platform(plan, grads, h, kernel, targets, ids, rest_lse, cotangents)


def _tokens(h):
    """`[batch, length, D]` hidden states as `[batch * length, D]`."""
    return h.reshape(-1, h.shape[-1])


def _vocab_stats_bwd(plan, with_sum, with_top, shards, residuals, cotangents):
    h, kernel, targets, ids, rest_lse = residuals
    cotangents = cotangents[:4]  # top_id is not differentiated
    if shards is None:
        d_h, d_kernel = _grads_on_platform(_tokens(h), kernel, targets.reshape(-1), ids, rest_lse, cotangents, plan,
                                           with_sum, None)
        d_h = d_h.reshape(h.shape)
    else:
        tokens, rows, columns, replicated = vocab_parallel.partition_specs(shards)
        hidden = vocab_parallel.hidden_spec(shards)

        def local(h, kernel, targets, ids, rest_lse, cotangents):
            h = vocab_parallel.gather_sequence(h, shards)
            d_h, d_kernel = _grads_on_platform(_tokens(h), kernel, targets.reshape(-1), ids, rest_lse, cotangents,
                                               plan, with_sum, shards.vocab_axis, shards.batch_axes)
            # Each shard's columns add to every token's gradient.
            return vocab_parallel.sum_over_vocab(d_h.reshape(h.shape), shards), d_kernel

        d_h, d_kernel = jax.shard_map(
            local, mesh=shards.mesh, in_specs=(hidden, columns, tokens, replicated, tokens,
                                               (tokens, tokens, tokens, rows)),
            out_specs=(hidden, columns), check_vma=False,
        )(h, kernel, targets, ids, rest_lse, cotangents)
    return d_h.astype(h.dtype), d_kernel, None, None


_vocab_stats.defvjp(_vocab_stats_fwd, _vocab_stats_bwd)


def head_stats_from_hidden(hidden, kernel, target: NumberTarget, number_tokens: NumberTokens,
                           reads: NumberReads | None, plan: FusedPlan | ByPlatform, *, label_smoothing: float = 0.0,
                           with_masses: bool = False, with_top: bool = False,
                           shards: vocab_parallel.VocabShards | None = None):
    """`(HeadStats, top_ids)` of the logits `hidden @ kernel` (checked), streamed over
    vocabulary chunks as `plan` says (`fused_plan.plan`, made where the head is
    entered: a chip's, or one per platform; see the module docstring), at the positions `target.keep`; `top_ids`
    `[batch, length]` is the argmax over the vocabulary with `with_top`, else None. With
    `shards` (`vocab_parallel.vocab_shards`), vocabulary-parallel over its mesh. The
    number statistics are those `reads` names (None: none), from the number tokens'
    columns (`number_stats.from_columns`).
    """
    dtype = jnp.result_type(hidden, kernel)
    kernel = jnp.asarray(kernel, dtype)
    keep = target.keep
    # Ignored positions: zero hidden states give the zero logits the unfused path uses
    # there, and NaN or inf in them reach neither the loss nor the gradient.
    hidden = jnp.where(keep[..., None], jnp.asarray(hidden, dtype), jnp.zeros((), dtype))
    batch, length, _ = hidden.shape
    rest_lse, target_logit, logit_sum, number_logits, top_id = _vocab_stats(
        hidden, kernel, jnp.maximum(target.ids, 0),
        jnp.asarray(number_tokens.ids), plan, label_smoothing > 0, with_top, shards,
    )
    shape = (batch, length)
    numbers = number_stats.from_columns(number_logits.reshape(shape + (-1,)), target, number_tokens,
                                        NumberReads() if reads is None else reads)
    log_normalizer = jnp.logaddexp(numbers.log_normalizer, rest_lse.reshape(shape))
    masses = head_stats.number_mass_of(numbers, log_normalizer) if with_masses else None
    head = HeadStats(
        log_normalizer=log_normalizer,
        target_logit=jnp.where(keep, target_logit.reshape(shape), 0.0),
        logit_sum=logit_sum.reshape(shape) if label_smoothing > 0 else None,
        numbers=numbers if reads is not None else None,
        masses=masses,
    )
    return head, (top_id.reshape(shape) if with_top else None)
