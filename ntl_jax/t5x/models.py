"""T5X models trained with cross-entropy plus the Number Token Loss.

`NTLEncoderDecoderModel` and `NTLDecoderOnlyModel` are drop-in replacements for
`t5x.models.EncoderDecoderModel` and `t5x.models.DecoderOnlyModel`: swap the class in
a gin file and add the NTL options. Their `loss_fn` is

    cross-entropy (exactly as the stock model: label smoothing, z-loss)
      + ntl_weight * NTL

with both terms weighted by the same per-token weights and divided by the same
`loss_normalizing_factor` (None, a number, `NUM_REAL_TARGET_TOKENS`,
`NUM_TOTAL_TARGET_TOKENS`, `AVERAGE_PER_SEQUENCE`; packed batches included). The
arithmetic is `ntl_jax.cross_entropy_and_ntl`, a pure function tested without T5X.
`score_batch`, decoding and everything else stay the stock ones (cross-entropy only).

Zausinger et al., "Regress, Don't Guess", ICML 2025 (arXiv:2411.02083).
"""

from __future__ import annotations

import numbers as _pynumbers
from typing import Any, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from clu import metrics as clu_metrics
from t5x import metrics as metrics_lib
from t5x import models

import ntl_jax
from ntl_jax import losses
from ntl_jax.numbers import NumberTokens, check_squash_factor

# What `ntl_kind` accepts; "none" trains with cross-entropy alone (NTL still logged).
NTL_KINDS = ("was", "mse", "mae", "huber", "number_level", "number_level_float", "none")


def padded_number_tokens(number_tokens: NumberTokens, vocab_size: int) -> NumberTokens:
    """`number_tokens` widened to the network's (rounded-up) vocabulary size."""
    return number_tokens.padded_to(vocab_size)


def padded_vocab_size(vocabulary: Any, multiple: int = 128) -> int:
    """`vocabulary.vocab_size` rounded up to a multiple of `multiple` (for gin).

    Lets a gin file size the network for any vocabulary:
    `network.T5Config.vocab_size = @ntl_models.padded_vocab_size()` with
    `ntl_models.padded_vocab_size.vocabulary = %VOCABULARY`.
    """
    size = int(vocabulary.vocab_size)
    return -(-size // multiple) * multiple


def _check_ntl_options(ntl_weight, ntl_kind, reweigh, squash_factor, digit_level) -> None:
    if isinstance(ntl_weight, bool) or not isinstance(ntl_weight, _pynumbers.Real):
        raise TypeError(f"expected ntl_weight to be a number >= 0, got {ntl_weight!r}")
    if not ntl_weight >= 0:
        raise ValueError(f"expected ntl_weight >= 0, got {ntl_weight}")
    if ntl_kind not in NTL_KINDS:
        raise ValueError(f"expected ntl_kind in {NTL_KINDS}, got {ntl_kind!r}")
    for name, value in (("reweigh", reweigh), ("digit_level", digit_level)):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"expected {name} to be True or False, got {value!r}")
    check_squash_factor(squash_factor)
    if squash_factor is not None and ntl_kind != "was":
        raise ValueError(f"squash_factor applies to ntl_kind='was' only, got ntl_kind={ntl_kind!r}")


class _NTLLossMixin:
    """The shared `loss_fn`; mixed in before a stock T5X transformer model."""

    def __init__(
        self,
        *args,
        ntl_weight: float = 0.3,
        ntl_kind: str = "was",
        reweigh: bool = False,
        squash_factor: Optional[float] = None,
        digit_level: bool = True,
        **kwargs,
    ):
        # The stock model's own arguments (module, vocabularies, ...) pass through.
        super().__init__(*args, **kwargs)
        self._configure_ntl(
            ntl_weight=ntl_weight,
            ntl_kind=ntl_kind,
            reweigh=reweigh,
            squash_factor=squash_factor,
            digit_level=digit_level,
        )

    def _configure_ntl(self, *, ntl_weight, ntl_kind, reweigh, squash_factor, digit_level):
        _check_ntl_options(ntl_weight, ntl_kind, reweigh, squash_factor, digit_level)
        self._ntl_weight = float(ntl_weight)
        self._ntl_kind = ntl_kind
        self._reweigh = bool(reweigh)
        self._squash_factor = None if squash_factor is None else float(squash_factor)
        # Built once on the host from the output vocabulary; a closure constant in jit.
        self._number_tokens = NumberTokens.from_vocabulary(self.output_vocabulary, digit_level=digit_level)
        self._padded_number_tokens = {}

    @property
    def number_tokens(self) -> NumberTokens:
        """The number tokens of the output vocabulary."""
        return self._number_tokens

    @property
    def ntl_options(self) -> dict:
        return {
            "ntl_weight": self._ntl_weight,
            "ntl_kind": self._ntl_kind,
            "reweigh": self._reweigh,
            "squash_factor": self._squash_factor,
        }

    def _number_tokens_for(self, vocab_size: int) -> NumberTokens:
        if vocab_size not in self._padded_number_tokens:
            self._padded_number_tokens[vocab_size] = padded_number_tokens(self._number_tokens, vocab_size)
        return self._padded_number_tokens[vocab_size]

    def loss_fn(
        self,
        params: Any,
        batch: Mapping[str, jnp.ndarray],
        dropout_rng: Optional[jax.Array],
    ) -> Tuple[jnp.ndarray, Mapping[str, clu_metrics.Metric]]:
        """Cross-entropy + `ntl_weight` * NTL, and the stock metrics plus NTL ones."""
        logits = self._compute_logits(params, batch, dropout_rng)
        targets = batch["decoder_target_tokens"]
        number_tokens = self._number_tokens_for(logits.shape[-1])
        segment_kwargs = {
            "decoder_segment_ids": batch.get("decoder_segment_ids"),
            "decoder_positions": batch.get("decoder_positions"),
        }
        loss, parts = ntl_jax.cross_entropy_and_ntl(
            logits,
            targets,
            number_tokens,
            weights=batch.get("decoder_loss_weights"),
            ntl_kind=self._ntl_kind,
            ntl_weight=self._ntl_weight,
            reweigh=self._reweigh,
            squash_factor=self._squash_factor,
            label_smoothing=self._label_smoothing,
            z_loss=self._z_loss,
            loss_normalizing_factor=self._loss_normalizing_factor,
            **segment_kwargs,
        )
        # The stock metrics see the same (possibly rescaled) weights as the stock model.
        _, weights = ntl_jax.loss_normalizing_factor_and_weights(
            self._loss_normalizing_factor,
            targets,
            batch.get("decoder_loss_weights"),
            **segment_kwargs,
        )
        metrics = self._compute_metrics(
            logits=logits,
            targets=targets,
            mask=weights,
            loss=loss,
            z_loss=parts["z_loss"],
            segment_ids=_segment_ids(batch),
        )
        metrics.update(self._ntl_metrics(logits, targets, weights, number_tokens, parts))
        return loss, metrics

    def _ntl_metrics(self, logits, targets, weights, number_tokens, parts):
        """NTL metrics, and the stock cross-entropy metrics without the NTL term."""
        num_tokens = jnp.array(targets.size)
        cross_entropy = parts["cross_entropy"]
        # The stock metric is `loss - z_loss`, which would include ntl_weight * NTL.
        out = {
            "cross_ent_loss": metrics_lib.AveragePerStep(total=cross_entropy),
            "cross_ent_loss_per_all_target_tokens": clu_metrics.Average(
                total=cross_entropy, count=num_tokens
            ),
            "ntl_loss": metrics_lib.AveragePerStep(total=parts["ntl"]),
        }
        # Undo the normalisation to get a mean over the (weighted) number positions.
        factor = parts["loss_normalizing_factor"]
        out["ntl_loss_per_number_token"] = clu_metrics.Average(
            total=parts["ntl"] * factor, count=parts["ntl_weight_sum"]
        )
        out.update(number_quality_metrics(logits, targets, weights, number_tokens))
        return out


def _segment_ids(batch: Mapping[str, jnp.ndarray]) -> Mapping[str, jnp.ndarray]:
    """The packing/padding features the stock `loss_fn` hands to `_compute_metrics`."""
    segment_ids = {k[: -len("_segment_ids")]: v for k, v in batch.items() if k.endswith("_segment_ids")}
    if not segment_ids:
        segment_ids = {
            k: v != 0 for k, v in batch.items() if k in ("encoder_input_tokens", "decoder_target_tokens")
        }
    return segment_ids


def number_quality_metrics(logits, targets, weights, number_tokens: NumberTokens):
    """How well the number head regresses, at target positions that are number tokens.

    - `number_abs_error`: mean |expected digit value - target digit value|, the
      expectation taken under the softmax restricted to the number tokens.
    - `number_token_mass`: mean full-vocabulary probability on number tokens.

    Both are plain means over the counted positions (weight > 0, or target != 0 when
    there are no weights), so they do not depend on the loss-normalising factor.
    """
    logits = jax.lax.stop_gradient(logits)
    value, mass = ntl_jax.predict_numbers(logits, number_tokens)
    counted, target_value = losses.target_values(targets, number_tokens)
    counted &= (weights > 0) if weights is not None else (targets != 0)
    count = jnp.sum(counted)
    abs_error = jnp.where(counted, jnp.abs(value - target_value), 0.0)
    return {
        "number_abs_error": clu_metrics.Average(total=jnp.sum(abs_error), count=count),
        "number_token_mass": clu_metrics.Average(total=jnp.sum(jnp.where(counted, mass, 0.0)), count=count),
    }


class NTLEncoderDecoderModel(_NTLLossMixin, models.EncoderDecoderModel):
    """`t5x.models.EncoderDecoderModel` trained with cross-entropy + NTL.

    Args:
      *args, **kwargs: those of `t5x.models.EncoderDecoderModel` (module,
        input_vocabulary, output_vocabulary, optimizer_def, z_loss, label_smoothing,
        loss_normalizing_factor, ...).
      ntl_weight: the factor on NTL (lambda; 0.3 in the paper). 0 trains with
        cross-entropy alone and still logs the NTL metrics.
      ntl_kind: `"was"` (Wasserstein-1, the paper's NTL-WAS), `"mse"`, `"mae"`,
        `"huber"` (dot-product NTL), `"number_level"`, `"number_level_float"`, or
        `"none"`.
      reweigh: scale by the probability mass on number tokens (ntloss's default is
        True; the paper, and this default, use False).
      squash_factor: for `"was"`, make the farthest wrong digit cost this many times
        the closest one (None: plain |difference|).
      digit_level: only the single characters 0-9 are number tokens (the paper);
        False counts every piece that parses as a number.

    The number tokens come from `output_vocabulary`.
    """


class NTLDecoderOnlyModel(_NTLLossMixin, models.DecoderOnlyModel):
    """`t5x.models.DecoderOnlyModel` trained with cross-entropy + NTL.

    The loss counts only the positions the stock model counts (with
    `decoder_loss_weights`, the targets of a prefix LM). Arguments as
    `NTLEncoderDecoderModel`, the rest as `t5x.models.DecoderOnlyModel`
    (module, vocabulary, optimizer_def, ...).
    """
