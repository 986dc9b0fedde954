"""CE + `ntl_weight` x NTL inside MaxText's own `loss_fn`, `train_step` and `eval_step`.

MaxText's `loss_fn` (`maxtext.trainers.pre_train.train`) computes its cross-entropy from
the logits, or, under vocabulary tiling (`num_vocab_tiling > 1`), from the final hidden
states tile by tile without forming the logits. `number_loss_fn` calls it unchanged and
adds NTL. Under vocabulary tiling, where `tiles.fits`, MaxText's tiles compute it
(`tiles.py`) and hand back its sum. Elsewhere the final hidden states go through
MaxText's own output head again with the head's kernel cut to the `N` number-token
columns (`number_logits`), giving the number tokens' logits `[batch, length, N]`, from
which `ntl_jax.ntl_from_number_logits` computes NTL.

That route reads nothing of the `[batch, length, vocab]` logits. A second reader of them
would make XLA write them out where MaxText's step otherwise fuses the head's matmul into
its cross-entropy and never does (a `[batch, length, vocab]` buffer per device more:
docs/guides/maxtext.md). The losses that read a whole sequence (`number_level`, `del`)
see it in order, and NTL's own cost is an `N`-column matmul and the scatter of its
gradient into the head's.

The hidden states are the input of the decoder's `apply_output_head` (caught while
MaxText's `loss_fn` runs), or under vocabulary tiling the `hidden_states` the decoder
sows. NTL is masked as MaxText's cross-entropy (positions with `targets_segmentation !=
0`) and normalised as its authors normalise it (`NumberLoss.normalised`: for NTL its mean
over the number targets, times the real targets' count over MaxText's divisor, so that it
stands to MaxText's CE as the paper's term to its CE mean; under MaxText's own gradient
accumulation, which sums each micro-batch's loss and divides the summed gradient, each
micro-batch's term stands so to its cross-entropy sum). MaxText's `xent_sum`, and so its
`lm_loss`, perplexity and evaluation loss, stay cross-entropy only; its `learning/loss`
is the objective trained on. `number_train_step` and `number_eval_step` trace MaxText's
steps each in a `step.step` and add `learning/ntl` (NTL's mean over the positions it
counts), `learning/ntl_term` (what it adds to the loss) and the evaluation's sums to
MaxText's metrics from the loss's aux.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from ntl_jax._core import pipeline
from ntl_jax._core.losses import ntl_from_number_logits
from ntl_jax._core.objective import ntl_mean
from ntl_jax.maxtext import step
from ntl_jax.maxtext.settings import NumberLossSettings, check_config
from ntl_jax.maxtext.tokens import number_tokens

# Added to the aux of MaxText's loss_fn; summed over microbatches by its gradient accumulation.
NTL_SUM = "ntl_sum"  # the number loss summed over the positions it counts
NTL_WEIGHT_SUM = "ntl_weight_sum"  # how many positions it counts: NTL's mean is NTL_SUM / NTL_WEIGHT_SUM
NUMBER_TARGETS = "number_targets"  # how many real targets are number tokens
# What the number loss adds to the loss on the scale of MaxText's cross-entropy sum (its
# `xent_sum`): summed over micro-batches, each one's term in its authors' ratio to its CE.
NTL_TERM_SUM = "ntl_term_sum"


class LossAux(dict):
    """MaxText's loss aux, a pytree whose every rebuild is handed to the step being traced
    (`step.Step.aux`): MaxText's steps read their loss aux after `value_and_grad` or its
    gradient-accumulation scan, where only the rebuilt dict holds values of the step's
    own trace, and keep it to themselves."""


def _publish(aux: LossAux) -> LossAux:
    state = step.current()
    if state is not None:
        state.aux[:] = [aux]
    return aux


def _flatten_with_keys(aux):
    keys = sorted(aux)
    return [(jax.tree_util.DictKey(k), aux[k]) for k in keys], tuple(keys)


def _flatten(aux):
    keys = sorted(aux)
    return [aux[k] for k in keys], tuple(keys)


def _unflatten(keys, values):
    return _publish(LossAux(zip(keys, values)))


jax.tree_util.register_pytree_with_keys(LossAux, _flatten_with_keys, _unflatten, _flatten)


def _last_aux(state: step.Step, where: str) -> LossAux:
    if not state.aux:
        raise RuntimeError(f"expected MaxText's {where} to call the loss installed by ntl_jax.maxtext; it did not "
                           "(a MaxText version this integration was not made for?)")
    return state.aux[0]


@contextlib.contextmanager
def _head_inputs(decoder):
    """Catches the first `[batch, length, d_model]` input of `decoder.apply_output_head`
    with its own norm (MTP's calls skip it): the final hidden states, and whether dropout
    is off. Yields a list of `(hidden, deterministic)`."""
    cls = type(decoder)
    own = "apply_output_head" in cls.__dict__
    stock = cls.apply_output_head
    seen: list = []

    @functools.wraps(stock)
    def apply_output_head(self, shared_embedding, y, deterministic, model_mode, normalize_y=True):
        if self is decoder and normalize_y and jnp.ndim(y) == 3 and not seen:
            seen.append((y, deterministic))
        return stock(self, shared_embedding, y, deterministic, model_mode, normalize_y=normalize_y)

    cls.apply_output_head = apply_output_head
    try:
        yield seen
    finally:
        if own:
            cls.apply_output_head = stock
        else:
            del cls.apply_output_head


def _final_hidden(seen: list, aux, config, is_train: bool):
    """The final hidden states and whether dropout is off: under vocabulary tiling those
    the decoder sows, read as MaxText's own tiled loss reads them; else the head's input."""
    if config.num_vocab_tiling > 1:
        [hidden] = aux["intermediate_outputs"]["decoder"]["hidden_states"]
        return hidden, (not config.enable_dropout) if is_train else True
    if not seen:
        raise RuntimeError("expected MaxText's decoder to compute its logits through apply_output_head; it did not")
    return seen[0]


def number_logits(model, config, hidden, ids, deterministic) -> jax.Array:
    """The logits of the tokens `ids` (`[N]`), `[batch, length, N]`: MaxText's output head
    (its final norm, tied or untied projection, soft cap, float32 cast) applied to the
    final hidden states `hidden` with its kernel cut to those columns, in a copy of the
    model; the gradient reaches the kernel's columns and the hidden states."""
    ids = jnp.asarray(ids)
    graphdef, state = nnx.split(model)
    local = nnx.merge(graphdef, state, copy=True)
    if config.logits_via_embedding:
        local.token_embedder.embedding.set_value(jnp.take(model.token_embedder.embedding[...], ids, axis=0))
    else:
        local.decoder.logits_dense.kernel.set_value(jnp.take(model.decoder.logits_dense.kernel[...], ids, axis=-1))
    return local.logits_from_hidden_states_for_vocab_tiling(hidden, deterministic, "train")


def number_loss_fn(stock_loss_fn, settings: NumberLossSettings):
    """MaxText's `loss_fn` with `settings.weight` x NTL added to its loss, and the aux
    holding `ntl_sum` (NTL summed over the real targets), `ntl_weight_sum` (how many of
    them it counts) and `number_targets` (how many are number tokens). Without a number
    loss (`settings.number_loss` None) it is MaxText's loss itself."""
    if not settings.computes_ntl:
        return stock_loss_fn
    from maxtext.utils.globals import EPS

    number_loss = settings.number_loss

    @functools.wraps(stock_loss_fn)
    def loss_fn(model, config, data, dropout_rng, params, sparsity_state=None, is_train=True):
        check_config(config, settings)
        numbers = number_tokens(config, digit_level=settings.digit_level, prefixed_numbers=settings.prefixed_numbers)
        state, in_tiles = step.current(), []
        if state is not None:
            state.receivers.append(in_tiles)
        try:
            with _head_inputs(model.decoder) as seen:
                loss, aux = stock_loss_fn(model, config, data, dropout_rng, params, sparsity_state=sparsity_state,
                                          is_train=is_train)
        finally:
            if state is not None:
                state.receivers.pop()
        # stock_loss_fn cut `data` to the micro-batch it trained on, in place.
        targets, real = data["targets"], data["targets_segmentation"] != 0
        if in_tiles:
            # Computed inside MaxText's tiles, whose backward pass differentiates its term;
            # the sum carries no gradient of its own (tiles.py).
            [ntl_sum] = in_tiles
        else:
            hidden, deterministic = _final_hidden(seen, aux, config, is_train)
            columns = number_logits(model, config, hidden, numbers.ids, deterministic)
            ntl_sum = jnp.sum(ntl_from_number_logits(columns, targets, numbers, number_loss=number_loss, weights=real))
        counted = pipeline.counted_weight(targets, real, numbers, number_loss)
        # The term beside MaxText's cross-entropy sum, as the loss's authors put it beside
        # CE's mean over the tokens (a term scaled to CE is scaled to its cross-entropy).
        term_sum = number_loss.term(aux["xent_sum"], number_loss.normalised(ntl_sum, counted, aux["total_weights"]),
                                    settings.weight)
        manual_accumulation = config.gradient_accumulation_steps > 1 and not config.use_tunix_gradient_accumulation
        if settings.weight > 0:
            # Normalised as MaxText normalises its cross-entropy.
            normalizer = 1.0 if manual_accumulation else aux["total_weights"] + EPS
            loss = loss + term_sum / normalizer
        is_number = jnp.any(targets[..., None] == jnp.asarray(numbers.ids), axis=-1) & real
        return loss, _publish(LossAux(aux, **{NTL_SUM: ntl_sum, NTL_WEIGHT_SUM: counted,
                                              NUMBER_TARGETS: jnp.sum(is_number), NTL_TERM_SUM: term_sum}))

    return loss_fn


def ntl_metrics(aux, prefix: str, weight: float, number_loss=None) -> dict:
    """From a step's loss aux (summed over gradient accumulation's micro-batches):
    `{prefix}/ntl`, NTL's mean over the positions it counts (`ntl_jax.ntl_mean`, as
    `cross_entropy_and_ntl`'s `parts["ntl"]`, 0 where none); `{prefix}/ntl_term`, what
    the number loss adds to the loss (`ntl_term`); `{prefix}/number_targets`."""
    return {f"{prefix}/ntl": ntl_mean(aux[NTL_SUM], aux[NTL_WEIGHT_SUM]),
            f"{prefix}/ntl_term": ntl_term(aux, weight, number_loss),
            f"{prefix}/number_targets": aux[NUMBER_TARGETS]}


def ntl_term(aux, weight, number_loss):
    """What `weight` x the number loss adds to the loss, beside MaxText's cross-entropy
    as the loss's authors put it beside CE's mean over the tokens (`NumberLoss.normalised`
    and `term`; for NTL `weight` x its mean over the positions it counts; under gradient
    accumulation the micro-batches' terms, each beside its own cross-entropy, summed as
    MaxText sums their cross-entropies), divided as MaxText divides its `lm_loss`."""
    from maxtext.utils.globals import EPS

    return aux[NTL_TERM_SUM] / (aux["total_weights"] + EPS)


def number_train_step(stock_train_step, settings: NumberLossSettings):
    """MaxText's `train_step`, traced in a `step.step`, with `learning/ntl`,
    `learning/ntl_term` and `learning/number_targets` among its scalar metrics; its
    `learning/loss` is the objective under gradient accumulation too (whose loss MaxText
    rebuilds from the cross-entropy alone)."""
    if not settings.computes_ntl:
        return stock_train_step

    @functools.wraps(stock_train_step)
    def train_step(model, config, state_mesh_shardings, params_shardings, state, data, dropout_rng=None):
        with step.step(train=True) as traced:
            new_state, metrics = stock_train_step(model, config, state_mesh_shardings, params_shardings, state, data,
                                                  dropout_rng)
        aux = _last_aux(traced, "train_step")
        scalars = metrics["scalar"]
        scalars.update(ntl_metrics(aux, "learning", settings.weight, settings.number_loss))
        if config.gradient_accumulation_steps > 1 and settings.weight > 0:
            scalars["learning/loss"] = scalars["learning/loss"] + scalars["learning/ntl_term"]
        return new_state, metrics

    return train_step


def number_eval_step(stock_eval_step, settings: NumberLossSettings):
    """MaxText's `eval_step`, traced in a `step.step`, with `evaluation/ntl_sum`,
    `evaluation/ntl_weight_sum` and `evaluation/number_targets`, which
    `NumberLossMetricLogger` sums over an evaluation into `eval/avg_ntl`."""
    if not settings.computes_ntl:
        return stock_eval_step

    @functools.wraps(stock_eval_step)
    def eval_step(model, config, state, data, dropout_rng=None):
        with step.step(train=False) as traced:
            metrics = stock_eval_step(model, config, state, data, dropout_rng)
        aux = _last_aux(traced, "eval_step")
        for key in (NTL_SUM, NTL_WEIGHT_SUM, NUMBER_TARGETS):
            metrics["scalar"][f"evaluation/{key}"] = aux[key]
        return metrics

    return eval_step
