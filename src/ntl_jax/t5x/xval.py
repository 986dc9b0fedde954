"""xVal (Golkar et al. 2023) as a T5X model, as the paper's authors train it
(`model_args=xval`): every number one `[NUM]` token whose input embedding, in the
encoder and the decoder, is multiplied by the number's log-scaled value, a number head
on the decoder's output, and the loss `(CE + MSE) / 2`.

`XvalEncoderDecoderModel` takes `ntl_jax.t5x.networks.XvalTransformer` and the xVal
vocabulary (`ntl_jax.seqio.xval.xval_vocabulary()`) on both sides; its feature converter
(`XvalFeatureConverter`) carries the numbers' scales from the `ntl_math_*_xval` tasks
(unpacked batches). The loss, network and decoding are the trainer's
(`ntl_jax.flax.xval`): on the same batch and parameters the model's loss is the
trainer's `--loss xval`.

- `loss_fn`: `(CE + MSE) / 2`, CE the mean token cross-entropy over the targets with
  weight > 0 and MSE the mean squared error of the head at the `[NUM]` targets, in the
  scaled space. Means per batch (per microbatch under T5X's microbatching), as the
  trainer's; no loss-normalising factor, label smoothing or z-loss (the authors' xVal
  has none). Metrics: T5X's, with `cross_ent_loss` and `number_mse`.
- `predict_batch_with_aux`: greedy decoding, each emitted `[NUM]` fed back with the
  head's value; returns `[B, 2 * L]`, each position's token followed by the float32
  bits (as int32) of its value at a `[NUM]`, which the xVal vocabulary's `decode`
  writes as the number. One decode per example.
- `score_batch`: T5X's, on the logits of the scaled inputs.
"""

from __future__ import annotations

from typing import Any, Mapping

from ntl_jax.t5x._install import require_t5x

require_t5x()  # before T5X is imported: says how to install it

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from t5x import metrics as metrics_lib  # noqa: E402
from t5x import models  # noqa: E402

from ntl_jax.flax.xval import greedy_decode, xval_loss, xval_scale  # noqa: E402
from ntl_jax.seqio.xval import XvalFeatureConverter, XvalSeqioVocabulary  # noqa: E402

__all__ = ["XvalEncoderDecoderModel"]


class XvalEncoderDecoderModel(models.EncoderDecoderModel):
    """`t5x.models.EncoderDecoderModel` for xVal (see the module docstring).

    Args:
      module: an `XvalNetwork` encoder-decoder (`ntl_jax.t5x.networks.XvalTransformer`).
      input_vocabulary, output_vocabulary: `XvalSeqioVocabulary`, with one `[NUM]` id.
      optimizer_def: as T5X's.
      **kwargs: T5X's `decode_fn` and `default_decoder_params` are not used (decoding is
        greedy); `label_smoothing`, `z_loss` and `loss_normalizing_factor` must be left
        at their defaults.

    Raises:
      TypeError: if a vocabulary is not xVal's.
      ValueError: for a `[NUM]` id that differs between the vocabularies, or a label
        smoothing, z-loss or loss-normalising factor.
    """

    FEATURE_CONVERTER_CLS = XvalFeatureConverter

    def __init__(self, module, input_vocabulary, output_vocabulary, optimizer_def, **kwargs):
        for side, vocabulary in (("input", input_vocabulary), ("output", output_vocabulary)):
            if not isinstance(vocabulary, XvalSeqioVocabulary):
                raise TypeError(f"xVal expected an XvalSeqioVocabulary as {side}_vocabulary, got "
                                f"{type(vocabulary).__name__}")
        if input_vocabulary.num_id != output_vocabulary.num_id:
            raise ValueError(f"expected one [NUM] id, got {input_vocabulary.num_id} (input) and "
                             f"{output_vocabulary.num_id} (output)")
        unused = {k: kwargs[k] for k in ("label_smoothing", "z_loss", "loss_normalizing_factor") if kwargs.get(k)}
        if unused:
            raise ValueError(f"xVal's loss is (CE + MSE) / 2 with means over the batch; expected no {sorted(unused)}, "
                             f"got {unused}")
        super().__init__(module, input_vocabulary, output_vocabulary, optimizer_def, **kwargs)
        self._num_id = int(output_vocabulary.num_id)

    @property
    def num_id(self) -> int:
        return self._num_id

    def _logits_and_numbers(self, params, batch: Mapping[str, jax.Array], dropout_rng=None, mutable=False,
                            other_variables=None):
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        return self.module.apply(
            {"params": params, **(other_variables or {})},
            batch["encoder_input_tokens"], batch["decoder_input_tokens"], batch["decoder_target_tokens"],
            encoder_segment_ids=batch.get("encoder_segment_ids"), decoder_segment_ids=batch.get("decoder_segment_ids"),
            encoder_positions=batch.get("encoder_positions"), decoder_positions=batch.get("decoder_positions"),
            encoder_scale=xval_scale(batch["encoder_input_tokens"], batch["encoder_scale"], self._num_id),
            decoder_scale=xval_scale(batch["decoder_input_tokens"], batch["decoder_scale"], self._num_id),
            enable_dropout=rngs is not None, rngs=rngs, mutable=mutable)

    def _compute_logits(self, params, batch, dropout_rng=None, mutable=False, other_variables=None):
        out = self._logits_and_numbers(params, batch, dropout_rng, mutable, other_variables)
        if mutable:
            (logits, _), variables = out
            return logits, variables
        return out[0]

    def loss_fn(self, params, batch: Mapping[str, jax.Array], dropout_rng) -> tuple[jax.Array, dict]:
        logits, numbers = self._logits_and_numbers(params, batch, dropout_rng)
        targets = batch["decoder_target_tokens"]
        weights = batch.get("decoder_loss_weights")
        loss, parts = xval_loss(logits, numbers, targets, batch["target_values"], self._num_id, weights)
        segment_ids = {k[: -len("_segment_ids")]: v for k, v in batch.items() if k.endswith("_segment_ids")}
        if not segment_ids:
            segment_ids = {k: batch[k] != 0 for k in ("encoder_input_tokens", "decoder_target_tokens")}
        metrics = self._compute_metrics(logits=logits, targets=targets,
                                        mask=(targets > 0) if weights is None else weights, loss=loss,
                                        segment_ids=segment_ids)
        metrics.update({"cross_ent_loss": metrics_lib.AveragePerStep(total=parts["cross_entropy"]),
                        "number_mse": metrics_lib.AveragePerStep(total=parts["mse"])})
        return loss, metrics

    def predict_batch_with_aux(self, params, batch: Mapping[str, jax.Array], rng=None, decoder_params=None,
                               return_all_decodes: bool = False, num_decodes: int | None = None,
                               prompt_with_targets: bool = False) -> tuple[jax.Array, dict[str, Any]]:
        if return_all_decodes or (num_decodes or 1) != 1 or prompt_with_targets:
            raise ValueError(f"xVal decodes greedily, one decode per example without a prompt; got "
                             f"return_all_decodes={return_all_decodes}, num_decodes={num_decodes}, "
                             f"prompt_with_targets={prompt_with_targets}")
        del rng, decoder_params
        tokens = batch["encoder_input_tokens"]
        ids, numbers = greedy_decode(
            self.module, params, tokens, xval_scale(tokens, batch["encoder_scale"], self._num_id),
            batch["decoder_input_tokens"].shape[1], self._num_id, self.output_vocabulary.eos_id)
        bits = jax.lax.bitcast_convert_type(numbers.astype(jnp.float32), jnp.int32)
        decodes = jnp.stack([ids, jnp.where(ids == self._num_id, bits, 0)], axis=-1).reshape(ids.shape[0], -1)
        return decodes, {}
