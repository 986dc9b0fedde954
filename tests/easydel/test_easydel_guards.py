"""What `ntl_jax.easydel` relies on in EasyDeL is checked, and each EasyDeL change it
catches is simulated here: a release it was not tested with, a LossConfig with a field
it does not know, a release that no longer picks the loss by `config.loss_type`, a
model whose head is not `hidden @ kernel`, and a trainer that never calls the strategy."""

import dataclasses
from importlib import metadata

import pytest

pytest.importorskip("easydel")

import easydel as ed  # noqa: E402
from easydel.infra import base_module, loss_utils  # noqa: E402

from ntl_jax import easydel as ntl_easydel  # noqa: E402
from ntl_jax.easydel import install, versions  # noqa: E402
from tests.easydel import tiny  # noqa: E402
from tests.easydel.test_easydel_trainer import _dataset  # noqa: E402


def test_an_untested_easydel_release_is_refused_unless_asked_for(monkeypatch):
    monkeypatch.setattr(metadata, "version", lambda name: "0.4.0" if name == "easydel" else metadata.version(name))
    monkeypatch.delenv(versions.UNTESTED_EASYDEL_ENV, raising=False)
    with pytest.raises(RuntimeError, match=r"expected EasyDeL 0\.3\.0, .* got easydel 0\.4\.0.*"
                                           r"NTL_JAX_UNTESTED_EASYDEL=1"):
        ntl_easydel.use(tiny.llama(), tiny.tokenizer(), number_loss="was")
    monkeypatch.setenv(versions.UNTESTED_EASYDEL_ENV, "1")
    ntl_easydel.check_easydel_version()


def test_the_installed_release_is_a_tested_one():
    assert metadata.version("easydel") in ntl_easydel.TESTED_EASYDEL


def test_a_loss_config_with_a_field_it_does_not_know_is_refused():
    @dataclasses.dataclass
    class NewLossConfig(loss_utils.LossConfig):
        token_weighting: str = "uniform"

    with pytest.raises(ValueError, match="LossConfig fields as ntl_jax.easydel knows them, got new ones: "
                                         "token_weighting"):
        ntl_easydel.check_loss_config(NewLossConfig())
    ntl_easydel.check_loss_config(loss_utils.LossConfig())


def test_a_release_that_no_longer_picks_the_loss_by_loss_type_is_refused(monkeypatch):
    monkeypatch.setattr(base_module, "resolve_loss_strategy", lambda loss_fn: loss_utils.CausalLMLossStrategy())
    with pytest.raises(RuntimeError, match=r"loss_strategy to be the number loss's strategy after "
                                           r"config.loss_type='ForCausalLM\+NumberTokenLoss\d+', got .*CausalLM"):
        ntl_easydel.use(tiny.llama(), tiny.tokenizer(), number_loss="was")


@pytest.mark.parametrize("change, message", [
    (lambda project: (lambda h: 30.0 * jnp_tanh(project(h) / 30.0)), "soft cap"),
    (lambda project: (lambda h: 0.5 * project(h)), "logit scale"),
    (lambda project: (lambda h: project(h) + 0.25), "a bias"),
], ids=["soft cap", "scale", "bias"])
def test_a_head_that_is_not_hidden_times_kernel_is_refused(change, message, monkeypatch):
    model = tiny.llama()
    stock = type(model).make_lm_head_fn
    monkeypatch.setattr(type(model), "make_lm_head_fn", lambda self: change(stock(self)))
    with pytest.raises(ValueError, match=rf"expected LlamaForCausalLM's logits to be hidden @ kernel \[32, 264\] "
                                         rf"\(its lm_head kernel\), got otherwise .*{message}"):
        ntl_easydel.use(model, tiny.tokenizer(), number_loss="was")


def jnp_tanh(x):
    import jax.numpy as jnp

    return jnp.tanh(x)


def test_a_head_without_a_kernel_is_refused(monkeypatch):
    model = tiny.llama()
    monkeypatch.setattr(type(model), "get_lm_head", lambda self: object())
    with pytest.raises(TypeError, match="expected LlamaForCausalLM's lm_head to hold a kernel"):
        ntl_easydel.use(model, tiny.tokenizer(), number_loss="was")


def test_a_trainer_that_never_calls_the_strategy_stops_at_its_first_step(tmp_path, monkeypatch):
    # A release whose compute_loss computes the stock loss on the logits, never the strategy.
    def compute_loss(self, *, labels=None, loss_config=None, loss_kwargs=None, **batch):
        labels = batch["input_ids"] if labels is None else labels
        outputs = self(**{k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")})
        metrics = loss_utils.ForCausalLMLoss(outputs.logits, labels, attention_mask=batch.get("attention_mask"))
        return outputs.replace(loss=metrics.loss), metrics

    monkeypatch.setattr(base_module.EasyDeLBaseModule, "compute_loss", compute_loss)
    arguments = ed.SFTConfig(max_length=32, total_batch_size=8, max_training_steps=1, save_directory=str(tmp_path),
                             use_wandb=False, dataset_text_field="text", packing=False, model_name="tiny",
                             progress_bar_type="json", do_last_save=False)
    trainer = ed.SFTTrainer(arguments=arguments, processing_class=tiny.tokenizer(), model=tiny.llama(),
                            train_dataset=_dataset())
    ntl_easydel.use(trainer, number_loss="was")
    with pytest.raises(RuntimeError, match=r"expected the trainer's train_step to compute its loss with the model's "
                                           r"loss strategy .*ran without the number loss"):
        trainer.train()


def test_a_trainer_refuses_labels_out_of_range_before_its_step(tmp_path):
    arguments = ed.SFTConfig(max_length=32, total_batch_size=8, max_training_steps=1, save_directory=str(tmp_path),
                             use_wandb=False, dataset_text_field="text", packing=False, model_name="tiny",
                             progress_bar_type="json", do_last_save=False)
    trainer = ed.SFTTrainer(arguments=arguments, processing_class=tiny.tokenizer(), model=tiny.llama(),
                            train_dataset=_dataset())
    ntl_easydel.use(trainer, number_loss="was")
    batch = tiny.batch(size=8)
    batch["labels"] = batch["labels"].at[2, 4].set(-7)
    with pytest.raises(ValueError, match=r"1 out of range: -7 at \(2, 4\)"):
        trainer._execute_train_step(trainer.model_state, batch)


def test_each_use_registers_a_loss_type_of_its_own():
    first, second = tiny.llama(), tiny.llama()
    a = ntl_easydel.use(first, tiny.tokenizer(), number_loss="was")
    b = ntl_easydel.use(second, tiny.tokenizer(), number_loss="mse")
    assert first.config.loss_type != second.config.loss_type
    assert first.config.loss_type.startswith(install.LOSS_TYPE_PREFIX)
    assert first.loss_strategy is a and second.loss_strategy is b
