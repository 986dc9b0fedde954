"""T5X's `num_microbatches` with the NTL models (skipped without t5x).

T5X runs `loss_fn` once per microbatch, sums the gradients and merges the metrics. Each
microbatch's number term must stand to that microbatch's CE as the authors' term stands
to their CE, so the accumulated step is the sum of the authors' objectives, one per slice.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("t5x.trainer", reason="t5x is not installed (it is not on PyPI; see the README)")

from t5x import adafactor  # noqa: E402
from t5x import metrics as t5x_metrics  # noqa: E402
from t5x import models as t5x_models  # noqa: E402
from t5x import train_state as t5x_train_state  # noqa: E402
from t5x import trainer as t5x_trainer  # noqa: E402

import ntl_jax  # noqa: E402
from ntl_jax.t5x import models as ntl_models  # noqa: E402
from tests.t5x.test_t5x_models import _batch, _encdec  # noqa: E402

SLICES = 2


def _whole_batch():
    """Two [3, 10] packed batches stacked, so that each microbatch is one of them."""
    halves = [_batch(packed=True, seed=seed) for seed in (11, 12)]
    return {k: jnp.concatenate([h[k] for h in halves]) for k in halves[0]}, halves


def _authors_objective(params, batch, stock, number_tokens, weight):
    """`(CE, term)`: CE as T5X computes it for the slice, and λ × NTL-WAS's mean over the
    slice's number targets (the term as it stands beside CE under NUM_REAL_TARGET_TOKENS,
    where T5X's factor is the weights' sum)."""
    ce, _ = stock.loss_fn(params, batch, None)
    logits = stock._compute_logits(params, batch)
    targets, weights = batch["decoder_target_tokens"], batch["decoder_loss_weights"]
    mean = ntl_jax.ntl_was(logits, targets, number_tokens, weights=weights, reduction="mean")
    return ce, weight * mean


@pytest.fixture(scope="module")
def variables():
    model = _encdec(t5x_models.EncoderDecoderModel)
    shapes = {"encoder_input_tokens": (6, 7), "decoder_input_tokens": (6, 10)}
    return model.get_initial_variables(jax.random.PRNGKey(3), shapes, {k: jnp.int32 for k in shapes})


@pytest.mark.parametrize("fused_loss", [False, True], ids=["logits", "fused"])
def test_microbatches_sum_the_authors_objective_of_each_slice(variables, fused_loss):
    params = variables["params"]
    options = dict(loss_normalizing_factor="NUM_REAL_TARGET_TOKENS", z_loss=0.0)
    stock = _encdec(t5x_models.EncoderDecoderModel, **options)
    ours = _encdec(ntl_models.NTLEncoderDecoderModel, number_loss="was", fused_loss=fused_loss, **options)
    state = t5x_train_state.FlaxOptimTrainState.create(adafactor.Adafactor(decay_rate=0.8), variables)
    whole, halves = _whole_batch()

    grads, metrics, _ = jax.jit(
        lambda s, b: t5x_trainer.accumulate_grads_microbatched(ours, s, b, jax.random.PRNGKey(0), SLICES)
    )(state, whole)
    metrics = t5x_metrics.set_step_metrics_num_steps(metrics, 1)

    weight = 0.3  # NTL-WAS's own λ, the paper's
    parts = [_authors_objective(params, h, stock, ours.number_tokens, weight) for h in halves]
    for ce, term in parts:
        assert float(term / ce) > 0.05  # the term weighs in each slice
    ce_sum = sum(float(ce) for ce, _ in parts)
    term_sum = sum(float(term) for _, term in parts)
    np.testing.assert_allclose(float(metrics["ntl_term"].compute()), term_sum, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["loss"].compute()), ce_sum + term_sum, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["cross_ent_loss"].compute()), ce_sum, rtol=1e-5)

    # `ntl` pools the slices' sums and counts: the mean over the whole batch's number targets.
    logits = stock._compute_logits(params, whole)
    pooled = ntl_jax.ntl_was(logits, whole["decoder_target_tokens"], ours.number_tokens,
                             weights=whole["decoder_loss_weights"], reduction="mean")
    np.testing.assert_allclose(float(metrics["ntl"].compute()), float(pooled), rtol=1e-5)

    # The gradient T5X accumulates is the sum of each slice's authors' objective's gradient.
    def reference(p):
        return sum(ce + term for ce, term in
                   (_authors_objective(p, h, stock, ours.number_tokens, weight) for h in halves))

    expected = jax.grad(reference)(params)
    leaves = jax.tree_util.tree_leaves
    for got, want in zip(leaves(grads), leaves(expected)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-6)
    # Not the whole batch's objective: each slice is normalised by its own counts.
    whole_ce, whole_term = _authors_objective(params, whole, stock, ours.number_tokens, weight)
    assert abs(float(whole_ce + whole_term) - (ce_sum + term_sum)) > 0.5
