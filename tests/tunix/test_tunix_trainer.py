"""`NumberTokenLossTrainer` runs Tunix's training loop on CE + NTL and logs the parts;
the number tokens come from the tokenizers Tunix wraps; on 8 host devices with Tunix's
mesh the loss equals one device's."""

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest

from tests import tokenizer_builders
from tests.tunix.families import qwen2_model

pytest.importorskip("tunix")

from tunix.generate.tokenizer_adapter import TokenizerAdapter  # noqa: E402
from tunix.sft import peft_trainer  # noqa: E402

import ntl_jax  # noqa: E402
from ntl_jax import tunix as ntl_tunix  # noqa: E402
from ntl_jax.data import multiplication  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def character_tokenizer():
    """A Qwen-like stand-in (one token per digit) as a transformers tokenizer."""
    import tokenizers
    import transformers

    pieces = ["<pad>", "<eos>", "<unk>", *"0123456789 *+-=?.,Wabcdefghijklmnopqrstuvwxyz"]
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=model, pad_token="<pad>", eos_token="<eos>",
                                                unk_token="<unk>")


def test_number_tokens_from_tunix_adapters_equal_the_wrapped_tokenizers():
    for tokenizer in (tokenizer_builders.transformers_fast(tokenizer_builders.qwen_style()),
                      tokenizer_builders.sentencepiece_processor()):
        adapter = TokenizerAdapter(tokenizer)
        ours, expected = ntl_tunix.number_tokens(adapter), ntl_jax.NumberTokens.from_tokenizer(tokenizer)
        assert ours.vocab_size == expected.vocab_size and ours.num_numbers == expected.num_numbers > 0
        np.testing.assert_array_equal(ours.ids, expected.ids)
        np.testing.assert_array_equal(ours.number_values, expected.number_values)
    qwen = ntl_tunix.number_tokens(TokenizerAdapter(tokenizer_builders.transformers_fast(
        tokenizer_builders.qwen_style())))
    assert qwen.num_numbers == 10  # Qwen's digits, one token each


def test_training_inputs_put_the_loss_on_the_answer_and_refuse_what_does_not_fit():
    tokenizer = TokenizerAdapter(character_tokenizer())
    [batch] = ntl_tunix.training_inputs([("What is 12 * 3?", "36"), ("What is 2 * 2?", "4")], tokenizer,
                                        batch_size=2, max_length=20)
    assert batch.input_tokens.shape == (2, 20)
    row = batch.input_tokens[0]
    answer = row[batch.input_mask[0]]
    assert answer.tolist() == tokenizer.encode("36") + [tokenizer.eos_id()]
    assert (row[18:] == tokenizer.pad_id()).all()  # 15 + 2 + eos tokens, then padding
    assert batch.input_mask[1].tolist() == [False] * 14 + [True] * 2 + [False] * 4  # "4" and eos
    with pytest.raises(ValueError, match=r"max_length=10 tokens, got 18"):
        list(ntl_tunix.training_inputs([("What is 12 * 3?", "36")], tokenizer, batch_size=1, max_length=10))


def _number_fractions(batches, numbers) -> np.ndarray:
    """Per batch: the share of its counted targets that are number tokens."""
    fractions = []
    for batch in batches:
        targets, mask = batch.input_tokens[:, 1:], batch.input_mask[:, 1:]
        fractions.append(np.sum(mask & np.isin(targets, numbers.ids)) / np.sum(mask))
    return np.asarray(fractions)


def test_the_trainer_trains_on_ce_plus_ntl_and_logs_its_parts():
    tokenizer = TokenizerAdapter(character_tokenizer())
    numbers = ntl_tunix.number_tokens(tokenizer)
    model = qwen2_model(tied=True, vocab=len(tokenizer.tokenizer))
    steps = 6
    pairs = multiplication.examples("train", 8 * steps, seed=0)
    batches = list(ntl_tunix.training_inputs(pairs, tokenizer, batch_size=8, max_length=40))
    config = peft_trainer.TrainingConfig(eval_every_n_steps=3, max_steps=steps, pbar_description=None)
    evaluated_parts = []

    class Recording(ntl_tunix.NumberTokenLossTrainer):
        def _post_process_eval_step(self, aux):
            evaluated_parts.append(jax.device_get(aux))
            super()._post_process_eval_step(aux)

    trainer = Recording(model, optax.adam(3e-3), config, numbers, ntl_weight=0.3, number_loss="was", fused=True)
    trainer = trainer.with_gen_model_input_fn(ntl_tunix.model_input_fn(tokenizer.pad_id()))
    trainer.train(batches, batches[:2])
    names = ("loss", "cross_entropy", "ntl", "ntl_term")
    logged = {name: np.asarray(trainer.metrics_logger.get_metric_history("", name, "train")) for name in names}
    assert len(logged["loss"]) == len(logged["ntl"]) == len(logged["ntl_term"]) >= steps - 1
    np.testing.assert_allclose(logged["loss"], logged["cross_entropy"] + logged["ntl_term"], rtol=1e-5)
    # `ntl` is the mean over the number targets (the answers' digits, not their eos); since 0.5.0
    # `ntl_term` = 0.3 * ntl * weight_sum / factor = 0.3 * ntl under NUM_REAL_TARGET_TOKENS, no
    # longer scaled by the batch's share of number targets (below 1 here, so the two differ).
    fractions = _number_fractions(batches, numbers)
    assert np.all((fractions > 0.5) & (fractions < 1.0)), fractions
    np.testing.assert_allclose(logged["ntl_term"], 0.3 * logged["ntl"], rtol=1e-5)
    assert np.all(np.abs(logged["ntl_term"] - 0.3 * logged["ntl"] * fractions[:len(logged["ntl"])])
                  > 1e-3 * logged["ntl_term"])
    assert logged["loss"][-1] < logged["loss"][0]  # Adam at 3e-3 on a random model: the loss falls
    evaluated = {name: np.asarray(trainer.metrics_logger.get_metric_history("", name, "eval")) for name in names}
    assert len(evaluated["loss"]) == len(evaluated["ntl"]) >= 2  # each evaluation, every 3 steps
    np.testing.assert_allclose(evaluated["loss"], evaluated["cross_entropy"] + evaluated["ntl_term"], rtol=1e-5)
    # Each evaluation's `ntl` is pooled over its two batches' number targets, its other parts
    # are the means of the batches' values, as Tunix's loss.
    assert len(evaluated_parts) == 2 * len(evaluated["ntl"])
    for i, (first, second) in enumerate(zip(evaluated_parts[::2], evaluated_parts[1::2])):
        pooled = (first["ntl_sum"] + second["ntl_sum"]) / (first["ntl_weight_sum"] + second["ntl_weight_sum"])
        np.testing.assert_allclose(evaluated["ntl"][i], pooled, rtol=1e-6)
        np.testing.assert_allclose(evaluated["ntl_term"][i], (first["ntl_term"] + second["ntl_term"]) / 2, rtol=1e-6)


def test_the_trainer_refuses_old_keywords_with_the_new_form_named():
    tokenizer = TokenizerAdapter(character_tokenizer())
    numbers = ntl_tunix.number_tokens(tokenizer)
    model = qwen2_model(tied=True, vocab=len(tokenizer.tokenizer))
    config = peft_trainer.TrainingConfig(eval_every_n_steps=3, max_steps=1, pbar_description=None)
    with pytest.raises(TypeError, match=r"NumberTokenLossTrainer\(\) no longer takes ntl_kind=.*number_loss="):
        ntl_tunix.NumberTokenLossTrainer(model, optax.adam(3e-3), config, numbers, ntl_kind="was")
    with pytest.raises(TypeError, match=r"no longer takes max_number_length=.*number_level\(max_number_length="):
        ntl_tunix.NumberTokenLossTrainer(model, optax.adam(3e-3), config, numbers, number_loss="number_level",
                                         max_number_length=5)
    with pytest.raises(ValueError, match="nope"):
        ntl_tunix.NumberTokenLossTrainer(model, optax.adam(3e-3), config, numbers, number_loss="nope")


def test_on_tunix_mesh_of_8_devices_equal_to_one_device():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "tunix" / "mesh_check.py")], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sharded == one device on 8 devices, from the logits and fused" in result.stdout
