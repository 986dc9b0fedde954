"""The number losses on their own, as pure JAX functions with ntloss's reductions.

`number_token_loss` computes any number loss (a `ntl_jax.losses` value, or a spec) from
the logits, `ntl_from_number_logits` from the number tokens' logits alone. `ntl_was`,
`ntl_dot` and `number_level_loss` are ntloss users' doorway (`NTLoss`,
`NTLossDotProduct`, `NumberLevelLoss` of ntloss 0.3.2): ntloss's arguments, the same
numbers to float32 precision.

Conventions (optax style): arrays first, options keyword-only. `logits`
`[batch, length, vocab]` (f32, bf16 or f16; statistics in f32), `targets`
`[batch, length]` integer ids, `weights` `[batch, length]` finite and non-negative. A
position is ignored when its weight is 0 or its target is outside `[0, vocab)` (T5X's
rule, no error; `check_targets` raises instead): it contributes exactly 0, gradients
too. `reduction`: `"none"` (the default, ntloss's) per position, loss x weight at
counted positions, an array, not a scalar: `jax.grad` of it fails with "Gradient only
defined for scalar-output functions", so to train pass `"mean"` or `"sum"`; `"sum"`;
`"mean"`, that sum over the counted positions' weights.
"""

from __future__ import annotations

from typing import Callable, Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from ntl_jax._core import checks, digit_runs, head_stats, number_stats, pipeline
from ntl_jax._core.head_stats import HeadStats
from ntl_jax._core.migration import refuses_old_keywords
from ntl_jax._core.number_losses import ntl, registry
from ntl_jax._core.number_losses.number_loss import DEFAULT, NumberLoss
from ntl_jax._core.number_stats import NumberReads, expected_value
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.targets import number_target

Reduction = Literal["none", "sum", "mean"]
_EPS = float(jnp.finfo(jnp.float32).eps)
# ntloss's `loss_function`s by name.
_LOSS_FUNCTIONS = {"mse": ntl.mse, "mae": ntl.mae, "huber": ntl.huber}


def reduce_loss(loss, counted, weights, reduction: str):
    """ntloss's reductions of a per-position `loss` at the `counted` positions."""
    w = jnp.where(counted, 1.0 if weights is None else weights, 0.0)
    per_token = jnp.where(counted, loss, 0.0) * w
    if reduction == "none":
        return per_token
    total = jnp.sum(per_token)
    if reduction == "sum":
        return total
    return total / jnp.maximum(jnp.sum(w), _EPS)


@refuses_old_keywords
def number_token_loss(
    logits: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    number_loss: NumberLoss | str = DEFAULT,
    weights: ArrayLike | None = None,
    reduction: Reduction = "none",
) -> jax.Array:
    """Any number loss, per position or reduced, from the logits.

    At a number target with value `y`, `p = softmax(z)` over the number tokens' logits
    `z`: NTL-WAS `sum_j p_j |v_j - y|`, NTL-MSE `(sum_j p_j v_j - y)^2`, ... each written
    beside its reference in `ntl_jax/_core/ntl.py` (docs/guides/losses.md).

    Args:
      logits: `[batch, length, vocab]` floating.
      targets: `[batch, length]` integer token ids.
      number_tokens: the vocabulary's `NumberTokens`.
      number_loss: a `ntl_jax.losses` value or a spec (`"was"`, `"smmd(mode=mmd)"`).
      weights: optional `[batch, length]` non-negative weights.
      reduction: `"none"` (`[batch, length]`, not a scalar to differentiate), `"sum"`
        or `"mean"` (over the counted positions' weights).

    Examples:
      >>> import jax.numpy as jnp
      >>> nt = NumberTokens.from_pieces(["<pad>", "0", "1", "2"])
      >>> logits = jnp.log(jnp.array([[[1e-9, 0.5, 0.0, 0.5]]]) + 1e-30)
      >>> float(number_token_loss(logits, jnp.array([[1]]), nt, reduction="sum"))  # 0.5*0 + 0.5*2
      1.0
    """
    checks.check_reduction(reduction)
    number_loss = _required(number_loss)
    weights = checks.check_logits_and_targets(logits, targets, number_tokens, weights)

    def head_of(target, reads, with_masses):
        return head_stats.from_logits(logits, target, number_tokens, reads, with_masses=with_masses)

    run = pipeline.run(head_of, targets, weights, jnp.shape(logits)[-1], number_tokens, number_loss)
    loss, counted = pipeline.number_loss_at(run.head, run.target, number_tokens, number_loss)
    return reduce_loss(loss, counted, weights, reduction)


# From the number tokens' logits alone there is no full-vocabulary mass to reweigh by.
@refuses_old_keywords(new_forms={"reweigh": "number_loss=ntl_jax.losses.was(reweigh=True) to number_token_loss or "
                                           "cross_entropy_and_ntl instead (reweighing needs the whole vocabulary's "
                                           "logits, which this function does not see)"})
def ntl_from_number_logits(
    number_logits: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    number_loss: NumberLoss | str = DEFAULT,
    weights: ArrayLike | None = None,
    reduction: Reduction = "none",
) -> jax.Array:
    """`number_token_loss` from the number tokens' logits alone, `[batch, length, N]`
    (column `j` the logit of `number_tokens.ids[j]`): how a framework with its own
    cross-entropy adds NTL beside it (`ntl_jax.maxtext`). Equal to `number_token_loss` on
    logits whose number columns these are; without the full log-normaliser, no reweighing.

    Examples:
      >>> import jax.numpy as jnp
      >>> nt = NumberTokens.from_pieces(["<pad>", "0", "1", "2"])
      >>> logits = jnp.log(jnp.array([[[1e-9, 0.5, 0.5, 0.0]]]) + 1e-30)
      >>> float(ntl_from_number_logits(logits[..., 1:], jnp.array([[3]]), nt, reduction="sum"))  # .5*2 + .5*1
      1.5
    """
    checks.check_reduction(reduction)
    number_loss = _required(number_loss)
    if number_loss.needs_masses:
        raise ValueError(f"number loss {number_loss.spec!r}: expected reweigh=False from the number tokens' logits "
                         "alone (reweighing needs the full vocabulary's log-normaliser), got reweigh=True")
    checks.check_number_tokens(number_tokens)
    weights = checks.check_number_logits_and_targets(number_logits, targets, number_tokens, weights)

    def head_of(target, reads, with_masses):
        # Ignored positions read zeros: whatever their logits hold reaches no value or gradient.
        columns = jnp.where(target.keep[..., None], jnp.asarray(number_logits).astype(jnp.float32), 0.0)
        numbers = number_stats.from_columns(columns, target, number_tokens, reads)
        return HeadStats(None, None, None, numbers, None)

    run = pipeline.run(head_of, targets, weights, number_tokens.vocab_size, number_tokens, number_loss)
    loss, counted = pipeline.number_loss_at(run.head, run.target, number_tokens, number_loss)
    return reduce_loss(loss, counted, weights, reduction)


def _required(number_loss) -> NumberLoss:
    resolved = registry.resolve(number_loss)
    if resolved is None:
        raise ValueError(f"expected number_loss a NumberLoss or a spec of one, got {number_loss!r}")
    return resolved


# -- ntloss's doorway: its classes' arguments, nothing else --------------------------


@refuses_old_keywords(only=("formulation",))
def ntl_was(
    logits: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    weights: ArrayLike | None = None,
    reweigh: bool = False,
    squash_factor: float | None = None,
    reduction: Reduction = "none",
) -> jax.Array:
    """ntloss's `NTLoss`: NTL-WAS, `sum_j p_j D[y, j]`, `p` the softmax over the number
    tokens, `D` the distance table (or its squashed form); ntloss defaults to
    `reweigh=True`, the paper does not. `number_token_loss` with
    `ntl_jax.losses.was(squash_factor=..., reweigh=...)`. `reduction` `"none"` (ntloss's
    default) gives `[batch, length]`, not a scalar: `jax.grad` of it fails with "Gradient
    only defined for scalar-output functions"; train on `"mean"` or `"sum"`.

    Examples:
      >>> import jax.numpy as jnp
      >>> nt = NumberTokens.from_pieces(["<pad>", "0", "1", "2"])
      >>> logits = jnp.log(jnp.array([[[1e-9, 0.5, 0.0, 0.5]]]) + 1e-30)
      >>> float(ntl_was(logits, jnp.array([[1]]), nt, reduction="sum"))  # 0.5*0 + 0.5*2
      1.0
    """
    return number_token_loss(logits, targets, number_tokens, weights=weights, reduction=reduction,
                             number_loss=ntl.was(squash_factor=squash_factor, reweigh=reweigh))


@refuses_old_keywords(new_forms={"ntl_kind": "loss_function= ('mse', 'mae', 'huber' or a function), ntloss's name"},
                      only=("ntl_kind", "formulation"))
def ntl_dot(
    logits: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    weights: ArrayLike | None = None,
    loss_function: str | Callable = "mse",
    reweigh: bool = False,
    reduction: Reduction = "none",
) -> jax.Array:
    """ntloss's `NTLossDotProduct`: `loss_function(sum_j p_j v_j, y)`, `"mse"`, `"mae"`,
    `"huber"` (delta 1) or a function of two float32 `[batch, length]` arrays.
    `number_token_loss` with `ntl_jax.losses.mse()` (or `expected_value_loss(f)`);
    `reduction` `"none"` per position (not a scalar to differentiate), `"sum"` or `"mean"`.

    Examples:
      >>> import jax.numpy as jnp
      >>> nt = NumberTokens.from_pieces(["<pad>", "0", "1", "2"])
      >>> logits = jnp.log(jnp.array([[[1e-9, 0.5, 0.0, 0.5]]]) + 1e-30)
      >>> float(ntl_dot(logits, jnp.array([[3]]), nt, reduction="sum"))  # (1 - 2)^2
      1.0
    """
    if isinstance(loss_function, str):
        if loss_function not in _LOSS_FUNCTIONS:
            raise ValueError(f"expected loss_function in {tuple(_LOSS_FUNCTIONS)} or a function (prediction, target) "
                             f"-> loss, got {loss_function!r}")
        number_loss = _LOSS_FUNCTIONS[loss_function](reweigh=reweigh)
    elif callable(loss_function):
        number_loss = ntl.expected_value_loss(loss_function, reweigh=reweigh)
    else:
        raise ValueError(f"expected loss_function in {tuple(_LOSS_FUNCTIONS)} or a function (prediction, target) -> "
                         f"loss, got {loss_function!r}")
    return number_token_loss(logits, targets, number_tokens, weights=weights, reduction=reduction,
                             number_loss=number_loss)


@refuses_old_keywords(new_forms={"ntl_kind": "float_level=True for 'number_level_float' (ntloss's name)"},
                      only=("ntl_kind", "formulation"))
def number_level_loss(
    logits: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    weights: ArrayLike | None = None,
    float_level: bool = False,
    reweigh: bool = False,
    max_number_length: int = digit_runs.MAX_PLACES,
    reduction: Reduction = "none",
) -> jax.Array:
    """ntloss's `NumberLevelLoss`: runs of digits joined into numbers, each scored
    `|yhat - y| / (|yhat| + |y| + eps)` at its first digit. A weight of 0 ends a number
    (ntloss's `loss_weights` join across it). `number_token_loss` with
    `ntl_jax.losses.number_level(...)`, which also takes multi-digit tables; `reduction`
    `"none"` per position (not a scalar to differentiate), `"sum"` or `"mean"`.

    Examples:
      >>> import jax.numpy as jnp
      >>> nt = NumberTokens.from_pieces(["<pad>", "0", "1", "2"])
      >>> sure = lambda ids: jnp.log(jax.nn.one_hot(ids, 4) + 1e-30)
      >>> logits = sure(jnp.array([[3, 2, 0]]))  # predicts "21", label "12"
      >>> round(float(number_level_loss(logits, jnp.array([[2, 3, 0]]), nt, reduction="sum")), 4)
      0.2727
    """
    number_loss = ntl.number_level(float_level=float_level, max_number_length=max_number_length,
                                        reweigh=reweigh)
    return number_token_loss(logits, targets, number_tokens, weights=weights, reduction=reduction,
                             number_loss=number_loss)


def predict_numbers(logits: ArrayLike, number_tokens: NumberTokens) -> tuple[jax.Array, jax.Array]:
    """The expected number-token value and the number-token mass at every position.

    Args:
      logits: `[batch, length, vocab]` floating.
      number_tokens: the vocabulary's `NumberTokens`.

    Returns:
      `(value, number_mass)`, both `[batch, length]` float32: `sum_j p_j v_j` with `p`
      the softmax over the number tokens only, and the full-vocabulary softmax
      probability on number tokens.

    Examples:
      >>> import jax.numpy as jnp
      >>> nt = NumberTokens.from_pieces(["a", "0", "1", "2"])
      >>> value, mass = predict_numbers(jnp.log(jnp.array([[[0.5, 0.25, 0.0, 0.25]]]) + 1e-30), nt)
      >>> round(float(value[0, 0]), 4), round(float(mass[0, 0]), 4)
      (1.0, 0.5)
    """
    checks.check_logits_and_targets(logits, None, number_tokens)
    everywhere = jnp.zeros(jnp.shape(logits)[:2], jnp.int32)  # every position kept; the ids are not read
    target = number_target(everywhere, None, jnp.shape(logits)[-1], number_tokens)
    head = head_stats.from_logits(logits, target, number_tokens, NumberReads(means=(expected_value,)),
                                  with_masses=True)
    return head.numbers.means[expected_value], head.masses[0]
