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
from flax import struct
from t5x import metrics as metrics_lib
from t5x import models

from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax.t5x._loss import NTLLossMixin, NTLMean, number_quality_totals

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


@struct.dataclass
class _NTLAverage(NTLMean, clu_metrics.Average):
    """clu's `Average` of `ntl`, its mean `ntl_jax.ntl_mean` (0 where nothing counted)."""


class _NTLLossMixin(NTLLossMixin):
    """`NTLLossMixin` with T5X's metric classes."""

    per_step_metric = metrics_lib.AveragePerStep
    average_metric = clu_metrics.Average
    ntl_metric = _NTLAverage


class NTLEncoderDecoderModel(_NTLLossMixin, models.EncoderDecoderModel):
    """`t5x.models.EncoderDecoderModel` trained with cross-entropy + NTL (docs/guides/t5x.md).

    Args:
      *args, **kwargs: those of `t5x.models.EncoderDecoderModel` (module, input_vocabulary, output_vocabulary,
        the source of the number tokens, optimizer_def, z_loss, label_smoothing, loss_normalizing_factor, ...).
      number_loss: a value of `ntl_jax.losses` (default `was()`, the paper's NTL-WAS), a spec string
        (`"smmd(mode=mmd)"`), or None / `"none"` for cross-entropy alone. In gin, bind its constructor:
        `NTLEncoderDecoderModel.number_loss = @losses.smmd()` and `losses.smmd.mode = 'mmd'`.
      ntl_weight: lambda on the loss's term (its authors'); None: the loss's own; 0 still logs NTL.
      gce_sigma: > 0: Gaussian-smoothed cross-entropy (GCE) of this width at number targets; 0 is one-hot.
        Exclusive with `label_smoothing`; the paper pairs it with `ntl_jax.losses.was_cdf(sigma=gce_sigma)`.
      digit_level: only the characters 0-9 are number tokens (the paper); False: every piece that parses as one.
      fused_loss: True takes the loss from the decoder's hidden states and the logits kernel, never forming
        the `[batch, length, vocab]` logits (`ntl_jax.fused_cross_entropy_and_ntl`; equal to float32
        rounding); False (default) does not; `"auto"` (the gin files' default) fuses where each device
        holds >= `d_model` target tokens.
      fused_chunk_size: vocabulary columns per chunk with `fused_loss` (None: about 8M logits).
      fused_vocab_axis: the mesh axis (default `"model"`) the fused loss is vocabulary-parallel over under a
        `PjitPartitioner` with `num_partitions > 1`; None leaves it to XLA, which gathers the whole kernel.
      fused_device_kind: the chip the fused loss is compiled for (a `device_kind`, "TPU v5 lite"; None:
        the platform it is lowered for decides, a TPU with a v5e's chunk), `compile_check` sets it.

    Metrics: the stock ones (`cross_ent_loss` is cross-entropy alone), `ntl`, `ntl_term`,
    `number_abs_error` and `number_token_mass`.
    """


class NTLDecoderOnlyModel(_NTLLossMixin, models.DecoderOnlyModel):
    """`t5x.models.DecoderOnlyModel` trained with cross-entropy + NTL.

    The loss counts only the positions the stock model counts (with
    `decoder_loss_weights`, the targets of a prefix LM). Arguments as
    `NTLEncoderDecoderModel`, the rest as `t5x.models.DecoderOnlyModel`
    (module, vocabulary, optimizer_def, ...).
    """
