"""T5X models trained with cross-entropy plus the Number Token Loss.

`NTLEncoderDecoderModel` and `NTLDecoderOnlyModel` are drop-in replacements for
`t5x.models.EncoderDecoderModel` and `t5x.models.DecoderOnlyModel`: swap the class in
a gin file and add the NTL options. Their `loss_fn` is

    cross-entropy (exactly as the stock model: label smoothing, z-loss)
      + ntl_weight * NTL

with NTL the `number_loss`, one value of `ntl_jax.losses` (or a spec string);
both terms weighted by the same per-token weights and divided by the same
`loss_normalizing_factor` (None, a number, `NUM_REAL_TARGET_TOKENS`,
`NUM_TOTAL_TARGET_TOKENS`, `AVERAGE_PER_SEQUENCE`; packed batches included). The
arithmetic, the loss and every metric input, is `ntl_jax.t5x._loss` (on
`ntl_jax.cross_entropy_and_ntl`), pure functions and a mixin tested without T5X.
`score_batch`, decoding and everything else stay the stock ones (cross-entropy only).

Targets outside the vocabulary: a position whose target id is outside
`[0, logits.shape[-1])` is ignored everywhere. It adds nothing to either loss term,
does not count in the loss-normalising factor, and has mask 0 in the stock metrics
(`accuracy`, `loss_per_nonpadding_target_token`, `non_padding_fraction/loss_weights`),
where the stock model would still count it.

Zausinger et al., "Regress, Don't Guess", ICML 2025 (arXiv:2411.02083).
"""

from __future__ import annotations

from typing import Any

from ntl_jax.t5x._install import require_t5x

require_t5x()  # before T5X is imported: says how to install it

from clu import metrics as clu_metrics
from t5x import metrics as metrics_lib
from t5x import models

from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax.t5x._loss import NTLLossMixin, number_quality_totals

__all__ = ["NTLDecoderOnlyModel", "NTLEncoderDecoderModel", "number_quality_metrics", "padded_vocab_size"]


def padded_vocab_size(vocabulary: Any, multiple: int = 128) -> int:
    """`vocabulary.vocab_size` rounded up to a multiple of `multiple` (for gin).

    Lets a gin file size the network for any vocabulary:
    `network.T5Config.vocab_size = @ntl_models.padded_vocab_size()` with
    `ntl_models.padded_vocab_size.vocabulary = %VOCABULARY`.
    """
    size = int(vocabulary.vocab_size)
    return -(-size // multiple) * multiple


def number_quality_metrics(logits, targets, weights, number_tokens: NumberTokens):
    """How well the number head regresses, at target positions that are number tokens.

    - `number_abs_error`: mean |expected digit value - target digit value|, the
      expectation taken under the softmax restricted to the number tokens.
    - `number_token_mass`: mean full-vocabulary probability on number tokens.

    Both are plain means (clu `Average`) over the counted positions (weight > 0, or
    target != 0 when there are no weights), so they do not depend on the
    loss-normalising factor. See `ntl_jax.t5x._loss.number_quality_totals`.
    """
    totals = number_quality_totals(logits, targets, weights, number_tokens)
    return {name: clu_metrics.Average(total=total, count=count) for name, (total, count) in totals.items()}


class _NTLLossMixin(NTLLossMixin):
    """`NTLLossMixin` with T5X's metric classes."""

    per_step_metric = metrics_lib.AveragePerStep
    average_metric = clu_metrics.Average


class NTLEncoderDecoderModel(_NTLLossMixin, models.EncoderDecoderModel):
    """`t5x.models.EncoderDecoderModel` trained with cross-entropy + NTL.

    Args:
      *args, **kwargs: those of `t5x.models.EncoderDecoderModel` (module,
        input_vocabulary, output_vocabulary, optimizer_def, z_loss, label_smoothing,
        loss_normalizing_factor, ...).
      number_loss: the number loss, a value of `ntl_jax.losses` (`was()`, the paper's
        NTL-WAS, the default; `mse()`, `smmd(mode="mmd")`, ..., or one of your own),
        a spec string (`"was"`, `"smmd(mode=mmd)"`), or None / `"none"` for
        cross-entropy alone. In gin its constructor is bound on its own:
        `NTLEncoderDecoderModel.number_loss = @losses.smmd()` and
        `losses.smmd.mode = 'mmd'` (with `from ntl_jax import losses`).
      ntl_weight: the factor on NTL (lambda; 0.3 in the paper). 0 trains with
        cross-entropy alone and still logs the NTL metrics.
      gce_sigma: Gaussian-smoothed cross-entropy (the paper's GCE baseline): at a
        number target the label is a Gaussian of this width over the number tokens'
        values (`ntl_jax.cross_entropy_and_ntl`); 0 (default) is the stock one-hot.
        Exclusive with `label_smoothing`. It changes the cross-entropy only; the
        paper's pairing with NTL-WAS-CDF against the same label is
        `number_loss=ntl_jax.losses.was_cdf(sigma=gce_sigma)`.
      digit_level: only the single characters 0-9 are number tokens (the paper);
        False counts every piece that parses as a number.
      fused_loss: compute the loss from the decoder's hidden states and the logits
        kernel (`logits_dense`, or the embedding with `logits_via_embedding`) without
        forming the `[batch, length, vocab]` logits in training
        (`ntl_jax.fused_cross_entropy_and_ntl`); the same loss, gradients and metrics
        to float32 rounding. In gin: `NTLEncoderDecoderModel.fused_loss = True`.
        `"auto"` (the shipped gin files' default) fuses where it saves memory, where
        each device holds at least `d_model` target tokens, and takes the logits
        elsewhere (a fine-tuning batch of 32 x 32 targets on a pod holds 64 per chip).
      fused_chunk_size: vocabulary columns per chunk with `fused_loss` (None: about
        8M logits per chunk; per device when vocabulary-parallel).
      fused_vocab_axis: with `fused_loss`, the mesh axis the logits kernel's
        vocabulary is sharded over; default `"model"`, as T5X's standard partitioning
        rules map `vocab` to it. When the step runs under T5X's `PjitPartitioner`
        (`num_partitions > 1`) and the mesh has this axis with more than one device,
        the loss is vocabulary-parallel over it: each device streams only its own
        kernel columns and the kernel is never all-gathered (the mesh's other axes
        shard the batch; the vocabulary must divide by the axis size, which a
        vocabulary padded to a multiple of 128 does for the usual partitions). On one
        device, or with None, the loss is computed as without a mesh (under a
        partitioner XLA then gathers the whole `[d_model, vocab]` kernel every step).
        In gin: `NTLEncoderDecoderModel.fused_vocab_axis = None`.

    The number tokens come from `output_vocabulary`. Metrics: the stock ones (their
    mask is the effective weights, 0 where the target id is outside the logits'
    vocabulary), with `cross_ent_loss` the cross-entropy alone, plus `ntl` (the mean
    of the number loss over the positions it counts), `ntl_term` (what it adds to the
    loss, per step), `number_abs_error` and `number_token_mass`; without a number
    loss, no `ntl` nor `ntl_term`.
    """


class NTLDecoderOnlyModel(_NTLLossMixin, models.DecoderOnlyModel):
    """`t5x.models.DecoderOnlyModel` trained with cross-entropy + NTL.

    The loss counts only the positions the stock model counts (with
    `decoder_loss_weights`, the targets of a prefix LM). Arguments as
    `NTLEncoderDecoderModel`, the rest as `t5x.models.DecoderOnlyModel`
    (module, vocabulary, optimizer_def, ...).
    """
