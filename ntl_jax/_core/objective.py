"""The training objective: T5X cross-entropy plus a weighted Number Token Loss.

Pure functions with T5X's exact semantics (`t5x.losses.compute_weighted_cross_entropy`
and `get_loss_normalizing_factor_and_weights`), so the same arithmetic serves the T5X
model subclass, the single-machine trainer and a user's own optax step, and is tested
without t5x installed. The paper trains on `CE + 0.3 * NTL`.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from ntl_jax._core import losses
from ntl_jax._core.number_stats import VALUE, NumberStats
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.options import Options


class LossNormalizingFactor(enum.Enum):
    """T5X's `SpecialLossNormalizingFactor`, by the same names and values."""

    NUM_REAL_TARGET_TOKENS = 1
    NUM_TOTAL_TARGET_TOKENS = 2
    AVERAGE_PER_SEQUENCE = 3


def _special_factor(factor: Any) -> LossNormalizingFactor | None:
    """The special factor named by a string or an enum member (ours or T5X's), else None."""
    if isinstance(factor, str):
        name = factor.upper()
    elif isinstance(factor, enum.Enum):
        name = factor.name
    else:
        return None
    try:
        return LossNormalizingFactor[name]
    except KeyError:
        choices = ", ".join(m.name for m in LossNormalizingFactor)
        raise ValueError(
            f"expected loss_normalizing_factor None, a number or one of {choices}; got {factor!r}"
        ) from None


def _sum_weights_per_segment(positions, segment_ids, weights):
    """Total weight of the packed segment each position belongs to (one row).

    A port of T5X's `_sum_weights_per_segment`: segments start where `positions == 0`,
    padding (`segment_ids == 0`) is assumed to come only at the end of a row.
    """

    def repeat_last_nonzero(xs, reverse=False):
        def step(prev, x):
            y = jnp.where(x == 0, prev, x)
            return y, y

        return jax.lax.scan(step, jnp.zeros_like(xs[0]), xs, reverse=reverse)[1]

    starts = positions == 0
    final = jnp.concatenate([starts[1:], jnp.ones(1, dtype=bool)]) & (segment_ids != 0)
    final_cumulative = jnp.where(final, jnp.cumsum(weights), 0.0)
    final_totals = jnp.concatenate(
        [final_cumulative[:1], jnp.diff(repeat_last_nonzero(final_cumulative))]
    )
    return repeat_last_nonzero(final_totals, reverse=True)


def loss_normalizing_factor_and_weights(
    loss_normalizing_factor,
    targets,
    weights=None,
    *,
    decoder_segment_ids=None,
    decoder_positions=None,
):
    """Resolves a loss-normalising factor into a number and the effective weights.

    T5X's `get_loss_normalizing_factor_and_weights`: None or a number pass through
    (with `weights` unchanged, possibly None). A special factor, given as its name
    (case-insensitive) or as an enum member, makes weights default to
    `targets > 0` and then:

    - `NUM_REAL_TARGET_TOKENS`: factor = sum of the weights;
    - `NUM_TOTAL_TARGET_TOKENS`: factor = batch x length (padding included);
    - `AVERAGE_PER_SEQUENCE`: each weight is divided by its sequence's total weight
      (per packed segment when `decoder_segment_ids` is given, using
      `decoder_positions`), 0/0 giving 0; factor = the sum of the new weights.

    A special factor can come out 0 (all weights 0, or an empty batch);
    `cross_entropy_and_ntl` then divides by 1, so the loss is 0, not NaN. A number
    must be finite and > 0 (checked when it is a Python value or a concrete array).

    Args:
      loss_normalizing_factor: None, a number, a string or an enum member.
      targets: `[batch, length]` integer target tokens (padding id 0).
      weights: optional `[batch, length]` loss weights (`decoder_loss_weights`).
      decoder_segment_ids: `[batch, length]` for packed batches, else None.
      decoder_positions: `[batch, length]`, required with `decoder_segment_ids`.

    Returns:
      `(factor, weights)`.

    Raises:
      TypeError, ValueError: for a factor that is no number, string or enum member, a
        number that is not finite and > 0, or segment features of the wrong shape.

    Examples:
      >>> import jax.numpy as jnp
      >>> factor, w = loss_normalizing_factor_and_weights(
      ...     "AVERAGE_PER_SEQUENCE", jnp.array([[5, 6, 1, 0], [7, 1, 0, 0]]))
      >>> float(factor), w.tolist()
      (2.0, [[0.3333333432674408, 0.3333333432674408, 0.3333333432674408, 0.0], [0.5, 0.5, 0.0, 0.0]])
    """
    losses.check_array("targets", targets, "[batch, length]")
    targets_shape = jnp.shape(targets)
    for name, value in (("decoder_segment_ids", decoder_segment_ids), ("decoder_positions", decoder_positions)):
        if value is None:
            continue
        losses.check_array(name, value, "[batch, length]")
        if jnp.shape(value) != targets_shape:
            raise ValueError(
                f"expected {name} of shape {targets_shape} [batch, length] (as targets), got {jnp.shape(value)}"
            )
    special = _special_factor(loss_normalizing_factor)
    if special is None:
        if loss_normalizing_factor is not None and not isinstance(
            loss_normalizing_factor, (int, float, np.number, jax.Array, np.ndarray)
        ):
            raise TypeError(
                "expected loss_normalizing_factor None, a number, a string or an enum member; "
                f"got {type(loss_normalizing_factor).__name__}"
            )
        if loss_normalizing_factor is not None:
            losses.check_real("loss_normalizing_factor", loss_normalizing_factor, low=0.0, low_inclusive=False)
        return loss_normalizing_factor, weights
    if weights is None:
        weights = jnp.asarray(targets > 0, jnp.float32)
    weights = jnp.asarray(weights, jnp.float32)
    if special is LossNormalizingFactor.NUM_REAL_TARGET_TOKENS:
        return jnp.sum(weights), weights
    if special is LossNormalizingFactor.NUM_TOTAL_TARGET_TOKENS:
        return int(np.prod(jnp.shape(targets))), weights
    if decoder_segment_ids is not None:
        if decoder_positions is None:
            raise ValueError("expected decoder_positions with decoder_segment_ids (a packed batch), got None")
        per_sequence = jax.vmap(_sum_weights_per_segment)(decoder_positions, decoder_segment_ids, weights)
    else:
        per_sequence = jnp.sum(weights, axis=-1, keepdims=True)
    # 0/0 gives 0, without a NaN on the way (it would reach the gradient).
    nonzero = per_sequence != 0
    weights = jnp.where(nonzero, weights / jnp.where(nonzero, per_sequence, 1.0), 0.0)
    return jnp.sum(weights), weights


class HeadStats(NamedTuple):
    """What every term of the objective needs from the `[batch, length, vocab]` logits,
    per position (all float32): the cross-entropy, z-loss and every NTL variant are
    functions of these, so the logits themselves can be streamed (`fused.py`).

    - `log_normalizer`: `logsumexp(logits)` over the vocabulary, `[batch, length]`;
    - `target_logit`: the target's logit (0 where the target is outside the vocabulary);
    - `logit_sum`: the sum of the logits over the vocabulary (label smoothing only, else None);
    - `numbers`: the number tokens' statistics (`NumberStats`: what the NTL variant
      reads, the value for metrics, `label_logit` for GCE), or None (cross-entropy only);
    - `masses`: `(mass, rest)`, the probability on number tokens and on the others
      (`reweigh` only, else None).
    """

    log_normalizer: jax.Array
    target_logit: jax.Array
    logit_sum: jax.Array | None
    numbers: NumberStats | None
    masses: tuple | None


def _target_logit(wide, targets, logits):
    vocab = wide.shape[-1]
    in_vocab = losses.in_vocabulary(targets, vocab)
    return jnp.where(in_vocab, losses.take_target_logit(wide, jnp.where(in_vocab, targets, 0), logits), 0.0)


def _cross_entropy_per_position(head: HeadStats, targets, vocab: int, *, label_smoothing, z_loss, label=None):
    """T5X's per-token cross-entropy with label smoothing and z-loss, without
    materialising the one-hot soft targets: `lse * sum(q) - sum(q * logits) - H(q)`.

    `label`: `(smoothed, q)` of `losses.target_distribution` for Gaussian smoothing
    (GCE): at the `smoothed` positions the cross-entropy is `lse - sum_j q_j *
    number_logit_j` over the number tokens, without subtracting `H(q)` (as the authors'
    `GaussianLabelSmoother`); elsewhere it is unchanged."""
    confidence = 1.0 - label_smoothing
    low = (1.0 - confidence) / (vocab - 1)
    normalizing_constant = -(confidence * np.log(confidence) + (vocab - 1) * low * np.log(low + 1e-20))
    in_vocab = losses.in_vocabulary(targets, vocab)
    on = jnp.where(in_vocab, confidence, 0.0)
    if low > 0:
        mass = on + low * (vocab - in_vocab)
        weighted_logits = on * head.target_logit + low * (head.logit_sum - head.target_logit)
    else:
        mass, weighted_logits = on, on * head.target_logit
    z_term = z_loss * jnp.square(head.log_normalizer)
    ce = head.log_normalizer * mass - weighted_logits - normalizing_constant
    if label is not None:
        smoothed, _ = label
        # Sanitised first: q is 0 outside the smoothed rows, so this is finite everywhere.
        ce = jnp.where(smoothed, head.log_normalizer - head.numbers.label_logit, ce)
    return ce + z_term, z_term


def head_stats(logits, targets, keep, number_tokens, *, label_smoothing, reweigh, ntl_kind=None, squash_factor=None,
               label=None, with_numbers=True, log_normalizer=None):
    """`HeadStats` of the logits (any float dtype) at the positions `keep` (`[batch,
    length]` bool; the targets -1 elsewhere); `with_numbers=False` leaves out the
    number tokens' statistics (cross-entropy only), else they hold what `ntl_kind`
    reads (None: none), the expected value, and `label_logit` for a GCE `label`.
    `log_normalizer` may be given; else it is computed, with reweigh from the same
    sums as the number mass.

    Every statistic reads the logits widened to float32, a conversion XLA fuses into
    each pass rather than a copy, so the gradients of all of them add up in float32 and
    are rounded to the logits' dtype once. Whatever the logits hold at the positions
    not kept (NaN, inf) reaches no statistic and no gradient: each statistic is masked
    where it is `[batch, length]` or `[batch, length, N]`, and the gradients that read
    the logits select it away. Each gradient is elementwise (the target's is a select,
    the number statistics' see `number_stats`), so XLA computes the whole logits
    gradient in one fused pass."""
    wide = logits.astype(jnp.float32)
    numbers = None
    if with_numbers or reweigh:
        numbers = losses.variant_stats(ntl_kind, wide, keep, targets, number_tokens, squash_factor=squash_factor,
                                       label=label, reads=(VALUE,), logits=logits)
    masses = None
    if reweigh:
        log_normalizer, masses = losses.number_mass(wide, numbers, keep, logits=logits)
        log_normalizer = jnp.where(keep, log_normalizer, 0.0)
    elif log_normalizer is None:
        log_normalizer = losses.log_normalizer(wide, keep, logits=logits)
    # The sum's gradient does not read the logits, so masking its value is enough.
    logit_sum = jnp.where(keep, jnp.sum(wide, axis=-1), 0.0) if label_smoothing > 0 else None
    return HeadStats(
        log_normalizer=log_normalizer,
        target_logit=_target_logit(wide, targets, logits),
        logit_sum=logit_sum,
        numbers=numbers,
        masses=masses,
    )


def weighted_cross_entropy(
    logits: ArrayLike, targets: ArrayLike, *, weights: ArrayLike | None = None, label_smoothing: float = 0.0,
    z_loss: float = 0.0, loss_normalizing_factor=None, log_normalizer: ArrayLike | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """T5X's `compute_weighted_cross_entropy`, computed in float32.

    Args:
      logits: `[batch, length, vocab]` floating.
      targets: `[batch, length]` integer.
      weights: optional `[batch, length]`; without it every position counts, pad
        targets (id 0) included.
      label_smoothing: T5X's label smoothing (true class `1 - ls`, the rest share `ls`).
      z_loss: coefficient of the auxiliary `logsumexp(logits)^2` term.
      loss_normalizing_factor: a number (resolve special factors first with
        `loss_normalizing_factor_and_weights`) or None for a plain sum.
      log_normalizer: optional precomputed `logsumexp(logits, -1)`.

    Positions with weight 0, and positions whose target id is outside `[0, vocab)`,
    are ignored: they add exactly 0 whatever their logits hold and do not count in
    `weight_sum` (T5X's rule, without an error; `check_targets(targets, vocab)` raises
    for such ids instead). Options and concrete weights are checked when traced; under `jit`
    the weights are assumed finite and non-negative.

    Returns:
      `(loss, z_loss, weight_sum)`: the weighted, normalised sums; `loss` includes
      the z-loss term.

    Examples:
      >>> import jax.numpy as jnp
      >>> loss, z, n = weighted_cross_entropy(jnp.zeros((1, 2, 4)), jnp.array([[1, 2]]))
      >>> round(float(loss), 4), float(z), int(n)  # 2 * log(4)
      (2.7726, 0.0, 2)
    """
    losses.check_array("logits", logits, "[batch, length, vocab]")
    losses.check_array("targets", targets, "[batch, length]")
    if jnp.ndim(logits) != jnp.ndim(targets) + 1:
        raise ValueError(
            f"expected logits of rank targets.ndim + 1, got logits {jnp.shape(logits)} and targets {jnp.shape(targets)}"
        )
    if jnp.shape(logits)[:-1] != jnp.shape(targets):
        raise ValueError(
            f"expected targets of shape {jnp.shape(logits)[:-1]} (logits' leading axes), got {jnp.shape(targets)}"
        )
    if not jnp.issubdtype(jnp.result_type(logits), jnp.floating):
        raise TypeError(f"expected floating-point logits (f32, bf16 or f16), got {jnp.result_type(logits)}")
    if not jnp.issubdtype(jnp.result_type(targets), jnp.integer):
        raise TypeError(f"expected integer targets (token ids), got {jnp.result_type(targets)}")
    Options(ntl_kind="none", label_smoothing=label_smoothing, z_loss=z_loss)  # checks them
    if loss_normalizing_factor is not None:
        losses.check_real("loss_normalizing_factor", loss_normalizing_factor, low=0.0, low_inclusive=False)
    weights = losses.check_weights(weights, jnp.shape(targets))
    vocab = jnp.shape(logits)[-1]
    keep, kept_targets = losses.keep_positions(targets, weights, vocab)
    weights = jnp.where(keep, 1.0 if weights is None else weights, 0.0)
    if log_normalizer is not None:
        log_normalizer = jnp.where(keep, log_normalizer, 0.0)
    head = head_stats(logits, kept_targets, keep, None, log_normalizer=log_normalizer,
                      label_smoothing=label_smoothing, reweigh=False, with_numbers=False)
    return _weighted_cross_entropy_sums(
        head, targets, weights, vocab, label_smoothing=label_smoothing, z_loss=z_loss,
        loss_normalizing_factor=loss_normalizing_factor,
    )


def _weighted_cross_entropy_sums(head, targets, weights, vocab, *, label_smoothing, z_loss, loss_normalizing_factor,
                                 label=None):
    """`weighted_cross_entropy` from the head's statistics, on checked inputs whose
    ignored positions are sanitised (statistics finite) and weighted 0; `label` as in
    `_cross_entropy_per_position`."""
    total, z_term = _cross_entropy_per_position(
        head, targets, vocab, label_smoothing=label_smoothing, z_loss=z_loss, label=label,
    )
    total, z_term = total * weights, z_term * weights
    weight_sum = jnp.sum(weights)
    if loss_normalizing_factor is not None:
        total, z_term = total / loss_normalizing_factor, z_term / loss_normalizing_factor
    return jnp.sum(total), jnp.sum(z_term), weight_sum


def cross_entropy_and_ntl(
    logits: ArrayLike,
    targets: ArrayLike,
    number_tokens: NumberTokens,
    *,
    weights: ArrayLike | None = None,
    ntl_kind: str | Callable = "was",
    ntl_weight: float = 0.3,
    reweigh: bool = False,
    squash_factor: float | None = None,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    gce_sigma: float = 0.0,
    loss_normalizing_factor=None,
    decoder_segment_ids=None,
    decoder_positions=None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The paper's training objective `CE + ntl_weight * NTL`, with T5X's weighting.

    Both terms use the same effective weights and are divided by the same resolved
    loss-normalising factor, so `ntl_weight` means the same thing under every factor,
    packed or not. With `ntl_weight=0` this is exactly T5X's stock loss, and NTL is
    still computed and reported in `parts` (the cross-entropy baseline's diagnostic);
    `ntl_kind="none"` skips computing it. Pad targets count unless `weights` or a
    special `loss_normalizing_factor` leaves them out (see `weights`).

    Args:
      logits: `[batch, length, vocab]` floating; `vocab` may exceed the table of
        `number_tokens` (a network's rounded-up vocabulary): those ids are no numbers.
      targets: `[batch, length]` integer. Ids outside `[0, vocab)` are ignored
        without an error (T5X's rule); `check_targets(targets, vocab)` raises for them
        instead (under `jit` through `jax.experimental.checkify`).
      number_tokens: the output vocabulary's `NumberTokens`.
      weights: optional `[batch, length]` loss weights (`decoder_loss_weights`).
        **Padding counts unless you say otherwise.** With `weights=None` every target
        in `[0, vocab)` counts, the pad id 0 included: in a padded batch the
        cross-entropy trains the model to predict the padding, and
        `parts["weight_sum"]` counts the pads. Only a special
        `loss_normalizing_factor` (a name such as `"NUM_REAL_TARGET_TOKENS"`) makes
        the default `targets > 0` (T5X's rule; a number or None does not). In your own
        optax step, pass `weights=(targets > 0)` (or your padding mask), or a special
        factor.
      ntl_kind: the NTL variant: `"was"` (the paper's default),
        `"mse"`, `"mae"`, `"huber"`, `"number_level"`, `"number_level_float"`,
        `"was_cdf"`; a function `(prediction, target) -> loss` for NTL-L_p with that
        loss (see `ntl_dot`); or `"none"` for cross-entropy without computing NTL.
      ntl_weight: lambda, 0.3 in the paper.
      reweigh: see `ntl_was`; the paper does not reweigh (ntloss defaults to True).
      squash_factor: see `ntl_was`; only with `ntl_kind="was"`.
      label_smoothing, z_loss: as T5X's cross-entropy.
      gce_sigma: Gaussian-smoothed cross-entropy (GCE), the paper's baseline: at a
        number target of value `y` the label is `q_j ~ exp(-(v_j - y)^2 / (2
        sigma^2))` over the number tokens writing as many digits as the target (all
        the digits on single-digit tables; see `losses.target_distribution`), and the
        cross-entropy is `-sum_j q_j log p_j` with `p` the full-vocabulary softmax. As
        in the authors' `GaussianLabelSmoother`, the entropy of `q` is not subtracted
        (T5X's label smoothing subtracts it), so a perfect prediction costs `H(q)`.
        Other targets, and number tokens with a sign, point or exponent, keep their
        one-hot. 0 (default) is the plain cross-entropy; exclusive with
        `label_smoothing`. `ntl_kind="was_cdf"` scores against this label too.
      loss_normalizing_factor: None, a number, or a special factor (string or enum):
        see `loss_normalizing_factor_and_weights`.
      decoder_segment_ids, decoder_positions: for packed batches.

    Returns:
      `(loss, parts)`: the scalar loss to differentiate, and a dict of float32
      scalars for logging: `cross_entropy` (without the z-term; with `gce_sigma`, the
      smoothed one), `z_loss`, `ntl` (normalised, before `ntl_weight`), `weight_sum`,
      `ntl_weight_sum` (weight on the positions NTL counts) and
      `loss_normalizing_factor` (1 when None).

    Examples:
      >>> import jax.numpy as jnp
      >>> nt = NumberTokens.from_pieces(["<pad>", "</s>", "0", "1", "2"])
      >>> logits = jnp.zeros((1, 2, 5))
      >>> loss, parts = cross_entropy_and_ntl(logits, jnp.array([[3, 1]]), nt,
      ...                                     loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
      >>> round(float(parts["cross_entropy"]), 4), round(float(parts["ntl"]), 4)  # log 5; (2/3)/2
      (1.6094, 0.3333)
      >>> loss, parts = cross_entropy_and_ntl(logits, jnp.array([[3, 1]]), nt, gce_sigma=1.0, ntl_kind="was_cdf",
      ...                                     loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
      >>> round(float(parts["cross_entropy"]), 4)  # the label on "1" is (e^-.5, 1, e^-.5) / (1 + 2 e^-.5): log 5 again
      1.6094
    """
    options = Options(ntl_kind=ntl_kind, ntl_weight=ntl_weight, reweigh=reweigh, squash_factor=squash_factor,
                      label_smoothing=label_smoothing, z_loss=z_loss, gce_sigma=gce_sigma)
    weights = losses.check_inputs(logits, targets, number_tokens, weights)
    vocab = jnp.shape(logits)[-1]
    weights, factor = resolve_weights_and_factor(
        targets, weights, vocab, loss_normalizing_factor,
        decoder_segment_ids=decoder_segment_ids, decoder_positions=decoder_positions,
    )
    head, targets = logits_head_stats(logits, targets, weights, number_tokens, options)
    return objective_from_head(head, targets, weights, factor, number_tokens, options, vocab=vocab)


def logits_head_stats(logits, targets, weights, number_tokens: NumberTokens, options: Options, *,
                      with_numbers=None):
    """`(HeadStats, targets)` of checked logits under resolved `weights`, the targets -1
    at ignored positions (weight 0, or outside the logits' vocabulary), with the number
    statistics that `options.ntl_kind` (`"none"`: none) and the GCE label read;
    `with_numbers` True keeps the number statistics for metrics even without them,
    None only when they are read."""
    # Ignored positions: their targets become -1 (no number, no digit), and NaN or inf
    # in their logits reach neither the loss nor the gradient (see `head_stats`).
    keep, targets = losses.keep_positions(targets, weights, jnp.shape(logits)[-1])
    label = losses.gaussian_label(targets, number_tokens, options.gce_sigma) if options.smoothed else None
    head = head_stats(
        logits, targets, keep, number_tokens, label_smoothing=options.label_smoothing, reweigh=options.reweigh,
        ntl_kind=options.variant, squash_factor=options.squash_factor, label=label,
        with_numbers=(options.variant is not None or options.smoothed) if with_numbers is None else with_numbers,
    )
    return head, targets


def resolve_weights_and_factor(targets, weights, vocab: int, loss_normalizing_factor, *,
                               decoder_segment_ids=None, decoder_positions=None):
    """`(weights, factor)` as `cross_entropy_and_ntl` uses them: targets outside the
    vocabulary weighted 0 before anything is counted, then T5X's resolution of the
    factor; a special factor that comes out 0 (nothing counted) becomes 1, so every
    sum is 0 rather than NaN. `weights` comes out float32 `[batch, length]`."""
    special = _special_factor(loss_normalizing_factor)
    if weights is None and special is not None:
        weights = jnp.asarray(targets > 0, jnp.float32)  # T5X's default for special factors
    in_vocab = losses.in_vocabulary(targets, vocab)
    weights = jnp.where(in_vocab, 1.0 if weights is None else weights, 0.0)
    factor, weights = loss_normalizing_factor_and_weights(
        loss_normalizing_factor, targets, weights,
        decoder_segment_ids=decoder_segment_ids, decoder_positions=decoder_positions,
    )
    if special is not None:
        factor = max(factor, 1) if isinstance(factor, int) else jnp.where(factor > 0, factor, 1.0)
    return weights, factor


def objective_from_head(head: HeadStats, targets, weights, factor, number_tokens: NumberTokens, options: Options, *,
                        vocab: int):
    """`(loss, parts)` of `cross_entropy_and_ntl` from the head's statistics over a
    `vocab`-wide output, with ignored positions already sanitised (target -1, weight 0).
    With `options.gce_sigma` > 0 the label over the number tokens (`[batch, length, N]`, no
    logits read) serves NTL-WAS-CDF and marks the smoothed positions, where the
    cross-entropy reads the head's `numbers.label_logit`."""
    label = losses.target_distribution(targets, number_tokens, options.gce_sigma) if options.smoothed else None
    ce, z, weight_sum = _weighted_cross_entropy_sums(
        head, targets, weights, vocab, label_smoothing=options.label_smoothing, z_loss=options.z_loss,
        loss_normalizing_factor=factor, label=label,
    )
    if options.variant is None:
        ntl = ntl_weight_sum = jnp.float32(0.0)
    else:
        per_position, counted = losses.ntl_per_position(
            head.numbers, targets, number_tokens, kind=options.variant, masses=head.masses,
            squash_factor=options.squash_factor, distribution=None if label is None else label[1],
        )
        per_token = losses.reduce_loss(per_position, counted, weights, "none")
        ntl = jnp.sum(per_token)
        ntl_weight_sum = jnp.sum(jnp.where(counted, weights, 0.0))
        if factor is not None:
            ntl = ntl / factor
    loss = ce + options.ntl_weight * ntl
    parts = {
        "loss": loss,
        "cross_entropy": ce - z,
        "z_loss": z,
        "ntl": ntl,
        "weight_sum": jnp.asarray(weight_sum, jnp.float32),
        "ntl_weight_sum": jnp.asarray(ntl_weight_sum, jnp.float32),
        "loss_normalizing_factor": jnp.asarray(1.0 if factor is None else factor, jnp.float32),
    }
    return loss, parts
