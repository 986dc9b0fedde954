"""How expectations under the number-token softmax are computed, on each backend.

Every number loss is a function of a few statistics of the number tokens' logits `z`
(`NumberStats`): their log-normaliser, expectations `E_p[f]` under `p = softmax(z)` over
the number tokens only, for functions `f` of a number token (its value, its distance
to the target, or of its logit itself), and weighted sums `sum_j w_j z_j` for weights
`w` that depend on the target alone. A variant names the functions it needs
(`NumberReads`); this module computes them in one of three formulations, which give
the same numbers (to float32 rounding) and differ only in what the compiled program
moves:

- **columns**: take the `N` number-token columns and compute in `[batch, length, N]`;
  the gradient is `take`'s scatter back into the logits' gradient. On XLA's CPU backend
  exponentials over the whole vocabulary are compute that CE does not pay for, while
  gathering `N` columns is cheap and the float32 scatter adds into CE's own gradient
  buffer in place. The fused head has only the columns, so it always takes this path
  (`from_columns`).
- **gathered**: the same columns, their gradient gathered back from `[batch, length, N]`
  through a constant `[vocab]` map of each column's slot: elementwise over the logits,
  so XLA's GPU backend fuses it into the cross-entropy's gradient, where the scatter
  writes a float32 `[batch, length, vocab]` buffer of its own.
- **reductions**: masked reductions over the whole vocabulary, which XLA fuses with the
  cross-entropy's own reductions over the same logits, and a gradient written in closed
  form, elementwise over `[batch, length, vocab]`, which fuses into the cross-entropy's
  gradient. On the TPU a gather of columns, or the scatter of their gradient, is a pass
  over the logits of its own; this way NTL adds none.

Each backend takes its own with `jax.lax.platform_dependent`: columns on the CPU,
gathered on GPUs, reductions elsewhere (the TPU). The measurements behind each choice are
in docs/performance.md. Tests and benchmarks compute one formulation on every backend
inside `with forced_formulation(name):`.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntl_jax._core.compat import is_traced
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.targets import NumberTarget, number_ranks

FORMULATIONS = ("columns", "gathered", "reductions")
# The formulation every backend takes, "auto" for each its own (`forced_formulation`).
_forced = ["auto"]
# For `probs` (or `columns`) the reductions path takes each number token's column as a masked sum over
# the vocabulary (its gradient a select), each adding a compare, a select and an add
# per element of the logits; beyond this many number tokens it gathers the columns.
_COLUMNS_BY_REDUCTION_MAX = 32


class Columns(NamedTuple):
    """What a function of a number token may read, at `K` columns (the `N` number
    tokens, or the whole vocabulary with zeros off the numbers): `id`, `value`, `rank`
    (`number_ranks`) and `digits` (`NumberTokens.digit_counts`), each `[K]`, and `logit`,
    the logits `[batch, length, K]` float32 (0 at ignored positions)."""

    id: jax.Array
    value: jax.Array
    rank: jax.Array
    digits: jax.Array
    logit: jax.Array


def of_logits(f: Callable) -> Callable:
    """Marks a function `f(columns, target, number_tokens)` that reads `columns.logit`: the reductions
    formulation then differentiates it too (its derivative, elementwise in the logit)."""
    f.of_logits = True
    return f


def expected_value(columns: Columns, target: NumberTarget, number_tokens: NumberTokens):
    """`v_j`: its expectation is the predicted value `sum_j p_j v_j`."""
    return columns.value


class NumberReads(NamedTuple):
    """What a computation needs of the number tokens' logits: `means`, functions
    `f(columns, target, number_tokens)` whose expectation under `p` it reads; `sums`,
    functions `w(columns, target, number_tokens)` of the target alone whose weighted sum of the logits
    `sum_j w_j z_j` it reads; `probs`, whether it reads `p` itself; `columns`, whether
    it reads the number tokens' logits `z` themselves (a softmax over some of them)."""

    means: tuple = ()
    sums: tuple = ()
    probs: bool = False
    columns: bool = False

    def __or__(self, other: NumberReads) -> NumberReads:
        return NumberReads(tuple(dict.fromkeys(self.means + other.means)),
                           tuple(dict.fromkeys(self.sums + other.sums)), self.probs or other.probs,
                           self.columns or other.columns)


class NumberStats(NamedTuple):
    """Per position, `[batch, length]` float32 unless said otherwise; at ignored
    positions finite values that nothing counts.

    - `shift`: the largest number-token logit (a constant to the gradient);
    - `exp_sum`: `sum_j exp(z_j - shift)`, so `log_normalizer = shift + log(exp_sum)`;
    - `means`: `{f: sum_j p_j f_j}` for the functions read;
    - `sums`: `{w: sum_j w_j z_j}`;
    - `probs`: `p`, `[batch, length, N]`, or None;
    - `columns`: `z`, `[batch, length, N]` (0 at ignored positions), or None.
    """

    shift: jax.Array
    exp_sum: jax.Array
    means: dict
    sums: dict
    probs: jax.Array | None = None
    columns: jax.Array | None = None

    @property
    def log_normalizer(self):
        return self.shift + jnp.log(self.exp_sum)


@contextlib.contextmanager
def forced_formulation(formulation: str):
    """Inside the block, the number statistics traced are computed with `formulation` (one
    of `FORMULATIONS`, or "auto") on every backend: how the tests hold each formulation to
    the same numbers on the CPU, and the benchmarks compare them. Read when a function is
    traced: a function `jit` traced before keeps its formulation."""
    if formulation != "auto" and formulation not in FORMULATIONS:
        raise ValueError(f"expected formulation 'auto' or one of {FORMULATIONS}, got {formulation!r}")
    _forced.append(formulation)
    try:
        yield
    finally:
        _forced.pop()


def number_stats(wide, target: NumberTarget, number_tokens: NumberTokens, reads: NumberReads, *,
                 logits=None) -> NumberStats:
    """`NumberStats` of float32 `[batch, length, vocab]` logits `wide` (widened from
    `logits`, their own dtype, default `wide`: XLA fuses the conversion into each pass)
    at the positions `target.keep`; whatever the logits hold elsewhere reaches neither
    the statistics nor their gradients. Each backend takes its own formulation, unless
    one is forced (`forced_formulation`)."""
    logits = wide if logits is None else logits
    formulation = _forced[-1]
    compute = functools.partial(_by_formulation, number_tokens=number_tokens, reads=reads)
    if formulation == "auto":
        out = jax.lax.platform_dependent(
            wide, logits, target, cpu=functools.partial(compute, formulation="columns"),
            cuda=functools.partial(compute, formulation="gathered"),
            rocm=functools.partial(compute, formulation="gathered"),
            default=functools.partial(compute, formulation="reductions"))
    else:
        out = compute(wide, logits, target, formulation=formulation)
    shift, exp_sum, means, sums, probs, columns = out
    return NumberStats(shift, exp_sum, dict(zip(reads.means, means)), dict(zip(reads.sums, sums)), probs, columns)


def _by_formulation(wide, logits, target, *, formulation, number_tokens, reads):
    """`(shift, exp_sum, means, sums, probs, columns)` with `means` and `sums` as tuples in the
    order of `reads` (a pytree `platform_dependent` can return)."""
    if formulation == "columns":
        # The CPU's columns come from the widened logits: gathered from 16-bit ones, the
        # objective took longer on XLA's CPU backend (benchmarks/loss_overhead.py).
        return _from_columns(take_columns(wide, target.keep, number_tokens), target, number_tokens, reads)
    if formulation == "gathered":
        columns = take_columns(wide, target.keep, number_tokens, logits, gradient="gather")
        return _from_columns(columns, target, number_tokens, reads)
    return _from_reductions(wide, logits, target, number_tokens, reads)


def from_columns(columns, target: NumberTarget, number_tokens: NumberTokens, reads: NumberReads) -> NumberStats:
    """`NumberStats` from the number tokens' logits `[batch, length, N]` float32, 0 at
    ignored positions (the fused head's path)."""
    shift, exp_sum, means, sums, probs, columns = _from_columns(columns, target, number_tokens, reads)
    return NumberStats(shift, exp_sum, dict(zip(reads.means, means)), dict(zip(reads.sums, sums)), probs, columns)


def _from_columns(columns, target, number_tokens, reads):
    shift = _finite_max(columns, target.keep)
    exp = jnp.exp(columns - shift[..., None])
    exp_sum = jnp.sum(exp, axis=-1)
    probs = exp / exp_sum[..., None]
    at = _number_columns(number_tokens, columns)
    means = tuple(jnp.sum(probs * f(at, target, number_tokens), axis=-1) for f in reads.means)
    sums = tuple(jnp.sum(w(at, target, number_tokens) * columns, axis=-1) for w in reads.sums)
    return shift, exp_sum, means, sums, probs if reads.probs else None, columns if reads.columns else None


def _number_columns(number_tokens: NumberTokens, logits) -> Columns:
    ids = jnp.asarray(number_tokens.ids)
    return Columns(ids, jnp.asarray(number_tokens.number_values, jnp.float32),
                   jnp.asarray(number_ranks(number_tokens)),
                   number_tokens.at_numbers(number_tokens.digit_counts, jnp.int32), logits)


def take_columns(wide, keep, number_tokens: NumberTokens, logits=None, *, gradient="scatter"):
    """The number tokens' logits, `[batch, length, N]` float32, 0 where `keep` is False
    (taken before any arithmetic, so nothing else of the logits is read).

    They are gathered from `logits`, the logits in their own dtype (default `wide`), and
    widened, which is exact: on the TPU, gathered from `wide`, 16-bit logits would first
    be written out widened in full. The gradient is with respect to `wide`, so it adds to
    the other logits gradients in float32 and is rounded once; `gradient` says how it
    reaches the logits' columns: `"scatter"` (`take`'s own) or `"gather"` (the columns'
    gradient gathered through each column's slot, see the module docstring)."""
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
    # gather from the columns' gradient through the constant `[vocab]` slot map.
    n = ids.shape[0]
    sums = jnp.zeros(dwide.shape[:-1] + (n + 1,), dwide.dtype).at[..., slots].add(dwide)
    return _take_widened(wide, logits, ids, slots), sums[..., :n].astype(jnp.float32)


def _slots(number_tokens: NumberTokens, vocab: int):
    """`[vocab]` int32: each number token's place in `number_tokens.ids`, N elsewhere."""
    n = int(np.shape(number_tokens.ids)[0])
    if is_traced(number_tokens.ids):
        return jnp.full((vocab,), n, jnp.int32).at[number_tokens.ids].set(jnp.arange(n, dtype=jnp.int32))
    slots = np.full((vocab,), n, np.int32)
    slots[np.asarray(number_tokens.ids)] = np.arange(n, dtype=np.int32)
    return jnp.asarray(slots)


def _from_reductions(wide, logits, target, number_tokens, reads):
    """Masked reductions over the vocabulary (see the module docstring). `probs` and
    `columns` need every column: they are taken as one masked sum each (up to
    `_COLUMNS_BY_REDUCTION_MAX` number tokens, else gathered), and everything follows
    from them as on the columns path."""
    keep = target.keep
    if reads.probs or reads.columns:
        n = int(np.shape(number_tokens.ids)[0])
        if n > _COLUMNS_BY_REDUCTION_MAX:
            columns = take_columns(wide, keep, number_tokens, logits)
        else:
            columns = _masked_columns(wide, keep, number_tokens)
        return _from_columns(columns, target, number_tokens, reads)
    is_number, tables = _vocab_tables(number_tokens, wide.shape[-1])
    # The largest number logit, in the logits' own dtype (a maximum commutes with
    # widening, and XLA fuses it with a cross-entropy's own).
    shift = _finite_max(jnp.where(is_number, logits, -jnp.inf), keep).astype(jnp.float32)
    exp_sum, moments = _number_moments(reads.means, wide, shift, keep, is_number, tables, target, number_tokens)
    means = tuple(jax.lax.index_in_dim(moments, k, axis=-1, keepdims=False) for k in range(len(reads.means)))
    # sum_j w_j z_j as a masked sum over the vocabulary, w computed at every column from
    # its tables. Its gradient (w) does not read the logits.
    at = tables._replace(logit=wide)
    sums = tuple(jnp.sum(jnp.where(keep[..., None] & is_number, w(at, target, number_tokens) * wide, 0.0), axis=-1)
                 for w in reads.sums)
    return jnp.where(keep, shift, 0.0), exp_sum, means, sums, None, None


def _masked_columns(wide, keep, number_tokens: NumberTokens):
    """`take_columns` as one masked sum over the vocabulary per number token: XLA fuses
    them with the other reductions over the logits, and their gradient is a select per
    number token, fused into the other gradients (a gather's transpose is a scatter)."""
    column = jax.lax.broadcasted_iota(jnp.int32, wide.shape, wide.ndim - 1)
    ids = number_tokens.ids if is_traced(number_tokens.ids) else np.asarray(number_tokens.ids)
    sums = [jnp.sum(jnp.where(column == ids[j], wide, 0.0), axis=-1) for j in range(ids.shape[0])]
    return jnp.where(keep[..., None], jnp.stack(sums, axis=-1), 0.0)


def _finite_max(x, keep):
    """The largest entry of the last axis (0 where it is not finite, or not `keep`),
    a constant to the gradient."""
    top = jax.lax.stop_gradient(jnp.max(x, axis=-1))
    return jnp.where(keep & jnp.isfinite(top), top, 0.0)


def _vocab_tables(number_tokens: NumberTokens, vocab: int):
    """`(is_number, Columns)` over the whole vocabulary, each `[vocab]`: whether the id
    is a number token, and its id, value, rank and digit count (0 off the numbers); the
    logit left None."""
    ids = number_tokens.ids
    if is_traced(ids) or is_traced(number_tokens.number_values):
        ids = jnp.asarray(ids)
        is_number = jnp.zeros(vocab, bool).at[ids].set(True)
        values = jnp.zeros(vocab, jnp.float32).at[ids].set(jnp.asarray(number_tokens.number_values, jnp.float32))
        ranks = jnp.zeros(vocab, jnp.float32).at[ids].set(number_ranks(number_tokens))
        counts = jnp.zeros(vocab, jnp.int32).at[ids].set(
            number_tokens.at_numbers(number_tokens.digit_counts, jnp.int32))
        return is_number, Columns(jnp.arange(vocab, dtype=jnp.int32), values, ranks, counts, None)
    # The usual closure constants: built on the host, constants of the program.
    ids = np.asarray(ids)
    is_number = np.zeros(vocab, bool)
    is_number[ids] = True
    values = np.zeros(vocab, np.float32)
    values[ids] = np.asarray(number_tokens.number_values, np.float32)
    ranks = np.zeros(vocab, np.float32)
    ranks[ids] = number_ranks(number_tokens)
    counts = np.zeros(vocab, np.int32)
    counts[ids] = np.asarray(number_tokens.digit_counts, np.int32)[ids]
    tables = Columns(np.arange(vocab, dtype=np.int32), values, ranks, counts, None)
    return jnp.asarray(is_number), Columns(*(None if t is None else jnp.asarray(t) for t in tables))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _number_moments(means, wide, shift, keep, is_number, tables, target, number_tokens):
    """`(exp_sum, moments)`: the exponential sum about `shift` (the largest number
    logit, a constant), and `moments` `[batch, length, K]`, `sum_j p_j f_k(j)` for the
    `K` functions `means`, all as masked reductions over the vocabulary (0 at positions
    not `keep`, `exp_sum` 1). The derivative is a JVP rule whose transpose, the
    gradient, is elementwise: `d exp_sum = sum_v e_v dz_v`, `d moment_k = sum_v p_v
    (f_k(v) - moment_k + f_k'(v)) dz_v` (`f_k'` the derivative in the logit, for the
    functions `of_logits`), with `e_v = exp(z_v - shift)` and `p_v` at the number
    tokens, 0 elsewhere, and whatever the logits hold off `keep` selected away."""
    mask = keep[..., None] & is_number
    exp = jnp.where(mask, jnp.exp(wide - shift[..., None]), 0.0)
    exp_sum = jnp.where(keep, jnp.sum(exp, axis=-1), 1.0)
    at = tables._replace(logit=jnp.where(mask, wide, 0.0))
    moments = [jnp.sum(exp * f(at, target, number_tokens), axis=-1) / exp_sum for f in means]
    stacked = jnp.stack(moments, axis=-1) if moments else jnp.zeros(keep.shape + (0,), jnp.float32)
    return exp_sum, stacked


@_number_moments.defjvp
def _number_moments_jvp(means, primals, tangents):
    wide, shift, keep, is_number, tables, target, number_tokens = primals
    dwide = tangents[0]
    exp_sum, moments = _number_moments(means, wide, shift, keep, is_number, tables, target, number_tokens)
    # p from the log-normaliser, not from the forward pass's exponentials, so XLA
    # recomputes it in the gradient's own fused pass rather than keeping
    # `[batch, length, vocab]` of exponentials between the two.
    mask = keep[..., None] & is_number
    log_normalizer = shift + jnp.log(exp_sum)
    p = jnp.where(mask, jnp.exp(wide - log_normalizer[..., None]), 0.0)
    d_exp_sum = exp_sum * jnp.sum(p * dwide, axis=-1)
    logit = jnp.where(mask, wide, 0.0)
    d_moments = []
    for k, f in enumerate(means):
        def feature(z, f=f):
            return f(tables._replace(logit=z), target, number_tokens)

        if getattr(f, "of_logits", False):
            value, slope = jax.jvp(feature, (logit,), (jnp.ones_like(logit),))
            value = value + slope
        else:
            value = feature(logit)
        d_moments.append(jnp.sum(p * (value - jax.lax.index_in_dim(moments, k, axis=-1)) * dwide, axis=-1))
    d_stacked = jnp.stack(d_moments, axis=-1) if d_moments else jnp.zeros_like(moments)
    return (exp_sum, moments), (d_exp_sum, d_stacked)
