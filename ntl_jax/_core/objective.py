"""The training objective, assembled top-down: `CE + ntl_weight * NTL` with T5X's
weighting, from the logits (`cross_entropy_and_ntl`) or from the decoder's hidden states
without forming the logits (`fused_cross_entropy_and_ntl`).

Both entries run the same steps: check the inputs once (`checks`), resolve the weights
and the loss-normalising factor (`normalization`), build the labels (`targets`), take
the head's statistics (`head_stats` from the logits, `fused` from the hidden states),
and assemble the cross-entropy (`cross_entropy`) and the number loss (`variants`) from
them (`objective_from_head`). T5X's semantics exactly
(`t5x.losses.compute_weighted_cross_entropy`), so the same arithmetic serves the T5X
model subclass, the trainer and a user's own optax step. The paper trains on
`CE + 0.3 * NTL`.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from ntl_jax._core import checks, cross_entropy, fused, head_stats, normalization, variants, vocab_parallel
from ntl_jax._core.head_stats import HeadStats
from ntl_jax._core.number_stats import NumberReads, expected_value
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.options import Options
from ntl_jax._core.targets import NumberTarget, number_target


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
    formulation: str = "auto",
    max_number_length: int | None = None,
    smmd_mode: str | None = None,
    smmd_sigma: float | None = None,
    smmd_alpha: float | None = None,
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
        `"was_cdf"`, or NTL's successors `"del"` (DEL), `"dist2"` (DIST²) and `"smmd"` (SMMD), see
        `number_token_loss`; a function `(prediction, target) -> loss` for NTL-L_p with that
        loss (see `ntl_dot`); or `"none"` for cross-entropy without computing NTL.
      ntl_weight: lambda, 0.3 in the paper.
      reweigh: see `ntl_was`; the paper does not reweigh (ntloss defaults to True).
      squash_factor: see `ntl_was`; only with `ntl_kind="was"` or `"smmd"` (see
        `number_token_loss`).
      label_smoothing, z_loss: as T5X's cross-entropy.
      gce_sigma: Gaussian-smoothed cross-entropy (GCE), the paper's baseline: at a
        number target of value `y` the label is `q_j ~ exp(-(v_j - y)^2 / (2
        sigma^2))` over the number tokens writing as many digits as the target (all
        the digits on single-digit tables; see `targets.gaussian_label`), and the
        cross-entropy is `-sum_j q_j log p_j` with `p` the full-vocabulary softmax. As
        in the authors' `GaussianLabelSmoother`, the entropy of `q` is not subtracted
        (T5X's label smoothing subtracts it), so a perfect prediction costs `H(q)`.
        Other targets, and number tokens with a sign, point or exponent, keep their
        one-hot. 0 (default) is the plain cross-entropy; exclusive with
        `label_smoothing`. `ntl_kind="was_cdf"` scores against this label too.
      loss_normalizing_factor: None, a number, or a special factor (string or enum):
        see `loss_normalizing_factor_and_weights`.
      decoder_segment_ids, decoder_positions: for packed batches.
      formulation: how the number statistics are computed: "auto" (each backend's
        own: the number columns on the CPU, with their gradient gathered back on GPUs,
        masked reductions over the vocabulary on the TPU), or "columns", "gathered",
        "reductions" on every backend. The same numbers to float32 rounding; only what
        the compiled program moves differs (docs/performance.md).
      max_number_length: with `ntl_kind="number_level"` or `"number_level_float"`, the
        most places a number has (None: ntloss's 20), see `number_level_loss`.
      smmd_mode, smmd_sigma, smmd_alpha: with `ntl_kind="smmd"`, SMMD's terms, kernel
        width and smoothness weight (None: the authors' defaults), see `number_token_loss`.

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
                      label_smoothing=label_smoothing, z_loss=z_loss, gce_sigma=gce_sigma, formulation=formulation,
                      max_number_length=max_number_length, smmd_mode=smmd_mode, smmd_sigma=smmd_sigma,
                      smmd_alpha=smmd_alpha)
    weights = checks.check_logits_and_targets(logits, targets, number_tokens, weights)
    checks.check_objective(number_tokens, options, targets, loss_normalizing_factor, decoder_segment_ids,
                           decoder_positions)
    vocab = jnp.shape(logits)[-1]
    weights, factor = normalization.resolve_weights_and_factor(
        targets, weights, vocab, loss_normalizing_factor,
        decoder_segment_ids=decoder_segment_ids, decoder_positions=decoder_positions,
    )
    target = number_target(targets, weights, vocab, number_tokens, gce_sigma=options.gce_sigma)
    head = head_stats.from_logits(logits, target, number_tokens, number_reads(options), formulation=formulation,
                                  label_smoothing=label_smoothing, reweigh=reweigh)
    return objective_from_head(head, target, weights, factor, number_tokens, options, vocab=vocab)


def fused_cross_entropy_and_ntl(
    hidden: ArrayLike,
    kernel: ArrayLike,
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
    chunk_size: int | None = None,
    vocab_axis: str | None = None,
    sequence_parallel: bool = False,
    mesh=None,
    max_number_length: int | None = None,
    smmd_mode: str | None = None,
    smmd_sigma: float | None = None,
    smmd_alpha: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`cross_entropy_and_ntl(hidden @ kernel, ...)` without the logits in memory.

    The same loss and parts (to float32 rounding), and the same gradients with respect
    to `hidden` and `kernel`, while the largest temporary is one `[batch * length,
    chunk_size]` float32 block instead of several `[batch, length, vocab]` ones. The
    backward pass recomputes each chunk's logits (one more matmul than the unfused
    path).

    Args:
      hidden: `[batch, length, d_model]` floating, the decoder's output before the
        logits projection (after its final norm and dropout).
      kernel: `[d_model, vocab]` floating, the projection (T5.1.1's `logits_dense`
        kernel). With logits tied to the embedding (`logits_via_embedding`), pass the
        embedding table transposed, `embedding.T`, and fold T5's `1/sqrt(d_model)`
        logit scaling into `hidden` (`hidden / jnp.sqrt(d_model)`): the logits are
        linear in both.
      targets, number_tokens: as in `cross_entropy_and_ntl`; the kernel has a column
        per id of `number_tokens`' vocabulary, or more (ids beyond it are no numbers).
        Targets outside `[0, kernel.shape[1])` are ignored without an error (T5X's
        rule); `check_targets(targets, kernel.shape[1])` raises for them instead.
      weights: and the other options (`ntl_kind`, `ntl_weight`, `reweigh`, `squash_factor`,
        `label_smoothing`, `z_loss`, `gce_sigma`, `loss_normalizing_factor`,
        `decoder_segment_ids`, `decoder_positions`, `max_number_length`, `smmd_mode`, `smmd_sigma`,
        `smmd_alpha`): exactly as in `cross_entropy_and_ntl`
        (Gaussian smoothing needs only the number tokens' logits, which the head computes
        anyway): with `weights=None` pad targets count unless the factor is a special one.
      chunk_size: vocabulary columns per chunk (per device when sharded); None picks
        about 8M logits per chunk (`default_chunk_size`), and with `vocab_axis` the
        same number of chunks, each over a device's share of the columns and tokens.
        Any size works.
      vocab_axis: the name of the mesh axis the kernel's columns are sharded over
        (T5X: `"model"`), for vocabulary-parallel training: each device streams only
        its own columns, the per-token statistics are combined across the axis (a
        maximum and a sum), the `d_model x n` number-token columns are summed to every
        device, and the backward pass writes each device's slice of the kernel's
        gradient; the kernel is never gathered. The mesh's other axes shard the tokens
        (hidden states on the batch axis). The vocabulary must divide by the axis size.
        None (default): no mesh needed; under `jit` with sharded inputs XLA partitions
        the computation itself, gathering the kernel.
      sequence_parallel: with `vocab_axis`, whether `hidden` arrives with its sequence
        split over `vocab_axis` too (`P(batch axes, vocab_axis, None)`, Megatron-LM's
        sequence parallelism): each device gathers its batch shard's whole sequence
        inside the head and gets back its own part of the hidden states' gradient (a
        reduce-scatter where the default sums it to every device), so neither the
        hidden states nor their gradient are held whole per device outside the head.
        The length must divide by the axis size.
      mesh: the `jax.sharding.Mesh` for `vocab_axis`; None takes the mesh in context
        (`with mesh:`, as T5X's partitioner runs, or `jax.set_mesh`).

    Mixed dtypes are promoted (`jnp.result_type(hidden, kernel)`); products accumulate
    in float32 and no float32 `[batch, length, vocab]` array is formed.

    Returns:
      `(loss, parts)` as `cross_entropy_and_ntl`.

    Examples:
      >>> import jax.numpy as jnp
      >>> nt = NumberTokens.from_pieces(["<pad>", "</s>", "0", "1", "2"])
      >>> hidden, kernel = jnp.ones((1, 2, 3)), jnp.zeros((3, 5))
      >>> loss, parts = fused_cross_entropy_and_ntl(hidden, kernel, jnp.array([[3, 1]]), nt,
      ...     loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
      >>> round(float(parts["cross_entropy"]), 4), round(float(parts["ntl"]), 4)  # log 5; (2/3)/2
      (1.6094, 0.3333)
    """
    options = Options(ntl_kind=ntl_kind, ntl_weight=ntl_weight, reweigh=reweigh, squash_factor=squash_factor,
                      label_smoothing=label_smoothing, z_loss=z_loss, gce_sigma=gce_sigma,
                      max_number_length=max_number_length, smmd_mode=smmd_mode, smmd_sigma=smmd_sigma,
                      smmd_alpha=smmd_alpha)
    weights = checks.check_hidden_and_kernel(hidden, kernel, targets, number_tokens, weights, chunk_size)
    checks.check_objective(number_tokens, options, targets, loss_normalizing_factor, decoder_segment_ids,
                           decoder_positions)
    vocab = jnp.shape(kernel)[1]
    weights, factor = normalization.resolve_weights_and_factor(
        targets, weights, vocab, loss_normalizing_factor,
        decoder_segment_ids=decoder_segment_ids, decoder_positions=decoder_positions,
    )
    target = number_target(targets, weights, vocab, number_tokens, gce_sigma=options.gce_sigma)
    shards = vocab_parallel.vocab_shards(vocab_axis, mesh, vocab, jnp.shape(hidden)[0], jnp.shape(hidden)[1],
                                         sequence_parallel)
    head, _ = fused.head_stats_from_hidden(hidden, kernel, target, number_tokens, number_reads(options),
                                           label_smoothing=label_smoothing, reweigh=reweigh, chunk_size=chunk_size,
                                           shards=shards)
    return objective_from_head(head, target, weights, factor, number_tokens, options, vocab=vocab)


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
    checks.check_integer_targets(targets)
    checks.check_segments(targets, decoder_segment_ids, decoder_positions)
    checks.check_loss_normalizing_factor(loss_normalizing_factor)
    return normalization.resolve(normalization.special_factor(loss_normalizing_factor), loss_normalizing_factor,
                                 targets, weights, decoder_segment_ids, decoder_positions)


def number_reads(options: Options, *, with_value: bool = False) -> NumberReads | None:
    """What the objective reads of the number tokens' logits: the number loss's own, the
    GCE label's sum, the expected value (`with_value`, for metrics); None when nothing
    (cross-entropy alone)."""
    if options.variant is None and not (options.smoothed or options.reweigh or with_value):
        return None
    reads = NumberReads(means=(expected_value,)) if with_value else NumberReads()
    if options.variant is not None:
        reads |= options.variant.reads
    if options.smoothed:
        reads |= cross_entropy.GCE_READS
    return reads


def objective_from_head(head: HeadStats, target: NumberTarget, weights, factor, number_tokens: NumberTokens,
                        options: Options, *, vocab: int):
    """`(loss, parts)` of the objective from the head's statistics over a `vocab`-wide
    output; `weights` resolved, `factor` the resolved loss-normalising factor (None: a
    plain sum); `weights` are 0 wherever `target.keep` is False, as resolved."""
    ce, z, weight_sum = cross_entropy.weighted_sums(
        head, target, weights, vocab, label_smoothing=options.label_smoothing, z_loss=options.z_loss,
        loss_normalizing_factor=factor,
    )
    variant = options.variant
    if variant is None:
        ntl = ntl_weight_sum = jnp.float32(0.0)
    else:
        per_position, counted = variant.loss(head.numbers, target, number_tokens)
        if head.masses is not None:
            per_position = variants.reweigh(per_position, head.masses, variant, number_tokens)
        counted_weights = jnp.where(counted, weights, 0.0)
        ntl = jnp.sum(jnp.where(counted, per_position, 0.0) * counted_weights)
        ntl_weight_sum = jnp.sum(counted_weights)
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
