"""The NTL T5X models' loss and metrics, without T5X.

`ntl_jax.t5x._loss.model_loss` against numpy references of T5X's definitions
(`get_loss_normalizing_factor_and_weights`, `compute_weighted_cross_entropy`) and of
NTL-WAS, and `NTLLossMixin.loss_fn` on a fake base class standing in for T5X's
`BaseTransformerModel` (logits from the params, a recording `_compute_metrics`, and
stand-ins for T5X's `AveragePerStep` and clu's `Average`).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ntl_jax
from ntl_jax import losses
from ntl_jax._core.options import Options
from ntl_jax.t5x import _loss as t5x_loss
from tests.objective_options import SQUARED_DISTANCE, as_options

PIECES = ["<pad>", "</s>", "a", "b", "c"] + list("0123456789") + ["."]
DIGIT_IDS = np.arange(5, 15)
VOCAB = len(PIECES)  # 16
WIDTH = 24  # the network's logits are wider (vocabularies are rounded up)
NT = ntl_jax.NumberTokens.from_pieces(PIECES)
SPECIAL = ["NUM_REAL_TARGET_TOKENS", "NUM_TOTAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE"]
FACTORS = [None, 37.5] + SPECIAL


# -- batches and numpy references ------------------------------------------------------


def _row(rng, lengths, total):
    """One row of packed sequences: mostly digits, some letters, EOS (1) at each end."""
    tokens, segments, positions = [], [], []
    for seg, n in enumerate(lengths, start=1):
        body = np.where(rng.random(n - 1) < 0.7, rng.choice(DIGIT_IDS, n - 1), rng.integers(2, 5, n - 1))
        tokens += list(body) + [1]
        segments += [seg] * n
        positions += list(range(n))
    pad = total - len(tokens)
    return tokens + [0] * pad, segments + [0] * pad, positions + [0] * pad


def make_batch(packed, seed=0, with_weights=True):
    """A [3, 10] encoder-decoder batch; packed rows hold two or three sequences."""
    rng = np.random.default_rng(seed)
    layouts = [[4, 3], [5, 2, 3], [10]] if packed else [[6], [9], [3]]
    rows = [_row(rng, lengths, 10) for lengths in layouts]
    targets, segment_ids, positions = (np.array([r[i] for r in rows], np.int32) for i in range(3))
    batch = {
        "encoder_input_tokens": rng.integers(2, VOCAB, size=(3, 7)).astype(np.int32),
        "decoder_target_tokens": targets,
        "decoder_input_tokens": np.where(positions == 0, 0, np.roll(targets, 1, axis=1)).astype(np.int32),
    }
    if with_weights:
        weights = (targets > 0).astype(np.int32)
        weights[0, 1] = 0  # one real token excluded from the loss by its weight
        batch["decoder_loss_weights"] = weights
    if packed:
        batch["encoder_segment_ids"] = np.ones((3, 7), np.int32)
        batch["encoder_positions"] = np.tile(np.arange(7, dtype=np.int32), (3, 1))
        batch["decoder_segment_ids"] = segment_ids
        batch["decoder_positions"] = positions
    return {k: jnp.asarray(v) for k, v in batch.items()}


def make_logits(seed=0, shape=(3, 10, WIDTH)):
    return jax.random.normal(jax.random.PRNGKey(seed), shape) * 2.0


def t5x_factor_and_weights(factor, batch):
    """T5X's `get_loss_normalizing_factor_and_weights`, written out in numpy."""
    targets = np.asarray(batch["decoder_target_tokens"])
    weights = batch.get("decoder_loss_weights")
    weights = None if weights is None else np.asarray(weights, np.float64)
    if factor is None or isinstance(factor, float):
        return factor, weights
    if weights is None:
        weights = (targets > 0).astype(np.float64)
    if factor == "NUM_REAL_TARGET_TOKENS":
        return weights.sum(), weights
    if factor == "NUM_TOTAL_TARGET_TOKENS":
        return float(targets.size), weights
    assert factor == "AVERAGE_PER_SEQUENCE"
    if "decoder_segment_ids" in batch:
        segments = np.asarray(batch["decoder_segment_ids"])
        totals = np.zeros_like(weights)
        for b in range(targets.shape[0]):
            for s in set(segments[b].tolist()) - {0}:
                totals[b, segments[b] == s] = weights[b, segments[b] == s].sum()
    else:
        totals = np.broadcast_to(weights.sum(-1, keepdims=True), weights.shape)
    weights = np.where(totals != 0, weights / np.where(totals != 0, totals, 1), 0.0)
    return weights.sum(), weights


def t5x_cross_entropy(logits, targets, weights, factor, label_smoothing=0.0, z_loss=0.0):
    """T5X's `compute_weighted_cross_entropy` in numpy: one-hot soft targets, log-softmax."""
    logits = np.asarray(logits, np.float64)
    vocab = logits.shape[-1]
    confidence = 1.0 - label_smoothing
    low = (1.0 - confidence) / (vocab - 1)
    constant = -(confidence * np.log(confidence) + (vocab - 1) * low * np.log(low + 1e-20))
    soft = np.where(np.arange(vocab) == np.asarray(targets)[..., None], confidence, low)
    lse = np.log(np.exp(logits).sum(-1))
    z = z_loss * lse**2
    loss = -(soft * (logits - lse[..., None])).sum(-1) + z - constant
    if weights is not None:
        loss, z = loss * weights, z * weights
    if factor is not None:
        loss, z = loss / factor, z / factor
    return loss.sum(), z.sum()


def numpy_digit_softmax(logits):
    digit_logits = np.asarray(logits, np.float64)[..., DIGIT_IDS]
    p = np.exp(digit_logits - digit_logits.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def numpy_was(logits, targets):
    """Per-position NTL-WAS `sum_j p_j |y - j|`, and where the target is a digit."""
    targets = np.asarray(targets)
    is_digit = (targets >= 5) & (targets <= 14)
    y = np.where(is_digit, targets - 5, 0)
    per_position = (numpy_digit_softmax(logits) * np.abs(y[..., None] - np.arange(10))).sum(-1)
    return np.where(is_digit, per_position, 0.0), is_digit


def loss_of(logits, batch, loss_normalizing_factor=None, **options):
    """`model_loss` with the objective's options as keywords (`Options`)."""
    return t5x_loss.model_loss(logits, batch, NT, as_options(**options), loss_normalizing_factor)


# -- the fake T5X base class -----------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class FakeAveragePerStep:
    """Stands in for `t5x.metrics.AveragePerStep` (one step)."""

    total: jax.Array

    def compute(self):
        return self.total


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class FakeAverage:
    """Stands in for `clu.metrics.Average`."""

    total: jax.Array
    count: jax.Array

    def compute(self):
        return self.total / self.count


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class FakeNTLAverage(t5x_loss.NTLMean, FakeAverage):
    """Stands in for `ntl_jax.t5x.models`' clu `Average` with `NTLMean`'s compute."""


class FakeVocabulary:
    vocab_size = VOCAB

    def id_to_piece(self, i):
        return PIECES[i]


class FakeTransformerModel:
    """What `NTLLossMixin` needs of T5X's `BaseTransformerModel`, and nothing else."""

    def __init__(self, *, vocabulary, label_smoothing=0.0, z_loss=0.0, loss_normalizing_factor=None):
        self._output_vocabulary = vocabulary
        self._label_smoothing = label_smoothing
        self._z_loss = z_loss
        self._loss_normalizing_factor = loss_normalizing_factor
        self.metric_calls = []

    @property
    def output_vocabulary(self):
        return self._output_vocabulary

    def _compute_logits(self, params, batch, dropout_rng=None):
        del batch, dropout_rng
        return params["logits"]

    def _compute_metrics(self, logits, targets, mask, loss, z_loss=None, segment_ids=None):
        self.metric_calls.append(
            dict(logits=logits, targets=targets, mask=mask, loss=loss, z_loss=z_loss, segment_ids=segment_ids)
        )
        correct = (jnp.argmax(logits, -1) == targets) & (mask > 0)
        return {
            "loss": FakeAveragePerStep(total=loss),
            "accuracy": FakeAverage(total=jnp.sum(correct), count=jnp.sum(mask > 0)),
        }


class FakeNTLModel(t5x_loss.NTLLossMixin, FakeTransformerModel):
    per_step_metric = FakeAveragePerStep
    average_metric = FakeAverage
    ntl_metric = FakeNTLAverage


def fake_model(**kwargs):
    return FakeNTLModel(vocabulary=FakeVocabulary(), **kwargs)


def value(metric):
    return float(metric.compute())


# -- the loss --------------------------------------------------------------------------


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("factor", FACTORS, ids=str)
def test_loss_equals_cross_entropy_and_ntl(factor, packed):
    batch, logits = make_batch(packed, seed=1), make_logits(1)
    options = dict(ntl_weight=0.3, label_smoothing=0.1, z_loss=1e-4, loss_normalizing_factor=factor)
    out = loss_of(logits, batch, **options)
    segments = {k: batch[k] for k in ("decoder_segment_ids", "decoder_positions") if k in batch}
    want, parts = ntl_jax.cross_entropy_and_ntl(
        logits, batch["decoder_target_tokens"], NT, weights=batch["decoder_loss_weights"],
        **options, **segments,
    )
    np.testing.assert_allclose(float(out.loss), float(want), rtol=1e-6)
    np.testing.assert_allclose(float(out.z_loss), float(parts["z_loss"]), rtol=1e-6)
    np.testing.assert_allclose(float(out.per_step["ntl_term"]), float(parts["ntl_term"]), rtol=1e-6)
    total, count = out.averages["ntl"]
    np.testing.assert_allclose(float(total) / float(count), float(parts["ntl"]), rtol=1e-6)
    np.testing.assert_allclose(float(count), float(parts["ntl_weight_sum"]), rtol=1e-6)


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("factor", FACTORS, ids=str)
def test_zero_ntl_weight_is_t5x_stock_cross_entropy(factor, packed):
    batch, logits = make_batch(packed, seed=2), make_logits(2)
    out = loss_of(logits, batch, ntl_weight=0.0, label_smoothing=0.1, z_loss=1e-3, loss_normalizing_factor=factor)
    lnf, weights = t5x_factor_and_weights(factor, batch)
    ce, z = t5x_cross_entropy(logits, batch["decoder_target_tokens"], weights, lnf, label_smoothing=0.1, z_loss=1e-3)
    np.testing.assert_allclose(float(out.loss), ce, rtol=2e-5)
    np.testing.assert_allclose(float(out.z_loss), z, rtol=2e-5)
    np.testing.assert_allclose(np.asarray(out.mask), weights, rtol=1e-6)
    # ntl_jax's own T5X cross-entropy agrees on the same weights and factor.
    got = ntl_jax.weighted_cross_entropy(logits, batch["decoder_target_tokens"], weights=weights,
                                         label_smoothing=0.1, z_loss=1e-3, loss_normalizing_factor=lnf)
    np.testing.assert_allclose(float(out.loss), float(got[0]), rtol=1e-5)


def test_none_and_number_factors_sum_and_divide():
    batch, logits = make_batch(False, seed=3), make_logits(3)
    total = loss_of(logits, batch, loss_normalizing_factor=None)
    scaled = loss_of(logits, batch, loss_normalizing_factor=233472.0)
    np.testing.assert_allclose(float(scaled.loss), float(total.loss) / 233472.0, rtol=1e-6)
    assert total.loss_normalizing_factor is None and scaled.loss_normalizing_factor == 233472.0
    # None: the weighted sum of the per-token cross-entropy, plus 0.3 x NTL's mean over the
    # counted (digit) positions times the cross-entropy's weight (as if summed at every target).
    weights = np.asarray(batch["decoder_loss_weights"], np.float64)
    ce, _ = t5x_cross_entropy(logits, batch["decoder_target_tokens"], weights, None)
    was, is_digit = numpy_was(logits, batch["decoder_target_tokens"])
    mean = (was * weights).sum() / weights[is_digit].sum()
    np.testing.assert_allclose(float(total.loss), ce + 0.3 * mean * weights.sum(), rtol=2e-5)
    # Not the old term (0.3 x the NTL sum): the two differ on this batch.
    assert abs(mean * weights.sum() - (was * weights).sum()) > 1e-2 * (was * weights).sum()


def test_num_real_target_tokens_is_a_mean_over_weighted_tokens():
    batch, logits = make_batch(True, seed=4), make_logits(4)
    out = loss_of(logits, batch, ntl_weight=0.5, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    weights = np.asarray(batch["decoder_loss_weights"], np.float64)
    ce, _ = t5x_cross_entropy(logits, batch["decoder_target_tokens"], weights, None)
    was, is_digit = numpy_was(logits, batch["decoder_target_tokens"])
    assert float(out.loss_normalizing_factor) == weights.sum() == 26  # 7 + 10 + 10 real tokens, one weighted 0
    # CE's mean over the weighted tokens plus 0.5 x NTL's mean over the weighted digits.
    ntl_mean = (was * weights).sum() / weights[is_digit].sum()
    np.testing.assert_allclose(float(out.loss), ce / weights.sum() + 0.5 * ntl_mean, rtol=2e-5)


def test_num_total_target_tokens_counts_padding():
    batch, logits = make_batch(False, seed=5), make_logits(5)
    out = loss_of(logits, batch, loss_normalizing_factor="NUM_TOTAL_TARGET_TOKENS")
    plain = loss_of(logits, batch, loss_normalizing_factor=None)
    assert out.loss_normalizing_factor == 30  # 3 x 10, a static number
    np.testing.assert_allclose(float(out.loss), float(plain.loss) / 30, rtol=1e-6)


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_average_per_sequence_is_the_mean_of_sequence_means(packed):
    batch, logits = make_batch(packed, seed=6), make_logits(6)
    out = loss_of(logits, batch, ntl_weight=0.3, loss_normalizing_factor="AVERAGE_PER_SEQUENCE")
    targets = np.asarray(batch["decoder_target_tokens"])
    weights = np.asarray(batch["decoder_loss_weights"], np.float64)
    log_probs = np.asarray(jax.nn.log_softmax(logits), np.float64)
    ce_per_token = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    was, is_digit = numpy_was(logits, targets)
    segments = np.asarray(batch["decoder_segment_ids"]) if packed else (targets > 0).astype(int)
    means = []
    per_sequence = np.zeros_like(weights)  # each token's weight over its sequence's total
    for b in range(3):
        for s in set(segments[b].tolist()) - {0}:
            where = segments[b] == s
            means.append((ce_per_token[b, where] * weights[b, where]).sum() / weights[b, where].sum())
            per_sequence[b, where] = weights[b, where] / weights[b, where].sum()
    assert len(means) == (6 if packed else 3)
    # CE: the mean of the sequence means. NTL: 0.3 x its mean over the digits weighted
    # 1/len per sequence (the weights sum to the number of sequences, the factor).
    ntl_mean = (was * per_sequence).sum() / per_sequence[is_digit].sum()
    np.testing.assert_allclose(float(out.loss), np.mean(means) + 0.3 * ntl_mean, rtol=2e-5)
    np.testing.assert_allclose(float(out.per_step["ntl_term"]), 0.3 * ntl_mean, rtol=2e-5)
    np.testing.assert_allclose(float(out.loss_normalizing_factor), len(means), rtol=1e-6)


def test_empty_batch_gives_zero_not_nan():
    batch, logits = make_batch(True, seed=7), make_logits(7)
    batch["decoder_loss_weights"] = jnp.zeros_like(batch["decoder_loss_weights"])
    for factor in FACTORS:
        out = loss_of(logits, batch, loss_normalizing_factor=factor)
        assert float(out.loss) == 0.0, factor
        assert float(out.per_step["ntl_term"]) == 0.0
        assert [float(x) for x in out.averages["ntl"]] == [0.0, 0.0]  # nothing counted: no NaN in the total


def test_targets_outside_the_vocabulary_are_ignored_in_loss_and_factor():
    batch, logits = make_batch(True, seed=8), make_logits(8)
    targets = np.asarray(batch["decoder_target_tokens"]).copy()
    outside = np.zeros_like(targets, bool)
    outside[0, 2], outside[1, 0], outside[2, 5] = True, True, True
    bad = dict(batch, decoder_target_tokens=jnp.asarray(np.where(outside, [[WIDTH], [-1], [WIDTH + 7]], targets)))
    # The same batch with those positions weighted 0 instead.
    zeroed = dict(batch, decoder_loss_weights=jnp.where(outside, 0, batch["decoder_loss_weights"]))
    logits = jnp.where(jnp.asarray(outside)[..., None], jnp.nan, logits)  # never read there
    for factor in FACTORS:
        got = loss_of(logits, bad, loss_normalizing_factor=factor)
        want = loss_of(logits, zeroed, loss_normalizing_factor=factor)
        np.testing.assert_allclose(float(got.loss), float(want.loss), rtol=1e-6, err_msg=str(factor))
        assert np.isfinite(float(got.loss))


def test_logits_narrower_than_the_vocabulary_raise():
    with pytest.raises(ValueError, match=rf"last axis >= the vocabulary size of number_tokens \({VOCAB}\)"):
        loss_of(make_logits(0, (3, 10, VOCAB - 1)), make_batch(False))


# -- the metrics -----------------------------------------------------------------------


@pytest.mark.parametrize("factor", FACTORS, ids=str)
def test_cross_ent_loss_metric_excludes_the_ntl_term(factor):
    batch, logits = make_batch(True, seed=9), make_logits(9)
    out = loss_of(logits, batch, ntl_weight=0.7, z_loss=1e-2, loss_normalizing_factor=factor)
    lnf, weights = t5x_factor_and_weights(factor, batch)
    ce, z = t5x_cross_entropy(logits, batch["decoder_target_tokens"], weights, lnf, z_loss=1e-2)
    np.testing.assert_allclose(float(out.per_step["cross_ent_loss"]), ce - z, rtol=2e-5)
    total, count = out.averages["cross_ent_loss_per_all_target_tokens"]
    np.testing.assert_allclose(float(total), ce - z, rtol=2e-5)
    assert int(count) == 30
    # The stock metric (loss - z_loss) would carry 0.7 * NTL.
    stock = float(out.loss - out.z_loss)
    np.testing.assert_allclose(stock - float(out.per_step["cross_ent_loss"]), float(out.per_step["ntl_term"]),
                               rtol=1e-5)
    # The term: 0.7 x NTL's mean x the cross-entropy's weight / the factor.
    total, count = out.averages["ntl"]
    np.testing.assert_allclose(float(out.per_step["ntl_term"]),
                               0.7 * float(total) / float(count) * weights.sum() / (lnf or 1.0), rtol=1e-5)
    assert float(out.per_step["ntl_term"]) > 0


@pytest.mark.parametrize("factor", FACTORS, ids=str)
def test_ntl_metrics_against_numpy(factor):
    batch, logits = make_batch(True, seed=10), make_logits(10)
    out = loss_of(logits, batch, loss_normalizing_factor=factor)
    lnf, weights = t5x_factor_and_weights(factor, batch)
    weights = np.ones((3, 10)) if weights is None else weights
    was, is_digit = numpy_was(logits, batch["decoder_target_tokens"])
    total = (was * weights).sum()
    want_mean = total / weights[is_digit].sum()
    np.testing.assert_allclose(float(out.per_step["ntl_term"]), 0.3 * want_mean * weights.sum() / (lnf or 1.0),
                               rtol=2e-5)
    # `ntl`: the mean over the counted positions, whatever the factor.
    per_number_total, per_number_count = out.averages["ntl"]
    np.testing.assert_allclose(float(per_number_total) / float(per_number_count), want_mean, rtol=2e-5)
    np.testing.assert_allclose(float(per_number_count), weights[is_digit].sum(), rtol=1e-6)


def test_number_abs_error_and_mass_by_hand():
    batch, logits = make_batch(False, seed=11), make_logits(11)
    out = loss_of(logits, batch)
    targets = np.asarray(batch["decoder_target_tokens"])
    counted = (targets >= 5) & (targets <= 14) & (np.asarray(batch["decoder_loss_weights"]) > 0)
    expected_value = numpy_digit_softmax(logits) @ np.arange(10.0)
    full = np.exp(np.asarray(logits, np.float64))
    mass = full[..., DIGIT_IDS].sum(-1) / full.sum(-1)
    assert counted.sum() >= 8
    for name, want in (
        ("number_abs_error", np.abs(expected_value - (targets - 5))[counted].mean()),
        ("number_token_mass", mass[counted].mean()),
    ):
        total, count = out.averages[name]
        assert int(count) == counted.sum()
        np.testing.assert_allclose(float(total) / int(count), want, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("number_loss", [losses.was(), losses.was(reweigh=True)], ids=["was", "was_reweigh"])
def test_number_metrics_from_the_head_equal_predict_numbers(number_loss):
    batch = make_batch(True, seed=21)
    for scale in (1.0, 60.0):  # large logits too: the mass stays accurate and finite
        logits = make_logits(21) * scale
        out = loss_of(logits, batch, number_loss=number_loss, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
        want = t5x_loss.number_quality_totals(logits, batch["decoder_target_tokens"], batch["decoder_loss_weights"],
                                              NT)
        for name in ("number_abs_error", "number_token_mass"):
            np.testing.assert_allclose(np.asarray(out.averages[name]), np.asarray(want[name]), rtol=2e-5, atol=1e-30,
                                       err_msg=f"{name} x{scale}")


def test_metrics_add_no_pass_over_the_vocabulary():
    """Compiled, the loss with every metric exponentiates the `[batch, length, vocab]`
    logits as often as `cross_entropy_and_ntl` alone does (the metrics reuse its
    log-normaliser and number statistics)."""
    import re

    vocab = 1000
    batch, logits = make_batch(True, seed=22), make_logits(22, (3, 10, vocab))
    nt = NT
    segments = {k: batch[k] for k in ("decoder_segment_ids", "decoder_positions")}

    def full_vocab_exps(fn):
        text = jax.jit(fn).lower(logits).compile().as_text()
        return len(re.findall(rf"f32\[3,10,{vocab}\]\{{[^}}]*\}} exponential\(", text))

    def with_metrics(x):
        out = t5x_loss.model_loss(x, batch, nt, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
        return out.loss, out.per_step, out.averages

    def loss_alone(x):
        return ntl_jax.cross_entropy_and_ntl(
            x, batch["decoder_target_tokens"], nt, weights=batch["decoder_loss_weights"],
            loss_normalizing_factor="NUM_REAL_TARGET_TOKENS", **segments)[0]

    def loss_and_another_softmax(x):
        # A metric that takes a softmax of its own (of other logits, so XLA cannot share
        # its exponentials): the counter sees the pass it adds.
        return loss_alone(x), jnp.sum(jax.nn.softmax(0.5 * x, axis=-1)[..., 0])

    baseline = full_vocab_exps(loss_alone)
    assert baseline >= 1
    assert full_vocab_exps(with_metrics) == baseline
    assert full_vocab_exps(loss_and_another_softmax) > baseline


def test_number_metrics_do_not_depend_on_the_factor_or_ntl_weight():
    batch, logits = make_batch(True, seed=12), make_logits(12)
    reference = loss_of(logits, batch)
    for options in (dict(loss_normalizing_factor="AVERAGE_PER_SEQUENCE"), dict(ntl_weight=0.0),
                    dict(number_loss="mse", loss_normalizing_factor=12.0), dict(number_loss=None)):
        out = loss_of(logits, batch, **options)
        for name in ("number_abs_error", "number_token_mass"):
            np.testing.assert_allclose(np.asarray(out.averages[name]), np.asarray(reference.averages[name]),
                                       rtol=1e-6, err_msg=f"{name} {options}")


def test_zero_ntl_weight_still_logs_ntl():
    batch, logits = make_batch(True, seed=13), make_logits(13)
    zero = loss_of(logits, batch, ntl_weight=0.0, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    some = loss_of(logits, batch, ntl_weight=0.3, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    mean = lambda out: float(out.averages["ntl"][0]) / float(out.averages["ntl"][1])  # noqa: E731
    assert mean(zero) > 0
    np.testing.assert_allclose(mean(zero), mean(some), rtol=1e-6)
    assert float(zero.per_step["ntl_term"]) == 0.0
    np.testing.assert_allclose(float(zero.loss), float(zero.per_step["cross_ent_loss"]), rtol=1e-6)
    np.testing.assert_allclose(float(some.loss - zero.loss), float(some.per_step["ntl_term"]), rtol=1e-5)
    # The term: 0.3 x the NTL mean x the weight of the targets over the factor, which is
    # that weight here (NUM_REAL_TARGET_TOKENS): 0.3 x the mean.
    factor = float(some.loss_normalizing_factor)
    assert factor == float(np.asarray(batch["decoder_loss_weights"]).sum())
    np.testing.assert_allclose(float(some.per_step["ntl_term"]), 0.3 * mean(zero), rtol=1e-5)


@pytest.mark.parametrize("none", [None, "none"])
def test_number_loss_none_is_cross_entropy_with_number_metrics(none):
    batch, logits = make_batch(False, seed=14), make_logits(14)
    out = loss_of(logits, batch, number_loss=none, ntl_weight=0.3)
    ce_only = loss_of(logits, batch, ntl_weight=0.0)
    np.testing.assert_allclose(float(out.loss), float(ce_only.loss), rtol=1e-6)
    # No number loss: no `ntl` to log (a mean over nothing), no term.
    assert "ntl" not in out.averages and "ntl_term" not in out.per_step
    np.testing.assert_allclose(np.asarray(out.averages["number_abs_error"]),
                               np.asarray(ce_only.averages["number_abs_error"]), rtol=1e-6)


@pytest.mark.parametrize("factor", FACTORS, ids=str)
def test_mask_without_loss_weights_is_t5x_default_for_the_factor(factor):
    batch, logits = make_batch(False, seed=15, with_weights=False), make_logits(15)
    out = loss_of(logits, batch, loss_normalizing_factor=factor)
    targets = np.asarray(batch["decoder_target_tokens"])
    _, weights = t5x_factor_and_weights(factor, batch)
    want = np.ones(targets.shape) if weights is None else weights  # None: T5X counts every position
    np.testing.assert_allclose(np.asarray(out.mask), want, rtol=1e-6)
    # Padding never counts in the number metrics.
    counted = (targets >= 5) & (targets <= 14)
    assert int(out.averages["number_abs_error"][1]) == counted.sum()


# -- the mixin on a fake T5X base class ------------------------------------------------


@pytest.mark.parametrize("factor", FACTORS, ids=str)
def test_loss_fn_on_a_fake_base_matches_model_loss(factor):
    batch, logits = make_batch(True, seed=16), make_logits(16)
    model = fake_model(label_smoothing=0.1, z_loss=1e-4, loss_normalizing_factor=factor)
    loss, metrics = model.loss_fn({"logits": logits}, batch, None)
    out = loss_of(logits, batch, label_smoothing=0.1, z_loss=1e-4, loss_normalizing_factor=factor)
    np.testing.assert_allclose(float(loss), float(out.loss), rtol=1e-6)
    assert set(metrics) == {"loss", "accuracy", "cross_ent_loss", "ntl_term", "cross_ent_loss_per_all_target_tokens",
                            "ntl", "number_abs_error", "number_token_mass"}
    assert isinstance(metrics["ntl_term"], FakeAveragePerStep) and isinstance(metrics["number_abs_error"], FakeAverage)
    assert isinstance(metrics["ntl"], FakeAverage)  # a mean over the counted positions
    np.testing.assert_allclose(value(metrics["ntl_term"]), float(out.per_step["ntl_term"]), rtol=1e-6)
    np.testing.assert_allclose(value(metrics["cross_ent_loss"]), float(out.per_step["cross_ent_loss"]), rtol=1e-6)
    for name, (total, count) in out.averages.items():
        np.testing.assert_allclose(value(metrics[name]), float(total) / float(count), rtol=1e-6, err_msg=name)
    (call,) = model.metric_calls
    assert call["logits"] is logits and call["targets"] is batch["decoder_target_tokens"]
    np.testing.assert_allclose(float(call["loss"]), float(loss), rtol=1e-6)
    np.testing.assert_allclose(float(call["z_loss"]), float(out.z_loss), rtol=1e-6)


def test_stock_metrics_mask_is_zero_at_targets_outside_the_vocabulary():
    batch, logits = make_batch(True, seed=17), make_logits(17)
    targets = np.asarray(batch["decoder_target_tokens"]).copy()
    targets[0, 0], targets[1, 3], targets[2, 9] = WIDTH, -3, WIDTH + 100  # outside [0, logits.shape[-1])
    targets[2, 8] = VOCAB + 2  # inside the logits (a padded id): counted, as the stock model does
    batch["decoder_target_tokens"] = jnp.asarray(targets)
    weights = np.asarray(batch["decoder_loss_weights"], np.float32)
    assert weights[0, 0] == weights[1, 3] == weights[2, 9] == 1
    for factor, with_weights in ((None, True), ("NUM_REAL_TARGET_TOKENS", True), (None, False),
                                 ("AVERAGE_PER_SEQUENCE", False)):
        model = fake_model(loss_normalizing_factor=factor)
        fed = batch if with_weights else {k: v for k, v in batch.items() if k != "decoder_loss_weights"}
        _, metrics = model.loss_fn({"logits": logits}, fed, None)
        mask = np.asarray(model.metric_calls[-1]["mask"])
        assert mask[0, 0] == mask[1, 3] == mask[2, 9] == 0, (factor, with_weights)
        assert mask[2, 8] > 0
        base = weights if with_weights else (np.ones_like(weights) if factor is None else (targets > 0) * 1.0)
        inside = (targets >= 0) & (targets < WIDTH)
        if factor != "AVERAGE_PER_SEQUENCE":
            np.testing.assert_array_equal(mask, np.where(inside, base, 0))
        # The fake's accuracy counts what the mask counts: out-of-vocabulary ids are not there.
        assert int(metrics["accuracy"].count) == int((np.where(inside, base, 0) > 0).sum())


def test_stock_metrics_get_segment_ids_as_t5x_builds_them():
    logits = make_logits(18)
    packed, unpacked = make_batch(True, seed=18), make_batch(False, seed=18)
    model = fake_model()
    model.loss_fn({"logits": logits}, packed, None)
    model.loss_fn({"logits": logits}, unpacked, None)
    packed_ids, unpacked_ids = model.metric_calls[0]["segment_ids"], model.metric_calls[1]["segment_ids"]
    assert set(packed_ids) == {"encoder", "decoder"}
    assert packed_ids["decoder"] is packed["decoder_segment_ids"]
    assert set(unpacked_ids) == {"encoder_input_tokens", "decoder_target_tokens"}
    np.testing.assert_array_equal(unpacked_ids["decoder_target_tokens"],
                                  np.asarray(unpacked["decoder_target_tokens"]) != 0)


def test_loss_fn_jits_and_its_gradient_is_the_objective_gradient():
    batch, logits = make_batch(True, seed=19), make_logits(19)
    model = fake_model(loss_normalizing_factor="AVERAGE_PER_SEQUENCE")
    traces = []

    def loss(params):
        traces.append(1)
        return model.loss_fn(params, batch, None)[0]

    step = jax.jit(jax.value_and_grad(loss))
    value_, grad = step({"logits": logits})
    step({"logits": logits + 1.0})
    assert len(traces) == 1  # no recompilation for new values
    segments = {k: batch[k] for k in ("decoder_segment_ids", "decoder_positions")}

    def objective(x):
        return ntl_jax.cross_entropy_and_ntl(
            x, batch["decoder_target_tokens"], NT, weights=batch["decoder_loss_weights"],
            loss_normalizing_factor="AVERAGE_PER_SEQUENCE", **segments)[0]

    want_value, want_grad = jax.value_and_grad(objective)(logits)
    np.testing.assert_allclose(float(value_), float(want_value), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad["logits"]), np.asarray(want_grad), rtol=1e-5, atol=1e-8)
    assert np.isfinite(np.asarray(grad["logits"])).all()


# -- Gaussian-smoothed cross-entropy and NTL-WAS-CDF ------------------------------------


@pytest.mark.parametrize("factor", [None, "NUM_REAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE"], ids=str)
def test_gce_and_was_cdf_match_the_float64_reference(factor):
    from tests.test_gce_and_cdf import reference

    batch, logits = make_batch(True, seed=23), make_logits(23)
    # The paper's pairing: NTL-WAS-CDF against the cross-entropy's Gaussian label.
    out = loss_of(logits, batch, number_loss=losses.was_cdf(sigma=1.5), gce_sigma=1.5, loss_normalizing_factor=factor)
    lnf, weights = t5x_factor_and_weights(factor, batch)
    want, ce, ntl, _, ntl_mean = reference(logits, batch["decoder_target_tokens"], weights, NT, sigma=1.5,
                                           kind="was_cdf", factor=lnf)
    # float32 sums of 30 positions, each a logsumexp over 24 logits or a cumulative sum over 10.
    np.testing.assert_allclose(float(out.loss), want, rtol=2e-6)
    np.testing.assert_allclose(float(out.per_step["cross_ent_loss"]), ce, rtol=2e-6)
    np.testing.assert_allclose(float(out.per_step["ntl_term"]), 0.3 * ntl, rtol=2e-6)
    np.testing.assert_allclose(float(out.averages["ntl"][0] / out.averages["ntl"][1]), ntl_mean, rtol=2e-6)
    # The fused head gives the same.
    rng = np.random.default_rng(23)
    hidden = jnp.asarray(rng.normal(size=(3, 10, 5)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(5, WIDTH)), jnp.float32)
    options = dict(number_loss=losses.was_cdf(sigma=1.5), gce_sigma=1.5)
    fused = t5x_loss.model_loss_from_hidden(hidden, kernel, batch, NT, as_options(**options), factor, chunk_size=7)
    unfused = loss_of(jnp.einsum("bld,dv->blv", hidden, kernel), batch, loss_normalizing_factor=factor, **options)
    np.testing.assert_allclose(float(fused.loss), float(unfused.loss), rtol=2e-5)


def test_the_model_trains_on_the_gaussian_label():
    batch, logits = make_batch(False, seed=24), make_logits(24)
    model = fake_model(number_loss="was_cdf(sigma=0.8)", gce_sigma=0.8,
                       loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    assert model.gce_sigma == 0.8 and fake_model().gce_sigma == 0.0
    assert model.number_loss is losses.was_cdf(sigma=0.8)  # the spec parsed, to the one value
    loss, metrics = model.loss_fn({"logits": logits}, batch, None)
    want = loss_of(logits, batch, number_loss=losses.was_cdf(sigma=0.8), gce_sigma=0.8,
                   loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    plain = loss_of(logits, batch, number_loss=losses.was_cdf(sigma=0.8),
                    loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    assert float(loss) == float(want.loss)
    assert value(metrics["cross_ent_loss"]) == float(want.per_step["cross_ent_loss"])
    assert abs(float(want.loss) - float(plain.loss)) > 1e-3  # the label is smoothed


def test_number_tokens_come_from_the_output_vocabulary():
    model = fake_model(digit_level=True)
    np.testing.assert_array_equal(model.number_tokens.ids, DIGIT_IDS)
    assert model.number_tokens.vocab_size == VOCAB
    assert model.ntl_options == {"ntl_weight": 0.3, "number_loss": "was"}
    assert model.number_loss is losses.was()
    assert fake_model(number_loss=None).ntl_options == {"ntl_weight": 0.3, "number_loss": "none"}
    assert fake_model(number_loss=losses.smmd(mode="mmd")).ntl_options["number_loss"] == "smmd(mode=mmd)"


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(ntl_weight=-0.1), ValueError),
        (dict(ntl_weight="0.3"), TypeError),
        (dict(ntl_weight=True), TypeError),
        (dict(number_loss="l2"), ValueError),
        (dict(number_loss="was(reweigh=yes)"), ValueError),  # a bad value in a spec string
        (dict(digit_level=1), TypeError),
        (dict(number_loss="was(squash_factor=1.0)"), ValueError),
        (dict(number_loss="mse(squash_factor=2.0)"), ValueError),
        (dict(gce_sigma=-1.0), ValueError),
        (dict(gce_sigma=float("nan")), ValueError),
        (dict(gce_sigma="1"), TypeError),
        (dict(gce_sigma=1.0, label_smoothing=0.1), ValueError),
        (dict(number_loss="was_cdf(squash_factor=2.0)"), ValueError),
        (dict(number_loss=lambda prediction, target: prediction - target), TypeError),
        (dict(number_loss=3), TypeError),
    ],
)
def test_bad_options_raise(kwargs, error):
    with pytest.raises(error):
        fake_model(**kwargs)


@pytest.mark.parametrize("old, new", [
    (dict(ntl_kind="mse"), "number_loss= a name"),
    (dict(squash_factor=2.0), r"number_loss=ntl_jax.losses.was\(squash_factor=...\)"),
    (dict(reweigh=True), r"number_loss=ntl_jax.losses.was\(reweigh=True\)"),
    (dict(max_number_length=3), r"number_loss=ntl_jax.losses.number_level\(max_number_length=...\)"),
    (dict(smmd_mode="mmd"), r"number_loss=ntl_jax.losses.smmd\(mode=...\)"),
    (dict(smmd_sigma=1.0), r"number_loss=ntl_jax.losses.smmd\(sigma=...\)"),
    (dict(smmd_alpha=0.5), r"number_loss=ntl_jax.losses.smmd\(alpha=...\)"),
])
def test_removed_keywords_name_the_new_form(old, new):
    (key,) = old
    with pytest.raises(TypeError, match=rf"FakeNTLModel\(\) no longer takes {key}= \(ntl_jax 0.3.0\); pass {new}"):
        fake_model(**old)


def test_a_table_the_loss_cannot_score_fails_when_the_model_is_made():
    class TwoValues(FakeVocabulary):
        vocab_size = 4

        def id_to_piece(self, i):
            return ["<pad>", "</s>", "0", "1"][i]

    with pytest.raises(ValueError, match="at least 3 distinct values for squash_factor"):
        FakeNTLModel(vocabulary=TwoValues(), number_loss=losses.was(squash_factor=2.0))


def test_a_model_without_metric_classes_says_what_to_set():
    class Bare(t5x_loss.NTLLossMixin, FakeTransformerModel):
        pass

    model = Bare(vocabulary=FakeVocabulary())
    with pytest.raises(TypeError, match="per_step_metric, average_metric and ntl_metric"):
        model.loss_fn({"logits": make_logits(0)}, make_batch(False), None)


def test_clu_metric_classes_accept_the_totals():
    clu_metrics = pytest.importorskip("clu.metrics")

    from flax import struct

    @struct.dataclass
    class NTLAverage(t5x_loss.NTLMean, clu_metrics.Average):  # as ntl_jax.t5x.models builds it
        pass

    class CluModel(t5x_loss.NTLLossMixin, FakeTransformerModel):
        per_step_metric = FakeAveragePerStep
        average_metric = clu_metrics.Average
        ntl_metric = NTLAverage

    batch, logits = make_batch(True, seed=20), make_logits(20)
    model = CluModel(vocabulary=FakeVocabulary(), loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    _, metrics = jax.jit(model.loss_fn)({"logits": logits}, batch, None)
    merged = metrics["number_abs_error"].merge(metrics["number_abs_error"])
    np.testing.assert_allclose(float(merged.compute()), float(metrics["number_abs_error"].compute()), rtol=1e-6)
    out = loss_of(logits, batch, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    total, count = out.averages["ntl"]
    np.testing.assert_allclose(float(metrics["ntl"].compute()), float(total / count), rtol=1e-6)
    merged = metrics["ntl"].merge(metrics["ntl"])  # across steps: the mean over all counted positions
    assert isinstance(merged, NTLAverage)
    np.testing.assert_allclose(float(merged.compute()), float(total / count), rtol=1e-6)
    assert float(NTLAverage(total=jnp.float32(0), count=jnp.float32(0)).compute()) == 0.0  # not NaN


def test_importing_the_loss_module_does_not_import_t5x():
    import subprocess
    import sys

    code = ("import sys, ntl_jax.t5x._loss; "
            "print([m for m in ('t5x', 'ntl_jax.t5x.models', 'clu', 'tensorflow') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_number_level_parameters_reach_the_model_loss():
    batch, logits = make_batch(False, seed=25), make_logits(25)
    factor = "NUM_REAL_TARGET_TOKENS"
    capped_loss = losses.number_level(max_number_length=1)
    model = fake_model(number_loss=capped_loss, loss_normalizing_factor=factor)
    loss, metrics = model.loss_fn({"logits": logits}, batch, None)
    capped = t5x_loss.model_loss(logits, batch, NT, Options(number_loss=capped_loss), factor)
    plain = t5x_loss.model_loss(logits, batch, NT, Options(number_loss=losses.number_level()), factor)
    assert float(loss) == float(capped.loss)
    # The objective's own (the loss's max_number_length is tested against number_level_loss).
    want, _ = ntl_jax.cross_entropy_and_ntl(logits, batch["decoder_target_tokens"], NT, number_loss=capped_loss,
                                            weights=batch["decoder_loss_weights"], loss_normalizing_factor=factor)
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)
    assert abs(float(capped.loss) - float(plain.loss)) > 1e-3  # numbers of 2+ digits: the cap changes it
    # The spec of the same loss gives the same model.
    by_spec = fake_model(number_loss="number_level(max_number_length=1)", loss_normalizing_factor=factor)
    assert by_spec.number_loss is capped_loss
    with pytest.raises(ValueError, match="number loss 'was' has no parameter 'max_number_length'"):
        fake_model(number_loss="was(max_number_length=3)")


def test_smmd_options_reach_the_model_loss():
    batch, logits = make_batch(False, seed=27), make_logits(27)
    factor = "NUM_REAL_TARGET_TOKENS"
    number_loss = losses.smmd(mode="mmd", sigma=1, squash_factor=3)  # gin may bind integers
    loss, _ = fake_model(number_loss=number_loss, loss_normalizing_factor=factor).loss_fn({"logits": logits}, batch,
                                                                                          None)
    want, _ = ntl_jax.cross_entropy_and_ntl(logits, batch["decoder_target_tokens"], NT, number_loss=number_loss,
                                            weights=batch["decoder_loss_weights"], loss_normalizing_factor=factor)
    default, _ = fake_model(number_loss="smmd", loss_normalizing_factor=factor).loss_fn({"logits": logits}, batch,
                                                                                        None)
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)
    assert abs(float(loss) - float(default)) > 1e-4
    with pytest.raises(ValueError, match="number loss 'was' has no parameter 'mode'"):
        fake_model(number_loss="was(mode=mmd)")


# -- a loss of the user's own ----------------------------------------------------------


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("factor", FACTORS, ids=str)
def test_a_loss_of_ones_own_is_the_objective_s(factor, packed):
    batch, logits = make_batch(packed, seed=28), make_logits(28)
    options = dict(ntl_weight=0.3, z_loss=1e-4, label_smoothing=0.1)
    out = loss_of(logits, batch, number_loss=SQUARED_DISTANCE, loss_normalizing_factor=factor, **options)
    segments = {k: batch[k] for k in ("decoder_segment_ids", "decoder_positions") if k in batch}
    want, parts = ntl_jax.cross_entropy_and_ntl(
        logits, batch["decoder_target_tokens"], NT, weights=batch["decoder_loss_weights"],
        number_loss=SQUARED_DISTANCE, loss_normalizing_factor=factor, **options, **segments)
    np.testing.assert_allclose(float(out.loss), float(want), rtol=1e-6)
    np.testing.assert_allclose(float(out.per_step["ntl_term"]), float(parts["ntl_term"]), rtol=1e-6)
    total, count = out.averages["ntl"]
    np.testing.assert_allclose(float(total) / float(count), float(parts["ntl"]), rtol=1e-6)
    # Against the plain formula: sum_j softmax(z)_j (v_j - y)^2 over the digits' logits z.
    lnf, weights = t5x_factor_and_weights(factor, batch)
    targets = np.asarray(batch["decoder_target_tokens"])
    is_digit = (targets >= 5) & (targets <= 14)
    y = np.where(is_digit, targets - 5, 0)
    per_position = (numpy_digit_softmax(logits) * np.square(np.arange(10) - y[..., None])).sum(-1)
    weights = np.ones(targets.shape) if weights is None else weights
    sums = (np.where(is_digit, per_position, 0.0) * weights).sum()
    np.testing.assert_allclose(float(total) / float(count), sums / weights[is_digit].sum(), rtol=2e-5)
    np.testing.assert_allclose(float(out.per_step["ntl_term"]),
                               0.3 * sums / weights[is_digit].sum() * weights.sum() / (lnf or 1.0), rtol=2e-5)
    # The fused head takes it too.
    rng = np.random.default_rng(28)
    hidden = jnp.asarray(rng.normal(size=(3, 10, 5)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(5, WIDTH)), jnp.float32)
    fused = t5x_loss.model_loss_from_hidden(hidden, kernel, batch, NT, Options(number_loss=SQUARED_DISTANCE),
                                            factor, chunk_size=7)
    unfused = loss_of(jnp.einsum("bld,dv->blv", hidden, kernel), batch, number_loss=SQUARED_DISTANCE,
                      loss_normalizing_factor=factor)
    np.testing.assert_allclose(float(fused.loss), float(unfused.loss), rtol=2e-5)


def test_the_model_takes_a_loss_of_ones_own():
    batch, logits = make_batch(True, seed=29), make_logits(29)
    model = fake_model(number_loss=SQUARED_DISTANCE, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    with pytest.raises(ValueError, match=r"no spec that parse reads back .*losses.register"):
        model.ntl_options  # it trains, but no name parse would refuse is recorded
    loss, metrics = jax.jit(model.loss_fn)({"logits": logits}, batch, None)
    want = loss_of(logits, batch, number_loss=SQUARED_DISTANCE, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    np.testing.assert_allclose(float(loss), float(want.loss), rtol=1e-6)
    np.testing.assert_allclose(value(metrics["ntl"]), float(want.averages["ntl"][0] / want.averages["ntl"][1]),
                               rtol=1e-6)


# -- the pieces the loss is made of ----------------------------------------------------


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("factor", FACTORS, ids=str)
def test_resolve_weights_is_t5x_s_factor_and_weights(factor, packed):
    batch = make_batch(packed, seed=30)
    got_factor, got_weights = t5x_loss.resolve_weights(WIDTH, batch, factor)
    want_factor, want_weights = t5x_factor_and_weights(factor, batch)
    np.testing.assert_allclose(np.asarray(got_weights), want_weights, rtol=1e-6)
    if want_factor is None:
        assert got_factor is None
    else:
        np.testing.assert_allclose(float(got_factor), want_factor, rtol=1e-6)
    # The same order as the public function's, and what the loss resolves.
    public = ntl_jax.loss_normalizing_factor_and_weights(
        factor, batch["decoder_target_tokens"], batch["decoder_loss_weights"],
        decoder_segment_ids=batch.get("decoder_segment_ids"), decoder_positions=batch.get("decoder_positions"))
    np.testing.assert_allclose(np.asarray(public[1], np.float32), np.asarray(got_weights), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(loss_of(make_logits(30), batch, loss_normalizing_factor=factor).mask),
                               np.asarray(got_weights), rtol=1e-6)


def test_number_quality_totals_are_predict_numbers_at_the_counted_positions():
    batch, logits = make_batch(False, seed=31), make_logits(31)
    targets, weights = batch["decoder_target_tokens"], batch["decoder_loss_weights"]
    totals = t5x_loss.number_quality_totals(logits, targets, weights, NT)
    value_, mass = ntl_jax.predict_numbers(logits, NT)
    counted = np.asarray((targets >= 5) & (targets <= 14) & (weights > 0))
    digit = np.asarray(targets) - 5
    assert int(totals["number_abs_error"][1]) == int(totals["number_token_mass"][1]) == counted.sum()
    np.testing.assert_allclose(float(totals["number_abs_error"][0]),
                               np.abs(np.asarray(value_) - digit)[counted].sum(), rtol=1e-6)
    np.testing.assert_allclose(float(totals["number_token_mass"][0]), np.asarray(mass)[counted].sum(), rtol=1e-6)
    # No gradient reaches the logits through the metrics.
    grad = jax.grad(lambda x: t5x_loss.number_quality_totals(x, targets, weights, NT)["number_abs_error"][0])(logits)
    assert not np.asarray(grad).any()
