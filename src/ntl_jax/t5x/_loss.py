"""The arithmetic of the NTL T5X models' `loss_fn`, importable without T5X.

`ntl_jax.t5x.models` puts `NTLLossMixin` in front of the stock T5X models. Everything
that mixin computes lives here, in pure functions on arrays, so it is tested where T5X
is not installed (T5X is not on PyPI):

- `model_loss`: the loss to differentiate (`ntl_jax.cross_entropy_and_ntl`: one
  pass, `pipeline.run`, then `objective.objective_from_head`), the inputs of the stock
  `_compute_metrics` (mask, z-loss, segment ids) and the NTL metrics as plain totals
  and counts;
- `number_quality_totals`: how well the number head regresses, as totals and counts;
- `NTLLossMixin`: the constructor options and `loss_fn`, on any base class that
  provides T5X's `_compute_logits`, `_compute_metrics`, `output_vocabulary`,
  `_label_smoothing`, `_z_loss` and `_loss_normalizing_factor`. It builds its metric
  objects through two class attributes (`per_step_metric`, `average_metric`), which
  `ntl_jax.t5x.models` sets to T5X's `AveragePerStep` and clu's `Average`.

Zausinger et al., "Regress, Don't Guess", ICML 2025 (arXiv:2411.02083).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Callable, Mapping, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from ntl_jax._core import checks, fused, fused_plan, head_stats, normalization, objective, pipeline, vocab_parallel
from ntl_jax._core.losses import predict_numbers
from ntl_jax._core.migration import check_no_old_keywords
from ntl_jax._core.number_losses.number_loss import DEFAULT, NumberLoss
from ntl_jax._core.number_losses.registry import NONE
from ntl_jax._core.number_stats import expected_value
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.options import CrossEntropy, Options
from ntl_jax._core.targets import number_target
from ntl_jax.flax import _linen


def segment_ids(batch: Mapping[str, Any]) -> dict:
    """The packing/padding features the stock `loss_fn` hands to `_compute_metrics`:
    every `<prefix>_segment_ids` keyed by its prefix, else (unpacked batches)
    `encoder_input_tokens != 0` and `decoder_target_tokens != 0`."""
    out = {k[: -len("_segment_ids")]: v for k, v in batch.items() if k.endswith("_segment_ids")}
    if not out:
        out = {k: v != 0 for k, v in batch.items() if k in ("encoder_input_tokens", "decoder_target_tokens")}
    return out


def _is_special(loss_normalizing_factor) -> bool:
    """Whether the factor names a special one (the objective's own rule)."""
    return normalization.special_factor(loss_normalizing_factor) is not None


def resolve_weights(vocab: int, batch: Mapping[str, Any], loss_normalizing_factor):
    """The loss-normalising factor and the effective per-token weights, as the loss
    resolves them (`normalization.factor_and_weights`, inside `pipeline.run`).

    T5X's `get_loss_normalizing_factor_and_weights` on the batch, except that a
    position whose target id is outside `[0, vocab)` (the logits' last axis) has weight 0 before
    the factor is taken (the losses ignore such positions: they count neither in
    `NUM_REAL_TARGET_TOKENS` nor in a sequence's total for `AVERAGE_PER_SEQUENCE`).
    Without `decoder_loss_weights` the weights are T5X's for the factor: `targets > 0`
    for a special factor, every position otherwise.

    Returns:
      `(factor, weights)`, the order of `ntl_jax.loss_normalizing_factor_and_weights`:
      None, the given number, or the resolved special factor (at least 1, so an empty
      batch gives 0, not NaN); and `[batch, length]` float32.
    """
    factor, weights = normalization.factor_and_weights(
        batch["decoder_target_tokens"], batch.get("decoder_loss_weights"), vocab, loss_normalizing_factor,
        decoder_segment_ids=batch.get("decoder_segment_ids"), decoder_positions=batch.get("decoder_positions"),
    )
    return factor, jnp.asarray(weights, jnp.float32)


def number_quality_totals(logits, targets, mask, number_tokens: NumberTokens) -> dict:
    """How well the number head regresses, as `{name: (total, count)}`.

    - `number_abs_error`: |expected digit value - target digit value|, the expectation
      taken under the softmax restricted to the number tokens;
    - `number_token_mass`: the full-vocabulary probability on number tokens.

    Both from `ntl_jax.predict_numbers`, summed over the positions whose target is a
    number token and whose `mask` is > 0 (`targets != 0` when `mask` is None), and
    `count` is the number of those positions: plain means, whatever the
    loss-normalising factor. No gradient flows.

    Args:
      logits: `[batch, length, vocab]`.
      targets: `[batch, length]` integer.
      mask: `[batch, length]` or None.
      number_tokens: the output vocabulary's `NumberTokens`.
    """
    value, mass = predict_numbers(jax.lax.stop_gradient(logits), number_tokens)
    return _number_totals(value, mass, targets, mask, number_tokens)


def _number_totals(value, mass, targets, mask, number_tokens: NumberTokens) -> dict:
    """`number_quality_totals` from the predicted value and number mass `[batch, length]`."""
    target = number_target(targets, None, number_tokens.vocab_size, number_tokens)
    counted, target_value = target.is_number, target.value
    counted &= (mask > 0) if mask is not None else (targets != 0)
    count = jnp.sum(counted)
    abs_error = jnp.where(counted, jnp.abs(value - target_value), 0.0)
    return {
        "number_abs_error": (jnp.sum(abs_error), count),
        "number_token_mass": (jnp.sum(jnp.where(counted, mass, 0.0)), count),
    }


def _predictions(head, number_tokens: NumberTokens):
    """`(value, number_mass)` `[batch, length]` from the head's statistics, without
    gradient: what `predict_numbers` computes, taken from the pass the loss made (the
    expected value it read, the mass from its normalisers), no further pass over the
    vocabulary."""
    value = jax.lax.stop_gradient(head.numbers.means[expected_value])
    mass = (head.masses if head.masses is not None else
            head_stats.number_mass_of(head.numbers, head.log_normalizer))[0]
    return value, jax.lax.stop_gradient(mass)


class ModelLoss(NamedTuple):
    """What the NTL models' `loss_fn` computes, as plain arrays.

    - `loss`: the scalar to differentiate, `CE (+ z-loss) + ntl_weight * NTL`;
    - `z_loss`: the normalised z-loss sum (the stock metrics' `z_loss`);
    - `mask`: `[batch, length]` float32, the effective weights, handed to the stock
      `_compute_metrics` as its `mask` (0 at padding, at weight-0 positions and at
      targets outside `[0, vocab)`; fractional for `AVERAGE_PER_SEQUENCE`, as T5X's);
    - `segment_ids`: the stock `_compute_metrics`'s `segment_ids`;
    - `per_step`: `{name: total}` for per-step averages (`cross_ent_loss`, `ntl_term`);
    - `averages`: `{name: (total, count)}` for means (`cross_ent_loss_per_all_target_tokens`,
      `ntl`: parts' `ntl_sum` and `ntl_weight_sum`, `number_abs_error`, `number_token_mass`);
    - `loss_normalizing_factor`: the resolved factor (None, a number, or an array);
    - `accuracy_inputs`: `(logits, targets)` for the stock accuracy metric when the
      loss was computed without logits (`model_loss_from_hidden`), else None.

    Without a number loss (`number_loss=None`) there is no `ntl` nor `ntl_term`.
    """

    loss: jax.Array
    z_loss: jax.Array
    mask: jax.Array
    segment_ids: dict
    per_step: dict
    averages: dict
    loss_normalizing_factor: Any
    accuracy_inputs: Optional[tuple] = None


def model_loss(
    logits,
    batch: Mapping[str, Any],
    number_tokens: NumberTokens,
    options: Options = Options(),
    loss_normalizing_factor=None,
) -> ModelLoss:
    """The NTL T5X models' loss and metric inputs from their logits and batch.

    `loss = CE + z_loss + ntl_weight * term`, the term normalised as the loss's authors
    do (`NumberLoss.normalised`: the paper's ratio to CE under every factor): exactly
    `ntl_jax.cross_entropy_and_ntl` on the batch's `decoder_target_tokens` and
    `decoder_loss_weights` (packed: `decoder_segment_ids`, `decoder_positions`), the
    same pass (`pipeline.run`, which also reads the expected value) and the same
    assembly (`objective.objective_from_head`). The number metrics come from that pass,
    with no second softmax over the vocabulary; with `ntl_weight=0` the loss is T5X's
    stock `compute_weighted_cross_entropy`.

    Metrics (`ModelLoss`): `cross_ent_loss`, the cross-entropy alone (the stock metric,
    `loss - z_loss`, would hold the NTL term); `ntl`, the mean of the number loss over
    the positions it counts (`parts["ntl"]`), logged at `ntl_weight=0` too; `ntl_term`,
    what it adds to the loss per step (`parts["ntl_term"]`); `number_abs_error`,
    `number_token_mass` as `number_quality_totals`.

    Args:
      logits: `[batch, length, vocab]` floating (`vocab` may exceed the table).
      batch: the T5X batch (`decoder_target_tokens` required).
      number_tokens: the output vocabulary's `NumberTokens`.
      options: the objective's `Options`, as the mixin builds them once per model.
      loss_normalizing_factor: the stock model's.
    """
    targets = batch["decoder_target_tokens"]
    weights = checks.check_logits_and_targets(logits, targets, number_tokens, batch.get("decoder_loss_weights"))
    vocab = jnp.shape(logits)[-1]

    def head_of(target, reads, with_masses):
        return head_stats.from_logits(logits, target, number_tokens, reads,
                                      label_smoothing=options.cross_entropy.label_smoothing, with_masses=with_masses)

    run = _run(head_of, batch, weights, vocab, number_tokens, options, loss_normalizing_factor)
    return _model_loss_from_run(run, batch, number_tokens, options, vocab=vocab,
                                loss_normalizing_factor=loss_normalizing_factor)


def model_loss_from_hidden(
    hidden,
    kernel,
    batch: Mapping[str, Any],
    number_tokens: NumberTokens,
    options: Options = Options(),
    loss_normalizing_factor=None,
    *,
    chunk_size: Optional[int] = None,
    vocab_axis: Optional[str] = None,
    device_kind: Optional[str] = None,
) -> ModelLoss:
    """`model_loss(hidden @ kernel, ...)` without forming the logits
    (`ntl_jax.fused_cross_entropy_and_ntl`'s streaming; the same values to float32
    rounding). The stock accuracy metric gets, instead of the logits, two-column
    stand-ins whose argmax is 0 exactly where the vocabulary's argmax (computed in
    the same stream) is the target, with all-zero targets (`accuracy_inputs`).

    `vocab_axis`: None (default), or the axis of the mesh in context (`with mesh:`,
    as T5X's partitioner runs the step, or `jax.set_mesh`) that shards the kernel's
    columns: vocabulary-parallel, each device streams its own columns and the kernel
    is never gathered (`fused_cross_entropy_and_ntl`'s `vocab_axis`; the mesh's
    other axes shard the batch). `device_kind`: the chip it is compiled for, as
    `fused_cross_entropy_and_ntl`'s (None: the platform it is lowered for decides)."""
    targets = batch["decoder_target_tokens"]
    weights = checks.check_hidden_and_kernel(hidden, kernel, targets, number_tokens,
                                             batch.get("decoder_loss_weights"), chunk_size)
    vocab = jnp.shape(kernel)[1]
    shards = vocab_parallel.vocab_shards(vocab_axis, None, vocab, jnp.shape(hidden)[0])
    plan = fused_plan.plan(jnp.shape(hidden), vocab, shards, device_kind=device_kind, chunk_size=chunk_size)
    top = []  # the vocabulary's argmax, streamed in the same pass, for the accuracy metric

    def head_of(target, reads, with_masses):
        head, top_ids = fused.head_stats_from_hidden(
            hidden, kernel, target, number_tokens, reads, plan, label_smoothing=options.cross_entropy.label_smoothing,
            with_masses=with_masses, with_top=True, shards=shards)
        top.append(top_ids)
        return head

    run = _run(head_of, batch, weights, vocab, number_tokens, options, loss_normalizing_factor)
    correct = (top[0] == targets).astype(jnp.float32)
    accuracy_inputs = (jnp.stack([correct, 1.0 - correct], axis=-1), jnp.zeros_like(targets))
    return _model_loss_from_run(run, batch, number_tokens, options, vocab=vocab,
                                loss_normalizing_factor=loss_normalizing_factor, accuracy_inputs=accuracy_inputs)


def _run(head_of, batch, weights, vocab, number_tokens, options: Options, loss_normalizing_factor) -> pipeline.Pass:
    """The loss's one pass over the batch, reading the expected value for the metrics."""
    return pipeline.run(head_of, batch["decoder_target_tokens"], weights, vocab, number_tokens, options.number_loss,
                        options.cross_entropy, loss_normalizing_factor=loss_normalizing_factor,
                        decoder_segment_ids=batch.get("decoder_segment_ids"),
                        decoder_positions=batch.get("decoder_positions"), with_value=True)


def context_vocab_axis(vocab_axis: Optional[str]) -> Optional[str]:
    """`vocab_axis` if the mesh in context (`with mesh:`, as T5X's partitioner runs the
    step, or `jax.set_mesh`) has that axis and more than one device, else None (no mesh,
    a one-device mesh, a mesh without the axis, or `vocab_axis` None): whether the fused
    loss runs per device under `shard_map`, its kernel's columns split over `vocab_axis`
    and its batch over the mesh's other axes.

    With one device on `vocab_axis` (a data-parallel mesh) that is the batch split alone:
    left to XLA's partitioner instead, the fused loop of a T5 Large step on a
    data-parallel v5e pod gathered a kernel-sized array 1,204 times."""
    if vocab_axis is None:
        return None
    mesh = vocab_parallel.context_mesh()
    if mesh is None or vocab_axis not in dict(mesh.shape) or mesh.size <= 1:
        return None
    return vocab_axis


# `fused_loss="auto"`: the fused head is taken where it pays (`fused_head_pays`).
AUTO = "auto"


def fused_head_pays(target_shape, d_model: int, model_axis: Optional[str]) -> bool:
    """Whether the fused head saves memory over the logits: when each device holds at
    least `d_model` target tokens. Its extra buffers are kernel-sized (`[d_model, vocab]`
    per device, the kernel's gradient and a chunk), what it saves is logits-sized
    (`[tokens, vocab]`, several times over in the backward pass), so it pays once the
    logits outweigh the kernel (docs/performance.md has the measurements). The tokens per
    device are the batch's over the mesh in context's data shards: its size over that
    of `model_axis`, the axis that does not split the batch."""
    mesh = vocab_parallel.context_mesh()
    shards = 1
    if mesh is not None:
        shape = dict(mesh.shape)
        shards = mesh.size // shape.get(model_axis, 1) if model_axis is not None else mesh.size
    return math.prod(target_shape) / shards >= d_model


def check_fused_loss(fused_loss) -> None:
    if isinstance(fused_loss, str) and fused_loss == AUTO:
        return
    if not isinstance(fused_loss, (bool, np.bool_)):
        raise TypeError(f"expected fused_loss True, False or {AUTO!r}, got {type(fused_loss).__name__} {fused_loss!r}")


def check_vocab_axis(vocab_axis, name: str = "fused_vocab_axis") -> None:
    """Raises `TypeError`/`ValueError` unless `vocab_axis` is None or a mesh axis name
    (a non-empty str)."""
    if vocab_axis is None:
        return
    if not isinstance(vocab_axis, str):
        raise TypeError(f"expected {name} None or the name of a mesh axis (a str such as 'model'), got {vocab_axis!r}")
    if not vocab_axis:
        raise ValueError(f"expected {name} None or the name of a mesh axis (such as 'model'), got an empty string")


def _model_loss_from_run(run: pipeline.Pass, batch, number_tokens, options: Options, *, vocab,
                         loss_normalizing_factor, accuracy_inputs=None) -> ModelLoss:
    """The common tail of `model_loss` and `model_loss_from_hidden`: the objective
    (`objective_from_head`) and the metrics' totals."""
    targets = batch["decoder_target_tokens"]
    loss, parts = objective.objective_from_head(run, number_tokens, options, vocab=vocab)
    num_tokens = jnp.array(np.prod(jnp.shape(targets)))
    cross_entropy = parts["cross_entropy"]
    per_step = {"cross_ent_loss": cross_entropy}
    averages = {"cross_ent_loss_per_all_target_tokens": (cross_entropy, num_tokens)}
    if options.number_loss is not None:
        per_step["ntl_term"] = parts["ntl_term"]
        averages["ntl"] = (parts["ntl_sum"], parts["ntl_weight_sum"])  # pooled over steps (NTLMean)
    # Number metrics: as the loss, but without a weights feature padding is not counted.
    number_mask = run.weights
    if batch.get("decoder_loss_weights") is None and not _is_special(loss_normalizing_factor):
        number_mask = jnp.where(targets != 0, run.weights, 0.0)
    averages.update(_number_totals(*_predictions(run.head, number_tokens), targets, number_mask, number_tokens))
    return ModelLoss(
        loss=loss,
        z_loss=parts["z_loss"],
        mask=run.weights,
        segment_ids=segment_ids(batch),
        per_step=per_step,
        averages=averages,
        loss_normalizing_factor=run.factor,
        accuracy_inputs=accuracy_inputs,
    )


class NTLLossMixin:
    """The NTL models' options and `loss_fn`; mixed in before a T5X transformer model.

    The base class provides `_compute_logits(params, batch, dropout_rng)`,
    `_compute_metrics(logits=, targets=, mask=, loss=, z_loss=, segment_ids=)`,
    `output_vocabulary`, `_label_smoothing`, `_z_loss` and `_loss_normalizing_factor`
    (T5X's `BaseTransformerModel` does). The NTL metrics are built with
    `per_step_metric(total=...)`, `average_metric(total=..., count=...)` and, for `ntl`,
    `ntl_metric(total=..., count=...)`, class attributes the concrete model sets (T5X's
    `AveragePerStep`, clu's `Average`, and clu's `Average` with `NTLMean`'s `compute`).

    Keyword arguments (the rest pass through to the base class): `number_loss`,
    `ntl_weight`, `digit_level`, `gce_sigma`, `fused_loss`, `fused_chunk_size`,
    `fused_vocab_axis`, `fused_device_kind`; see
    `ntl_jax.t5x.models.NTLEncoderDecoderModel`. A keyword 0.3.0 removed (the loss's
    name or one of its own parameters) raises a TypeError naming the new form: the
    number loss is one value, `number_loss`.

    `fused_vocab_axis` (default `"model"`, T5X's mesh axis of the vocabulary): with
    `fused_loss` and a mesh in context whose axis has more than one device, the loss is
    vocabulary-parallel over it, the kernel never all-gathered (docs/guides/t5x.md);
    else it is computed as on one device.
    """

    per_step_metric: Optional[Callable[..., Any]] = None
    average_metric: Optional[Callable[..., Any]] = None
    ntl_metric: Optional[Callable[..., Any]] = None

    def __init__(
        self,
        *args,
        number_loss: NumberLoss | str | None = DEFAULT,
        ntl_weight: Optional[float] = None,
        digit_level: bool = True,
        gce_sigma: float = 0.0,
        fused_loss: bool | str = False,
        fused_chunk_size: Optional[int] = None,
        fused_vocab_axis: Optional[str] = "model",
        fused_device_kind: Optional[str] = None,
        **kwargs,
    ):
        check_no_old_keywords(f"{type(self).__name__}()", kwargs)
        # The stock model's own arguments (module, vocabularies, ...) pass through.
        super().__init__(*args, **kwargs)
        self._configure_ntl(number_loss=number_loss, ntl_weight=ntl_weight, digit_level=digit_level,
                            gce_sigma=gce_sigma)
        check_fused_loss(fused_loss)
        checks.check_chunk_size(fused_chunk_size, "fused_chunk_size")
        self._fused_loss = fused_loss if fused_loss == AUTO else bool(fused_loss)
        self._fused_chunk_size = fused_chunk_size
        check_vocab_axis(fused_vocab_axis, "fused_vocab_axis")
        self._fused_vocab_axis = fused_vocab_axis
        checks.check_device_kind(fused_device_kind, "fused_device_kind")
        self._fused_device_kind = fused_device_kind

    def _configure_ntl(self, *, number_loss, ntl_weight, digit_level, gce_sigma=0.0):
        # Checked here, once per model: `loss_fn` reads the record.
        options = Options(
            number_loss=number_loss, ntl_weight=ntl_weight,
            cross_entropy=CrossEntropy(label_smoothing=getattr(self, "_label_smoothing", 0.0),
                                       z_loss=getattr(self, "_z_loss", 0.0), gce_sigma=gce_sigma),
        )
        # Kept as Python floats (gin may bind integers), once they are known to be numbers.
        self._options = dataclasses.replace(
            options, ntl_weight=float(options.ntl_weight),
            cross_entropy=dataclasses.replace(options.cross_entropy, gce_sigma=float(gce_sigma)))
        checks.check_bool("digit_level", digit_level)
        # Built once on the host from the output vocabulary; a closure constant in jit.
        self._number_tokens = NumberTokens.from_vocabulary(self.output_vocabulary, digit_level=digit_level)
        loss = self._options.number_loss
        if loss is not None and loss.check_table is not None:
            loss.check_table(self._number_tokens)  # a table the loss cannot score fails here, not in the first step

    @property
    def number_tokens(self) -> NumberTokens:
        """The number tokens of the output vocabulary."""
        return self._number_tokens

    @property
    def number_loss(self) -> NumberLoss | None:
        """The number loss (`ntl_jax.losses`), None for cross-entropy alone."""
        return self._options.number_loss

    @property
    def gce_sigma(self) -> float:
        """The width of the Gaussian label of the cross-entropy (0: the stock one-hot)."""
        return self._options.cross_entropy.gce_sigma

    @property
    def fused_loss(self) -> bool | str:
        """Whether the loss is taken from the hidden states and the logits kernel: True,
        False, or `"auto"`, where each step's shapes decide (`fused_head_pays`)."""
        return self._fused_loss

    @property
    def fused_device_kind(self) -> Optional[str]:
        """The chip the fused loss is compiled for (a `jax.Device.device_kind`), None where
        the platform it is lowered for decides (a TPU's program with a v5e's chunk on a
        TPU)."""
        return self._fused_device_kind

    def compiled_for(self, device_kind: str):
        """A copy of this model whose fused loss is traced for the chip `device_kind`
        (`fused_device_kind`): what `ntl_jax.t5x.compile_check` compiles ahead of time."""
        checks.check_device_kind(device_kind)
        model = copy.copy(self)
        model._fused_device_kind = device_kind
        return model

    @property
    def ntl_options(self) -> dict:
        """The NTL term as plain values: `ntl_weight` and `number_loss`, the loss's spec
        (`"was"`, `"smmd(mode=mmd)"`; `"none"` without one)."""
        loss = self._options.number_loss
        return {"ntl_weight": self._options.ntl_weight, "number_loss": NONE if loss is None else loss.spec}

    def loss_fn(
        self,
        params: Any,
        batch: Mapping[str, jnp.ndarray],
        dropout_rng: Optional[jax.Array],
    ) -> Tuple[jnp.ndarray, Mapping[str, Any]]:
        """Cross-entropy + `ntl_weight` * NTL, and the stock metrics plus NTL ones.

        With `fused_loss`, the network runs without its logits projection and the loss
        streams `hidden @ kernel` over vocabulary chunks (`model_loss_from_hidden`):
        the `[batch, length, vocab]` logits are never formed; vocabulary-parallel over
        `fused_vocab_axis` when the mesh in context shards it (`context_vocab_axis`).
        With `fused_loss="auto"`, so where each device holds at least `d_model` target
        tokens (`fused_head_pays`); elsewhere the logits are `hidden @ kernel`."""
        fused = False
        if self._fused_loss is False:
            logits = self._compute_logits(params, batch, dropout_rng)
        else:
            with _linen.projection_skipped() as heads:
                hidden = self._compute_logits(params, batch, dropout_rng)
            hidden, kernel = _linen.cast_like_projection(hidden, *_linen.projection_kernel(params, heads))
            fused = self._fused_loss is True or fused_head_pays(
                batch["decoder_target_tokens"].shape, kernel.shape[0], self._fused_vocab_axis)
            if not fused:
                logits = jnp.einsum("...d,dv->...v", hidden, kernel)
        if fused:
            out = model_loss_from_hidden(
                hidden, kernel, batch, self._number_tokens, self._options, self._loss_normalizing_factor,
                chunk_size=self._fused_chunk_size, vocab_axis=context_vocab_axis(self._fused_vocab_axis),
                device_kind=self._fused_device_kind,
            )
            logits, targets = out.accuracy_inputs
        else:
            out = model_loss(logits, batch, self._number_tokens, self._options, self._loss_normalizing_factor)
            targets = batch["decoder_target_tokens"]
        metrics = self._compute_metrics(
            logits=logits,
            targets=targets,
            mask=out.mask,
            loss=out.loss,
            z_loss=out.z_loss,
            segment_ids=out.segment_ids,
        )
        metrics.update(self._ntl_metrics(out))
        return out.loss, metrics

    def _ntl_metrics(self, out: ModelLoss) -> dict:
        """The NTL metrics, and the stock cross-entropy metrics without the NTL term."""
        model = type(self)
        per_step, average, ntl = model.per_step_metric, model.average_metric, model.ntl_metric
        if per_step is None or average is None or ntl is None:
            raise TypeError(
                f"{model.__name__} must set per_step_metric, average_metric and ntl_metric "
                "(t5x.metrics.AveragePerStep, clu.metrics.Average and an Average with NTLMean's compute "
                "in ntl_jax.t5x.models)"
            )
        metrics = {name: per_step(total=total) for name, total in out.per_step.items()}
        metrics.update({name: (ntl if name == "ntl" else average)(total=total, count=count)
                        for name, (total, count) in out.averages.items()})
        return metrics


class NTLMean:
    """Put before clu's `Average` (`ntl_jax.t5x.models`): the metric of `ntl`, whose
    mean, merged over the steps T5X reports (training's summary period, an evaluation),
    is `ntl_jax.ntl_mean` of their sums and counts, 0 where none counted."""

    def compute(self):
        return objective.ntl_mean(self.total, self.count)
