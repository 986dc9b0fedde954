"""`ntl_jax.easydel`'s loss strategy against EasyDeL 0.3.0 itself, on tiny Llama (untied
head) and Qwen3 (tied) models: at weight 0 it is EasyDeL's own loss and gradient, dense
and chunked; at weight > 0 it is `cross_entropy_and_ntl` on the model's own logits, in
value and gradient, for a loss read position by position, one read across positions
and one of one's own; EasyDeL's loss options are honoured or refused by name; bad
input stops with an error that says what is wrong."""

import dataclasses

import pytest

pytest.importorskip("easydel")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from easydel.infra.loss_utils import LossConfig  # noqa: E402

import ntl_jax  # noqa: E402
from ntl_jax import easydel as ntl_easydel  # noqa: E402
from ntl_jax import losses  # noqa: E402
from tests.easydel import tiny  # noqa: E402

SQUARED = losses.expectation("squared_distance_easydel", lambda v, y: (v - y) ** 2)
LOSSES = ["was", "number_level", SQUARED]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny.tokenizer()


@pytest.mark.parametrize("name", sorted(tiny.MODELS))
@pytest.mark.parametrize("loss_config", [None, LossConfig(chunk_token_size=4)], ids=["dense", "chunked"])
def test_weight_zero_is_easydels_own_loss_and_gradient(name, loss_config, tokenizer):
    # Chunked without padding: EasyDeL 0.3.0's chunked gradient differs from its own dense
    # one where the attention mask has zeros (its value agrees); the strategy's is the dense one.
    model, batch = tiny.MODELS[name](), tiny.batch(padded=loss_config is None)
    stock_loss, stock, stock_grads = tiny.loss_and_grads(model, batch, loss_config)
    ntl_easydel.use(model, tokenizer, number_loss="was", ntl_weight=0.0)
    loss, metrics, grads = tiny.loss_and_grads(model, batch, loss_config)
    np.testing.assert_allclose(float(loss), float(stock_loss), rtol=2e-6)
    if loss_config is None:  # (EasyDeL's chunked path counts the masked prompt in its weight_sum)
        np.testing.assert_allclose(float(metrics.weight_sum), float(stock.weight_sum), rtol=0)
    assert float(metrics.other_metrics["ntl_term"]) == 0.0 < float(metrics.other_metrics["ntl"])
    tiny.assert_trees_close(grads, stock_grads, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(tiny.MODELS))
@pytest.mark.parametrize("number_loss", LOSSES, ids=lambda x: x if isinstance(x, str) else x.name)
def test_the_objective_is_cross_entropy_and_ntl_on_the_models_logits(name, number_loss, tokenizer):
    model, batch = tiny.MODELS[name](), tiny.batch()
    numbers = ntl_easydel.number_tokens(tokenizer)
    ntl_easydel.use(model, tokenizer, number_loss=number_loss)  # the loss's own weight

    def objective(logits, targets, weights):
        return ntl_jax.cross_entropy_and_ntl(logits, targets, numbers, weights=weights, number_loss=number_loss,
                                             loss_normalizing_factor=jnp.sum(weights))

    expected, parts, expected_grads = tiny.logits_loss_and_grads(model, batch, objective)
    loss, metrics, grads = tiny.loss_and_grads(model, batch)
    assert float(parts["ntl_term"]) > 0.01
    np.testing.assert_allclose(float(loss), float(expected), rtol=2e-6)
    for part in ("ntl", "ntl_term", "ntl_sum", "ntl_weight_sum", "cross_entropy"):
        np.testing.assert_allclose(float(metrics.other_metrics[part]), float(parts[part]), rtol=2e-6, err_msg=part)
    # number_level's quotients (sMAPE over joined digits) reach Qwen3's tied embedding and norms at
    # 1.4e-4 to 3.8e-4 in L2 from float32 sums in another order; the others within 1e-4.
    tiny.assert_trees_close(grads, expected_grads, rtol=1e-3 if number_loss == "number_level" else 1e-4)


def test_ntl_weight_none_is_the_losss_own_weight_and_an_explicit_one_scales_the_term(tokenizer):
    model, batch = tiny.llama(), tiny.batch()
    own = ntl_easydel.use(model, tokenizer, number_loss="was")
    assert own.ntl_weight is None and losses.was().default_weight == 0.3
    _, metrics, _ = tiny.loss_and_grads(model, batch)
    ntl_easydel.use(model, tokenizer, number_loss="was", ntl_weight=0.6)
    _, doubled, _ = tiny.loss_and_grads(model, batch)
    np.testing.assert_allclose(float(doubled.other_metrics["ntl_term"]), 2 * float(metrics.other_metrics["ntl_term"]),
                               rtol=1e-6)


@pytest.mark.parametrize("options", [dict(label_smoothing=0.1), dict(z_loss=1e-3),
                                     dict(loss_normalizing_factor=7.0), dict(chunk_vocab_size=64)],
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_easydels_loss_options_are_honoured(options, tokenizer):
    # Without an attention mask (EasyDeL's label smoothing charges positions labelled
    # -100 that the mask covers; the strategy counts no target there).
    model, batch = tiny.llama(), tiny.batch(padded=False)
    config = LossConfig(**options)
    stock_loss, stock, stock_grads = tiny.loss_and_grads(model, batch, config)
    ntl_easydel.use(model, tokenizer, number_loss="was", ntl_weight=0.0)
    loss, metrics, grads = tiny.loss_and_grads(model, batch, config)
    np.testing.assert_allclose(float(loss), float(stock_loss), rtol=3e-6)
    np.testing.assert_allclose(float(metrics.z_loss), float(stock.z_loss), rtol=3e-6, atol=1e-9)
    tiny.assert_trees_close(grads, stock_grads, rtol=5e-4)  # z-loss's: 2.9e-4 in L2 on a key kernel


def test_the_total_target_tokens_factor_divides_by_every_target(tokenizer):
    # (EasyDeL 0.3.0's own dense loss fails on this factor: KeyError 'decoder_target_tokens'.)
    model, batch = tiny.llama(), tiny.batch()
    ntl_easydel.use(model, tokenizer, number_loss="was")
    real, real_metrics, _ = tiny.loss_and_grads(model, batch)
    total, _, _ = tiny.loss_and_grads(model, batch, LossConfig(loss_normalizing_factor="NUM_TOTAL_TARGET_TOKENS"))
    _, weights = tiny.targets_and_weights(batch)
    np.testing.assert_allclose(float(total), float(real) * float(jnp.sum(weights)) / weights.size, rtol=2e-6)


def test_num_items_in_batch_divides_the_loss_as_easydel_divides_it(tokenizer):
    model, batch = tiny.llama(), dict(tiny.batch(), num_items_in_batch=jnp.float32(3.0))
    stock_loss, _, _ = tiny.loss_and_grads(model, batch)
    ntl_easydel.use(model, tokenizer, number_loss="was", ntl_weight=0.0)
    loss, _, _ = tiny.loss_and_grads(model, batch)
    without, _, _ = tiny.loss_and_grads(model, tiny.batch())
    np.testing.assert_allclose(float(loss), float(stock_loss), rtol=2e-6)
    np.testing.assert_allclose(float(loss), float(without) / 3.0, rtol=2e-6)


@pytest.mark.parametrize("options, named", [
    (dict(reduction="mean"), "reduction='mean'"),
    (dict(divide_weight_sum=True), "divide_weight_sum=True"),
    (dict(shift_tokens=False), "shift_tokens=False"),
    (dict(compute_dtype="bf16"), "compute_dtype='bf16'"),
    (dict(loss_normalizing_factor="AVERAGE_PER_SEQUENCE"), "loss_normalizing_factor='AVERAGE_PER_SEQUENCE'"),
    (dict(loss_normalizing_factor="NO_WEIGHT_NUM_REAL_TARGET_TOKENS"), "NO_WEIGHT_NUM_REAL_TARGET_TOKENS"),
])
def test_loss_options_it_cannot_honour_are_refused_by_name(options, named, tokenizer):
    model, batch = tiny.llama(), tiny.batch()
    ntl_easydel.use(model, tokenizer, number_loss="was")
    with pytest.raises(ValueError, match="NumberLossStrategy honours, got: .*" + named.replace("(", r"\(")):
        with model.mesh:
            model.compute_loss(loss_config=LossConfig(**options), **batch)


def test_a_tokenizer_without_digit_tokens_is_refused():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    letters = Tokenizer(models.WordLevel({c: i for i, c in enumerate("abcdefgh<>")}, unk_token="<"))
    letters.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    with pytest.raises(ValueError, match="expected a tokenizer with digit tokens 0-9 for the number loss"):
        ntl_easydel.use(tiny.llama(), PreTrainedTokenizerFast(tokenizer_object=letters), number_loss="was")


def test_a_tokenizer_larger_than_the_model_is_refused(tokenizer):
    with pytest.raises(ValueError, match=r"at most the model's vocab_size=128 ids, got 260"):
        ntl_easydel.use(tiny.llama(vocab_size=128), tokenizer, number_loss="was")


def test_labels_out_of_range_are_refused(tokenizer):
    model, batch = tiny.llama(), tiny.batch()
    ntl_easydel.use(model, tokenizer, number_loss="was")
    labels = batch["labels"].at[1, 6].set(tiny.VOCAB + 5)
    with pytest.raises(ValueError, match=rf"expected target ids in \[0, {tiny.VOCAB}\).*1 out of range: "
                                         rf"{tiny.VOCAB + 5} at \(1, 6\)"):
        with model.mesh:
            model.compute_loss(**dict(batch, labels=labels))


def test_a_model_without_a_headless_forward_pass_is_refused(tokenizer, monkeypatch):
    model = tiny.llama()
    stock_call = type(model).__call__

    def call(self, input_ids=None, attention_mask=None):  # no apply_lm_head
        return stock_call(self, input_ids=input_ids, attention_mask=attention_mask)

    monkeypatch.setattr(type(model), "__call__", call)
    with pytest.raises(TypeError, match="whose call takes apply_lm_head .*got LlamaForCausalLM"):
        ntl_easydel.use(model, tokenizer, number_loss="was")


def test_the_strategy_is_a_value_of_its_settings(tokenizer):
    numbers = ntl_easydel.number_tokens(tokenizer)
    strategy = ntl_easydel.NumberLossStrategy(numbers, number_loss="smmd(sigma=2)", ntl_weight=0.1)
    assert strategy.number_loss == losses.smmd(sigma=2.0) and strategy.ntl_weight == 0.1
    with pytest.raises(TypeError, match="expected fused-head options among .*, got vocab_axis"):
        ntl_easydel.NumberLossStrategy(numbers, vocab_axis="tp")
    with pytest.raises(TypeError, match="expected NumberTokens"):
        ntl_easydel.NumberLossStrategy(tokenizer)
    assert dataclasses.fields(LossConfig)  # what check_loss_config reads
