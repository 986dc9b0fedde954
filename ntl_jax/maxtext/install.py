"""Puts the number loss into MaxText's modules for the length of a run.

MaxText has no hook for a loss: its programs find `loss_fn`, `train_step`, `eval_step`
and `MetricLogger` as module attributes when they run, so each entry point swaps those
attributes for the wrapped ones (`loss.py`, `metrics.py`) and puts them back afterwards.
MaxText's own code is not copied or changed.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Callable, Sequence

import numpy as np

from ntl_jax.maxtext import tiles
from ntl_jax.maxtext.loss import NTL_SUM, NUMBER_TARGETS, number_eval_step, number_loss_fn, number_train_step
from ntl_jax.maxtext.metrics import number_metric_logger
from ntl_jax.maxtext.settings import NumberLossSettings, split_argv


@contextlib.contextmanager
def _replaced(*replacements):
    """Sets `module.name = value` for each `(module, name, value)`, restoring on exit."""
    saved = [(module, name, getattr(module, name)) for module, name, _ in replacements]
    try:
        for module, name, value in replacements:
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


def launch(argv: Sequence[str], program: str,
           installed: Callable[[NumberLossSettings], contextlib.AbstractContextManager]) -> None:
    """Runs the MaxText module `program`'s `main` on `argv` less its `ntl_*` arguments,
    inside `installed(settings)` (`pretraining` or `fine_tuning`) of the settings they
    make. The settings are checked before MaxText is imported."""
    maxtext_argv, settings = split_argv(argv)
    with installed(settings):
        importlib.import_module(program).main(maxtext_argv)


def pretraining(settings: NumberLossSettings):
    """A context in which MaxText's pretraining programs (`train`, `train_compile`)
    train on CE + NTL and log NTL."""
    from maxtext.common import metric_logger
    from maxtext.trainers.pre_train import train

    return _replaced(
        *_in_tiles(settings),
        (train, "loss_fn", number_loss_fn(train.loss_fn, settings)),
        (train, "train_step", number_train_step(train.train_step, settings)),
        (train, "eval_step", number_eval_step(train.eval_step, settings)),
        (metric_logger, "MetricLogger", number_metric_logger(metric_logger.MetricLogger)),
    )


def fine_tuning(settings: NumberLossSettings):
    """A context in which MaxText's supervised fine-tuning (`train_sft`, Tunix's
    `PeftTrainer` on MaxText's `loss_fn`) trains on CE + NTL and logs NTL: Tunix's
    metrics as `ntl`, MaxText's as `learning/ntl` and `eval/avg_ntl`."""
    from maxtext.trainers.post_train import hooks as post_train_hooks
    from maxtext.trainers.post_train.sft import hooks as sft_hooks
    from maxtext.trainers.post_train.sft import train_sft

    return _replaced(
        *_in_tiles(settings),
        (train_sft, "loss_fn", number_loss_fn(train_sft.loss_fn, settings)),
        (train_sft, "MaxTextPeftTrainer", _number_peft_trainer(train_sft.MaxTextPeftTrainer)),
        (sft_hooks, "SFTTrainingHooks", _number_sft_hooks(sft_hooks.SFTTrainingHooks)),
        (post_train_hooks, "MetricLogger", number_metric_logger(post_train_hooks.MetricLogger)),
    )


def _in_tiles(settings: NumberLossSettings) -> list:
    """The replacements that compute NTL inside MaxText's vocabulary tiles (`tiles.py`):
    its tiled loss, which `loss_fn` finds in its module, and the cross-entropy its tiles
    call."""
    from maxtext.trainers.pre_train import train
    from maxtext.utils import vocabulary_tiling

    return [(train, "vocab_tiling_nnx_loss", tiles.number_vocab_tiling_loss(train.vocab_tiling_nnx_loss, settings)),
            (vocabulary_tiling, "max_utils", tiles.tile_max_utils())]


def _buffer_ntl(buffer, aux) -> None:
    # As ntl_jax.tunix's trainer logs its parts: each step's value joins the buffer the
    # trainer writes through Tunix's metrics logger.
    if buffer is None or aux is None or NTL_SUM not in aux:
        return
    for name, value in (("ntl", aux[NTL_SUM] / np.maximum(aux["total_weights"], 1)),
                        ("number_targets", aux[NUMBER_TARGETS])):
        values, _ = buffer.additional_metrics.setdefault(name, ([], np.mean))
        values.append(value)


def _number_peft_trainer(stock_trainer_class):
    class NumberLossPeftTrainer(stock_trainer_class):
        """MaxText's `PeftTrainer`, logging NTL (`ntl`) through Tunix's metrics logger."""

        def _post_process_train_step(self, aux):
            super()._post_process_train_step(aux)
            _buffer_ntl(self._buffered_train_metrics, aux)

        def _post_process_eval_step(self, aux):
            super()._post_process_eval_step(aux)
            _buffer_ntl(self._buffered_eval_metrics, aux)

    return NumberLossPeftTrainer


def _number_sft_hooks(stock_hooks_class):
    class NumberLossSFTTrainingHooks(stock_hooks_class):
        """MaxText's SFT hooks, writing Tunix's `ntl` into MaxText's metrics."""

        def _pend(self, train_ctx, mode: str, prefix: str) -> None:
            for tunix_name, name in (("ntl", "ntl" if mode == "train" else "avg_ntl"),
                                     ("number_targets", "number_targets")):
                try:  # the latest value (Tunix's get_metric is the mean of them all)
                    history = train_ctx.metrics_logger.get_metric_history(train_ctx.metrics_prefix, tunix_name, mode)
                except Exception:  # noqa: BLE001 - as MaxText's hooks read Tunix's optional metrics
                    continue
                self.metric_logger.pending_scalars[f"{prefix}/{name}"] = float(history[-1])

        def on_train_step_end(self, train_ctx, train_step, train_loss, step_time=0.0):
            self._pend(train_ctx, "train", "learning")
            super().on_train_step_end(train_ctx, train_step, train_loss, step_time)

        def on_eval_step_end(self, train_ctx, eval_loss):
            self._pend(train_ctx, "eval", "eval")
            super().on_eval_step_end(train_ctx, eval_loss)

    return NumberLossSFTTrainingHooks
