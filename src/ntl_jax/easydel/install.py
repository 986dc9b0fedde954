"""`use`: the number loss turned on for an EasyDeL model, state or trainer in one line.

EasyDeL picks a model's loss strategy by `config.loss_type` from its `LOSS_MAPPING`
(`EasyDeLBaseModule.loss_strategy`). `use` registers a `NumberLossStrategy` there
under a name of its own and sets the model's `config.loss_type` to it, so every copy of
the model EasyDeL's trainers rebuild from their state (`state.merge`) computes the
objective. Given a trainer, it also wraps the trainer's steps (`guard_trainer`): each
batch's labels are checked on the host before the step, a step whose metrics lack the
strategy's says that the trainer never called it, and `ntl` is pooled from the sums
and counts that EasyDeL averaged over gradient accumulation's micro-batches.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import numpy as np

import ntl_jax
from ntl_jax import losses
from ntl_jax.easydel import heads
from ntl_jax.easydel.strategy import NumberLossStrategy, check_loss_config
from ntl_jax.easydel.tokens import number_tokens
from ntl_jax.easydel.versions import check_easydel_version

# config.loss_type of the models `use` has set up: LOSS_TYPE_PREFIX + a counter.
LOSS_TYPE_PREFIX = "ForCausalLM+NumberTokenLoss"
_numbered = itertools.count()
# EasyDeL's cached properties that hold a model's loss; cleared when the loss changes.
_CACHED = ("lossfn_type", "loss_function", "loss_strategy")


def register(strategy: NumberLossStrategy) -> str:
    """Puts `strategy` into EasyDeL's `LOSS_MAPPING` under a new name and returns the
    name: a model whose `config.loss_type` is that name computes its loss with it."""
    from easydel.infra import loss_utils

    name = f"{LOSS_TYPE_PREFIX}{next(_numbered)}"
    loss_utils.LOSS_MAPPING[name] = strategy
    return name


def install(model: Any, strategy: NumberLossStrategy) -> str:
    """Makes `model` (an EasyDeL causal LM) and the copies rebuilt from it compute their
    loss with `strategy`; returns the `loss_type` set. The head is checked first
    (`heads.check_head`), with the model's mesh in context."""
    with _mesh(model):
        heads.check_head(model)
    loss_type = register(strategy)
    _set_loss_type(model, loss_type)
    if model.loss_strategy is not strategy:
        raise RuntimeError(f"expected {type(model).__name__}.loss_strategy to be the number loss's strategy after "
                           f"config.loss_type={loss_type!r}, got {model.loss_strategy!r} (an EasyDeL release that "
                           "chooses its loss otherwise)")
    return loss_type


def _set_loss_type(model: Any, loss_type: str) -> None:
    model.config.loss_type = loss_type
    for name in _CACHED:
        model.__dict__.pop(name, None)


def _mesh(model):
    mesh = getattr(model, "mesh", None)
    import contextlib

    return mesh if mesh is not None else contextlib.nullcontext()


def use(target: Any, tokenizer: Any = None, *, number_loss=losses.DEFAULT, ntl_weight: float | None = None,
        digit_level: bool = True, prefixed_numbers: bool = False, **fused_options) -> NumberLossStrategy:
    """Trains `target` on CE + `ntl_weight` x the number loss: an EasyDeL causal LM
    (`EasyDeLBaseModule`), its `EasyDeLState`, or a trainer built on one (its model and
    its steps: `guard_trainer`).

    Args:
      target: the model, state or trainer.
      tokenizer: the model's Hugging Face tokenizer; None: the trainer's `processing_class`.
      number_loss: a `ntl_jax.losses` value, yours too, or a spec ("was", "smmd(sigma=2)").
      ntl_weight: lambda; None: the loss's own (`NumberLoss.default_weight`, 0.3 for NTL).
      digit_level, prefixed_numbers: which tokens are numbers (`number_tokens`).
      **fused_options: as `NumberLossStrategy`'s.

    Returns:
      The `NumberLossStrategy` installed.

    Raises:
      RuntimeError: an EasyDeL release it was not tested with (`check_easydel_version`),
        or one that no longer picks a loss by `config.loss_type`.
      TypeError, ValueError: a model whose head it cannot read (`heads.check_head`), a
        tokenizer without number tokens, a trainer whose loss options it refuses.
    """
    check_easydel_version()
    from easydel.infra.base_module import EasyDeLBaseModule
    from easydel.infra.base_state import EasyDeLState
    from easydel.trainers.base_trainer import BaseTrainer

    trainer = target if isinstance(target, BaseTrainer) else None
    if trainer is not None:
        tokenizer = trainer.processing_class if tokenizer is None else tokenizer
        check_loss_config(getattr(trainer.arguments, "loss_config", None))
        model = trainer.model_state.model
    elif isinstance(target, EasyDeLState):
        model = target.model
    elif isinstance(target, EasyDeLBaseModule):
        model = target
    else:
        raise TypeError(f"expected an EasyDeL model, EasyDeLState or trainer, got {type(target).__name__}")
    if tokenizer is None:
        raise ValueError("expected the model's tokenizer (its Hugging Face tokenizer), got None")
    vocab = int(heads.head_kernel(model).shape[1])
    numbers = number_tokens(tokenizer, vocab_size=vocab, digit_level=digit_level, prefixed_numbers=prefixed_numbers)
    strategy = NumberLossStrategy(numbers, number_loss=number_loss, ntl_weight=ntl_weight, **fused_options)
    loss_type = install(model, strategy)
    if trainer is not None:
        # The trainer's own (abstract) model, where its config is a copy of the state's.
        other = getattr(trainer, "_model", None)
        if other is not None and hasattr(other, "config"):
            _set_loss_type(other, loss_type)
        guard_trainer(trainer, strategy, vocab)
    return strategy


def guard_trainer(trainer: Any, strategy: NumberLossStrategy, vocab: int) -> None:
    """Wraps the trainer's train and evaluation steps (its `_execute_train_step`,
    `_execute_eval_step`): the batch's labels are checked before the step
    (`ntl_jax.check_targets`, EasyDeL's `ignore_index` allowed), and after it `ntl` is
    pooled from the step's sums and counts (EasyDeL averages every metric over gradient
    accumulation's micro-batches; the mean of their means would weigh a micro-batch with
    one number as much as one with a hundred).

    Raises (from the step):
      RuntimeError: the step's metrics hold none of the strategy's: the trainer computed
        its loss without the model's loss strategy (a trainer of its own, or a release
        that changed how it calls it), and trained without NTL.
    """
    config = check_loss_config(getattr(trainer.arguments, "loss_config", None))
    for name in ("_execute_train_step", "_execute_eval_step"):
        stock = getattr(trainer, name, None)
        if stock is None:
            raise RuntimeError(f"expected an EasyDeL trainer with {name}, got {type(trainer).__name__} without it "
                               "(a trainer or release ntl_jax.easydel was not made for)")
        setattr(trainer, name, _guarded(stock, name, vocab, config.ignore_index))


def _guarded(stock, name: str, vocab: int, ignore_index: int):
    @functools.wraps(stock)
    def step(state, batch, *args, **kwargs):
        labels = batch.get("labels") if hasattr(batch, "get") else None
        if labels is None and hasattr(batch, "get"):
            labels = batch.get("input_ids")
        if labels is not None:
            ntl_jax.check_targets(np.asarray(labels), vocab, ignore_index=ignore_index)
        result = stock(state, batch, *args, **kwargs)
        metrics = result[1] if isinstance(result, tuple) else result
        failed = isinstance(result, tuple) and len(result) > 2 and result[2] is not None
        if failed or metrics is None or metrics.loss is None:
            return result
        other = metrics.other_metrics or {}
        if "ntl_sum" not in other:
            raise RuntimeError(
                f"expected the trainer's {name.removeprefix('_execute_')} to compute its loss with the model's loss "
                f"strategy (ntl_jax.easydel's), got metrics without it ({sorted(other)}): the step ran without the "
                "number loss. A trainer that computes its own loss (DPO, GRPO, distillation, ...) or an EasyDeL "
                "release that no longer calls module.compute_loss; train with EasyDeL's Trainer or SFTTrainer")
        pooled = dict(other, ntl=ntl_jax.ntl_mean(other["ntl_sum"], other["ntl_weight_sum"]))
        metrics = metrics.replace(other_metrics=pooled)
        return (result[0], metrics, *result[2:]) if isinstance(result, tuple) else metrics

    return step
