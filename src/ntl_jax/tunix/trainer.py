"""Tunix's `PeftTrainer` with CE + NTL as its loss, logging the loss parts."""

from __future__ import annotations

from typing import Any

import numpy as np
from tunix.sft import peft_trainer

from ntl_jax._core.migration import check_no_old_keywords
from ntl_jax._core.number_losses.number_loss import DEFAULT, NumberLoss
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.objective import ntl_mean
from ntl_jax.tunix.loss import AVERAGED_PARTS, number_token_loss_fn


def _pooled_ntl(sums_and_counts: list) -> np.ndarray:
    sums, counts = zip(*sums_and_counts)
    return np.asarray(ntl_mean(sums, counts))


def buffer_ntl(buffer: peft_trainer.MetricsBuffer, ntl_sum, ntl_weight_sum) -> None:
    """Adds a step's number-loss sum and count to a Tunix `MetricsBuffer`, whose `ntl`
    is then `ntl_jax.ntl_mean` of the sums and counts it holds: Tunix writes a buffer
    by reducing each metric's list of values with the function beside it, once per
    training step (over gradient accumulation's micro-batches) and once per evaluation
    (over all its batches)."""
    values, _ = buffer.additional_metrics.setdefault("ntl", ([], _pooled_ntl))
    values.append((ntl_sum, ntl_weight_sum))


def _buffer_parts(buffer: peft_trainer.MetricsBuffer | None, parts: Any) -> None:
    # As Tunix's DPO trainer logs its own parts: each step's value joins the buffer the
    # trainer writes through its metrics logger.
    if buffer is None or parts is None:
        return
    for name in AVERAGED_PARTS:
        values, _ = buffer.additional_metrics.setdefault(name, ([], np.mean))
        values.append(parts[name])
    buffer_ntl(buffer, parts["ntl_sum"], parts["ntl_weight_sum"])


class NumberTokenLossTrainer(peft_trainer.PeftTrainer):
    """`PeftTrainer` training on `CE + ntl_weight * NTL` (`number_token_loss_fn`).

    Besides Tunix's `loss` (the objective) and `perplexity`, its metrics logger records,
    for training and evaluation, `cross_entropy` and `ntl_term` (what NTL adds to `loss`:
    `loss = cross_entropy + ntl_term`, plus `z_loss` when set), each as Tunix's `loss` the
    mean of its batches' values, and `ntl`, the number loss's mean over all the number
    targets of a training step's micro-batches or of an evaluation's batches (pooled:
    `buffer_ntl`). LoRA models train their adapters, as with Tunix's loss.

    Args:
      model, optimizer, training_config: as `PeftTrainer`'s.
      number_tokens: the vocabulary's `NumberTokens` (`ntl_jax.tunix.number_tokens`).
      number_loss, ntl_weight, fused, **options: as `number_token_loss_fn`'s.
      metrics_logger: as `PeftTrainer`'s.
    """

    def __init__(self, model, optimizer, training_config: peft_trainer.TrainingConfig, number_tokens: NumberTokens,
                 *, number_loss: NumberLoss | str | None = DEFAULT, ntl_weight: float | None = None,
                 fused: bool = False, metrics_logger=None, **options):
        check_no_old_keywords(f"{type(self).__name__}()", options)
        loss_fn = number_token_loss_fn(number_tokens, number_loss=number_loss, ntl_weight=ntl_weight, fused=fused,
                                       **options)
        super().__init__(model, optimizer, training_config, metrics_logger=metrics_logger)
        self.with_loss_fn(loss_fn, has_aux=True)

    def _post_process_train_step(self, aux: Any) -> None:
        _buffer_parts(self._buffered_train_metrics, aux)

    def _post_process_eval_step(self, aux: Any) -> None:
        _buffer_parts(self._buffered_eval_metrics, aux)
