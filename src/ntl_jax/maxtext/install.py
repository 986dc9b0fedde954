"""Puts the number loss into MaxText's modules for the length of a run.

MaxText has no hook for a loss: its programs find `loss_fn`, `train_step`, `eval_step`
and `MetricLogger` as module attributes when they run, so each entry point swaps those
attributes for the wrapped ones (`loss.py`, `metrics.py`) and puts them back afterwards.
MaxText's own code is not copied or changed, so what it relies on is checked: MaxText's
version against those tested (`check_maxtext_version`), and while a step is traced,
what its vocabulary tiles do (`tiles.py`, `step.py`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from importlib import metadata
from typing import Callable, Sequence

import numpy as np

from ntl_jax._core.tested_releases import check_tested_release
from ntl_jax.maxtext import step, tiles
from ntl_jax.maxtext.loss import (
    NTL_SUM,
    NTL_WEIGHT_SUM,
    NUMBER_TARGETS,
    ntl_term,
    number_eval_step,
    number_loss_fn,
    number_train_step,
)
from ntl_jax.maxtext.metrics import number_metric_logger
from ntl_jax.maxtext.settings import NumberLossSettings, split_argv

# The MaxText releases the tests (tests/maxtext) ran with.
TESTED_MAXTEXT = ("0.2.5",)
# Set to 1 to launch on another MaxText, after tests/maxtext pass with it (.ci/maxtext).
UNTESTED_MAXTEXT_ENV = "NTL_JAX_UNTESTED_MAXTEXT"


def check_maxtext_version() -> None:
    """Raises `RuntimeError` if the MaxText installed is none of `TESTED_MAXTEXT`, unless
    `NTL_JAX_UNTESTED_MAXTEXT=1`: the integration replaces MaxText's functions by their
    names and relies on what they do, which a release may change."""
    check_tested_release("maxtext", "MaxText", TESTED_MAXTEXT, UNTESTED_MAXTEXT_ENV, metadata.version("maxtext"))


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
           installed: Callable[[NumberLossSettings], contextlib.AbstractContextManager], **settings) -> None:
    """Runs the MaxText module `program`'s `main` on `argv` less its `ntl_*` arguments,
    inside `installed(settings)` (`pretraining` or `fine_tuning`) of the settings they
    make with `settings` (`NumberLossSettings` fields from Python: `number_loss=` a
    `NumberLoss`). The settings and MaxText's version are checked before MaxText runs."""
    maxtext_argv, settings = split_argv(argv, **settings)
    with installed(settings):
        importlib.import_module(program).main(maxtext_argv)


def pretraining(settings: NumberLossSettings):
    """A context in which MaxText's pretraining programs (`train`, `train_compile`)
    train on CE + NTL and log NTL."""
    check_maxtext_version()
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
    metrics as `ntl` and `ntl_term`, MaxText's as `learning/ntl`, `learning/ntl_term` and
    `eval/avg_ntl`."""
    check_maxtext_version()
    from maxtext.trainers.post_train import hooks as post_train_hooks
    from maxtext.trainers.post_train.sft import hooks as sft_hooks
    from maxtext.trainers.post_train.sft import train_sft

    return _replaced(
        *_in_tiles(settings),
        (train_sft, "loss_fn", number_loss_fn(train_sft.loss_fn, settings)),
        (train_sft, "MaxTextPeftTrainer", _number_peft_trainer(train_sft.MaxTextPeftTrainer, settings)),
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


def _buffer_ntl(buffer, aux, settings: NumberLossSettings) -> None:
    # As ntl_jax.tunix's trainer logs its parts: each step's values join the buffer the
    # trainer writes through Tunix's metrics logger, `ntl` pooled from sums and counts.
    from ntl_jax.tunix.trainer import buffer_ntl  # Tunix: fine-tuning only

    if buffer is None or aux is None or NTL_SUM not in aux:
        return
    buffer_ntl(buffer, aux[NTL_SUM], aux[NTL_WEIGHT_SUM])
    for name, value in (("ntl_term", ntl_term(aux, settings.weight, settings.number_loss)),
                        ("number_targets", aux[NUMBER_TARGETS])):
        values, _ = buffer.additional_metrics.setdefault(name, ([], np.mean))
        values.append(value)


def _in_step(step_fn, *, train: bool):
    """`step_fn` traced in a `step.step` (what MaxText's own steps run in, `loss.py`)."""
    @functools.wraps(step_fn)
    def traced(*args, **kwargs):
        with step.step(train=train):
            return step_fn(*args, **kwargs)

    return traced


def _number_peft_trainer(stock_trainer_class, settings: NumberLossSettings):
    class NumberLossPeftTrainer(stock_trainer_class):
        """MaxText's `PeftTrainer`, its steps traced each in a `step.step`, logging NTL
        (`ntl`, pooled over a step's micro-batches and an evaluation's batches, and
        `ntl_term`) through Tunix's metrics logger."""

        def create_train_step_fn(self):
            return _in_step(super().create_train_step_fn(), train=True)

        def create_eval_step_fn(self):
            return _in_step(super().create_eval_step_fn(), train=False)

        def _post_process_train_step(self, aux):
            super()._post_process_train_step(aux)
            _buffer_ntl(self._buffered_train_metrics, aux, settings)

        def _post_process_eval_step(self, aux):
            super()._post_process_eval_step(aux)
            _buffer_ntl(self._buffered_eval_metrics, aux, settings)

    return NumberLossPeftTrainer


def _number_sft_hooks(stock_hooks_class):
    class NumberLossSFTTrainingHooks(stock_hooks_class):
        """MaxText's SFT hooks, writing Tunix's `ntl`, `ntl_term` and `number_targets` into
        MaxText's metrics."""

        def _pend(self, train_ctx, mode: str, prefix: str) -> None:
            names = (("ntl", "ntl"), ("ntl_term", "ntl_term")) if mode == "train" else (("ntl", "avg_ntl"),)
            for tunix_name, name in (*names, ("number_targets", "number_targets")):
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
