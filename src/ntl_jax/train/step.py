"""The training step: CE + λ·NTL in a jitted optax update.

This is the example to copy into your own trainer. The whole NTL integration is the
single call to `ntl_jax.cross_entropy_and_ntl` (or, from hidden states,
`ntl_jax.fused_cross_entropy_and_ntl`), which replaces the usual cross-entropy. The
step's metrics are that call's parts: `ntl` is the mean number loss over the positions
it counts, `ntl_term` what λ times it adds to `loss`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import optax

from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.objective import cross_entropy_and_ntl, fused_cross_entropy_and_ntl
from ntl_jax._core.options import CrossEntropy
from ntl_jax.flax import _linen
from ntl_jax.train import loss_names

# `--loss` values (`loss_names`): "ce", the cross-entropy baseline (NTL-WAS at weight 0:
# logged, not trained on); a number loss of `ntl_jax.losses` by the trainer's name of its
# spec, "ntl-<variant>" ("del", "dist2" and "smmd" for NTL's successors), parameters in
# parentheses ("smmd(mode=mmd)"); and the same on the Gaussian-smoothed cross-entropy
# (`gce_sigma`): "gce", "gce+<number loss>".
GCE_PREFIX = loss_names.GCE_PREFIX
# The authors' default width of the Gaussian label (`GaussianLabelSmoother`).
DEFAULT_GCE_SIGMA = 1.0


def uses_gce(loss) -> bool:
    """Whether `loss` ("gce", "gce+<number loss>") smooths the cross-entropy's label."""
    return isinstance(loss, str) and (loss == "gce" or loss.startswith(GCE_PREFIX))


def trains_ntl(loss) -> bool:
    """Whether `loss` trains on a number loss ("ce" and "gce" only log NTL-WAS)."""
    return loss not in loss_names.PLAIN


def objective(loss, ntl_weight: float, gce_sigma: float, ntl_mean_over: str | None = None) -> dict:
    """The `ntl_jax.cross_entropy_and_ntl` options of a token-head `loss` (a name, or a
    `NumberLoss` trained as CE + λ·loss): `number_loss`, `ntl_weight` (0 for "ce" and
    "gce", which log NTL-WAS) and `cross_entropy` (`gce_sigma` 0 for the losses without "gce");
    `ntl_mean_over`, where given, how the number loss's term is normalised.

    With "gce+", a number loss that scores against a label of its own takes GCE's
    (`NumberLoss.with_label_width`; the paper's GCE + NTL-WAS-CDF), unless it sets a width.
    """
    from ntl_jax import losses

    number_loss = loss if isinstance(loss, losses.NumberLoss) else loss_names.number_loss(loss)
    gce_sigma = gce_sigma if uses_gce(loss) else 0.0
    if gce_sigma and number_loss.with_label_width is not None:
        number_loss = losses.with_mean_over(number_loss.with_label_width(float(gce_sigma)), number_loss.mean_over)
    if ntl_mean_over is not None:
        number_loss = losses.with_mean_over(number_loss, ntl_mean_over)
    return dict(number_loss=number_loss, ntl_weight=ntl_weight if trains_ntl(loss) else 0.0,
                cross_entropy=CrossEntropy(gce_sigma=gce_sigma))


def model_inputs(batch: dict) -> tuple[tuple, dict]:
    """`(args, kwargs)` of the network call on `batch`: encoder-decoder features (with
    "encoder_input_tokens") or decoder-only ones (a prefix LM when the batch has
    "decoder_causal_attention")."""
    if "encoder_input_tokens" in batch:
        return (batch["encoder_input_tokens"], batch["decoder_input_tokens"],
                batch["decoder_target_tokens"]), {}
    return ((batch["decoder_input_tokens"], batch["decoder_target_tokens"]),
            {"decoder_causal_attention": batch.get("decoder_causal_attention")})


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any
    dropout_rng: jax.Array


def create_train_state(model, optimizer: optax.GradientTransformation, batch: dict,
                       seed: int) -> TrainState:
    """Initialises parameters from `seed` and the shapes of `batch`."""
    init_rng, dropout_rng = jax.random.split(jax.random.key(seed))
    args, kwargs = model_inputs(batch)
    variables = model.init(init_rng, *args, **kwargs, enable_dropout=False)
    params = variables["params"]
    return TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params,
                      opt_state=optimizer.init(params),
                      dropout_rng=jax.random.key_data(dropout_rng))


def make_train_step(model, optimizer: optax.GradientTransformation,
                    number_tokens: NumberTokens, *, loss=loss_names.DEFAULT,
                    ntl_weight: float | None = None, z_loss: float = 1e-4,
                    loss_normalizing_factor: Any = "NUM_REAL_TARGET_TOKENS",
                    fused_loss: bool = False, gce_sigma: float = DEFAULT_GCE_SIGMA,
                    ntl_mean_over: str | None = None):
    """Returns `train_step(state, batch) -> (state, metrics)`, jitted.

    Args:
      model: a `Transformer` or `DecoderOnlyTransformer` (or any module with a T5X
        network interface); the batch's features say which (see `model_inputs`).
      optimizer: the optax transformation `state.opt_state` belongs to.
      number_tokens: the vocabulary's number tokens (a static closure constant).
      loss: a token-head loss (`loss_names`): "ce" trains with cross-entropy only (and
        logs NTL-WAS as a diagnostic); "gce" likewise with the Gaussian-smoothed
        cross-entropy; a number loss ("ntl-was", "smmd(mode=mmd)", or a `NumberLoss`)
        is CE + λ·loss, and "gce+<number loss>" GCE + λ·loss (the paper pairs GCE with
        NTL-WAS-CDF, "gce+ntl-was-cdf", which then scores against the smoothed label).
      ntl_weight: λ; None: the number loss's own (0.3 for NTL, the paper's); ignored
        (0) for "ce" and "gce". The loss's term is normalised as its authors normalise it
        (`NumberLoss.mean_over`).
      z_loss, loss_normalizing_factor: as in T5X's cross-entropy.
      fused_loss: compute the loss from the decoder's hidden states and the logits
        kernel with `ntl_jax.fused_cross_entropy_and_ntl`, never forming the
        `[batch, length, vocab]` logits; the same loss to float32 rounding.
      gce_sigma: the width of the Gaussian label of the "gce" losses (1.0, the
        authors' default); not used by the others.
      ntl_mean_over: how the number loss's term is normalised (`NumberLoss.mean_over`);
        None: the loss's own.
    """
    try:
        chosen = objective(loss, ntl_weight, gce_sigma, ntl_mean_over)
    except ValueError as e:
        raise ValueError(f"loss: {e}") from None

    def loss_fn(params, batch, dropout_rng):
        args, kwargs = model_inputs(batch)
        kwargs.update(enable_dropout=True, rngs={"dropout": dropout_rng})
        targets = batch["decoder_target_tokens"]
        options = dict(chosen, weights=batch["decoder_loss_weights"], loss_normalizing_factor=loss_normalizing_factor,
                       cross_entropy=dataclasses.replace(chosen["cross_entropy"], z_loss=z_loss))
        if fused_loss:
            hidden, kernel = _linen.hidden_states_and_kernel(model, {"params": params}, *args, **kwargs)
            return fused_cross_entropy_and_ntl(hidden, kernel, targets, number_tokens, **options)
        logits = model.apply({"params": params}, *args, **kwargs)
        # The one NTL line: T5X cross-entropy (+ z-loss) + ntl_weight * number loss, same weights.
        return cross_entropy_and_ntl(logits, targets, number_tokens, **options)

    @jax.jit
    def train_step(state: TrainState, batch: dict):
        # A fresh dropout key per step, derived from the step: resuming replays it exactly.
        rng = jax.random.fold_in(jax.random.wrap_key_data(state.dropout_rng), state.step)
        (loss_value, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, batch, rng)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss_value, "grad_norm": optax.tree.norm(grads), **parts}
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step
