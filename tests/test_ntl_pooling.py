"""`ntl` is one number: every logger reports the same batches' number loss as their sums
over their counts (`ntl_jax.ntl_mean`), never the mean of the batches' means.

Three batches with 1, 6 and 3 number targets go through each logger that runs here: the
objective's parts, Keras's metric and the fused model's tracker, Tunix's loss function and
its trainer's buffer as Tunix writes it, the trainer's logging window, T5X's metric totals,
and MaxText's evaluation sums, fine-tuning buffer and (with MaxText) training metrics. Each
must give the hand-computed pooled mean, which differs from the mean of the batches' means.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ntl_jax

PIECES = ["<pad>", "</s>", "<unk>", "+", "=", "."] + list("0123456789")
NT = ntl_jax.NumberTokens.from_pieces(PIECES)
DIGIT = {d: PIECES.index(str(d)) for d in range(10)}  # digit -> token id
PLUS, EOS = PIECES.index("+"), PIECES.index("</s>")
# Per batch `[2, 5]` targets: 1, 6 and 3 number targets among other tokens and padding.
TARGETS = [
    np.array([[DIGIT[7], PLUS, EOS, 0, 0], [PLUS, EOS, 0, 0, 0]]),
    np.array([[DIGIT[1], DIGIT[2], DIGIT[3], EOS, 0], [DIGIT[9], DIGIT[0], DIGIT[4], PLUS, EOS]]),
    np.array([[DIGIT[5], PLUS, DIGIT[8], EOS, 0], [DIGIT[2], EOS, 0, 0, 0]]),
]
WEIGHTS = [(t > 0).astype(np.float32) for t in TARGETS]
D_MODEL = 6
KERNEL = np.random.default_rng(0).normal(size=(D_MODEL, len(PIECES))).astype(np.float32)
# The logits are hidden @ kernel, so that the fused head sees the same batches.
HIDDEN = [np.random.default_rng(1 + i).normal(scale=2.0, size=(2, 5, D_MODEL)).astype(np.float32)
          for i in range(len(TARGETS))]
LOGITS = [h @ KERNEL for h in HIDDEN]


def _sum_and_count(i):
    """NTL-WAS summed over batch `i`'s number targets, by hand (`sum_j p_j |y - v_j|`, p
    the softmax over the number tokens' logits), and how many there are."""
    ids, values = np.array([DIGIT[d] for d in range(10)]), np.arange(10.0)
    columns = np.asarray(LOGITS[i], np.float64)[..., ids]
    p = np.exp(columns - columns.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    is_number = np.isin(TARGETS[i], ids) & (WEIGHTS[i] > 0)
    y = np.where(is_number, TARGETS[i] - DIGIT[0], 0)  # the digits' ids are consecutive
    was = (p * np.abs(y[..., None] - values)).sum(-1)
    return (was * is_number).sum(), is_number.sum()


SUMS, COUNTS = zip(*(_sum_and_count(i) for i in range(len(TARGETS))))
POOLED = sum(SUMS) / sum(COUNTS)
MEAN_OF_MEANS = np.mean([s / c for s, c in zip(SUMS, COUNTS)])


def _parts(i, **options):
    _, parts = ntl_jax.cross_entropy_and_ntl(LOGITS[i], TARGETS[i], NT, weights=WEIGHTS[i], number_loss="was",
                                             ntl_weight=0.3, **options)
    return parts


def test_the_batches_count_differently_so_pooling_is_not_averaging():
    assert COUNTS == (1.0, 6.0, 3.0)
    assert abs(POOLED - MEAN_OF_MEANS) > 0.05 * POOLED, (POOLED, MEAN_OF_MEANS)
    for i in range(len(TARGETS)):  # each batch's own mean is the objective's parts["ntl"]
        parts = _parts(i)
        np.testing.assert_allclose(float(parts["ntl_sum"]), SUMS[i], rtol=1e-5)
        np.testing.assert_allclose(float(parts["ntl"]), SUMS[i] / COUNTS[i], rtol=1e-5)


def test_ntl_mean_is_zero_without_counts_and_differentiable_there():
    assert float(ntl_jax.ntl_mean(0.0, 0.0)) == 0.0
    assert float(ntl_jax.ntl_mean([1.0, 2.0], [0.0, 0.0])) == 0.0
    grad = jax.grad(lambda s: ntl_jax.ntl_mean(s, 0.0))(1.0)
    assert np.isfinite(float(grad))


# -- the loggers: each returns the `ntl` it reports over the three batches -----------------


def _objective():
    parts = [_parts(i) for i in range(len(TARGETS))]
    return ntl_jax.ntl_mean([p["ntl_sum"] for p in parts], [p["ntl_weight_sum"] for p in parts])


def _keras_metric():
    pytest.importorskip("keras")
    from ntl_jax.keras import NumberTokenLossMetric

    metric = NumberTokenLossMetric(NT)
    for logits, targets, weights in zip(LOGITS, TARGETS, WEIGHTS):
        metric.update_state(targets, logits, sample_weight=weights)
    return metric.result()


def _keras_fused_tracker():
    pytest.importorskip("keras")
    from ntl_jax.keras.metrics import NumberLossMean

    tracker = NumberLossMean("ntl")  # FusedNumberTokenLossModel's, fed as its compute_loss does
    for hidden, targets, weights in zip(HIDDEN, TARGETS, WEIGHTS):
        _, parts = ntl_jax.fused_cross_entropy_and_ntl(hidden, KERNEL, targets, NT, weights=weights,
                                                       number_loss="was", ntl_weight=0.3)
        tracker.update_state(parts["ntl_sum"], parts["ntl_weight_sum"])
    return tracker.result()


class _Written:
    """What Tunix's `PeftTrainer._write_metrics` logs, without a trainer."""

    def _log_metrics(self, loss, step, additional_metrics):
        self.logged = additional_metrics


def _written_by_tunix(buffer):
    from tunix.sft import peft_trainer

    written = _Written()
    peft_trainer.PeftTrainer._write_metrics(written, buffer)
    return written.logged


def _tunix():
    pytest.importorskip("tunix")
    from tunix.sft import peft_trainer

    from ntl_jax.tunix import number_token_loss_fn
    from ntl_jax.tunix.trainer import _buffer_parts

    def model_of(logits):  # a model whose prediction of each next token is `logits`
        return lambda *inputs: (jnp.concatenate([logits, jnp.zeros((2, 1, len(PIECES)))], axis=1), None)

    loss_fn = number_token_loss_fn(NT, number_loss="was", ntl_weight=0.3)
    buffer = peft_trainer.MetricsBuffer(step=0, losses=[])  # a step's micro-batches, or an evaluation's batches
    for logits, targets, weights in zip(LOGITS, TARGETS, WEIGHTS):
        tokens = np.concatenate([np.full((2, 1), PLUS), targets], axis=1)
        mask = np.concatenate([np.zeros((2, 1), bool), weights > 0], axis=1)
        loss, parts = loss_fn(model_of(logits), tokens, mask, None, None)
        buffer.losses.append(loss)
        _buffer_parts(buffer, parts)
    return _written_by_tunix(buffer)["ntl"]


def _trainer():
    pytest.importorskip("flax")
    from ntl_jax.train.trainer import window_metrics

    # What the trainer's step returns, for each step of a logging window.
    return window_metrics([{"loss": 1.0, "grad_norm": 1.0, **_parts(i)} for i in range(len(TARGETS))])["ntl"]


def _t5x():
    clu_metrics = pytest.importorskip("clu.metrics")
    from flax import struct

    from ntl_jax._core.options import Options
    from ntl_jax.t5x import _loss as t5x_loss

    @struct.dataclass
    class NTLAverage(t5x_loss.NTLMean, clu_metrics.Average):  # as ntl_jax.t5x.models builds it
        pass

    merged = None
    for logits, targets, weights in zip(LOGITS, TARGETS, WEIGHTS):
        batch = {"decoder_target_tokens": targets, "decoder_loss_weights": weights}
        out = t5x_loss.model_loss(logits, batch, NT, Options(number_loss="was", ntl_weight=0.3))
        step = NTLAverage(*out.averages["ntl"])
        merged = step if merged is None else merged.merge(step)  # as T5X merges a summary's or an evaluation's
    return merged.compute()


def _maxtext_aux(i):
    """What ntl_jax.maxtext's loss function adds to MaxText's loss aux for batch `i`."""
    from ntl_jax.maxtext.loss import NTL_SUM, NTL_TERM_SUM, NTL_WEIGHT_SUM, NUMBER_TARGETS

    parts = _parts(i)
    return {NTL_SUM: parts["ntl_sum"], NTL_WEIGHT_SUM: parts["ntl_weight_sum"], NUMBER_TARGETS: COUNTS[i],
            "total_weights": WEIGHTS[i].sum(), "xent_sum": parts["cross_entropy"] * WEIGHTS[i].sum(),
            NTL_TERM_SUM: parts["ntl_term"] * WEIGHTS[i].sum()}


def _maxtext_evaluation():
    from collections import defaultdict

    from ntl_jax.maxtext.metrics import add_eval_sums, eval_ntl

    summed = defaultdict(float)  # MaxText's cumulative evaluation scalars
    for i in range(len(TARGETS)):
        add_eval_sums(summed, {f"evaluation/{k}": v for k, v in _maxtext_aux(i).items()})
    return eval_ntl(summed)


def _maxtext_fine_tuning():
    pytest.importorskip("tunix")
    pytest.importorskip("maxtext")  # its term is normalised with MaxText's epsilon
    from tunix.sft import peft_trainer

    from ntl_jax.maxtext.install import _buffer_ntl
    from ntl_jax.maxtext.settings import NumberLossSettings

    settings = NumberLossSettings(weight=0.3)
    buffer = peft_trainer.MetricsBuffer(step=0, losses=[])
    for i in range(len(TARGETS)):
        buffer.losses.append(0.0)
        _buffer_ntl(buffer, _maxtext_aux(i), settings)
    return _written_by_tunix(buffer)["ntl"]


def _maxtext_training():
    pytest.importorskip("maxtext")
    from ntl_jax.maxtext.loss import ntl_metrics

    # MaxText's gradient accumulation sums the micro-batches' aux.
    aux = jax.tree.map(lambda *xs: sum(xs), *[_maxtext_aux(i) for i in range(len(TARGETS))])
    return ntl_metrics(aux, "learning", 0.3)["learning/ntl"]


LOGGERS = {
    "objective": _objective,
    "keras_metric": _keras_metric,
    "keras_fused_tracker": _keras_fused_tracker,
    "tunix": _tunix,
    "trainer": _trainer,
    "t5x": _t5x,
    "maxtext_evaluation": _maxtext_evaluation,
    "maxtext_fine_tuning": _maxtext_fine_tuning,
    "maxtext_training": _maxtext_training,
}


@pytest.mark.parametrize("logger", sorted(LOGGERS))
def test_each_logger_pools_the_same_batches_into_the_same_ntl(logger):
    ntl = float(np.asarray(LOGGERS[logger]()))
    np.testing.assert_allclose(ntl, POOLED, rtol=2e-5)
    assert abs(ntl - MEAN_OF_MEANS) > 0.05 * POOLED  # not the mean of the batches' means
