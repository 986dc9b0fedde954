"""CE + `ntl_weight` x NTL as an EasyDeL loss strategy.

EasyDeL computes a model's loss in two phases (`easydel.infra.loss_utils`):
`plan_forward` says what to pass to the model's call, `compute` turns its outputs into
`LossMetrics`. `NumberLossStrategy` asks for the headless forward pass
(`apply_lm_head=False`), as EasyDeL's own chunked `CausalLMLossStrategy` does, and
computes the objective from the hidden states and the head's kernel through
`ntl_jax.fused_cross_entropy_and_ntl`: the `[batch, length, vocab]` logits are never
held. Its cross-entropy is EasyDeL's (next-token targets, its weights, its normalising
factor, label smoothing and z-loss as T5X has them); the number loss's term joins it as
every integration joins it (`NumberLoss.normalised`: for NTL its mean over the number
targets x the targets' weight over CE's factor), with the loss's own weight where
`ntl_weight` is None.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from easydel.infra.loss_utils import BaseLossStrategy, LossConfig, LossForwardPlan, LossMetrics

import ntl_jax
from ntl_jax import losses
from ntl_jax.easydel import heads
from ntl_jax.easydel.versions import check_easydel_version

# What `compute` adds to EasyDeL's `LossMetrics.other_metrics`, which its trainer logs:
# the number loss's mean over the positions it counts (pooled: `ntl_mean`), what it adds
# to the loss, its sum and count (for pooling over steps), and the cross-entropy alone.
METRICS = ("ntl", "ntl_term", "ntl_sum", "ntl_weight_sum", "cross_entropy")

# Each field of EasyDeL's LossConfig, by what the strategy does with it.
HONOURED = ("ignore_index", "label_smoothing", "z_loss", "loss_normalizing_factor", "chunk_vocab_size",
            "break_on_nan")
# Memory settings of EasyDeL's own cross-entropy: they choose its chunks, not the loss.
MEMORY_ONLY = ("chunk_token_size", "chunk_block_size")
# For the other tasks (classification), which a causal LM's loss does not read.
OTHER_TASKS = ("num_labels", "problem_type", "num_classification_labels", "classification_problem_type")
CHECKED = ("reduction", "divide_weight_sum", "shift_tokens", "compute_dtype")
KNOWN_FIELDS = frozenset(HONOURED + MEMORY_ONLY + OTHER_TASKS + CHECKED)
FACTORS = ("NUM_REAL_TARGET_TOKENS", "NUM_TOTAL_TARGET_TOKENS")
# What the fused head takes beside the objective's options.
FUSED_OPTIONS = ("gce_sigma", "chunk_size", "backward", "device_kind")


def _factor_name(factor) -> str | None:
    name = getattr(factor, "name", factor)
    return name.upper() if isinstance(name, str) else None


def check_loss_config(config: LossConfig | None) -> LossConfig:
    """EasyDeL's loss options as the strategy takes them: `config` (or EasyDeL's
    defaults), or `ValueError` naming each option it refuses.

    Honoured: `ignore_index`, `label_smoothing`, `z_loss`, `loss_normalizing_factor`
    ("NUM_REAL_TARGET_TOKENS", EasyDeL's default; "NUM_TOTAL_TARGET_TOKENS"; a number;
    None), `chunk_vocab_size` (the fused head's vocabulary chunk), and
    `num_items_in_batch` where EasyDeL passes it. `chunk_token_size` and
    `chunk_block_size` size EasyDeL's own chunks and change no value. Refused: a
    `reduction`, `divide_weight_sum`, `shift_tokens=False`, `compute_dtype="bf16"` (the
    fused head accumulates in float32), and the factors "NO_WEIGHT_NUM_REAL_TARGET_TOKENS"
    and "AVERAGE_PER_SEQUENCE". A field this list does not know (a newer EasyDeL) is
    refused too.
    """
    config = LossConfig() if config is None else config
    fields = {field.name for field in dataclasses.fields(config)}
    unknown = sorted(fields - KNOWN_FIELDS)
    if unknown:
        raise ValueError(f"expected EasyDeL's LossConfig fields as ntl_jax.easydel knows them, got new ones: "
                         f"{', '.join(unknown)} (an EasyDeL release this integration was not made for)")
    refused = []
    if config.reduction is not None:
        refused.append(f"reduction={config.reduction!r} (the loss is CE's weighted sum over its factor)")
    if config.divide_weight_sum:
        refused.append("divide_weight_sum=True")
    if not config.shift_tokens:
        refused.append("shift_tokens=False (a causal LM predicts the next token)")
    if config.compute_dtype not in (None, "fp32"):
        refused.append(f"compute_dtype={config.compute_dtype!r} (the fused head accumulates in float32)")
    factor = config.loss_normalizing_factor
    name = _factor_name(factor)
    if name is not None and name not in FACTORS:
        refused.append(f"loss_normalizing_factor={name!r} (take one of {', '.join(FACTORS)}, a number or None)")
    if name is None and factor is not None and not isinstance(factor, (int, float)):
        refused.append(f"loss_normalizing_factor={factor!r}")
    if refused:
        raise ValueError("expected EasyDeL loss options that NumberLossStrategy honours, got: " + "; ".join(refused))
    return config


def loss_weights(labels: jax.Array, batch, config: LossConfig) -> jax.Array:
    """EasyDeL's weights of the next-token targets `labels[:, 1:]`, `[batch, length - 1]`:
    the batch's `decoder_loss_weights`, else its attention mask, else the labels that
    are not `ignore_index`. (With an attention mask, positions labelled `ignore_index`
    keep weight 1: they count in EasyDeL's factor, and add no loss.)"""
    targets = labels[:, 1:]
    weights = batch.get("decoder_loss_weights")
    if weights is not None:
        weights = jnp.asarray(weights)
        return weights[:, 1:] if weights.shape == labels.shape else weights
    mask = batch.get("attention_mask")
    if mask is not None:
        return jnp.asarray(mask)[:, 1:].astype(jnp.float32)
    return (targets != config.ignore_index).astype(jnp.float32)


def normalizing_factor(weights: jax.Array, config: LossConfig):
    """CE's divisor as EasyDeL's factor names it; 1 where the weights sum to 0."""
    name = _factor_name(config.loss_normalizing_factor)
    if name == "NUM_REAL_TARGET_TOKENS":
        total = jnp.sum(weights)
        return jnp.where(total > 0, total, 1.0)
    if name == "NUM_TOTAL_TARGET_TOKENS":
        return float(weights.size)
    return config.loss_normalizing_factor


class NumberLossStrategy(BaseLossStrategy):
    """EasyDeL's loss seam computing CE + `ntl_weight` x the number loss from the hidden
    states and the head's kernel (`ntl_jax.fused_cross_entropy_and_ntl`).

    Args:
      number_tokens: the tokenizer's `NumberTokens` (`ntl_jax.easydel.number_tokens`).
      number_loss: a `ntl_jax.losses` value, yours too, or its spec ("was",
        "smmd(sigma=2)"); None: CE alone, through the fused head.
      ntl_weight: lambda; None: the loss's own (`NumberLoss.default_weight`).
      **fused_options: `gce_sigma`, `chunk_size` (vocabulary columns per chunk; EasyDeL's
        `chunk_vocab_size` sets it too), `backward`, `device_kind`, as the fused head's.

    `compute` returns EasyDeL's `LossMetrics`: `loss` the objective (divided by
    `num_items_in_batch` where EasyDeL passes one), `z_loss`, `weight_sum` (the targets counted), no
    `accuracy` (the fused head takes no argmax), and `other_metrics` with `ntl`,
    `ntl_term`, `ntl_sum`, `ntl_weight_sum` and `cross_entropy`.
    """

    # EasyDeL's compute_loss reads the input ids as labels for a loss of this name.
    __name__ = "ForCausalLMLoss"

    def __init__(self, number_tokens: ntl_jax.NumberTokens, *, number_loss=losses.DEFAULT,
                 ntl_weight: float | None = None, **fused_options):
        check_easydel_version()
        if not isinstance(number_tokens, ntl_jax.NumberTokens):
            raise TypeError(f"expected NumberTokens (ntl_jax.easydel.number_tokens(tokenizer)), got "
                            f"{type(number_tokens).__name__}")
        unknown = sorted(set(fused_options) - set(FUSED_OPTIONS))
        if unknown:
            raise TypeError(f"expected fused-head options among {', '.join(FUSED_OPTIONS)}, got {', '.join(unknown)}")
        self.number_tokens = number_tokens
        self.number_loss = None if number_loss is None else losses.resolve(number_loss)
        self.ntl_weight = ntl_weight
        self.fused_options = dict(fused_options)
        self.calls = 0  # compute()'s traces and calls: the trainer's guard reads it

    def plan_forward(self, *, module, labels, loss_config, batch, loss_kwargs) -> LossForwardPlan:
        """The headless forward pass; the loss options are checked here, before the model runs."""
        del batch, loss_kwargs
        check_loss_config(loss_config)
        if labels is None:
            raise ValueError("expected labels [batch, length] for the number loss, got None")
        if not heads.supports_headless_forward(module):
            raise TypeError(f"expected an EasyDeL causal LM whose call takes apply_lm_head, got "
                            f"{type(module).__name__}: the fused head needs the hidden states before the LM head")
        return LossForwardPlan(forward_kwargs={"apply_lm_head": False})

    def compute(self, *, module, outputs, labels, loss_config, batch, loss_kwargs, paxis,
                forward_plan) -> LossMetrics:
        """`LossMetrics` of CE + `ntl_weight` x NTL for the next-token targets `labels[:, 1:]`."""
        config = check_loss_config(loss_config)
        if forward_plan.forward_kwargs.get("apply_lm_head", True):
            raise RuntimeError("expected EasyDeL to run the forward pass NumberLossStrategy.plan_forward planned "
                               "(apply_lm_head=False), got a plan without it")
        labels = jnp.asarray(labels)
        if labels.ndim != 2:
            raise ValueError(f"expected labels [batch, length], got shape {labels.shape}")
        kernel = heads.head_kernel(module)
        vocab = kernel.shape[1]
        if self.number_tokens.vocab_size > vocab:
            raise ValueError(f"expected a tokenizer with at most the model's {vocab} ids, got number tokens for "
                             f"{self.number_tokens.vocab_size}")
        if not isinstance(labels, jax.core.Tracer):  # traced labels: the trainer's guard checks its batches
            ntl_jax.check_targets(labels, vocab, ignore_index=config.ignore_index)
        self.calls += 1
        hidden = heads.hidden_states(module, outputs)[:, :-1]
        weights = loss_weights(labels, batch, config)
        # Positions labelled ignore_index are no target (-1: outside the vocabulary).
        targets = jnp.where(labels[:, 1:] == config.ignore_index, -1, labels[:, 1:])
        factor = normalizing_factor(weights, config)
        options = dict(self.fused_options)
        if config.chunk_vocab_size is not None:
            options.setdefault("chunk_size", int(config.chunk_vocab_size))
        options.update(_vocab_parallel(module, paxis, vocab))
        loss, parts = ntl_jax.fused_cross_entropy_and_ntl(
            hidden, kernel, targets, self.number_tokens, weights=weights, number_loss=self.number_loss,
            ntl_weight=self.ntl_weight, label_smoothing=config.label_smoothing, z_loss=config.z_loss,
            loss_normalizing_factor=factor, **options)
        items = loss_kwargs.get("num_items_in_batch", batch.get("num_items_in_batch"))
        scale = 1.0 if items is None else 1.0 / jnp.asarray(items, jnp.float32)
        other = {name: jnp.asarray(parts[name], jnp.float32) for name in METRICS}
        other["ntl_term"] = other["ntl_term"] * scale
        other["cross_entropy"] = other["cross_entropy"] * scale
        return LossMetrics(loss=loss * scale, z_loss=parts["z_loss"] * scale, weight_sum=parts["weight_sum"],
                           accuracy=None, other_metrics=other)


def _vocab_parallel(module, paxis, vocab: int) -> dict:
    """The fused head's `vocab_axis` and `mesh` where the model's mesh shards the
    vocabulary (EasyDeL's `PartitionAxis.vocab_axis`) over more than one device."""
    mesh = getattr(module, "mesh", None)
    axis = getattr(paxis, "vocab_axis", None) if paxis is not None else None
    if mesh is None or not isinstance(axis, str) or dict(mesh.shape).get(axis, 1) <= 1:
        return {}
    return {"vocab_axis": axis, "mesh": mesh}
