"""What the NTL variants read from the logits, and the three ways the backends compute it.

Every variant is a function of a few statistics of `p`, the softmax over the number
tokens only (`NumberStats`): its normaliser, the expected value `sum_j p_j v_j`, the
expected distance to the target `sum_j p_j D(v_j, y)`, the expected distance in rank
`sum_j p_j |r_j - r_t|` (NTL-WAS-CDF against a one-hot label, see `losses._was_cdf`), and
for NTL-WAS-CDF against a smoothed label `p` itself.
They are computed one of three ways, which give the same numbers (to float32 rounding)
and differ only in what the compiled program moves:

- **columns** (`from_columns`): take the `N` number-token columns and compute in
  `[batch, length, N]`; the gradient is `take`'s scatter back into the logits'
  gradient. On XLA's CPU backend exponentials over the whole vocabulary are compute
  that CE does not pay for (1.6-2.8x CE's time), while gathering `N` columns is cheap
  and the float32 scatter adds into CE's own gradient buffer in place. The fused head
  has only the columns (`hidden @ kernel[:, ids]`), so it always takes this path.
- **gathered**: the same columns, their gradient gathered back from `[batch, length, N]`
  through a constant `[vocab]` map of each column's slot (`take_columns(...,
  gradient="gather")`): elementwise over the logits, so XLA's GPU backend fuses it into
  the cross-entropy's gradient, where the scatter writes a float32 `[batch, length,
  vocab]` buffer of its own. With bf16 logits on an H200 the scatter took
  CE + NTL-WAS to 1.70-2.17x CE's time and twice its memory, the gather 1.02-1.23x and no
  more memory (float32: 1.01-1.27x against 1.01-1.16x; docs/performance.md).
- **reductions** (`from_reductions`): masked reductions over the whole vocabulary,
  which XLA fuses with the cross-entropy's own reductions over the same logits, and a
  gradient written in closed form, elementwise over `[batch, length, vocab]` from
  per-position scalars and constant `[vocab]` tables, which fuses into the
  cross-entropy's gradient. On the TPU a gather of columns, or the scatter of their
  gradient, is a pass over the logits of its own (1.35-2.8x optax CE's bytes,
  measured with libtpu's compiler); this way NTL adds no pass at all. (On the GPU these
  reductions do not fuse into CE's: 1.3-2.9x CE's time.)

`number_stats` picks per backend with `jax.lax.platform_dependent`: columns on the CPU,
gathered on GPUs (measured on CUDA; ROCm runs the same XLA GPU compiler), reductions
elsewhere (the TPU). `_FORCE` (tests and benchmarks) forces one of them on every
backend, so the CPU runs every test against each.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntl_jax._core.number_tokens import NumberTokens

# What a variant may read from `NumberStats` (`losses.Variant.reads`).
VALUE, DISTANCE, RANK_DISTANCE, PROBS = "value", "distance", "rank_distance", "probs"
# For `probs` the reductions path takes each number token's column as a masked sum over
# the vocabulary (its gradient a select), each adding a compare, a select and an add
# per element of the logits; beyond this many number tokens it takes the columns with a
# gather instead (and a scatter for the gradient, see above).
_COLUMNS_BY_REDUCTION_MAX = 32
# None: each backend's own formulation; one of FORMULATIONS: that one everywhere.
FORMULATIONS = ("columns", "gathered", "reductions")
_FORCE: str | None = None


class NumberStats(NamedTuple):
    """Per position, `[batch, length]` float32 unless said otherwise; at ignored
    positions (not `keep`) finite values that no variant counts.

    - `shift`: the largest number-token logit (a constant to the gradient);
    - `exp_sum`: `sum_j exp(logit_j - shift)` over the number tokens, so the number
      tokens' log-normaliser is `shift + log(exp_sum)` (`log_normalizer`);
    - `value`: `sum_j p_j v_j` (or None if not asked for);
    - `distance`: `sum_j p_j D(v_j, y)`, `D` the (squashed) distance to the target's
      value `y` (or None);
    - `rank_distance`: `sum_j p_j |r_j - r_t|`, `r_j` the number token's place when they
      are sorted by value (`number_ranks`), `r_t` the target's (or None);
    - `probs`: `p`, `[batch, length, N]` (or None);
    - `label_logit`: `sum_j q_j logit_j` for a label `q` over the number tokens
      (Gaussian-smoothed CE), or None.
    """

    shift: jax.Array
    exp_sum: jax.Array
    value: jax.Array | None = None
    distance: jax.Array | None = None
    rank_distance: jax.Array | None = None
    probs: jax.Array | None = None
    label_logit: jax.Array | None = None

    @property
    def log_normalizer(self):
        return self.shift + jnp.log(self.exp_sum)


def number_stats(wide, keep, target_value, number_tokens: NumberTokens, *, reads=(), squash_factor=None,
                 label=None, logits=None, target_rank=None):
    """`NumberStats` of float32 `[batch, length, vocab]` logits (widened from any dtype:
    XLA fuses the conversion into each pass) at the positions `keep`; whatever the
    logits hold elsewhere reaches neither the statistics nor their gradients.

    `reads` names the statistics to compute (`VALUE`, `DISTANCE`, `RANK_DISTANCE`,
    `PROBS`); `target_value` `[batch, length]` is the target's value (for `DISTANCE`; 0
    where no number), `target_rank` its place in value order (for `RANK_DISTANCE`, see
    `number_ranks`); `label` a `losses.GaussianLabel` for `label_logit` (GCE), or None.
    `logits`, the logits in their own dtype (default `wide`), give the largest number
    logit: a maximum commutes with widening, and taken in the logits' dtype XLA fuses it
    with a cross-entropy's own (see `losses.log_normalizer`).
    """
    args = (wide, keep, target_value, label, wide if logits is None else logits)
    options = dict(number_tokens=number_tokens, reads=tuple(reads), squash_factor=squash_factor,
                   target_rank=target_rank)
    columns = functools.partial(_from_widened_columns, **options)
    gathered = functools.partial(_from_columns_gathered_back, **options)
    reductions = functools.partial(from_reductions, **options)
    if _FORCE == "columns":
        return columns(*args)
    if _FORCE == "gathered":
        return gathered(*args)
    if _FORCE == "reductions":
        return reductions(*args)
    return jax.lax.platform_dependent(*args, cpu=columns, cuda=gathered, rocm=gathered, default=reductions)


def take_columns(wide, keep, number_tokens: NumberTokens, logits=None, *, gradient="scatter"):
    """The number tokens' logits, `[batch, length, N]` float32, 0 where `keep` is False
    (taken before any arithmetic, so nothing else of the logits is read).

    They are gathered from `logits`, the logits in their own dtype (default `wide`), and
    widened, which is exact: on the TPU, gathered from `wide`, 16-bit logits would first
    be written out widened in full (NTL-WAS-CDF with a GCE label, LLaMA-3-like table,
    bf16: 2.65x optax CE's bytes against 2.14x). The gradient is with respect to `wide`,
    so it adds to the other logits gradients in float32 and is rounded once; `gradient`
    says how it reaches the logits' columns: `"scatter"` (`take`'s own) or `"gather"`
    (the columns' gradient gathered through each column's slot, see the module
    docstring)."""
    ids = jnp.asarray(number_tokens.ids)
    if logits is None and gradient == "scatter":  # nothing to widen: take's own derivative
        columns = jnp.take(wide, ids, axis=-1)
    else:
        slots = _slots(number_tokens, wide.shape[-1]) if gradient == "gather" else None
        source = wide if logits is None else logits
        columns = _take_widened(wide, jax.lax.stop_gradient(source), ids, slots)
    return jnp.where(keep[..., None], columns, 0.0)


@jax.custom_jvp
def _take_widened(wide, logits, ids, slots):
    return jnp.take(logits, ids, axis=-1).astype(jnp.float32)


@_take_widened.defjvp
def _take_widened_jvp(primals, tangents):
    wide, logits, ids, slots = primals
    dwide = tangents[0]
    if slots is None:  # take's: its transpose is a scatter
        return _take_widened(wide, logits, ids, slots), jnp.take(dwide, ids, axis=-1).astype(jnp.float32)
    # The columns of the logits' tangent written as a sum into slots (each number token's
    # own, one more for all the other columns), so that its transpose, the gradient, is a
    # gather from the columns' gradient through the constant `[vocab]` slot map:
    # elementwise over the logits, where a scatter is a pass of its own.
    n = ids.shape[0]
    sums = jnp.zeros(dwide.shape[:-1] + (n + 1,), dwide.dtype).at[..., slots].add(dwide)
    return _take_widened(wide, logits, ids, slots), sums[..., :n].astype(jnp.float32)


def _slots(number_tokens: NumberTokens, vocab: int):
    """`[vocab]` int32: each number token's place in `number_tokens.ids`, N elsewhere."""
    n = int(np.shape(number_tokens.ids)[0])
    if _is_traced(number_tokens.ids):
        return jnp.full((vocab,), n, jnp.int32).at[number_tokens.ids].set(jnp.arange(n, dtype=jnp.int32))
    slots = np.full((vocab,), n, np.int32)
    slots[np.asarray(number_tokens.ids)] = np.arange(n, dtype=np.int32)
    return jnp.asarray(slots)


def _from_columns_gathered_back(wide, keep, target_value, label, logits, **options):
    # The GPU's formulation: gathered from the logits in their own dtype (as the TPU's
    # takes its columns), the widening fused into the gather.
    columns = take_columns(wide, keep, options["number_tokens"], logits, gradient="gather")
    return from_columns(columns, keep, target_value, label, **options)


def _from_logits_by_columns(wide, keep, target_value, label, logits, **options):
    columns = take_columns(wide, keep, options["number_tokens"], logits)
    return from_columns(columns, keep, target_value, label, **options)


def _from_widened_columns(wide, keep, target_value, label, logits, **options):
    # The CPU's formulation gathers from the widened logits: gathered from 16-bit ones,
    # the objective took longer on XLA's CPU backend (bf16, 16x128x32128: 1.45-1.51x its
    # CE-only setting against 1.37-1.40x, benchmarks/loss_overhead.py).
    return _from_logits_by_columns(wide, keep, target_value, label, None, **options)


def from_columns(columns, keep, target_value, label=None, *, number_tokens: NumberTokens, reads=(),
                 squash_factor=None, target_rank=None):
    """`NumberStats` from the number tokens' logits `[batch, length, N]` float32
    (sanitised: finite, or -inf, at ignored positions)."""
    shift = _finite_max(columns, keep)
    exp = jnp.exp(columns - shift[..., None])
    exp_sum = jnp.sum(exp, axis=-1)
    probs = exp / exp_sum[..., None]
    v = jnp.asarray(number_tokens.number_values, jnp.float32)
    return NumberStats(
        shift=shift,
        exp_sum=exp_sum,
        value=jnp.sum(probs * v, axis=-1) if VALUE in reads else None,
        distance=(jnp.sum(probs * _distance(v, target_value[..., None], number_tokens, squash_factor), axis=-1)
                  if DISTANCE in reads else None),
        rank_distance=(jnp.sum(probs * jnp.abs(number_ranks(number_tokens) - target_rank[..., None]), axis=-1)
                       if RANK_DISTANCE in reads else None),
        probs=probs if PROBS in reads else None,
        label_logit=None if label is None else jnp.sum(label.at(v, _column_counts(number_tokens)) * columns, axis=-1),
    )


def from_reductions(wide, keep, target_value, label=None, logits=None, *, number_tokens: NumberTokens, reads=(),
                    squash_factor=None, target_rank=None):
    """`NumberStats` from the whole logits by masked reductions over the vocabulary
    (see the module docstring). `PROBS` needs every column: they are taken as one masked
    sum each (up to `_COLUMNS_BY_REDUCTION_MAX` number tokens, else gathered), and
    everything follows from them as on the columns path."""
    options = dict(number_tokens=number_tokens, reads=reads, squash_factor=squash_factor, target_rank=target_rank)
    if PROBS in reads:
        n = int(np.shape(number_tokens.ids)[0])
        if n > _COLUMNS_BY_REDUCTION_MAX:
            return _from_logits_by_columns(wide, keep, target_value, label, logits, **options)
        return from_columns(_masked_columns(wide, keep, number_tokens), keep, target_value, label, **options)
    vocab = wide.shape[-1]
    is_number, values, ranks, counts = _vocab_tables(number_tokens, vocab)
    features = _Features(VALUE in reads, DISTANCE in reads, RANK_DISTANCE in reads, squash_factor, number_tokens)
    # The largest number logit, in the logits' own dtype (see `number_stats`).
    masked = jnp.where(is_number, wide if logits is None else logits, -jnp.inf)
    shift = _finite_max(masked, keep).astype(jnp.float32)
    targets = (target_value, target_rank)
    exp_sum, moments = _number_moments(features, wide, shift, keep, (is_number, values, ranks), targets)
    value, distance, rank_distance = features.split(moments)
    label_logit = None
    if label is not None:
        # sum_j q_j logit_j as a masked sum over the vocabulary, q computed at every
        # column from its value and digit count. Its gradient (q) does not read the logits.
        q = label.at(values, counts)
        label_logit = jnp.sum(jnp.where(keep[..., None] & is_number, q * wide, 0.0), axis=-1)
    return NumberStats(jnp.where(keep, shift, 0.0), exp_sum, value, distance, rank_distance, None, label_logit)


def _masked_columns(wide, keep, number_tokens: NumberTokens):
    """`take_columns` as one masked sum over the vocabulary per number token: XLA fuses
    them with the other reductions over the logits, and their gradient is a select per
    number token, fused into the other gradients (a gather's transpose is a scatter)."""
    column = jax.lax.broadcasted_iota(jnp.int32, wide.shape, wide.ndim - 1)
    ids = number_tokens.ids if _is_traced(number_tokens.ids) else np.asarray(number_tokens.ids)
    sums = [jnp.sum(jnp.where(column == ids[j], wide, 0.0), axis=-1) for j in range(ids.shape[0])]
    return jnp.where(keep[..., None], jnp.stack(sums, axis=-1), 0.0)


def _finite_max(x, keep):
    """The largest entry of the last axis (0 where it is not finite, or not `keep`),
    a constant to the gradient."""
    top = jax.lax.stop_gradient(jnp.max(x, axis=-1))
    return jnp.where(keep & jnp.isfinite(top), top, 0.0)


def _distance(v, y, number_tokens, squash_factor):
    return number_tokens.squash(jnp.abs(y - v), squash_factor)


def _column_counts(number_tokens: NumberTokens):
    """`[N]` the digits each number token writes (`NumberTokens.digit_counts`)."""
    return jnp.asarray(number_tokens.digit_counts, jnp.int32)[jnp.asarray(number_tokens.ids)]


def number_ranks(number_tokens: NumberTokens):
    """`[N]` float32: each number token's place (0 to N - 1) when the number tokens are
    sorted by value, ties in `number_tokens.ids` order (as NTL-WAS-CDF sorts them); a
    NumPy array (a constant of the program) unless the values are traced."""
    values = number_tokens.number_values
    if _is_traced(values):
        order = jnp.argsort(jnp.asarray(values, jnp.float32), stable=True)
        return jnp.zeros(order.shape, jnp.float32).at[order].set(jnp.arange(order.shape[0], dtype=jnp.float32))
    order = np.argsort(np.asarray(values, np.float32), kind="stable")
    ranks = np.empty(order.shape, np.float32)
    ranks[order] = np.arange(order.shape[0])
    return ranks


def _is_traced(x):
    return isinstance(x, jax.core.Tracer)


def _vocab_tables(number_tokens: NumberTokens, vocab: int):
    """`(is_number, values, ranks, counts)`, each `[vocab]`: whether the id is a number
    token, its value, its place in value order (`number_ranks`) and the digits it writes
    (each 0 off the number tokens)."""
    if _is_traced(number_tokens.ids) or _is_traced(number_tokens.number_values):
        ids = jnp.asarray(number_tokens.ids)
        is_number = jnp.zeros(vocab, bool).at[ids].set(True)
        values = jnp.zeros(vocab, jnp.float32).at[ids].set(jnp.asarray(number_tokens.number_values, jnp.float32))
        ranks = jnp.zeros(vocab, jnp.float32).at[ids].set(number_ranks(number_tokens))
        counts = jnp.zeros(vocab, jnp.int32).at[ids].set(_column_counts(number_tokens))
        return is_number, values, ranks, counts
    # The usual closure constants: built on the host, constants of the program.
    ids = np.asarray(number_tokens.ids)
    is_number = np.zeros(vocab, bool)
    is_number[ids] = True
    values = np.zeros(vocab, np.float32)
    values[ids] = np.asarray(number_tokens.number_values, np.float32)
    ranks = np.zeros(vocab, np.float32)
    ranks[ids] = number_ranks(number_tokens)
    counts = np.zeros(vocab, np.int32)
    counts[ids] = np.asarray(number_tokens.digit_counts, np.int32)[ids]
    return tuple(jnp.asarray(t) for t in (is_number, values, ranks, counts))


class _Features:
    """The functions of a number token whose expectations under `p` the reductions path
    computes: its value, its distance to the target's value, its distance in rank to
    the target's."""

    def __init__(self, value, distance, rank_distance, squash_factor, number_tokens):
        self.wanted = (value, distance, rank_distance)
        self.squash_factor, self.number_tokens = squash_factor, number_tokens

    def __call__(self, tables, targets):
        """`[K]` features, each broadcastable to `[batch, length, vocab]` float32."""
        _, values, ranks = tables
        target_value, target_rank = targets
        make = (
            lambda: values,
            lambda: _distance(values, target_value[..., None], self.number_tokens, self.squash_factor),
            lambda: jnp.abs(ranks - target_rank[..., None]),
        )
        return [f() for f, wanted in zip(make, self.wanted) if wanted]

    def split(self, moments):
        """`(value, distance, rank_distance)` from the stacked moments `[batch, length, K]`
        (None for those not computed)."""
        out, k = [], 0
        for wanted in self.wanted:
            out.append(jax.lax.index_in_dim(moments, k, axis=-1, keepdims=False) if wanted else None)
            k += int(wanted)
        return tuple(out)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _number_moments(features, wide, shift, keep, tables, targets):
    """`(exp_sum, moments)`: `NumberStats`' exponential sum about `shift` (the largest
    number logit, a constant), and `moments` `[batch, length, K]`, `sum_j p_j f_k(v_j)`
    for the `K` `features`, all as masked reductions over the vocabulary (0 at positions
    not `keep`, `exp_sum` 1). The derivative is a JVP rule whose transpose, the
    gradient, is elementwise: `d exp_sum = sum_v e_v dlogit_v`, `d moment_k = sum_v p_v
    (f_k(v) - moment_k) dlogit_v`, with `e_v = exp(logit_v - shift)` and `p_v` at the
    number tokens, 0 elsewhere, and whatever the logits hold off `keep` selected away."""
    mask = keep[..., None] & tables[0]
    exp = jnp.where(mask, jnp.exp(wide - shift[..., None]), 0.0)
    exp_sum = jnp.where(keep, jnp.sum(exp, axis=-1), 1.0)
    feats = features(tables, targets)
    moments = [jnp.sum(exp * f, axis=-1) / exp_sum for f in feats]
    stacked = jnp.stack(moments, axis=-1) if moments else jnp.zeros(keep.shape + (0,), jnp.float32)
    return exp_sum, stacked


@_number_moments.defjvp
def _number_moments_jvp(features, primals, tangents):
    wide, shift, keep, tables, targets = primals
    dwide = tangents[0]
    exp_sum, moments = _number_moments(features, wide, shift, keep, tables, targets)
    # p from the log-normaliser, not from the forward pass's exponentials, so XLA
    # recomputes it in the gradient's own fused pass rather than keeping
    # `[batch, length, vocab]` of exponentials between the two.
    mask = keep[..., None] & tables[0]
    log_normalizer = shift + jnp.log(exp_sum)
    p = jnp.where(mask, jnp.exp(wide - log_normalizer[..., None]), 0.0)
    d_exp_sum = exp_sum * jnp.sum(p * dwide, axis=-1)
    feats = features(tables, targets)
    d_moments = [jnp.sum(p * (f - jax.lax.index_in_dim(moments, k, axis=-1)) * dwide, axis=-1)
                 for k, f in enumerate(feats)]
    d_stacked = jnp.stack(d_moments, axis=-1) if d_moments else jnp.zeros_like(moments)
    return (exp_sum, moments), (d_exp_sum, d_stacked)
